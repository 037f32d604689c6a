// Beyond the paper: the cost model's compute term (CostModel::set_compute) and the device speeds it needs.
#include <gtest/gtest.h>

#include <algorithm>

#include "support/error_of.h"
#include "tributary/sched/cost_model.h"
#include "tributary/sched/genetic.h"

using namespace tributary::sched;
using tributary::test_support::error_of;

namespace {

// n devices, every pair the same link: communication cannot tell placements apart, only compute can.
Cluster uniform_cluster(const std::vector<double>& tflops) {
  const int n = static_cast<int>(tflops.size());
  Cluster c;
  c.name = "uniform";
  for (double t : tflops) c.devices.push_back(Device{.region = "", .tflops = t, .memory_gb = 0});
  c.latency_ms = Matrix(n, 10);
  c.bandwidth_gbps = Matrix(n, 1);
  return c;
}

}  // namespace

TEST(ComputeCost, FillAndDrainOverUnevenStages) {
  CostModel model(uniform_cluster({1, 1, 1, 1, 1, 1}), 0.1, 0.1, 2, 3);
  EXPECT_FALSE(model.has_compute());
  EXPECT_EQ(model.compute_cost({{0, 1, 2}, {3, 4, 5}}), 0.0);
  // Pipeline 0: 1 + 2 + 3 s; pipeline 1: 1 + 1 + 5 s.
  model.set_compute({1, 2, 3, 1, 1, 5}, 1);
  EXPECT_DOUBLE_EQ(model.compute_cost({{0, 1, 2}, {3, 4, 5}}), 7.0);  // m = 1: one stage after another, the slower
  model.set_compute({1, 2, 3, 1, 1, 5}, 4);
  // m = 4: (sum + 3 x slowest) / 4 = (6 + 9) / 4 = 3.75 and (7 + 15) / 4 = 5.5.
  EXPECT_DOUBLE_EQ(model.compute_cost({{0, 1, 2}, {3, 4, 5}}), 5.5);
  const Evaluation e = model.evaluate_pipelines({{0, 1, 2}, {3, 4, 5}});
  EXPECT_DOUBLE_EQ(e.compute, 5.5);
  EXPECT_DOUBLE_EQ(e.total, e.dp + 2 * e.pp + 5.5);
}

TEST(ComputeCost, ThePlanSpreadsSlowDevicesOverThePipelines) {
  // Devices 0 and 2 are 3x slower and have the best link between them (as have 1 and 3): the paper's cost chains them
  // into one pipeline, (0, 2) and (1, 3); knowing the speeds, the plan pays a slower link to split them.
  Cluster cluster = uniform_cluster({1, 3, 1, 3});
  cluster.latency_ms = Matrix(4, 0);
  cluster.bandwidth_gbps(0, 2) = cluster.bandwidth_gbps(2, 0) = 10;
  cluster.bandwidth_gbps(1, 3) = cluster.bandwidth_gbps(3, 1) = 10;
  GeneticOptions o;
  o.islands = 1;
  const CostModel paper(cluster, 0.01, 0.01, 2, 2);
  const ScheduleResult comm_only = schedule_genetic(paper, o);
  CostModel model(cluster, 0.01, 0.01, 2, 2);
  model.set_compute({1.0, 1.0 / 3, 1.0, 1.0 / 3}, 1);
  auto slow_together = [](const Evaluation& e) {
    for (const auto& pipeline : e.pipelines)
      if (std::count(pipeline.begin(), pipeline.end(), 0) + std::count(pipeline.begin(), pipeline.end(), 2) == 2)
        return true;
    return false;
  };
  EXPECT_TRUE(slow_together(comm_only.evaluation));
  EXPECT_DOUBLE_EQ(model.compute_cost(comm_only.evaluation.pipelines), 2.0);
  const ScheduleResult plan = schedule_genetic(model, o);
  EXPECT_FALSE(slow_together(plan.evaluation));
  EXPECT_DOUBLE_EQ(plan.evaluation.compute, 1.0 + 1.0 / 3);                            // one slow device per pipeline
  EXPECT_GT(plan.evaluation.dp + 2 * plan.evaluation.pp, comm_only.evaluation.total);  // it paid in communication
  EXPECT_LT(plan.evaluation.total, model.evaluate(comm_only.partition).total);
}

TEST(ComputeCost, TaskletSecondsFromTheDevicesSpeeds) {
  Workload w;
  w.num_layers = 2;
  w.width = 64;
  w.seq_len = 64;
  w.global_batch = 8;
  const auto t = tasklet_seconds(uniform_cluster({1, 3, 1, 3}), w, 2, 2);
  ASSERT_EQ(t.size(), 4u);
  EXPECT_DOUBLE_EQ(t[0], w.tasklet_flops(2, 2) / 1e12);
  EXPECT_DOUBLE_EQ(t[1], t[0] / 3);
}

TEST(ComputeCost, ADeviceWithoutASpeedIsNamed) {
  Cluster cluster = uniform_cluster({1, 0, 1, 1});
  cluster.devices[1].region = "Tokyo";
  Workload w;
  w.num_layers = 2;
  w.width = 64;
  w.seq_len = 64;
  w.global_batch = 8;
  const std::string msg = error_of([&] { tasklet_seconds(cluster, w, 2, 2); });
  EXPECT_NE(msg.find("device 1 (Tokyo) has no 'tflops'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--calibrate"), std::string::npos) << msg;
  CostModel model(cluster, 0.1, 0.1, 2, 2);
  EXPECT_NE(error_of([&] { model.set_compute({1, 1, 1}, 1); }).find("3 tasklet times for a cluster of 4"),
            std::string::npos);
  EXPECT_NE(error_of([&] { model.set_compute({1, 1, 1, 1}, 0); }).find("micro_batches = 0"), std::string::npos);
}

TEST(ComputeCost, WorkloadMicroBatches) {
  const std::string base = R"({"num_layers": 2, "width": 64, "seq_len": 64, "global_batch": 8)";
  EXPECT_EQ(parse_workload(base + "}", "w.json").micro_batches, 1);
  EXPECT_EQ(parse_workload(base + R"(, "micro_batches": 4})", "w.json").micro_batches, 4);
  EXPECT_NE(error_of([&] { parse_workload(base + R"(, "micro_batches": 0})", "w.json"); }).find("micro_batches"),
            std::string::npos);
  EXPECT_NE(error_of([&] { parse_workload(base + R"(, "micro_batches": 1.5})", "w.json"); }).find("whole number"),
            std::string::npos);
}
