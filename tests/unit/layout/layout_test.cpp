// The run's layout (parallel/layout.h) without processes: every kind of run, Megatron's rank order, a placement's,
// the groups a rank belongs to, and the shapes that cannot run. Built into core_tests: the layout is torch-free.
#include <gtest/gtest.h>

#include <unistd.h>

#include "support/error_of.h"
#include "tributary/config/run_config.h"
#include "tributary/config/run_layout.h"
#include "tributary/core/fs.h"
#include "tributary/parallel/layout.h"

using namespace tributary;
using tributary::test_support::error_of;

namespace {

LayoutSpec spec(int rank, int world, int64_t stages = 1, bool diloco = true) {
  return LayoutSpec{.rank = rank, .world_size = world, .pipeline_stages = stages, .diloco = diloco};
}

}  // namespace

TEST(Layout, OneProcessIsASingleRunWithNothingToSync) {
  const Layout l = Layout::resolve(spec(0, 1));
  EXPECT_EQ(l.kind(), RunKind::kSingle);
  EXPECT_EQ(l.sync(), SyncKind::kNone);
  EXPECT_EQ(l.name(), "single");
  auto local = spec(0, 1);
  local.local_chunks = 2;
  EXPECT_EQ(Layout::resolve(local).name(), "local");
}

TEST(Layout, ReplicasOfTheWholeModelSyncByTheAlgorithm) {
  const Layout diloco = Layout::resolve(spec(2, 4));
  EXPECT_EQ(diloco.kind(), RunKind::kReplicas);
  EXPECT_EQ(diloco.sync(), SyncKind::kDiloco);
  EXPECT_EQ(diloco.replicas(), 4);
  EXPECT_EQ(diloco.replica(), 2);
  EXPECT_EQ(diloco.name(), "diloco");
  const Layout ddp = Layout::resolve(spec(1, 2, 1, /*diloco=*/false));
  EXPECT_EQ(ddp.sync(), SyncKind::kDataParallel);
  EXPECT_EQ(ddp.name(), "ddp");
  EXPECT_EQ(ddp.warmup_ddp_steps(), 0);
}

TEST(Layout, PipelinesFollowMegatronsOrder) {
  // 3 pipelines x 2 stages: stage j's replicas are ranks 3j..3j+2; pipeline i is ranks i, i + 3.
  const Layout l = Layout::resolve(spec(4, 6, 2));
  EXPECT_EQ(l.kind(), RunKind::kPipelines);
  EXPECT_EQ(l.stages(), 2);
  EXPECT_EQ(l.replicas(), 3);
  EXPECT_EQ(l.stage(), 1);
  EXPECT_EQ(l.replica(), 1);
  EXPECT_EQ(l.pipeline_ranks(), (std::vector<int>{1, 4}));
  EXPECT_EQ(l.stage_replica_ranks(), (std::vector<int>{3, 4, 5}));
  EXPECT_EQ(l.sync(), SyncKind::kDiloco);
  EXPECT_EQ(l.name(), "pipeline+diloco");
  EXPECT_EQ(l.stage_data_parallel_steps(), 0) << "DiLoCo per stage without a warm-up: no per-step averaging";
}

TEST(Layout, APipelineStageAveragesGradientsUnderDataParallelOrDuringTheWarmUp) {
  EXPECT_EQ(Layout::resolve(spec(0, 4, 2, /*diloco=*/false)).stage_data_parallel_steps(), -1);
  auto warm = spec(0, 4, 2);
  warm.warmup_ddp_steps = 7;
  EXPECT_EQ(Layout::resolve(warm).stage_data_parallel_steps(), 7);
  const Layout one = Layout::resolve(spec(1, 2, 2, /*diloco=*/false));
  EXPECT_EQ(one.sync(), SyncKind::kNone) << "one pipeline: a stage has no replicas";
  EXPECT_EQ(one.stage_data_parallel_steps(), 0);
  EXPECT_EQ(one.name(), "pipeline");
  auto local = spec(1, 2, 2);
  local.local_chunks = 2;
  EXPECT_EQ(Layout::resolve(local).name(), "local-stages");
}

