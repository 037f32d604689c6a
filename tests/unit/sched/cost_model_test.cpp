#include <gtest/gtest.h>

#include "support/error_of.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

#include "test_paths.h"  // generated: TRIBUTARY_CLI, TRIBUTARY_SOURCE_DIR, ...
#include "tributary/core/error.h"
#include "tributary/core/fs.h"
#include "tributary/core/rng.h"
#include "tributary/plan/plan_workload.h"
#include "tributary/sched/cost_model.h"
#include "tributary/sched/genetic.h"
#include "tributary/sched/placement.h"

using namespace tributary;
using namespace tributary::sched;

namespace {

Cluster random_cluster(int n, uint64_t seed) {
  SplitMix64 rng(seed);
  Cluster c;
  c.name = "random";
  c.devices.resize(static_cast<size_t>(n));
  c.latency_ms = Matrix(n);
  c.bandwidth_gbps = Matrix(n);
  for (int a = 0; a < n; ++a)
    for (int b = a + 1; b < n; ++b) {
      c.latency_ms(a, b) = c.latency_ms(b, a) = double(rng.below(200));
      c.bandwidth_gbps(a, b) = c.bandwidth_gbps(b, a) = 0.1 + double(rng.below(1000)) / 100.0;
    }
  return c;
}

using test_support::error_of;

// Every balanced partition of n devices into m groups (canonical: group order by smallest member).
void all_partitions(int n, int m, int size, std::vector<int>& label, int d, std::vector<int>& count, int used,
                    const std::function<void(const Partition&)>& visit) {
  if (d == n) {
    Partition p(static_cast<size_t>(m));
    for (int i = 0; i < n; ++i) p[label[i]].push_back(i);
    visit(p);
    return;
  }
  for (int g = 0; g < std::min(m, used + 1); ++g) {
    if (count[g] == size) continue;
    label[d] = g;
    count[g]++;
    all_partitions(n, m, size, label, d + 1, count, std::max(used, g + 1), visit);
    count[g]--;
  }
}

double brute_force_optimum(const CostModel& model) {
  const int n = model.num_devices();
  std::vector<int> label(static_cast<size_t>(n)), count(static_cast<size_t>(model.d_pp()), 0);
  double best = std::numeric_limits<double>::infinity();
  all_partitions(n, model.d_pp(), model.d_dp(), label, 0, count, 0,
                 [&](const Partition& p) { best = std::min(best, model.cost(p)); });
  return best;
}

}  // namespace

TEST(CostModel, TermsMatchHandComputedValues) {
  // 4 devices, groups {0,1} and {2,3}. latency 10 ms everywhere, bandwidth 1 Gbit/s except 0-1 at 4 and 2-3 at 2.
  Cluster c = random_cluster(4, 1);
  for (int a = 0; a < 4; ++a)
    for (int b = 0; b < 4; ++b) {
      c.latency_ms(a, b) = 10;
      c.bandwidth_gbps(a, b) = 1;
    }
  c.bandwidth_gbps(0, 1) = c.bandwidth_gbps(1, 0) = 4;
  c.bandwidth_gbps(2, 3) = c.bandwidth_gbps(3, 2) = 2;
  c.bandwidth_gbps(0, 3) = c.bandwidth_gbps(3, 0) = 0.5;  // the matching must avoid 0-3
  CostModel m(c, /*c_dp=*/1.0, /*c_pp=*/0.5, /*d_dp=*/2, /*d_pp=*/2);
  // DP({0,1}) = 2 * (0.01 + 1*8 / (2*4)) = 2.02; DP({2,3}) = 2 * (0.01 + 8 / (2*2)) = 4.02
  EXPECT_NEAR(m.dp_cost({0, 1}), 2.02, 1e-12);
  EXPECT_NEAR(m.dp_cost({2, 3}), 4.02, 1e-12);
  // Matching {0,1} -> {2,3}: pairs 0-2 & 1-3 cost max(0.01+4, 0.01+4) = 4.01; 0-3 & 1-2 cost 0.01+8 = 8.01.
  std::vector<int> match;
  EXPECT_NEAR(m.bottleneck_matching({0, 1}, {2, 3}, &match), 4.01, 1e-12);
  EXPECT_EQ(match, (std::vector<int>{0, 1}));
  // Total = max DP + 2 * PP (one hop) = 4.02 + 2 * 4.01
  EXPECT_NEAR(m.cost({{0, 1}, {2, 3}}), 4.02 + 8.02, 1e-12);
  Evaluation e = m.evaluate({{0, 1}, {2, 3}});
  EXPECT_NEAR(e.total, 12.04, 1e-12);
  ASSERT_EQ(e.pipelines.size(), 2u);
}

