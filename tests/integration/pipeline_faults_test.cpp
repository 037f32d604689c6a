// Fault-tolerant pipelines (runtime/sync/pipeline_sync.h, dist.fault_tolerant with parallel.pipeline_stages): two
// machines' launches (--nnodes 2, --restart-island), each machine's two workers one pipeline of two stages. The
// pipelines are the quorum's members, each spoken for by its stage 0; a stage lost takes its pipeline out, its launch
// starts the pipeline again, and it rejoins from the peer pipeline (every stage's parameters and AdamW moments). Real
// processes, real c10d on loopback; the leads hash-check their whole models after every outer step.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "launch_support.h"
#include "test_paths.h"  // generated: TRIBUTARY_CLI, TRIBUTARY_SOURCE_DIR, ...
#include "tributary/core/fs.h"
#include "tributary/launch/launcher.h"

using namespace tributary;

using test_support::Distributed;
using test_support::membership_events;
using test_support::sh;
using test_support::tiny;
using test_support::work;

namespace {

// `count` machines of two workers on loopback, one pipeline of two stages each; `env` before every launch,
// `launch_extra` on each, `train` (when given) instead of train's --overwrite.
std::pair<int, std::string> pipelines_on_machines(const std::string& run, int count, const std::string& extra,
                                                  const std::string& launch_extra, const std::string& env = "",
                                                  const std::string& train = "") {
  const int port = free_tcp_port();
  auto node = [&](int n) {
    std::string command = tiny(run,
                               "--set train.steps=24 --set train.batch_size=4 --set dist.inner_steps=4 "
                               "--set parallel.pipeline_stages=2 --set parallel.islands=machines "
                               "--set dist.heartbeat_timeout_s=2 --set dist.collective_timeout_s=30 "
                               "--set dist.store_timeout_s=30 " +
                                   extra);
    if (!train.empty()) command = std::regex_replace(command, std::regex(" train --overwrite"), " train " + train);
    return fmt::format("{} {} launch --nnodes {} --node-rank {} --nproc 2 --master-port {} --grace 2 {} --{}", env,
                       TRIBUTARY_CLI, count, n, port, launch_extra, command);
  };
  std::string script;
  for (int n = 0; n + 1 < count; ++n) script += node(n) + " & pids=\"$pids $!\"; ";
  return sh("bash -c '" + script + node(count - 1) + "; rc=$?; for p in $pids; do wait $p || rc=1; done; exit $rc'");
}

std::pair<int, std::string> two_pipelines(const std::string& run, const std::string& extra,
                                          const std::string& launch_extra, const std::string& env = "",
                                          const std::string& train = "") {
  return pipelines_on_machines(run, 2, extra, launch_extra, env, train);
}

const std::string kFaultTolerant = "--set dist.fault_tolerant=true";
const std::string kRestartPipeline = "--max-restarts 1 --restart-island";

fs::path checkpoint(const std::string& run, int step = 24) {
  return work() / run / "checkpoints" / fmt::format("step-{:08d}", step);
}

// The per-stage moment sums a log line ends with ("(moment sums a, b)"), after `marker`.
std::string sums_after(const std::string& out, const std::string& marker) {
  const size_t at = out.find(marker);
  if (at == std::string::npos) return "";
  const size_t open = out.find("(moment sums ", at), close = out.find(')', open);
  return open == std::string::npos || close == std::string::npos ? "" : out.substr(open, close - open);
}

}  // namespace

TEST_F(Distributed, FaultTolerantPipelinesWithoutAFaultTrainWhatPipelinesTrain) {
  // The pipelines' stages 0 taking DiLoCo's rounds for the whole model (made current over each pipeline first) give
  // what DiLoCo per stage gives (fp32: a sum of two is exact either way), bit for bit.
  auto [rc, out] = two_pipelines("ftp_plain", "", "");
  ASSERT_EQ(rc, 0) << out;
  auto [rc2, out2] = two_pipelines("ftp_ft", kFaultTolerant, kRestartPipeline);
  ASSERT_EQ(rc2, 0) << out2;
  EXPECT_NE(out2.find("the quorum's members are the pipelines"), std::string::npos) << out2;
  EXPECT_TRUE(read_file(checkpoint("ftp_plain") / "model.safetensors") ==
              read_file(checkpoint("ftp_ft") / "model.safetensors"));
}

