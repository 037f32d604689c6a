// Asynchronous DiLoCo's merger on an in-memory store: a merge closes at its quorum after the grace window and names
// the late replica; updates are weighted by tokens / max(1, rounds merged since their start); stale, malformed,
// non-finite and unknown-version updates are refused and change nothing; a silent merger's term is taken over from the
// last commit, momentum included; a merger that comes back after its successor committed loses its commit.
#include <gtest/gtest.h>

#include <map>
#include <thread>

#include "support/participants.h"
#include "tributary/comm/heartbeat.h"
#include "tributary/optim/async_merger.h"

using namespace tributary;

namespace {

NamedTensors model() { return {{"w", torch::zeros({2, 3})}, {"b", torch::zeros({3})}}; }
const std::vector<std::string> kNames = {"w", "b"};  // model()'s order

NamedTensors filled(float v) { return {{"w", torch::full({2, 3}, v)}, {"b", torch::full({3}, v)}}; }

void post(comm::Store& store, int replica, float value, int64_t base, int64_t tokens = 100) {
  UpdateBoard(store, "fp32", std::nullopt, replica).post(filled(value), base, tokens, -1);
}

MergeRules rules(int replicas) {
  return {.replicas = replicas,
          .min_quorum = 2,
          .grace_s = 0.3,
          .max_staleness = 4,
          .token_budget = 0,
          .round_tokens = 100,
          .outer = {.lr = 1, .momentum = 0},
          .dead_after_s = 5};
}

NamedTensors version(comm::Store& store, int64_t v) {
  UpdateBoard board(store, "fp32", std::nullopt, 0);
  return board.fetch_params(*board.commit_of(v), kNames);
}

float value_of(const NamedTensors& t, const std::string& name) {
  for (const auto& [n, x] : t)
    if (n == name) return x.flatten()[0].item<float>();
  return NAN;
}

}  // namespace

TEST(AsyncMerger, AMergeClosesAtItsQuorumAfterTheGraceWindowAndWeighsUpdatesOlderThanARoundLess) {
  auto store = comm::Store::in_memory();
  std::vector<nlohmann::json> merges;
  AsyncMerger merger(UpdateBoard(store, "fp32", std::nullopt, 2), store, 2, rules(3), model(),
                     [&](const nlohmann::json& m) { merges.push_back(m); });
  EXPECT_FALSE(merger.poll());  // takes term 0 (the last rank) and publishes version 1, the initial model
  ASSERT_TRUE(merger.merging());
  ASSERT_EQ(UpdateBoard(store, "fp32", std::nullopt, 0).latest(), 1);

  post(store, 0, 0.1f, 1);
  EXPECT_FALSE(merger.poll()) << "one update is short of the quorum of 2";
  post(store, 1, 0.3f, 1);
  EXPECT_FALSE(merger.poll()) << "the quorum is in, the grace window is not over";
  std::this_thread::sleep_for(std::chrono::milliseconds(350));
  ASSERT_TRUE(merger.poll());
  ASSERT_EQ(merges.size(), 1u);
  EXPECT_EQ(merges[0]["version"], 2);
  EXPECT_EQ(merges[0]["late"], nlohmann::json::array({2})) << "replica 2 posted nothing: late";
  EXPECT_NEAR(value_of(version(store, 2), "w"), -0.4f / 3, 1e-6)
      << "a fresh round's update counts 1 / replicas (outer lr 1), however many are in the merge";

  // Replica 2's round trained alongside the two just merged (from version 1, the merger at 2: two thirds of a round
  // of the run merged since): not discounted. Every live replica in: the merge closes at once. Half a round's tokens
  // count half.
  const auto weights = [&](size_t m, const char* field = "weight") {
    std::map<int, double> w;
    for (const auto& u : merges.at(m)["merged"]) w[u["replica"].get<int>()] = u[field].get<double>();
    return w;
  };
  post(store, 2, 0.3f, 1);
  post(store, 0, 0.6f, 2);
  post(store, 1, 0.6f, 2, 50);
  ASSERT_TRUE(merger.poll());
  ASSERT_EQ(merges.size(), 2u);
  auto weight = weights(1);
  EXPECT_NEAR(weight[2], 1.0 / 3, 1e-9) << merges[1].dump();  // 100 / (100 x 3), lag 200 / 300
  EXPECT_NEAR(weight[0], 1.0 / 3, 1e-9);
  EXPECT_NEAR(weight[1], 1.0 / 6, 1e-9);  // 50 / (100 x 3)
  EXPECT_NEAR(value_of(version(store, 3), "b"), -0.4f / 3 - (0.3f / 3 + 0.6f / 3 + 0.6f / 6), 1e-6);

  // An update that started before one and a half rounds of the run were merged (450 tokens since version 1, a
  // round of the run is 300) counts 1 / 1.5 of a fresh one.
  post(store, 2, 0.3f, 1);
  post(store, 0, 0.6f, 3);
  post(store, 1, 0.6f, 3);
  ASSERT_TRUE(merger.poll());
  ASSERT_EQ(merges.size(), 3u);
  weight = weights(2);
  EXPECT_NEAR(weight[2], 1.0 / 3 / 1.5, 1e-9) << merges[2].dump();
  EXPECT_NEAR(weights(2, "lag")[2], 1.5, 1e-9);
  EXPECT_NEAR(weight[0], 1.0 / 3, 1e-9);
}