TEST(CostModel, BottleneckMatchingEqualsBruteForce) {
  for (uint64_t seed = 0; seed < 30; ++seed) {
    Cluster c = random_cluster(10, seed);
    CostModel m(c, 0.5, 0.3, 5, 2);
    std::vector<int> a = {0, 2, 4, 6, 8}, b = {1, 3, 5, 7, 9};
    std::vector<int> perm = {0, 1, 2, 3, 4};
    double best = std::numeric_limits<double>::infinity();
    do {
      double worst = 0;
      for (int i = 0; i < 5; ++i) worst = std::max(worst, m.w_pp(a[i], b[perm[i]]));
      best = std::min(best, worst);
    } while (std::next_permutation(perm.begin(), perm.end()));
    std::vector<int> match;
    double got = m.bottleneck_matching(a, b, &match);
    EXPECT_DOUBLE_EQ(got, best) << "seed " << seed;
    double worst = 0;
    for (int i = 0; i < 5; ++i) worst = std::max(worst, m.w_pp(a[i], b[match[i]]));
    EXPECT_DOUBLE_EQ(worst, got) << "the returned matching achieves the bottleneck";
  }
}

TEST(CostModel, OpenTspEqualsBruteForce) {
  for (uint64_t seed = 0; seed < 20; ++seed) {
    SplitMix64 rng(seed);
    const int k = 7;
    Matrix e(k);
    for (int i = 0; i < k; ++i)
      for (int j = i + 1; j < k; ++j) e(i, j) = e(j, i) = double(rng.below(1000));
    std::vector<int> perm(k);
    std::iota(perm.begin(), perm.end(), 0);
    double best = std::numeric_limits<double>::infinity();
    do {
      double c = 0;
      for (int i = 0; i + 1 < k; ++i) c += e(perm[i], perm[i + 1]);
      best = std::min(best, c);
    } while (std::next_permutation(perm.begin(), perm.end()));
    std::vector<int> order;
    EXPECT_DOUBLE_EQ(CostModel::open_tsp(e, &order), best) << "seed " << seed;
    double c = 0;
    for (int i = 0; i + 1 < k; ++i) c += e(order[i], order[i + 1]);
    EXPECT_DOUBLE_EQ(c, best);
  }
}

TEST(CostModel, MegatronOrderMatchesThePaperNumbers) {
  Workload w = load_workload("gpt3-xl");
  const std::pair<const char*, double> cases[] = {
      {"case5-worldwide", 75.29}, {"case4-regional", 39.98}, {"case3-multiple-datacenters", 17.65}};
  for (auto [name, expected] : cases) {
    CostModel m(preset(name), w.c_dp_gb, w.c_pp_gb, 8, 8);
    EXPECT_NEAR(m.evaluate_megatron().total, expected, 0.01) << name;
  }
}