TEST(Layout, APlacementRenamesTheRanks) {
  auto s = spec(0, 4, 2);
  s.placement = PlacedRanks{.replicas = 2, .stages = 2, .rank_at = {{3, 0}, {1, 2}}, .device_of_rank = {5, 6, 7, 8}};
  const Layout l = Layout::resolve(s);
  EXPECT_EQ(l.replica(), 0);
  EXPECT_EQ(l.stage(), 1);
  EXPECT_EQ(l.pipeline_ranks(), (std::vector<int>{3, 0}));
  EXPECT_EQ(l.stage_replica_ranks(), (std::vector<int>{0, 2}));
  EXPECT_EQ(l.device_of(0), 5);
}

TEST(Layout, DipacoWorkersSyncModules) {
  auto s = spec(1, 3);
  s.dipaco = true;
  const Layout l = Layout::resolve(s);
  EXPECT_EQ(l.kind(), RunKind::kDipaco);
  EXPECT_EQ(l.sync(), SyncKind::kModules);
  EXPECT_EQ(l.name(), "dipaco");
  EXPECT_EQ(l.replicas(), 3) << "every worker is a replica";
  EXPECT_EQ(l.replica(), 1);
}

TEST(Layout, ShapesThatCannotRunNameTheKey) {
  EXPECT_NE(error_of([] { Layout::resolve(spec(0, 1, 2)); }).find("launch --nproc 2"), std::string::npos);
  EXPECT_NE(error_of([] { Layout::resolve(spec(0, 3, 2)); }).find("does not divide the world size 3"),
            std::string::npos);
  auto local = spec(0, 2);
  local.local_chunks = 2;
  EXPECT_NE(error_of([&] { Layout::resolve(local); }).find("local.chunks = 2 with 2 processes"), std::string::npos);
  auto placed = spec(0, 4, 2);
  placed.placement = PlacedRanks{.replicas = 1, .stages = 2, .rank_at = {{0, 1}}, .device_of_rank = {0, 1}};
  placed.placement_key = "p.json";
  EXPECT_NE(error_of([&] { Layout::resolve(placed); }).find("parallel.placement = 'p.json' places 1 pipelines"),
            std::string::npos);
}

TEST(Layout, TheStartUpLineSaysTheKindAndThePlace) {
  EXPECT_EQ(Layout::resolve(spec(4, 6, 2)).describe(),
            "layout: 3 pipeline(s) x 2 stages, each stage's replicas kept together by DiLoCo; rank 4 runs stage 1 of "
            "pipeline 1");
  auto warm = spec(1, 2);
  warm.warmup_ddp_steps = 5;
  EXPECT_EQ(Layout::resolve(warm).describe(),
            "layout: 2 replicas of the model, kept together by DiLoCo after 5 data-parallel steps; this is replica 1");
}

TEST(Layout, IslandsAreConsecutiveRanksAndShardTheOuterExchange) {
  auto s = spec(3, 4);
  s.islands = "2";
  const Layout l = Layout::resolve(s);
  EXPECT_EQ(l.kind(), RunKind::kIslands);
  EXPECT_EQ(l.sync(), SyncKind::kDiloco);
  EXPECT_EQ(l.name(), "islands");
  EXPECT_EQ(l.islands().count(), 2);
  EXPECT_EQ(l.replicas(), 2);
  EXPECT_EQ(l.islands().island(), 1);
  EXPECT_EQ(l.replica(), 1);
  EXPECT_EQ(l.islands().rank_in_island(), 1);
  EXPECT_EQ(l.islands().ranks(), (std::vector<int>{2, 3}));
  EXPECT_EQ(l.islands().outer_shards(), 2);
  EXPECT_EQ(l.islands().outer_shard(), 1);
  EXPECT_EQ(l.islands().outer_shard_ranks(), (std::vector<int>{1, 3}));
  EXPECT_TRUE(l.islands().equal());
  EXPECT_EQ(l.describe(),
            "layout: 2 islands of 2/2 ranks, data parallel inside, DiLoCo across, the outer exchange sharded 2 way(s); "
            "rank 3 is rank 1 of island 1");
}