TEST_F(Distributed, AStageLostTakesItsPipelineOutAndItRejoinsFromAPeerPipeline) {
  // Rank 1 (pipeline 0's stage 1; pipeline 0 leads the run) is SIGKILLed at step 6. Its launch kills pipeline 0's
  // stage 0 and starts both again as the pipeline's life 1; pipeline 1 redoes the round alone, leads, and admits
  // pipeline 0 back, whose stage 0 heals from pipeline 1's — every stage's parameters and AdamW moments, made by
  // pipeline 1's two stages together — and hands stage 1 its part. The run completes with both pipelines, and the
  // final checkpoint holds both pipelines' whole models, byte for byte the same.
  // Every worker slowed 3x: the restarted pipeline's start-up has outer steps to join at.
  auto [rc, out] = two_pipelines("ftp_kill", kFaultTolerant + " --set dist.slow_workers=0:3,1:3,2:3,3:3",
                                 kRestartPipeline, "TRIBUTARY_FAIL_RANK=1 TRIBUTARY_FAIL_STEP=6");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("starting this machine's island again as its life 1"), std::string::npos) << out;
  EXPECT_NE(out.find("pipeline(s) 0 dropped out"), std::string::npos) << out;
  EXPECT_NE(out.find("pipeline 1 leads the run"), std::string::npos) << out;
  EXPECT_NE(out.find("pipeline 0 joined at step"), std::string::npos) << out;
  // What pipeline 1's stages sent is what pipeline 0's stages took (both sides log each stage's moment sums).
  const std::string sent = sums_after(out, "pipeline 1: a heal's state made by its 2 stages");
  ASSERT_FALSE(sent.empty()) << out;
  EXPECT_EQ(sums_after(out, "pipeline 0: its 2 stages took"), sent) << out;
  EXPECT_EQ(sent.find("0.000000e+00"), std::string::npos) << "every stage has moments: " << sent;
  const auto events = membership_events("ftp_kill");
  ASSERT_EQ(events.size(), 2u) << out;
  EXPECT_EQ(events[0], std::make_pair(2, 1)) << "pipeline 0 out";
  EXPECT_EQ(events[1], std::make_pair(1, 2)) << "pipeline 0 back";
  const auto summary = nlohmann::json::parse(read_file(work() / "ftp_kill" / "summary.json"));
  EXPECT_EQ(summary["steps"].get<int>(), 24);
  ASSERT_TRUE(fs::exists(checkpoint("ftp_kill") / "rank-1.model.safetensors"))
      << "the healed pipeline takes part in the checkpoint";
  EXPECT_TRUE(read_file(checkpoint("ftp_kill") / "model.safetensors") ==
              read_file(checkpoint("ftp_kill") / "rank-1.model.safetensors"))
      << "the pipelines' models are one after the last outer step";
}

TEST_F(Distributed, APipelineRestartedMidRoundIsHealedAndCountsInThatRound) {
  // H = 20 and every worker slowed 10x, so the round outlasts the pipeline's restart: rank 3 (pipeline 1's stage 1)
  // dies at step 2, pipeline 1 starts again and asks to join; pipeline 0's lead heals it mid-round (both of pipeline
  // 0's stages make the state) and the healed pipeline's pseudo-gradient counts in round x0 already.
  auto [rc, out] = two_pipelines("ftp_midround",
                                 kFaultTolerant +
                                     " --set train.steps=20 --set dist.inner_steps=20 --set dist.heartbeat_timeout_s=5 "
                                     "--set dist.slow_workers=0:10,1:10,2:10,3:10",
                                 kRestartPipeline, "TRIBUTARY_FAIL_RANK=3 TRIBUTARY_FAIL_STEP=2");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("pipeline 1 healed from the lead at step"), std::string::npos) << out;
  EXPECT_NE(out.find("pipeline 1 joined at step 20 (round x0)"), std::string::npos) << out;
  const std::string sent = sums_after(out, "pipeline 0: a heal's state made by its 2 stages");
  ASSERT_FALSE(sent.empty()) << out;
  EXPECT_EQ(sums_after(out, "pipeline 1: its 2 stages took"), sent) << out;
  // The death changed no round's members; the heal's event line is what the report lists it by (issue 66, item 21).
  const std::string metrics = read_file(work() / "ftp_midround" / "metrics.jsonl");
  EXPECT_NE(metrics.find(R"("event":"heal","healed":[1])"), std::string::npos) << metrics;
  auto [rc_report, out_report] = sh(std::string(TRIBUTARY_CLI) + " report " + (work() / "ftp_midround").string());
  ASSERT_EQ(rc_report, 0) << out_report;
  EXPECT_NE(read_file(work() / "ftp_midround" / "report.html").find("pipeline [1] restarted and healed mid-round"),
            std::string::npos);
  const fs::path ckpt = checkpoint("ftp_midround", 20);
  ASSERT_TRUE(fs::exists(ckpt / "rank-1.model.safetensors")) << out;
  EXPECT_TRUE(read_file(ckpt / "model.safetensors") == read_file(ckpt / "rank-1.model.safetensors"));
}