TEST(Scheduler, FindsTheOptimumOfSmallClusters) {
  // 2 regions x 4 devices, fast inside, slow between: every layout's optimum found by brute force.
  Cluster c = random_cluster(8, 7);
  for (int a = 0; a < 8; ++a)
    for (int b = 0; b < 8; ++b) {
      bool same = (a < 4) == (b < 4);
      c.latency_ms(a, b) = same ? 1 : 80;
      c.bandwidth_gbps(a, b) = same ? 10 : 0.5;
    }
  for (auto [dp, pp] : {std::pair{4, 2}, std::pair{2, 4}}) {
    CostModel m(c, 0.65, 0.47, dp, pp);
    auto r = schedule_genetic(m, {.seed = 3, .population = 20, .offspring = 30});
    EXPECT_NEAR(r.evaluation.total, brute_force_optimum(m), 1e-9) << dp << "x" << pp;
  }
  // and on random heterogeneous 8-device clusters
  for (uint64_t seed = 0; seed < 5; ++seed) {
    CostModel m(random_cluster(8, 100 + seed), 0.65, 0.47, 2, 4);
    auto r = schedule_genetic(m, {.seed = seed, .population = 20, .offspring = 40});
    EXPECT_NEAR(r.evaluation.total, brute_force_optimum(m), 1e-9) << "seed " << seed;
    // Pricing the plan's own pipelines as a fixed placement (plan --price) gives the plan's cost back.
    EXPECT_NEAR(m.evaluate_pipelines(r.evaluation.pipelines).total, r.evaluation.total, 1e-9) << "seed " << seed;
    // and any other placement of the same groups costs at least the optimum
    auto swapped = r.evaluation.pipelines;
    std::swap(swapped[0][1], swapped[1][1]);
    EXPECT_GE(m.evaluate_pipelines(swapped).total, r.evaluation.total - 1e-9);
  }
}

// DiLoCo per stage (workload sync_every = H): an iteration pays 1/H of the replicas' exchange, so the plan turns
// around. 2 regions x 4 devices, D_DP 2 x D_PP 4, a heavy exchange and light activations: data parallel keeps each
// stage's replicas in one region (the pipelines cross between regions once); with H = 100 each pipeline stays in one
// region and the replicas cross.
TEST(Scheduler, ADiLoCoWorkloadKeepsEachPipelineInOneRegion) {
  Cluster c = random_cluster(8, 7);
  for (int a = 0; a < 8; ++a)
    for (int b = 0; b < 8; ++b) {
      const bool same = (a < 4) == (b < 4);
      c.latency_ms(a, b) = same ? 1 : 80;
      c.bandwidth_gbps(a, b) = same ? 10 : 0.5;
    }
  Workload w = parse_workload(R"({"c_dp_gb": 2.0, "c_pp_gb": 0.1})", "w.json");
  const auto region = [](int device) { return device < 4; };
  for (int64_t h : {1, 100}) {
    w.sync_every = h;
    CostModel m(c, w.c_dp(2, 4), w.c_pp(2, 4), 2, 4, w.sync_every);
    EXPECT_DOUBLE_EQ(m.w_dp(0, 5), (0.080 + 2.0 * 8 / (2 * 0.5)) / double(h)) << "latency and bytes, both / H";
    auto r = schedule_genetic(m, {.seed = 3, .population = 20, .offspring = 30});
    EXPECT_NEAR(r.evaluation.total, brute_force_optimum(m), 1e-9) << "H = " << h;
    int pipelines_in_one_region = 0, replicas_in_one_region = 0;
    for (const auto& pipe : r.evaluation.pipelines)
      pipelines_in_one_region +=
          std::all_of(pipe.begin(), pipe.end(), [&](int d) { return region(d) == region(pipe[0]); });
    for (int s = 0; s < 4; ++s)
      replicas_in_one_region += region(r.evaluation.pipelines[0][s]) == region(r.evaluation.pipelines[1][s]);
    if (h == 1)
      EXPECT_EQ(replicas_in_one_region, 4) << "data parallel: each stage's replicas share a region";
    else
      EXPECT_EQ(pipelines_in_one_region, 2) << "DiLoCo, H = 100: each pipeline in one region";
  }
  EXPECT_NE(error_of([] {
              parse_workload(R"({"c_dp_gb": 2, "c_pp_gb": 1, "sync_every": 0})", "w.json");
            }).find("w.json: workload field 'sync_every' must be at least 1"),
            std::string::npos);
}

TEST(Scheduler, SameSeedSamePlan) {
  Workload w = load_workload("gpt3-xl");
  Cluster c = shuffle_ids(preset("case4-regional"), 11);
  CostModel m(c, w.c_dp_gb, w.c_pp_gb, 8, 8);
  // A generous budget: the test is about reproducibility, which only holds when the budget does not cut the run.
  GeneticOptions o{.seed = 5, .population = 30, .offspring = 6, .time_budget_s = 120};
  auto a = schedule_genetic(m, o), b = schedule_genetic(m, o);
  EXPECT_EQ(a.partition, b.partition);
  EXPECT_EQ(a.evaluation.total, b.evaluation.total);
  EXPECT_FALSE(a.budget_hit);
}