TEST(Layout, IslandsOfUnlikeSizeShardByTheSmallest) {
  auto s = spec(2, 5);
  s.islands = "3,2";
  const Layout third = Layout::resolve(s);  // rank 2: the third rank of island 0 holds no outer shard
  EXPECT_FALSE(third.islands().equal());
  EXPECT_EQ(third.islands().outer_shards(), 2);
  EXPECT_EQ(third.islands().island(), 0);
  EXPECT_EQ(third.islands().outer_shard(), -1);
  EXPECT_TRUE(third.islands().outer_shard_ranks().empty());
  s.rank = 4;
  const Layout last = Layout::resolve(s);
  EXPECT_EQ(last.islands().island(), 1);
  EXPECT_EQ(last.islands().rank_in_island(), 1);
  EXPECT_EQ(last.islands().outer_shard_ranks(), (std::vector<int>{1, 4}));
  auto machines = spec(5, 6);
  machines.islands = "machines";
  machines.local_world_size = 3;
  EXPECT_EQ(Layout::resolve(machines).islands().island(), 1);
  EXPECT_EQ(Layout::resolve(machines).islands().count(), 2);
}

TEST(Layout, FaultTolerantIslandsAreMachinesWhoseRanksZeroExchangeTheWholeModel) {
  auto s = spec(2, 4);
  s.islands = "machines";
  s.local_world_size = 2;
  s.fault_tolerant = true;
  const Layout lead = Layout::resolve(s);
  EXPECT_TRUE(lead.islands().leads_exchange());
  EXPECT_EQ(lead.islands().outer_shards(), 1);
  EXPECT_EQ(lead.islands().outer_shard(), 0);
  EXPECT_EQ(lead.islands().outer_shard_ranks(), (std::vector<int>{0, 2}));
  EXPECT_NE(lead.describe().find("fault tolerant: the islands are the quorum's members"), std::string::npos);
  s.rank = 3;
  EXPECT_EQ(Layout::resolve(s).islands().outer_shard(), -1) << "an island's other ranks follow its rank 0";
  s.islands = "2,1,1";  // an island of two on a machine of... two, then two islands of one
  EXPECT_NE(error_of([&] { Layout::resolve(s); }).find("each island must be one machine's workers"), std::string::npos);
  s.islands = "machines";
  s.island_steps = "2,1";
  EXPECT_NE(error_of([&] { Layout::resolve(s); }).find("fault-tolerant islands keep one pace"), std::string::npos);
}

TEST(Layout, IslandsThatCannotRunNameTheKey) {
  auto with = [](int world, const std::string& islands, auto change) {
    auto s = spec(0, world);
    s.islands = islands;
    change(s);
    return error_of([&] { Layout::resolve(s); });
  };
  auto none = [](LayoutSpec&) {};
  EXPECT_NE(with(4, "3", none).find("parallel.islands = 3: 3 islands do not divide the world of 4 ranks"),
            std::string::npos);
  EXPECT_NE(with(4, "2,1", none).find("the islands hold 3 ranks but the run has 4"), std::string::npos);
  EXPECT_NE(with(4, "two", none).find("expected a number of equal islands"), std::string::npos);
  EXPECT_NE(with(4, "2,0,2", none).find("expected a number"), std::string::npos);
  EXPECT_NE(with(4, "1", none).find("one island of all 4 ranks"), std::string::npos);
  EXPECT_NE(with(4, "machines", [](LayoutSpec& s) { s.local_world_size = 3; }).find("not machines of 3"),
            std::string::npos);
  EXPECT_NE(with(4, "2", [](LayoutSpec& s) { s.diloco = false; }).find("needs dist.algorithm = diloco"),
            std::string::npos);
  EXPECT_NE(with(4, "3,1", [](LayoutSpec& s) { s.pipeline_stages = 2; }).find("the same multiple of 2 ranks"),
            std::string::npos);
  EXPECT_NE(with(4, "2", [](LayoutSpec& s) { s.warmup_ddp_steps = 3; }).find("dist.warmup_ddp_steps = 3"),
            std::string::npos);
}

