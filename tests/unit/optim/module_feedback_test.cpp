// SparseLoCo per module for path-local DiPaCo (optim/module_feedback.h): the payload is exactly the packed size, what
// was not sent stays as each module's feedback until the module travels again, a failed upload leaves the feedback
// as it was, the checkpointed state goes on bit for bit, and through OwnerUpload the owner gets the decoded sums.
#include <gtest/gtest.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <mutex>

#include "support/thread_ranks.h"
#include "tributary/comm/codec.h"
#include "tributary/core/error.h"
#include "tributary/optim/module_feedback.h"
#include "tributary/optim/module_owners.h"
#include "tributary/optim/outer_loop.h"

using namespace tributary;

namespace {

// Two modules of odd shapes: 3x3 (9 values) and 7, so chunks of 5 cross the module boundary and leave a remainder.
const std::vector<std::vector<int64_t>> kShapes[2] = {{{3, 3}}, {{7}}};
constexpr comm::SparseChunkOptions kOptions{.chunk = 5, .k = 2, .bits = 8};

std::vector<torch::Tensor> sums_of(size_t module, int64_t seed) {
  torch::manual_seed(uint64_t(seed));
  std::vector<torch::Tensor> out;
  for (const auto& shape : kShapes[module]) out.push_back(torch::randn(shape));
  return out;
}

torch::Tensor flat(const std::vector<torch::Tensor>& ts) {
  std::vector<torch::Tensor> f;
  for (const auto& t : ts) f.push_back(t.reshape({-1}));
  return torch::cat(f);
}

torch::Tensor encode(ModuleFeedback& fb, const std::vector<size_t>& modules, int64_t seed,
                     std::vector<std::vector<torch::Tensor>>& sums) {
  sums.clear();
  for (size_t m : modules) sums.push_back(sums_of(m, seed * 10 + int64_t(m)));
  std::vector<const std::vector<torch::Tensor>*> ptrs;
  for (const auto& s : sums) ptrs.push_back(&s);
  return fb.encode(modules, ptrs);
}

}  // namespace

TEST(ModuleFeedback, WhatWasNotSentStaysWithTheModuleUntilItTravelsAgain) {
  // Decay 1: over the rounds, what every payload carried plus the feedback left equals every sum, module by module —
  // also for module 0, which sits out round 2 and keeps its feedback unchanged meanwhile.
  ModuleFeedback fb(kOptions, 1.0);
  const std::vector<std::vector<size_t>> rounds = {{0, 1}, {1}, {1, 0}, {0}};
  torch::Tensor total[2] = {torch::zeros({9}), torch::zeros({7})}, applied[2] = {torch::zeros({9}), torch::zeros({7})};
  for (size_t r = 0; r < rounds.size(); ++r) {
    const auto& modules = rounds[r];
    std::vector<std::vector<torch::Tensor>> sums;
    const auto before = fb.feedback();
    const auto payload = encode(fb, modules, int64_t(r), sums);
    int64_t n = 0;
    for (size_t m : modules) n += m == 0 ? 9 : 7;
    EXPECT_EQ(payload.numel(), fb.chunks().payload_bytes(n)) << "round " << r;
    auto decoded = torch::zeros({n});
    fb.chunks().decode_add(payload, decoded);
    EXPECT_LE((decoded != 0).sum().item<int64_t>(), (n / 5) * 2 + std::min<int64_t>(2, n % 5));  // top-2 per chunk
    fb.commit();
    int64_t at = 0;
    for (size_t k = 0; k < modules.size(); ++k) {
      const size_t m = modules[k];
      const int64_t len = m == 0 ? 9 : 7;
      total[m] += flat(sums[k]);
      applied[m] += decoded.narrow(0, at, len);
      at += len;
    }
    if (r == 1) {
      EXPECT_TRUE(torch::equal(fb.feedback().at(0), before.at(0))) << "an untouched module's feedback moved";
    }
  }
  for (size_t m : {0, 1}) {
    EXPECT_TRUE(torch::allclose(applied[m] + fb.feedback().at(m), total[m], 1e-5, 1e-5)) << m;
  }
  // Something was held back (top-2 of 5 at 8 bits is not lossless), so the identity above is not vacuous.
  EXPECT_GT(fb.feedback().at(1).abs().sum().item<double>(), 0.1);
}