TEST(Scheduler, BeatsThePublicGaOnShuffledWorldWide) {
  Workload w = load_workload("gpt3-xl");
  Cluster c = shuffle_ids(preset("case5-worldwide"), 1);
  CostModel m(c, w.c_dp_gb, w.c_pp_gb, 8, 8);
  auto r = schedule_genetic(m, {.seed = 1, .time_budget_s = 120});  // CI may run other tests beside it
  EXPECT_FALSE(r.budget_hit);
  EXPECT_LE(r.evaluation.total, 49.22 + 0.005);
  EXPECT_GT(m.evaluate_megatron().total, 2.5 * r.evaluation.total) << "shuffled ids make rank order bad";
}

TEST(ClusterFile, LoadsRegionsAndMatricesAndRejectsBadFiles) {
  Cluster r = parse_cluster(R"({"regions": [{"name": "a", "devices": 2, "tflops": 10}, {"name": "b", "devices": 1}],
                               "latency_ms": [[1, 20], [20, 2]], "bandwidth_gbps": [[10, 1], [1, 5]]})",
                            "r.json");
  ASSERT_EQ(r.size(), 3);
  EXPECT_EQ(r.latency_ms(0, 1), 1);
  EXPECT_EQ(r.latency_ms(1, 2), 20);
  EXPECT_EQ(r.bandwidth_gbps(2, 0), 1);
  EXPECT_EQ(r.devices[2].region, "b");

  auto msg = error_of(
      [] { parse_cluster(R"({"latency_ms": [[0, 1], [1]], "bandwidth_gbps": [[1, 1], [1, 1]]})", "bad.json"); });
  EXPECT_NE(msg.find("bad.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("latency_ms"), std::string::npos) << msg;
  msg = error_of(
      [] { parse_cluster(R"({"latency_ms": [[0, 1], [1, 0]], "bandwidth_gbps": [[1, 0], [0, 1]]})", "z.json"); });
  EXPECT_NE(msg.find("bandwidth_gbps"), std::string::npos) << msg;
  EXPECT_NE(msg.find("> 0"), std::string::npos) << msg;
  msg = error_of(
      [] { parse_cluster(R"({"latency_ms": [[0, -1], [1, 0]], "bandwidth_gbps": [[1, 1], [1, 1]]})", "n.json"); });
  EXPECT_NE(msg.find("latency_ms"), std::string::npos) << msg;
  msg = error_of([] { check_layout(preset("case3-multiple-datacenters"), 8, 7); });
  EXPECT_NE(msg.find("d_dp x d_pp"), std::string::npos) << msg;
  msg = error_of([] { parse_workload(R"({"widht": 3})", "w.json"); });
  EXPECT_NE(msg.find("widht"), std::string::npos) << msg;
}

TEST(ClusterFile, ShuffleIsAPermutation) {
  Cluster c = preset("case5-worldwide");
  std::vector<int> original;
  Cluster s = shuffle_ids(c, 42, &original);
  for (int a = 0; a < c.size(); ++a)
    for (int b = 0; b < c.size(); ++b) ASSERT_EQ(s.latency_ms(a, b), c.latency_ms(original[a], original[b]));
  std::vector<int> sorted = original;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < c.size(); ++i) EXPECT_EQ(sorted[i], i);
}

TEST(ClusterFile, PresetsEqualTheSharedReferenceMatrices) {
  fs::path dir = fs::path(TRIBUTARY_SOURCE_DIR) / ".." / "shared" / "reference" / "networks";
  if (!fs::exists(dir)) GTEST_SKIP() << "no " << dir << " beside the checkout";
  for (const auto& name : preset_names()) {
    Cluster file = load_cluster((dir / (name + ".json")).string());
    Cluster built = preset(name);
    ASSERT_EQ(file.size(), built.size()) << name;
    for (int a = 0; a < file.size(); ++a)
      for (int b = 0; b < file.size(); ++b) {
        if (a == b) continue;  // the diagonal is not used by the cost model
        ASSERT_DOUBLE_EQ(file.latency_ms(a, b), built.latency_ms(a, b)) << name << " " << a << "," << b;
        ASSERT_DOUBLE_EQ(file.bandwidth_gbps(a, b), built.bandwidth_gbps(a, b)) << name << " " << a << "," << b;
      }
  }
}