TEST(Layout, TimePacedIslandsTakeTheirOwnStepsPerTick) {
  auto s = spec(2, 3);
  s.islands = "2,1";
  s.island_steps = "2,1";
  const Layout l = Layout::resolve(s);
  EXPECT_EQ(l.islands().steps_per_tick(), 1);  // rank 2: the lone, slower island
  EXPECT_EQ(l.islands().steps(0), 2);
  EXPECT_EQ(l.islands().batches_per_tick(), 5);  // 2 ranks x 2 steps + 1 x 1
  EXPECT_NE(l.describe().find("time-paced: 2/1 optimizer steps per tick"), std::string::npos) << l.describe();
  s.island_steps = "";
  EXPECT_EQ(Layout::resolve(s).islands().batches_per_tick(), 3);
  s.island_steps = "2";
  EXPECT_NE(error_of([&] { Layout::resolve(s); }).find("gives 1 island(s) steps but parallel.islands makes 2"),
            std::string::npos);
  s.island_steps = "2,0";
  EXPECT_NE(error_of([&] { Layout::resolve(s); }).find("expected optimizer steps per tick"), std::string::npos);
  auto flat = spec(0, 2);
  flat.island_steps = "1,1";
  EXPECT_NE(error_of([&] { Layout::resolve(flat); }).find("without parallel.islands"), std::string::npos);
}