TEST(AsyncMerger, StaleMalformedAndNonFiniteUpdatesAreRefusedAndChangeNothing) {
  auto store = comm::Store::in_memory();
  MergeRules r = rules(3);
  r.max_staleness = 0;
  r.min_quorum = 1;
  r.grace_s = 0;
  AsyncMerger merger(UpdateBoard(store, "fp32", std::nullopt, 2), store, 2, r, model());
  merger.poll();
  post(store, 0, 0.5f, 1);
  ASSERT_TRUE(merger.poll());  // version 2
  ASSERT_EQ(merger.stats().refused, 0);

  post(store, 1, 0.5f, 1);     // trained from version 1; max_staleness 0
  post(store, 0, 0.5f, 7);     // a version no merger published
  post(store, 0, 0.5f, 2, 0);  // no tokens
  UpdateBoard(store, "fp32", std::nullopt, 1)
      .post({{"w", torch::full({2, 3}, NAN)}, {"b", torch::zeros({3})}}, 2, 100, -1);
  UpdateBoard(store, "fp32", std::nullopt, 1).post({{"w", torch::zeros({3, 2})}, {"b", torch::zeros({3})}}, 2, 100, -1);
  UpdateBoard(store, "fp32", std::nullopt, 1).post({{"b", torch::zeros({3})}}, 2, 100, -1);
  // bytes that are no safetensors, and a post that claims another replica's name
  const int64_t n = store.add("async/up/0/count", 0);
  store.set("async/up/0/" + std::to_string(n), "not safetensors");
  store.add("async/up/0/count", 1);
  UpdateBoard(store, "fp32", std::nullopt, 1).post(filled(0.5f), 2, 100, -1);
  store.set("async/up/1/" + std::to_string(store.add("async/up/1/count", 0) - 1),
            tensors_to_safetensors(filled(0.5f), {{"base", "2"}, {"tokens", "100"}, {"replica", "0"}}));

  EXPECT_FALSE(merger.poll()) << "nothing valid arrived: no merge";
  EXPECT_EQ(merger.stats().refused, 8);
  EXPECT_FALSE(store.check({"async/up/1/1"}) || store.check({"async/up/0/3"})) << "refused posts are not kept";
  EXPECT_EQ(UpdateBoard(store, "fp32", std::nullopt, 0).latest(), 2);
  EXPECT_NEAR(value_of(version(store, 2), "w"), -0.5f / 3, 1e-6);
}

TEST(AsyncMerger, WhenTheMergerFallsSilentAnotherTakesOverFromTheLastCommitMomentumIncluded) {
  auto store = comm::Store::in_memory();
  MergeRules r = rules(3);
  r.min_quorum = 1;
  r.grace_s = 0;
  r.dead_after_s = 0.5;
  r.outer = {.lr = 0.7, .momentum = 0.9};
  OuterOptimizer reference(model(), r.outer);
  {
    AsyncMerger first(UpdateBoard(store, "fp32", std::nullopt, 2), store, 2, r, model());
    first.poll();
    post(store, 0, 0.5f, 1);
    ASSERT_TRUE(first.poll());
    reference.apply({torch::full({2, 3}, 0.5f / 3), torch::full({3}, 0.5f / 3)});  // a round's update: 1 / 3
    post(store, 1, 0.25f, 2);  // posted, never merged by the first merger: its successor merges it
  }  // the first merger's process dies: its heartbeat stops
  AsyncMerger second(UpdateBoard(store, "fp32", std::nullopt, 0), store, 0, r, model());
  const auto start = std::chrono::steady_clock::now();
  while (!second.poll() && std::chrono::steady_clock::now() - start < std::chrono::seconds(5))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(second.merging()) << "the term was not taken over";
  EXPECT_EQ(second.stats().takeovers, 1);
  reference.apply({torch::full({2, 3}, 0.25f / 3), torch::full({3}, 0.25f / 3)});
  const NamedTensors v3 = version(store, 3);
  EXPECT_NEAR(value_of(v3, "w"), value_of(reference.global(), "w"), 1e-6)
      << "the successor's Nesterov step continued the first merger's momentum";

  // A merger that was frozen comes back thinking version 3 is its to write: the commit is taken, its bytes never read.
  UpdateBoard late(store, "fp32", std::nullopt, 2);
  EXPECT_FALSE(late.publish(3, 2, filled(9), filled(9), filled(1), nlohmann::json::object()));
  EXPECT_NEAR(value_of(version(store, 3), "w"), value_of(reference.global(), "w"), 1e-6);
  EXPECT_FALSE(store.check({"async/g/3/2"})) << "the loser's blob is removed";
}

