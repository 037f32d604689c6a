// DiPaCo's modules through the outer loop, two threads as two workers on a real group: each module's owner takes
// its outer step with the shard-weighted sum of every worker's contributions; the owners' ring brings the result to
// both replicas, the path-local upload leaves it with the owner.
#include <gtest/gtest.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <mutex>

#include "support/thread_ranks.h"
#include "tributary/comm/codec.h"
#include "tributary/optim/module_owners.h"
#include "tributary/optim/module_ring.h"
#include "tributary/optim/outer_loop.h"

using namespace tributary;

namespace {

// Three modules of one tensor each; module u owned by worker kOwner[u]. Plain averaging (outer lr 1, no momentum):
// an owner's step is global -= sum_p w_p delta_p / sum_p w_p.
constexpr int kOwner[3] = {0, 1, 0};

NamedTensors module_params(size_t u) {
  const int64_t n = int64_t(3 + u);
  return {{"m" + std::to_string(u), torch::arange(n, torch::kFloat32) + float(10 * u)}};
}

// Worker 0 ran paths through modules 0 (weight 1) and 1 (weight 3); worker 1 through module 1 only (weight 1);
// nobody through module 2. Each contribution is its weight times a constant pseudo-gradient.
std::map<size_t, ModuleAccumulator> contributions(int rank) {
  std::map<size_t, ModuleAccumulator> acc;
  auto delta = [](size_t u, float v) { return std::vector<torch::Tensor>{torch::full({int64_t(3 + u)}, v)}; };
  if (rank == 0) {
    acc[0].add(1.0, delta(0, 2.0));
    acc[1].add(3.0, delta(1, 1.0));
  } else {
    acc[1].add(1.0, delta(1, 5.0));
  }
  return acc;
}

struct Worker {
  OuterLoop loop{OuterLoopOptions{.outer = {1.0, 0.0}}};
  std::vector<NamedTensors> replicas;

  explicit Worker(int rank) {
    loop.start_owned(3, 0);
    for (size_t u = 0; u < 3; ++u) {
      replicas.push_back(module_params(u));
      if (kOwner[u] == rank) loop.own(u, replicas.back());
    }
  }
  void sync(int rank, OwnerReducer& reducer) {
    const auto acc = contributions(rank);
    std::vector<const ModuleAccumulator*> c;
    for (size_t u = 0; u < 3; ++u) c.push_back(acc.count(u) ? &acc.at(u) : nullptr);
    loop.sync_owned(/*step=*/4, c, {kOwner[0], kOwner[1], kOwner[2]}, reducer);
  }
};

// After the round: module 0 is 2 below where it started (worker 0's 1 * 2 / 1), module 1 too ((3 * 1 + 1 * 5) / 4).
torch::Tensor expected_module0() { return module_params(0)[0].second - 2.0; }
torch::Tensor expected_module1() { return module_params(1)[0].second - 2.0; }

}  // namespace

TEST(OwnerLoop, TheRingStepsEachModuleOnceAtItsOwnerWithTheWeightedSumAndEveryReplicaFollows) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::mutex mu;
  test_support::run_threads(2, [&](int rank) {
    comm::Group group(store, rank, 2, {}, "ring");
    comm::Exchange exchange(group, {});
    Worker w(rank);
    OwnerRing ring(group, exchange, {&w.replicas[0], &w.replicas[1], &w.replicas[2]});
    w.sync(rank, ring);
    std::lock_guard<std::mutex> lock(mu);
    SCOPED_TRACE(testing::Message() << "worker " << rank);
    // Modules 0 and 1 took their weighted steps; module 2, which no path touched, keeps its parameters.
    EXPECT_TRUE(torch::allclose(w.replicas[0][0].second, expected_module0()));
    EXPECT_TRUE(torch::allclose(w.replicas[1][0].second, expected_module1()));
    EXPECT_TRUE(torch::equal(w.replicas[2][0].second, module_params(2)[0].second));
    // Only owners hold outer state and step it: worker 0 module 0 (module 2: no path, no step), worker 1 module 1.
    EXPECT_EQ(w.loop.outer_steps(), 1);
    for (const auto& u : w.loop.units()) EXPECT_EQ(u.last_sync, 4);
  });
}

TEST(OwnerLoop, ThePathLocalUploadLeavesTheNewValuesWithTheOwner) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::mutex mu;
  test_support::run_threads(2, [&](int rank) {
    comm::Group group(store, rank, 2, {}, "upload");
    const auto codec = comm::make_codec("fp32");
    Worker w(rank);
    OwnerUpload upload(group, *codec);
    w.sync(rank, upload);
    std::lock_guard<std::mutex> lock(mu);
    SCOPED_TRACE(testing::Message() << "worker " << rank);
    if (rank == 1) {
      EXPECT_TRUE(torch::allclose(w.loop.owned(1)->global()[0].second, expected_module1()));
      EXPECT_EQ(upload.bytes().recv, 4 * 4 + 2 * 8);  // worker 0's sum of module 1 (fp32) and its [weight, paths]
      EXPECT_EQ(upload.bytes().sent, 0);              // worker 1 owns the only module it touched
    } else {
      EXPECT_TRUE(torch::allclose(w.loop.owned(0)->global()[0].second, expected_module0()));
      EXPECT_EQ(w.loop.owned(1), nullptr);
      EXPECT_EQ(upload.bytes().sent, 4 * 4 + 2 * 8);
    }
    // The upload leaves the workers' own copies alone: the new values are the owners' to publish.
    EXPECT_TRUE(torch::equal(w.replicas[1][0].second, module_params(1)[0].second));
  });
}

// With the run's key every message of the upload carries a tag (the masks, each sum and its weights): the owner's
// step is the one without it, and a stranger who sends in a worker's place (another key) changes nothing: the owner
// refuses the message before it decodes it, and no module takes a step.
TEST(OwnerLoop, ASealedUploadStepsAsThePlainOneAndAForgedMessageIsRefusedBeforeAnyStep) {
  const auto ours = comm::random_run_key(), theirs = comm::random_run_key();
  for (const bool forged : {false, true}) {
    SCOPED_TRACE(forged ? "forged" : "sealed");
    auto store = c10::make_intrusive<c10d::HashStore>();
    std::mutex mu;
    test_support::run_threads(2, [&](int rank) {
      comm::Group group(store, rank, 2, {}, "upload");
      const auto codec = comm::make_codec("fp32");
      const comm::WireMac mac(forged && rank == 0 ? theirs : ours);
      Worker w(rank);
      OwnerUpload upload(group, *codec, nullptr, nullptr, &mac, "upload|round0");
      std::string error;
      try {
        w.sync(rank, upload);
      } catch (const NetworkError& e) {
        error = e.what();
      }
      std::lock_guard<std::mutex> lock(mu);
      SCOPED_TRACE(testing::Message() << "worker " << rank);
      if (!forged) {
        EXPECT_EQ(error, "");
        if (rank == 1) {
          EXPECT_TRUE(torch::allclose(w.loop.owned(1)->global()[0].second, expected_module1()));
          EXPECT_EQ(upload.bytes().recv, 4 * 4 + 2 * 8 + 2 * comm::WireMac::kBytes);
        }
        return;
      }
      EXPECT_NE(error.find("does not carry the run's MAC"), std::string::npos) << error;
      EXPECT_EQ(w.loop.outer_steps(), 0);
    });
  }
}