// parallel.islands with pipelines: a pipeline per island, its stages on the island's consecutive ranks (island-major,
// not Megatron's order), each stage's replicas across the islands by DiLoCo; shapes that cannot are refused by name.
TEST(Layout, APipelinePerIslandPutsItsStagesOnTheIslandsRanks) {
  auto s = spec(1, 6, 3);
  s.islands = "2";
  const Layout l = Layout::resolve(s);
  EXPECT_EQ(l.kind(), RunKind::kPipelines);
  EXPECT_EQ(l.sync(), SyncKind::kDiloco);
  EXPECT_EQ(l.replicas(), 2);
  EXPECT_EQ(l.stage(), 1);
  EXPECT_EQ(l.replica(), 0);
  EXPECT_EQ(l.pipeline_ranks(), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(l.stage_replica_ranks(), (std::vector<int>{1, 4}));
  EXPECT_NE(l.describe().find("one per island"), std::string::npos) << l.describe();
  s.rank = 4;
  EXPECT_EQ(Layout::resolve(s).replica(), 1);
  s.islands = "4,2";
  EXPECT_NE(error_of([&] { Layout::resolve(s); }).find("the same multiple of 3 ranks"), std::string::npos);
  auto ddp = spec(0, 4, 2, false);
  ddp.islands = "2";
  EXPECT_NE(error_of([&] { Layout::resolve(ddp); }).find("needs dist.algorithm = diloco"), std::string::npos);
  auto paced = spec(0, 4, 2);
  paced.islands = "2";
  paced.island_steps = "auto";
  EXPECT_NE(error_of([&] { Layout::resolve(paced); }).find("every pipeline keeps the pace"), std::string::npos);
}

// Several pipelines per island: island i's d pipelines on its consecutive ranks; a stage's replicas in the island
// average every step, the island's first pipeline speaks for it across.
TEST(Layout, SeveralPipelinesPerIslandAverageAStageInsideAndTheFirstSpeaksAcross) {
  auto s = spec(5, 8, 2);  // 2 islands x 2 pipelines x 2 stages; rank 5: island 1, its pipeline 0 (pipeline 2), stage 1
  s.islands = "2";
  const Layout l = Layout::resolve(s);
  EXPECT_EQ(l.replicas(), 4);
  EXPECT_EQ(l.pipelines_per_island(), 2);
  EXPECT_EQ(l.replica(), 2);
  EXPECT_EQ(l.pipeline_in_island(), 0);
  EXPECT_EQ(l.stage(), 1);
  EXPECT_EQ(l.pipeline_ranks(), (std::vector<int>{4, 5}));
  EXPECT_EQ(l.island_stage_ranks(), (std::vector<int>{5, 7}));
  EXPECT_EQ(l.lead_stage_ranks(), (std::vector<int>{1, 5}));
  EXPECT_EQ(l.stage_data_parallel_steps(), -1) << "a stage's replicas in an island average every step";
  EXPECT_NE(l.describe().find("2 per island"), std::string::npos) << l.describe();
  s.rank = 6;
  EXPECT_EQ(Layout::resolve(s).pipeline_in_island(), 1);
  auto one = spec(1, 4, 2);
  one.islands = "2";
  EXPECT_EQ(Layout::resolve(one).stage_data_parallel_steps(), 0) << "one pipeline per island: DiLoCo only";
}

// parallel.island_steps = "auto": lockstep until the run measured every rank's step; then the slowest island takes one
// step per tick and island i round(T_slowest / T_i), an island as slow as its slowest rank.
TEST(Layout, AMeasuredPaceGivesEachIslandStepsInProportionToItsSpeed) {
  auto s = spec(2, 4);
  s.islands = "2,1,1";
  s.island_steps = "auto";
  const Layout l = Layout::resolve(s);
  EXPECT_TRUE(l.islands().measured_pace());
  EXPECT_EQ(l.islands().all_steps(), (std::vector<int64_t>{1, 1, 1}));
  // Ranks 0 and 1 (island 0: its slower rank counts), rank 2 (island 1), rank 3 (island 2, the slowest).
  EXPECT_EQ(l.islands().paced_steps({0.10, 0.12, 0.40, 0.50}), (std::vector<int64_t>{4, 1, 1}));
  EXPECT_EQ(l.islands().paced_steps({0.10, 0.12, 0.24, 0.50}), (std::vector<int64_t>{4, 2, 1}));
  EXPECT_EQ(l.islands().paced_steps({0.2, 0.2, 0.2, 0.2}), (std::vector<int64_t>{1, 1, 1}));
  EXPECT_EQ(l.islands().paced_steps({1e-9, 1e-9, 1e-9, 100.0}),
            (std::vector<int64_t>{IslandShape::kMaxPacedSteps, IslandShape::kMaxPacedSteps, 1}));
  s.island_steps = "2,1,1";
  EXPECT_FALSE(Layout::resolve(s).islands().measured_pace());
}

// parallel.placement naming an islands placement (`plan --sites --out`) gives the run its islands (RunConfig::load
// takes them into parallel.islands); parallel.islands may repeat them but not contradict them.
TEST(Layout, AnIslandsPlacementGivesTheIslands) {
  const fs::path file = fs::temp_directory_path() / ("trib_islands_" + std::to_string(::getpid()) + ".json");
  write_file(file, R"({"kind": "islands", "islands": [2, 2], "regions": ["a", "b"]})", false);
  const DistEnv env{.rank = 3, .world_size = 4, .local_rank = 3, .local_world_size = 4};
  const std::string placement = "parallel.placement=" + file.string();
  const Layout l = run_layout(RunConfig::load("", {placement}), env);
  EXPECT_EQ(l.kind(), RunKind::kIslands);
  EXPECT_EQ(l.islands().ranks(), (std::vector<int>{2, 3}));
  EXPECT_EQ(run_layout(RunConfig::load("", {placement, "parallel.islands=2,2"}), env).islands().count(), 2)
      << "the same islands said twice";
  const std::string message = error_of([&] { RunConfig::load("", {placement, "parallel.islands=4"}); });
  EXPECT_NE(message.find("parallel.islands = '4' and the islands of parallel.placement"), std::string::npos) << message;
  const std::vector<std::string> few_rounds{"train.steps=60", "dist.inner_steps=10", "optim.warmup_steps=6",
                                            "dist.algorithm=diloco", "dist.warmup_ddp_steps=-1"};
  auto with_placement = few_rounds;
  with_placement.push_back(placement);
  ASSERT_GT(RunConfig::load("", few_rounds).dist.warmup_ddp_steps, 0) << "the flat run's warm-up, for contrast";
  EXPECT_EQ(RunConfig::load("", with_placement).dist.warmup_ddp_steps, 0)
      << "DiLoCo's settings from the run know the islands (no data-parallel warm-up across the slow link)";
  // A placement nothing would read (a pipeline's, or not ours) in a run without pipeline stages is refused, not
  // ignored.
  for (const char* text :
       {R"({"d_dp": 2, "d_pp": 2, "pipelines": [[0, 1], [2, 3]]})", "[1, 2]", R"({"islands": "x"})"}) {
    write_file(file, text, false);
    EXPECT_NE(error_of([&] { RunConfig::load("", {placement}); }).find("is not an islands placement"),
              std::string::npos)
        << text;
  }
  fs::remove(file);
}