TEST(Placement, ReadBackAndBadFilesNamed) {
  const auto dir = fs::temp_directory_path() / "trib_placement_test";
  fs::create_directories(dir);
  const auto file = (dir / "p.json").string();
  write_file(file, R"({"d_dp": 2, "d_pp": 2, "pipelines": [[3, 1], [0, 2]]})", false);
  const auto p = sched::read_placement(file);
  EXPECT_EQ(p.pipelines[1][0], 0);
  EXPECT_EQ(p.cluster_device, (std::vector<int>{0, 1, 2, 3})) << "no ranks list: rank r is device r";
  // A plan made on shuffled ids says which device of the file as given each rank emulates.
  write_file(file, R"({"d_dp": 1, "d_pp": 2, "pipelines": [[1, 0]], "ranks": [{"rank": 0, "cluster_device": 5},
                       {"rank": 1, "cluster_device": 2}]})",
             false);
  EXPECT_EQ(sched::read_placement(file).cluster_device, (std::vector<int>{5, 2}));
  for (const char* bad :
       {R"({"d_dp": 2, "d_pp": 2, "pipelines": [[3, 1], [0, 1]]})", R"({"d_dp": 2, "d_pp": 2, "pipelines": [[3, 1]]})",
        R"({"d_dp": 2, "d_pp": 2})", R"({"d_dp": "2", "d_pp": 2, "pipelines": []})",
        R"({"d_dp": 2, "d_pp": 2, "pipelines": [[4, 1], [0, 2]]})",
        R"({"d_dp": 1, "d_pp": 1, "pipelines": [[0]], "ranks": [{"rank": 3, "cluster_device": 0}]})", "{"}) {
    write_file(file, bad, false);
    try {
      sched::read_placement(file);
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
    }
  }
  fs::remove_all(dir);
}

// plan --config: the workload is the training run's. 8 devices, 4 stages of an 8-block model, DiLoCo every 10 steps
// with int8 pseudo-gradients and int8 activations; data parallel sends fp32 every step; what cannot be priced is named.
TEST(Placement, TheWorkloadOfATrainingConfigIsTheRunsOwn) {
  const std::vector<std::string> base = {
      "model.vocab_size=257",       "model.num_layers=8",        "model.width=128",
      "model.num_heads=4",          "model.context=64",          "train.batch_size=8",
      "parallel.pipeline_stages=4", "model.tie_embeddings=false"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), base.begin(), base.end());
    return workload_of(RunConfig::load("", more), 8, "cfg.toml");
  };
  Workload w = with({"dist.algorithm=diloco", "dist.inner_steps=10", "dist.compression=int8",
                     "parallel.activation_compression=int8"});
  EXPECT_EQ(w.d_pp, 4);
  EXPECT_EQ(w.d_dp, 2);
  EXPECT_EQ(w.sync_every, 10);
  EXPECT_EQ(w.bytes_per_parameter, 1.0);
  EXPECT_EQ(w.bytes_per_activation, 1.0);
  EXPECT_EQ(w.global_batch, 16.0) << "8 sequences per pipeline, 2 pipelines";
  // 257 x 128 x 2 (untied embeddings) + 8 blocks x 213,248 + the final norm's 128 (model_test checks the formula)
  EXPECT_EQ(w.num_parameters, 1771904.0);
  EXPECT_DOUBLE_EQ(w.c_pp(2, 4), 64.0 * 128 * 1 * 8 / 1e9);
  Workload ddp = with({"dist.algorithm=ddp", "dist.inner_steps=10"});
  EXPECT_EQ(ddp.sync_every, 1);
  EXPECT_EQ(ddp.bytes_per_parameter, 4.0) << "data parallel all-reduces fp32 gradients";
  EXPECT_NE(error_of([&] { with({"dist.compression=topk"}); }).find("dist.compression = topk"), std::string::npos);
  EXPECT_NE(error_of([&] {
              workload_of(RunConfig::load("", base), 6, "cfg.toml");
            }).find("parallel.pipeline_stages = 4 does not divide the cluster's 6 devices"),
            std::string::npos);
}