TEST(AsyncMerger, AReplicaThatAppliesTheVersionsInt8OrFp4StepsLandsOnTheMergersBits) {
  for (const std::string codec : {"int8", "fp4"}) {
    SCOPED_TRACE(codec);
    auto store = comm::Store::in_memory();
    MergeRules r = rules(2);
    r.min_quorum = 1;
    r.grace_s = 0;
    r.outer = {.lr = 0.7, .momentum = 0.9};
    AsyncMerger merger(UpdateBoard(store, codec, std::nullopt, 1), store, 1, r, model());
    merger.poll();
    UpdateBoard replica(store, codec, std::nullopt, 0);
    NamedTensors mine = model();  // version 1, as every replica initialises it
    for (int64_t v = 2; v <= 4; ++v) {
      replica.post({{"w", torch::randn({2, 3})}, {"b", torch::randn({3})}}, v - 1, 100, -1);
      ASSERT_TRUE(merger.poll());
      const NamedTensors step = replica.fetch_step(*replica.commit_of(v), kNames);
      ASSERT_EQ(step.size(), 2u);
      for (auto& [name, t] : mine)
        for (const auto& [n, s] : step)
          if (n == name) t = t - s;
      const NamedTensors whole = replica.fetch_params(*replica.commit_of(v), kNames);
      for (const auto& [name, t] : whole)
        for (const auto& [n, x] : mine)
          if (n == name) {
            EXPECT_TRUE(torch::equal(t, x)) << "version " << v << ", " << name;
          }
    }
    if (codec != "fp4") continue;
    // fp4 posts whose shape asks for more values than their bytes hold, or a negative dimension: refused by the
    // merger, never decoded past their end.
    const auto bad_post = [&](torch::Tensor shape) {
      const int64_t n = store.add("async/up/0/count", 0);
      store.set("async/up/0/" + std::to_string(n),
                tensors_to_safetensors({{"w", torch::zeros({7}, torch::kUInt8)},
                                        {"w.shape", shape},
                                        {"b", torch::zeros({6}, torch::kUInt8)},
                                        {"b.shape", torch::tensor({int64_t{3}})}},
                                       {{"base", "4"}, {"tokens", "100"}, {"replica", "0"}}));
      store.add("async/up/0/count", 1);
    };
    bad_post(torch::tensor({int64_t{200}, int64_t{3}}));
    bad_post(torch::tensor({int64_t{-2}, int64_t{3}}));
    EXPECT_FALSE(merger.poll());
    EXPECT_EQ(merger.stats().refused, 2);
  }
}

TEST(AsyncMerger, ARobustRuleRefusesTheOutlierAndMovesTheModelAsFarAsTheAcceptedUpdatesWould) {
  // dist.aggregate = median with the norm test: of three fresh posts one is x100; it is refused by name and the merge
  // applies the median of the other two (0.2) times their summed weight (2 x 1/3).
  auto store = comm::Store::in_memory();
  MergeRules r = rules(3);
  r.aggregate = {.rule = "median", .norm_factor = 10};
  AsyncMerger merger(UpdateBoard(store, "fp32", std::nullopt, 2), store, 2, r, model());
  merger.poll();
  post(store, 0, 0.1f, 1);
  post(store, 1, 0.3f, 1);
  post(store, 2, 30.0f, 1);
  ASSERT_TRUE(merger.poll());
  EXPECT_EQ(merger.stats().refused, 1);
  EXPECT_NEAR(value_of(version(store, 2), "w"), -0.2f * 2 / 3, 1e-6);
  EXPECT_FALSE(store.check({"async/up/2/0"})) << "the refused post is not kept";
}