TEST(ModuleFeedback, AFailedUploadLeavesTheFeedbackAsItWas) {
  ModuleFeedback fb(kOptions, 0.95);
  std::vector<std::vector<torch::Tensor>> sums;
  encode(fb, {0, 1}, 1, sums);
  fb.commit();
  const auto kept = fb.feedback().at(0).clone();
  const auto first = encode(fb, {0}, 2, sums);
  fb.discard();  // the round failed
  EXPECT_TRUE(torch::equal(fb.feedback().at(0), kept));
  const auto again = encode(fb, {0}, 2, sums);  // redone: the same payload
  EXPECT_TRUE(torch::equal(first, again));
  fb.commit();
  EXPECT_FALSE(torch::equal(fb.feedback().at(0), kept));
}

TEST(ModuleFeedback, ACheckpointedFeedbackGoesOnBitForBitAndAForeignOneIsRefused) {
  ModuleFeedback a(kOptions, 0.95), b(kOptions, 0.95);
  std::vector<std::vector<torch::Tensor>> sums;
  for (int64_t r = 0; r < 2; ++r) {
    encode(a, {0, 1}, r, sums);
    a.commit();
  }
  b.load_state(a.state(), {9, 7}, "feedback.safetensors");
  EXPECT_TRUE(torch::equal(encode(a, {1, 0}, 7, sums), encode(b, {1, 0}, 7, sums)));
  auto expect_refused = [&](std::vector<std::pair<std::string, torch::Tensor>> state, const std::string& what) {
    try {
      b.load_state(state, {9, 7}, "feedback.safetensors");
      ADD_FAILURE() << "accepted " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'feedback.safetensors'"), std::string::npos) << e.what();
    }
  };
  expect_refused({{"feedback.1", torch::zeros({9})}}, "a module's feedback of another size");
  expect_refused({{"feedback.2", torch::zeros({7})}}, "a module the run does not have");
  expect_refused({{"residual.0", torch::zeros({9})}}, "another name");
}

TEST(ModuleFeedback, TheOwnerTakesItsStepWithTheSparseSumsDecoded) {
  // Worker 0 sends its sum of module 1 (owned by worker 1) as a sparse payload; every value of the 4-value chunk is
  // kept and equal, so the decoded sum is exact and the owner's step is the fp32 one: (3 x 1 + 1 x 5) / (3 + 1) = 2.
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::mutex mu;
  test_support::run_threads(2, [&](int rank) {
    comm::Group group(store, rank, 2, {}, "sparse-upload");
    const auto codec = comm::make_codec("fp32");
    ModuleFeedback feedback({.chunk = 4096, .k = 64, .bits = 2}, 0.95);
    OuterLoop loop{OuterLoopOptions{.outer = {1.0, 0.0}}};
    loop.start_owned(2, 0);
    const NamedTensors start = {{"m", torch::arange(4, torch::kFloat32)}};
    loop.own(size_t(rank), start);  // worker w owns module w
    std::map<size_t, ModuleAccumulator> acc;
    if (rank == 0) acc[1].add(3.0, {torch::full({4}, 1.0)});
    if (rank == 1) acc[1].add(1.0, {torch::full({4}, 5.0)});
    std::vector<const ModuleAccumulator*> c = {nullptr, &acc.at(1)};
    OwnerUpload upload(group, *codec, &feedback);
    loop.sync_owned(/*step=*/4, c, {0, 1}, upload);
    std::lock_guard<std::mutex> lock(mu);
    SCOPED_TRACE(testing::Message() << "worker " << rank);
    const double payload = double(feedback.chunks().payload_bytes(4));
    if (rank == 1) {
      EXPECT_TRUE(torch::allclose(loop.owned(1)->global()[0].second, start[0].second - 2.0))
          << loop.owned(1)->global()[0].second;
      EXPECT_EQ(upload.bytes().recv, payload + 2 * 8);
      EXPECT_TRUE(feedback.feedback().empty());  // the owner's own sum never travels
    } else {
      EXPECT_EQ(upload.bytes().sent, payload + 2 * 8);
      EXPECT_LT(payload, 4 * 4);
      EXPECT_TRUE(torch::equal(feedback.feedback().at(1), torch::zeros({4})));  // all sent, nothing left
    }
  });
}