TEST_F(Distributed, AFaultTolerantPipelinesCheckpointHoldsEveryStageAndResumes) {
  // The leads' checkpoint holds the whole model and every stage's AdamW moments; a resume hands each stage its part
  // and goes on to the end.
  const std::string every = kFaultTolerant + " --set train.checkpoint_every=8";
  auto [rc, out] = two_pipelines("ftp_resume", every, kRestartPipeline);
  ASSERT_EQ(rc, 0) << out;
  const auto optim = safetensors::File::load(checkpoint("ftp_resume", 16) / "optim.safetensors");
  double stage0 = 0, stage1 = 0;  // the sums of their moments
  for (const auto& [name, view] : optim.tensors()) {
    const double sum = name == "rng.cpu" ? 0.0 : to_torch(view).abs().sum().item<double>();
    (name.find("blocks.1.") != std::string::npos ? stage1 : stage0) += sum;
  }
  EXPECT_GT(stage0, 0) << "stage 0's moments";
  EXPECT_GT(stage1, 0) << "stage 1's moments, gathered from stage 1 by the lead";
  const auto before = nlohmann::json::parse(read_file(work() / "ftp_resume" / "summary.json"));
  fs::remove_all(checkpoint("ftp_resume", 24));
  auto [rc2, out2] = two_pipelines("ftp_resume", every, kRestartPipeline, "", "--resume");
  ASSERT_EQ(rc2, 0) << out2;
  EXPECT_NE(out2.find("resumed from"), std::string::npos) << out2;
  const auto after = nlohmann::json::parse(read_file(work() / "ftp_resume" / "summary.json"));
  EXPECT_EQ(after["steps"].get<int>(), 24);
  // Pipeline 1 resumes from pipeline 0's AdamW state and data position (the checkpoint is the leads'), so the run
  // is close to the uninterrupted one, not equal.
  EXPECT_NEAR(after["val_loss"].get<double>(), before["val_loss"].get<double>(), 0.05) << out2;
}

TEST_F(Distributed, FaultTolerantPipelinesThatCannotRestartAsAWholeAreRefusedBeforeTraining) {
  // Without islands a pipeline's machine is unknown: refused with the settings to use.
  auto [rc, out] =
      sh(fmt::format("{} launch --nproc 2 --master-port 0 --{}", TRIBUTARY_CLI,
                     tiny("ftp_bad", "--set train.steps=4 --set parallel.pipeline_stages=2 " + kFaultTolerant)));
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("each machine runs one whole pipeline"), std::string::npos) << out;
  // One pipeline per machine, but launched without --restart-island.
  auto [rc2, out2] = two_pipelines("ftp_bad2", kFaultTolerant, "");
  EXPECT_NE(rc2, 0);
  EXPECT_NE(out2.find("--restart-island --max-restarts N"), std::string::npos) << out2;
  EXPECT_FALSE(fs::exists(work() / "ftp_bad" / "checkpoints"));
  EXPECT_FALSE(fs::exists(work() / "ftp_bad2" / "checkpoints"));
}

TEST_F(Distributed, APipelineEvictedStaysEvictedAfterAnotherPipelineIsHealed) {
  // Three machines, one pipeline of two stages each. Pipeline 1's lead flips the sign of its updates: rated by the loss
  // its update brings on a probe batch (the leads hold the whole model), it is refused and evicted at exchange 3.
  // Pipeline 2's second stage (rank 5) is killed at step 10; the pipeline starts again and its lead is healed with the
  // rule's verdicts and ratings: the three pipelines end with one model.
  auto [rc, out] =
      pipelines_on_machines("ftp_evicted", 3,
                            kFaultTolerant +
                                " --set train.steps=32 --set dist.slow_workers=0:3,1:3,2:3,3:3,4:3,5:3 "
                                "--set dist.aggregate=median --set dist.evict_after=3 --set dist.min_score=0.2 "
                                "--set dist.score=loss --adversary 2:sign_flip",
                            kRestartPipeline, "TRIBUTARY_FAIL_RANK=5 TRIBUTARY_FAIL_STEP=10");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("pipeline 1's update refused in exchange 3 (1 of 2 accepted, dist.aggregate = median): a loss "
                     "rating of"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("pipeline 1 evicted in exchange 3"), std::string::npos) << out;
  EXPECT_NE(out.find("pipeline 2 joined at step"), std::string::npos) << out;
  const fs::path ckpt = checkpoint("ftp_evicted", 32);
  ASSERT_TRUE(fs::exists(ckpt / "rank-2.model.safetensors")) << out;
  EXPECT_EQ(read_file(ckpt / "model.safetensors"), read_file(ckpt / "rank-2.model.safetensors"))
      << "the healed pipeline judged pipeline 1 otherwise than the others";
}