TEST(AsyncMerger, WithIdentitiesAPostOrACommitInAnothersNameChangesNothing) {
  // Replicas 0..2 sign what they write; participant 3 holds the run's secret and an identity of its own. It posts an
  // update in replica 1's name and commits version 3 in the merger's name before the merger does: the post is
  // refused naming replica 1, and the merger's own version 3 is agreed in the commit's next slot.
  auto store = comm::Store::in_memory();
  const test_support::Participants p(4);
  MergeRules r = rules(3);
  r.min_quorum = 1;
  r.grace_s = 0;
  AsyncMerger merger(UpdateBoard(store, "fp32", std::nullopt, 2, p.signer(2)), store, 2, r, model());
  merger.poll();  // term 0, version 1
  UpdateBoard(store, "fp32", std::nullopt, 0, p.signer(0)).post(filled(0.3f), 1, 100, 2);
  UpdateBoard(store, "fp32", std::nullopt, 1, p.as(3, 1)).post(filled(9.0f), 1, 100, 2);
  ASSERT_TRUE(merger.poll());
  EXPECT_EQ(merger.stats().refused, 1) << "the post in replica 1's name";
  UpdateBoard reader(store, "fp32", std::nullopt, 0, p.signer(0));
  const auto v2 = reader.commit_of(2);
  ASSERT_TRUE(v2);
  EXPECT_NEAR(value_of(reader.fetch_params(*v2, kNames), "w"), -0.3f / 3, 1e-6) << "only replica 0's update";

  const std::string key = "async/commit/3";
  store.set_once(key, p.as(3, 2)->sign(key, R"({"merger": 2, "term": 0, "tokens": 0, "consumed": {}, "merged": [],
                                              "late": [], "done": true})"));
  EXPECT_FALSE(reader.commit_of(3)) << "a commit in the merger's name that it did not sign";
  UpdateBoard(store, "fp32", std::nullopt, 0, p.signer(0)).post(filled(0.3f), 2, 100, 2);
  ASSERT_TRUE(merger.poll());
  const auto v3 = reader.commit_of(3);
  ASSERT_TRUE(v3);
  EXPECT_FALSE(v3->meta.value("done", false));
  EXPECT_TRUE(store.check({key + "/1"})) << "agreed in the next slot";
  EXPECT_NEAR(value_of(reader.fetch_params(*v3, kNames), "w"), -0.6f / 3, 1e-6);
}

namespace {

// A model whose loss is linear: applying `step` x u lowers it by step x (sum of u's "w" + 10 x sum of its "b"), in
// the merge's flat order (w's 6 values, then b's 3).
class LinearProbe : public UpdateProbe {
 public:
  bool applies(int64_t numel) const override { return numel == 9; }
  std::vector<double> losses(const std::vector<const torch::Tensor*>& updates, double step, uint64_t) override {
    ++calls;
    std::vector<double> out;
    for (const torch::Tensor* u : updates)
      out.push_back(u ? -step * (u->slice(0, 0, 6).sum().item<double>() + 10 * u->slice(0, 6, 9).sum().item<double>())
                      : 0.0);
    return out;
  }
  int calls = 0;
};

}  // namespace

TEST(AsyncMerger, WithLossScoresTheMergerRatesEachUpdateByTheLossItBringsAndEvictsALiar) {
  // Replica 2's updates agree with the others' in direction (cosine ~0.49, above min_score) but raise the probe's
  // loss: its rating sinks by a quarter of the way to its target each merge, below 0.2 at the third, where it is
  // refused and evicted. Without the probe, its cosine alone never strikes it.
  auto store = comm::Store::in_memory();
  MergeRules r = rules(3);
  r.min_quorum = 3;
  r.grace_s = 0;
  r.aggregate = {.rule = "median", .evict_after = 1, .min_score = 0.2, .loss_scores = true};
  AsyncMerger merger(UpdateBoard(store, "fp32", std::nullopt, 2), store, 2, r, model());
  auto probe = std::make_unique<LinearProbe>();
  LinearProbe* seen = probe.get();
  merger.set_probe(std::move(probe), 1234);
  merger.poll();                      // version 1
  for (int64_t v = 1; v <= 4; ++v) {  // values that differ by replica and merge: no replay, no copy
    const float x = 0.3f + 0.01f * float(v);
    post(store, 0, x, v);
    post(store, 1, x + 0.001f, v);
    const NamedTensors liar = {{"w", torch::full({2, 3}, x + 0.002f)},
                               {"b", torch::full({3}, -0.2f - 0.01f * float(v))}};
    UpdateBoard(store, "fp32", std::nullopt, 2).post(liar, v, 100, -1);
    ASSERT_TRUE(merger.poll()) << "merge " << v;
  }
  EXPECT_EQ(seen->calls, 4) << "one probe pass per merge";
  EXPECT_EQ(merger.stats().refused, 2) << "merges 3 and 4 refuse replica 2";
  UpdateBoard reader(store, "fp32", std::nullopt, 0);
  EXPECT_EQ(reader.commit_of(5)->meta["merged"].size(), 2u) << reader.commit_of(5)->meta.dump();
}
