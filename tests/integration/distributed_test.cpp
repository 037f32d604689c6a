// Multi-process runs through `tributary launch`: real processes, real c10d (TCPStore + Gloo) on loopback.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "launch_support.h"
#include "test_paths.h"  // generated: TRIBUTARY_CLI, TRIBUTARY_SOURCE_DIR, ...
#include "tributary/core/fs.h"
#include "tributary/core/safetensors.h"
#include "tributary/data/dataset.h"
#include "tributary/launch/launcher.h"
#include "tributary/model/tensor_io.h"

using namespace tributary;

using test_support::any_process_mentions;
using test_support::Distributed;
using test_support::expect_resume_bit_exact;
using test_support::flat_params;
using test_support::sh;
using test_support::tiny;
using test_support::work;

TEST_F(Distributed, DataParallelEqualsOneProcessWithTheWholeBatch) {
  const std::string cli = TRIBUTARY_CLI;
  auto [rc1, out1] = sh(cli + tiny("single", "--set train.steps=6 --set train.batch_size=8"));
  ASSERT_EQ(rc1, 0) << out1;
  auto [rc2, out2] = sh(cli + " launch --nproc 2 --master-port 0 --" +
                        tiny("ddp", "--set train.steps=6 --set train.batch_size=4 --set dist.algorithm=ddp"));
  ASSERT_EQ(rc2, 0) << out2;
  EXPECT_NE(out2.find("2 replicas, data parallel: rank 0 sent"), std::string::npos) << out2;
  EXPECT_NE(out2.find("in 6 steps;"), std::string::npos) << "not outer steps\n" << out2;
  auto a = flat_params(work() / "single"), b = flat_params(work() / "ddp");
  EXPECT_TRUE(torch::allclose(a, b, 1e-4, 1e-5)) << "max diff " << (a - b).abs().max().item<double>();
  // with gradient accumulation the gradients are averaged after the last micro-batch instead of during backward
  auto [rc3, out3] = sh(cli + " launch --nproc 2 --master-port 0 --" +
                        tiny("ddp_accum",
                             "--set train.steps=6 --set train.batch_size=2 --set train.grad_accum=2 "
                             "--set dist.algorithm=ddp"));
  ASSERT_EQ(rc3, 0) << out3;
  auto c = flat_params(work() / "ddp_accum");
  EXPECT_TRUE(torch::allclose(a, c, 1e-4, 1e-5)) << "max diff " << (a - c).abs().max().item<double>();
  auto summary = nlohmann::json::parse(read_file(work() / "ddp" / "summary.json"));
  // 6 steps of a ring all-reduce of every gradient: 2 (N-1)/N x 4 bytes x parameters per step
  EXPECT_DOUBLE_EQ(summary["bytes_sent"].get<double>(), 6.0 * 4 * 123264);
  // Stopped between two log lines (every 5 steps): the exchanges of steps 6 and 7 count too (they were left out).
  auto [rc4, out4] = sh(cli + " launch --nproc 2 --master-port 0 --" +
                        tiny("ddp_cut",
                             "--set train.steps=20 --set train.batch_size=4 --set dist.algorithm=ddp "
                             "--stop-after-step 7"));
  ASSERT_EQ(rc4, 0) << out4;
  auto cut = nlohmann::json::parse(read_file(work() / "ddp_cut" / "summary.json"));
  EXPECT_EQ(cut["steps"].get<int>(), 7);
  EXPECT_TRUE(cut["val_loss"].is_null());
  EXPECT_NE(out4.find("7 steps, 3584 tokens in"), std::string::npos) << out4;
  EXPECT_NE(out4.find("| not evaluated |"), std::string::npos) << out4;  // it printed "val loss 0.0000"
  EXPECT_DOUBLE_EQ(cut["bytes_sent"].get<double>(), 7.0 * 4 * 123264);
}

TEST_F(Distributed, DilocoRunsAndCommunicatesHTimesLess) {
  const std::string cli = TRIBUTARY_CLI;
  auto [rc, out] = sh(cli + " launch --nproc 2 --master-port 0 --" +
                      tiny("diloco",
                           "--set train.steps=12 --set train.batch_size=4 --set dist.inner_steps=4 "
                           "--set dist.compression=int8"));
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("2 replicas, DiLoCo: rank 0 sent"), std::string::npos) << out;
  EXPECT_NE(out.find("in 3 outer steps;"), std::string::npos) << out;
  auto s = nlohmann::json::parse(read_file(work() / "diloco" / "summary.json"));
  EXPECT_EQ(s["outer_steps"].get<int>(), 3);
  // int8 quantised ring: 2 (N-1) chunks of params / N values + a 1 KB table each, 3 rounds -- 4x less than fp32; every
  // message ends with the run's 32-byte MAC (launch gives the run a secret: comm/wire_mac.h)
  EXPECT_NEAR(s["bytes_sent"].get<double>(), 3.0 * 2 * (123264 / 2 + 1024 + 32), 8);
  int rounds = 0;
  std::istringstream metrics(read_file(work() / "diloco" / "metrics.jsonl"));
  for (std::string line; std::getline(metrics, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("outer_step")) {
      ++rounds;
      for (const char* key : {"bytes_sent", "bytes_recv", "comm_s", "compute_s"}) EXPECT_TRUE(j.contains(key)) << key;
    }
  }
  EXPECT_EQ(rounds, 3);
}

TEST_F(Distributed, WorkersWithDifferentConfigsAreRefused) {
  const std::string cli = TRIBUTARY_CLI;
  const int port = free_tcp_port();
  auto cmd = [&](int rank, const std::string& extra) {
    return "RANK=" + std::to_string(rank) + " WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) +
           " " + cli + tiny("mismatch" + std::to_string(rank), "--set train.steps=4 " + extra);
  };
  auto [rc, out] =
      sh("(" + cmd(0, "") + ") 2>&1 & (" + cmd(1, "--set model.width=32 --set model.num_heads=2") + ") 2>&1; wait");
  EXPECT_NE(out.find("rank 1 differs from rank 0"), std::string::npos) << out;
  EXPECT_NE(out.find("model.width"), std::string::npos) << out;
}

TEST_F(Distributed, ADyingWorkerStopsTheLaunchWithNoOrphans) {
  const std::string cli = TRIBUTARY_CLI;
  const std::string marker = (work() / "dies").string();
  auto start = std::chrono::steady_clock::now();
  auto [rc, out] =
      sh("TRIBUTARY_FAIL_RANK=1 TRIBUTARY_FAIL_STEP=3 " + cli + " launch --nproc 2 --master-port 0 --grace 2 --" +
         tiny("dies", "--set train.steps=50 --set train.batch_size=4 --set dist.algorithm=ddp"));
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("rank 1"), std::string::npos) << out;
  EXPECT_LT(took, 30) << "launch must not wait for the collective timeout";
  EXPECT_FALSE(any_process_mentions(marker)) << "a worker outlived launch";
}

TEST_F(Distributed, StreamingFragmentsWithOverlapStayIdentical) {
  // 2 fragments staggered by H/2, each exchange overlapping 2 inner steps; replicas are hash-checked after every
  // landing (a mismatch would fail the run).
  const std::string cli = TRIBUTARY_CLI;
  auto [rc, out] = sh(cli + " launch --nproc 2 --master-port 0 --" +
                      tiny("streaming",
                           "--set train.steps=12 --set train.batch_size=4 --set dist.inner_steps=4 "
                           "--set dist.fragments=2 --set dist.overlap_steps=2 --set dist.compression=fp4"));
  ASSERT_EQ(rc, 0) << out;
  auto s = nlohmann::json::parse(read_file(work() / "streaming" / "summary.json"));
  // fragment 0 sends at 4, 8, 12 and fragment 1 at 6, 10 (+ a final one at 12): six landings
  EXPECT_EQ(s["outer_steps"].get<int>(), 6);
  EXPECT_TRUE(std::isfinite(s["val_loss"].get<double>()));
}

TEST_F(Distributed, DilocoAfterADataParallelWarmUp) {
  const std::string cli = TRIBUTARY_CLI;
  auto [rc, out] = sh(cli + " launch --nproc 2 --master-port 0 --" +
                      tiny("warm",
                           "--set train.steps=12 --set train.batch_size=4 --set dist.inner_steps=4 "
                           "--set dist.warmup_ddp_steps=4"));
  ASSERT_EQ(rc, 0) << out;
  auto s = nlohmann::json::parse(read_file(work() / "warm" / "summary.json"));
  EXPECT_EQ(s["outer_steps"].get<int>(), 2);  // DiLoCo from step 4: outer steps at 8 and 12
  // 4 data-parallel steps and 2 outer steps, each one fp32 ring all-reduce of every parameter
  EXPECT_DOUBLE_EQ(s["bytes_sent"].get<double>(), 6.0 * 4 * 123264);  // 2 (N-1)/N = 1 for N = 2
}

TEST_F(Distributed, TheRampSyncsTheFirstRoundsOftenAndResumesBitForBitInsideIt) {
  // dist.ramp_steps (optim/round_length.h) after a 2-step warm-up: rounds of max(1, round(4 * s / 8)) steps, s steps
  // after the warm-up: outer steps at 3, 4, 5, 7, 10 and the final one at 12. Stopped after step 5, inside the ramp,
  // the resumed run must count its rounds from the same start and end where the uninterrupted one does.
  const std::string args =
      "--set train.steps=12 --set train.batch_size=4 --set dist.inner_steps=4 --set dist.warmup_ddp_steps=2 "
      "--set dist.ramp_steps=8 --set dist.compression=int8 ";
  const std::string launch = std::string(TRIBUTARY_CLI) + " launch --nproc 2 --master-port 0 --";
  expect_resume_bit_exact(launch, "ramp", args, 5, 12,
                          {"model.safetensors", "outer.safetensors", "rank-1.model.safetensors"});
  auto s = nlohmann::json::parse(read_file(work() / "ramp_full" / "summary.json"));
  EXPECT_EQ(s["outer_steps"].get<int>(), 6);
}

TEST_F(Distributed, AStoppedRunResumesBitForBit) {
  // DiLoCo with 2 fragments and overlap 1: the stop requested after step 4 waits for the exchange in flight (it
  // lands at 5); the resumed run must end exactly where the uninterrupted one does, on every rank. SparseLoCo: each
  // rank's error feedback (what it has not sent yet) resumes too.
  const std::string cli = TRIBUTARY_CLI;
  const std::string diloco =
      "--set train.steps=12 --set train.batch_size=4 --set dist.inner_steps=4 "
      "--set dist.fragments=2 --set dist.overlap_steps=1 --set dist.compression=sparseloco ";
  const std::string launch = cli + " launch --nproc 2 --master-port 0 --";
  expect_resume_bit_exact(launch, "resume", diloco, 4, 12,
                          {"model.safetensors", "rank-1.model.safetensors", "rank-1.optim.safetensors",
                           "rank-0.codec.safetensors", "rank-1.codec.safetensors"});
  for (const char* file : {"rank-1.optim.safetensors", "rank-0.codec.safetensors", "rank-1.codec.safetensors"})
    EXPECT_TRUE(fs::exists(work() / "resume_cut" / "checkpoints" / "step-00000005" / file)) << file;
  // data parallel, stopped in the middle
  const std::string ddp = "--set train.steps=6 --set train.batch_size=4 --set dist.algorithm=ddp ";
  expect_resume_bit_exact(launch, "resume_ddp", ddp, 3, 6, {"model.safetensors"});
  // another number of workers (here one process) resumes from rank 0's replica, saying so
  auto [rc5, out5] =
      sh(cli +
         tiny("resume_cut", diloco + "--resume " + (work() / "resume_cut" / "checkpoints" / "step-00000005").string()));
  EXPECT_EQ(rc5, 0) << out5;
  EXPECT_NE(out5.find("resuming a checkpoint of 2 worker(s) with 1: every worker starts from rank 0's"),
            std::string::npos)
      << out5;
}

TEST_F(Distributed, APipelineRunResumesBitForBit) {
  // 2 pipelines x 2 stages (1F1B, 2 micro-batches), DiLoCo per stage with H = 3: stopped after step 4 (mid-round),
  // resumed, it ends where the uninterrupted run does: the consolidated model, and every rank's stage state.
  const std::string pp =
      "--set model.num_layers=4 --set train.steps=6 --set train.batch_size=4 "
      "--set parallel.pipeline_stages=2 --set parallel.micro_batches=2 --set parallel.schedule=1f1b "
      "--set dist.algorithm=diloco --set dist.inner_steps=3 ";
  expect_resume_bit_exact(std::string(TRIBUTARY_CLI) + " launch --nproc 4 --", "pp_resume", pp, 4, 6,
                          {"model.safetensors", "optim.safetensors", "rank-0.outer.safetensors",
                           "rank-3.model.safetensors", "rank-3.optim.safetensors", "rank-3.outer.safetensors"});
  EXPECT_TRUE(fs::exists(work() / "pp_resume_cut" / "checkpoints" / "step-00000004" / "rank-3.outer.safetensors"));
  // a pipeline run needs its number of workers back (each rank holds its own stage), and says so naming both
  auto [rc, out] = sh(
      std::string(TRIBUTARY_CLI) + " launch --nproc 2 --master-port 0 --" +
      tiny("pp_resume_cut", pp + "--resume " + (work() / "pp_resume_cut" / "checkpoints" / "step-00000004").string()));
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("state of 4 worker(s) and this run has 2; a pipeline run resumes with the same number"),
            std::string::npos)
      << out;
}

TEST_F(Distributed, KillingLaunchTakesItsWorkersWithIt) {
  // kill -9 of launch: its workers used to train on as orphans and race a --resume for the run directory. Now the
  // kernel's parent-death signal ends them with it.
  const std::string cli = TRIBUTARY_CLI;
  const fs::path run = work() / "orphans";
  fs::remove_all(run);
  auto [rc, out] = sh("(" + cli + " launch --nproc 2 --master-port 0 --" +
                      tiny("orphans", "--set train.steps=100000 --set train.batch_size=4 --set dist.inner_steps=50") +
                      " > /dev/null 2>&1 & pid=$!; for i in $(seq 300); do grep -q '\"loss\"' " +
                      (run / "metrics.jsonl").string() + " 2>/dev/null && break; sleep 0.2; done; " +
                      "workers=$(pgrep -P $pid); echo workers: $workers; kill -9 $pid; sleep 3; " +
                      "for w in $workers; do kill -0 $w 2>/dev/null && echo orphan $w; done; true)");
  ASSERT_TRUE(std::regex_search(out, std::regex("workers: [0-9]+ [0-9]+"))) << "launch's two workers: " << out;
  EXPECT_EQ(out.find("orphan"), std::string::npos) << out;
}

TEST_F(Distributed, ASignalStopsEveryRankAtTheSameStepWithOneCheckpoint) {
  // SIGTERM to launch reaches every worker; they agree on the stop within a few steps (comm/lagged_vote.h) — not at
  // the next outer step, which here is 50,000 steps away — and write one checkpoint together. Before the vote, DiLoCo
  // agreed only at outer steps: launch killed the workers after --grace and the run had no checkpoint (issue 12).
  const std::string cli = TRIBUTARY_CLI;
  const fs::path run = work() / "signalled";
  const std::string cfg = "--set train.steps=100000 --set train.batch_size=4 --set dist.inner_steps=50000";
  fs::remove_all(run);  // the wait below must see this run's first logged step, not an older run's
  auto [rc, out] = sh("(" + cli + " launch --nproc 2 --master-port 0 --grace 20 --" + tiny("signalled", cfg) +
                      " 2>&1 & pid=$!; for i in $(seq 300); do grep -q '\"loss\"' " + (run / "metrics.jsonl").string() +
                      " 2>/dev/null && break; sleep 0.2; done; kill -TERM $pid; wait $pid)");
  // Every worker stopped with its checkpoint: launch's status is theirs, 0, as a signalled `train`'s (issue 46,
  // item 9: it was 143 while train's was 0).
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("every worker stopped cleanly"), std::string::npos) << out;
  EXPECT_NE(out.find("stopped after step"), std::string::npos) << out;
  EXPECT_NE(out.find("stop agreed by every rank"), std::string::npos) << out;
  auto summary = nlohmann::json::parse(read_file(run / "summary.json"));
  EXPECT_TRUE(summary["stopped_early"].get<bool>());
  const int64_t step = summary["steps"].get<int64_t>();
  EXPECT_LT(step, 50000) << "stopped long before the first outer step";
  EXPECT_TRUE(summary["val_loss"].is_null()) << "no evaluation ran: no made-up 0.0 loss";
  EXPECT_TRUE(fs::exists(run / "checkpoints" / fmt::format("step-{:08d}", step) / "rank-1.optim.safetensors")) << out;
  // and the stopped run goes on from there (4 more steps, then stopped as asked), still before any outer step
  auto [rc2, out2] = sh(cli + " launch --nproc 2 --master-port 0 --" +
                        tiny("signalled", cfg + fmt::format(" --resume --stop-after-step {}", step + 4)) + " 2>&1");
  ASSERT_EQ(rc2, 0) << out2;
  EXPECT_NE(out2.find(fmt::format("' at step {}", step)), std::string::npos) << out2;  // "resumed from '…' at step N"
  auto resumed = nlohmann::json::parse(read_file(run / "summary.json"));
  EXPECT_EQ(resumed["steps"].get<int64_t>(), step + 4);
  EXPECT_EQ(resumed["outer_steps"].get<int64_t>(), 0);
}

TEST_F(Distributed, TheRankThatFailedIsBlamedNotThePeerThatLostItsConnection) {
  // Rank 1 refuses its own input (an Error, status 2); rank 0, waiting in an all-reduce, loses its connection and
  // exits with a NetworkError (status 4) first about half the time. Its message names rank 1: launch reports every
  // exit to the run's store before it stops the others (comm/exit_reports.h). Before, launch blamed whichever it reaped
  // first (the wrong rank in 15 of 26 tries, issue 12 item 8). Rank 1 runs 20x slower (a sleep after each step), so
  // that rank 0 is in the all-reduce when rank 1 fails: on a loaded machine rank 0 was once still computing its step
  // when launch stopped it, and said nothing of its own.
  const std::string cli = TRIBUTARY_CLI;
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto [rc, out] = sh("TRIBUTARY_FAIL_MODE=error TRIBUTARY_FAIL_RANK=1 TRIBUTARY_FAIL_STEP=3 " + cli +
                        " launch --nproc 2 --grace 2 --" +
                        tiny("blamed",
                             "--set train.steps=50 --set train.batch_size=4 --set dist.algorithm=ddp "
                             "--set dist.slow_workers=1:20"));
    EXPECT_EQ(rc, 2) << out;
    EXPECT_NE(out.find("launch: failed because rank 1 failed (status 2)"), std::string::npos) << out;
    EXPECT_NE(out.find("injected failure at step 3"), std::string::npos) << out;
    // Rank 0's own error names the rank whose exit broke its all-reduce (launch reported it to the store), not only
    // Gloo's "Connection closed by peer [address]:port".
    EXPECT_NE(out.find("in group 'group0' failed after"), std::string::npos) << out;
    EXPECT_NE(out.find("because rank 1 exited with status 2 (an error in its "
                       "input or config), as its launch reported; its own log says why"),
              std::string::npos)
        << out;
  }
}

TEST_F(Distributed, AStoppedRankIsNamedAndTheRunEndsAtTheCollectiveDeadline) {
  const std::string cli = TRIBUTARY_CLI;
  const std::string marker = (work() / "frozen").string();
  auto start = std::chrono::steady_clock::now();
  auto [rc, out] = sh("TRIBUTARY_FAIL_MODE=stop TRIBUTARY_FAIL_RANK=1 TRIBUTARY_FAIL_STEP=3 " + cli +
                      " launch --nproc 2 --grace 2 --" +
                      tiny("frozen",
                           "--set train.steps=50 --set train.batch_size=4 --set dist.algorithm=ddp "
                           "--set dist.collective_timeout_s=5 --set dist.store_timeout_s=5"));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(rc, 4) << out;  // rank 0's NetworkError: the run's status
  EXPECT_NE(out.find("rank 1 (pid"), std::string::npos) << out;
  EXPECT_NE(out.find("was stopped by SIGSTOP"), std::string::npos) << out;
  EXPECT_NE(out.find("timed out after"), std::string::npos) << out;
  EXPECT_NE(out.find("was stopped and rank 0 gave up waiting for it"), std::string::npos) << out;
  EXPECT_LT(took, 40) << out;
  EXPECT_FALSE(any_process_mentions(marker)) << "the stopped worker outlived launch";
}

TEST_F(Distributed, AWorldSizeDisagreementIsRefusedAtOnceNamingBothSizes) {
  // Before: every rank waited for ranks that would never come and ended in "Socket Timeout" after 600 s.
  const std::string cli = TRIBUTARY_CLI;
  const int port = free_tcp_port();
  auto cmd = [&](int rank, int world) {
    return fmt::format("RANK={} WORLD_SIZE={} MASTER_ADDR=127.0.0.1 MASTER_PORT={} {}", rank, world, port, cli) +
           tiny("worlds" + std::to_string(rank), "--set train.steps=4");
  };
  auto start = std::chrono::steady_clock::now();
  auto [rc, out] = sh("(" + cmd(0, 2) + "; echo rank0=$?) 2>&1 & (" + cmd(1, 3) + "; echo rank1=$?) 2>&1; wait");
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(out.find("rank 1 was started with WORLD_SIZE=3 but rank 0 with WORLD_SIZE=2"), std::string::npos) << out;
  EXPECT_NE(out.find("another rank refused the rendezvous"), std::string::npos) << out;  // rank 0 stops too
  EXPECT_NE(out.find("rank0=2"), std::string::npos) << out;
  EXPECT_NE(out.find("rank1=2"), std::string::npos) << out;
  EXPECT_LT(took, 60) << out;
}

TEST_F(Distributed, PipelineStagesEqualOneProcessWithTheWholeBatch) {
  // 2 stages (1F1B, 4 micro-batches) and 2 pipelines x 2 stages (GPipe, the batch split over the pipelines) train to
  // the parameters of one process with the whole batch; eval and the checkpoint see the consolidated model.
  const std::string cli = TRIBUTARY_CLI;
  const std::string four = "--set model.num_layers=4 --set train.steps=6 --set dist.algorithm=ddp ";
  auto [rc1, out1] = sh(cli + tiny("pp_single", four + "--set train.batch_size=8"));
  ASSERT_EQ(rc1, 0) << out1;
  auto [rc2, out2] = sh(cli + " launch --nproc 2 --" +
                        tiny("pp_2", four + "--set train.batch_size=8 --set parallel.pipeline_stages=2 "
                                            "--set parallel.micro_batches=4 --set parallel.schedule=1f1b"));
  ASSERT_EQ(rc2, 0) << out2;
  auto [rc3, out3] = sh(cli + " launch --nproc 4 --" +
                        tiny("pp_2x2", four + "--set train.batch_size=4 --set parallel.pipeline_stages=2 "
                                              "--set parallel.micro_batches=2"));
  ASSERT_EQ(rc3, 0) << out3;
  // The last line says what ran (it said "4 replicas ... received 0.00 MB in 0 outer steps" for 2 x 2 stages).
  EXPECT_NE(out2.find("1 pipeline(s) of 2 stages: rank 0 sent"), std::string::npos) << out2;
  EXPECT_NE(out3.find("2 pipeline(s) of 2 stages: rank 0 sent"), std::string::npos) << out3;
  EXPECT_NE(out3.find("(activations, their gradients and its stage's gradients)"), std::string::npos) << out3;
  // Issue 66, item 10: the start-up's tokens per step are one pipeline's; `done:` counts both: both are labelled.
  EXPECT_NE(out3.find("256 tokens per step per replica (512 per step in all)"), std::string::npos) << out3;
  EXPECT_NE(out1.find("512 tokens per step;"), std::string::npos) << out1;
  // Every worker of every kind of multi-process run keeps its own lines (workers/rankR.jsonl: none were written for
  // pipeline stages without replicas to exchange with).
  for (const char* file : {"pp_2/workers/rank1.jsonl", "pp_2x2/workers/rank3.jsonl"})
    EXPECT_TRUE(fs::exists(work() / file)) << file;
  auto a = flat_params(work() / "pp_single");
  for (const char* run : {"pp_2", "pp_2x2"}) {
    auto b = flat_params(work() / run);
    EXPECT_TRUE(torch::allclose(a, b, 1e-4, 1e-5)) << run << ": max diff " << (a - b).abs().max().item<double>();
    auto s = nlohmann::json::parse(read_file(work() / run / "summary.json"));
    EXPECT_EQ(s["algorithm"], "pipeline") << run;
  }
  // The scheduler's placement renames the ranks: a shuffled one trains bit for bit what rank order does.
  write_file_atomic(work() / "shuffled.json", R"({"d_dp": 2, "d_pp": 2, "pipelines": [[3, 1], [0, 2]]})");
  auto [rc6, out6] = sh(cli + " launch --nproc 4 --" +
                        tiny("pp_placed", four +
                                              "--set train.batch_size=4 --set parallel.pipeline_stages=2 "
                                              "--set parallel.micro_batches=2 --set parallel.placement=" +
                                              (work() / "shuffled.json").string()));
  ASSERT_EQ(rc6, 0) << out6;
  EXPECT_NE(out6.find("rank 3 runs stage 0 of pipeline 0"), std::string::npos) << out6;
  EXPECT_NE(out6.find("rank 0 runs stage 0 of pipeline 1"), std::string::npos) << out6;
  EXPECT_TRUE(torch::equal(flat_params(work() / "pp_2x2"), flat_params(work() / "pp_placed")));
  write_file_atomic(work() / "other.json", R"({"d_dp": 1, "d_pp": 4, "pipelines": [[3, 1, 0, 2]]})");
  auto [rc7, out7] = sh(cli + " launch --nproc 4 --" +
                        tiny("pp_placed", four +
                                              "--set train.batch_size=4 --set parallel.pipeline_stages=2 "
                                              "--set parallel.placement=" +
                                              (work() / "other.json").string()));
  EXPECT_NE(rc7, 0);
  EXPECT_NE(out7.find("places 1 pipelines x 4 stages but this run has 2 x 2"), std::string::npos) << out7;
  // Bad shapes are refused naming the key.
  auto [rc4, out4] = sh(cli + " launch --nproc 3 --" +
                        tiny("pp_bad", four + "--set parallel.pipeline_stages=2 --set train.batch_size=4"));
  EXPECT_NE(rc4, 0);
  EXPECT_NE(out4.find("parallel.pipeline_stages = 2 does not divide the world size 3"), std::string::npos) << out4;
  auto [rc5, out5] = sh(cli + tiny("pp_bad", four + "--set parallel.pipeline_stages=2 --set train.batch_size=4"));
  EXPECT_EQ(rc5, 2);
  EXPECT_NE(out5.find("needs at least 2 worker processes"), std::string::npos) << out5;
}

TEST_F(Distributed, DilocoPerStageTrainsWhatDilocoOnTheWholeModelDoes) {
  // Each stage's replicas across the 2 pipelines take their own outer steps every H = 3 inner steps; the outer
  // optimizer is elementwise, so stages synced apart equal the whole model synced at once (2 DiLoCo replicas).
  const std::string cli = TRIBUTARY_CLI;
  const std::string common =
      "--set model.num_layers=4 --set train.steps=6 --set train.batch_size=4 "
      "--set dist.algorithm=diloco --set dist.inner_steps=3 --set dist.compression=fp32 ";
  auto [rc1, out1] = sh(cli + " launch --nproc 2 --" + tiny("dl_whole", common));
  ASSERT_EQ(rc1, 0) << out1;
  auto [rc2, out2] = sh(cli + " launch --nproc 4 --" +
                        tiny("dl_stages", common + "--set parallel.pipeline_stages=2 --set parallel.micro_batches=2"));
  ASSERT_EQ(rc2, 0) << out2;
  auto a = flat_params(work() / "dl_whole"), b = flat_params(work() / "dl_stages");
  // The outer Nesterov step (lr 0.7, momentum 0.9) scales the pipeline's float reordering up: atol 1e-4 (a stage that
  // skipped its outer step would be off by its whole outer update).
  EXPECT_TRUE(torch::allclose(a, b, 1e-4, 1e-4)) << "max diff " << (a - b).abs().max().item<double>();
  auto s = nlohmann::json::parse(read_file(work() / "dl_stages" / "summary.json"));
  EXPECT_EQ(s["algorithm"], "pipeline+diloco");
  EXPECT_NE(out2.find("2 pipeline(s) of 2 stages: rank 0 sent"), std::string::npos) << out2;
  EXPECT_NE(out2.find("its stage's pseudo-gradients (2 outer steps)"), std::string::npos) << out2;
  EXPECT_EQ(s["outer_steps"].get<int>(), 2);
  // The same after a data-parallel warm-up of 2 steps (outer steps at 5 and 8): each stage averages its gradients over
  // its data group first, then starts DiLoCo from identical replicas.
  const std::string warm = common + "--set train.steps=8 --set dist.warmup_ddp_steps=2 ";
  auto [rc4, out4] = sh(cli + " launch --nproc 2 --" + tiny("dl_whole_warm", warm));
  ASSERT_EQ(rc4, 0) << out4;
  auto [rc5, out5] =
      sh(cli + " launch --nproc 4 --" +
         tiny("dl_stages_warm", warm + "--set parallel.pipeline_stages=2 --set parallel.micro_batches=2"));
  ASSERT_EQ(rc5, 0) << out5;
  auto c = flat_params(work() / "dl_whole_warm", 8), d = flat_params(work() / "dl_stages_warm", 8);
  EXPECT_TRUE(torch::allclose(c, d, 1e-4, 1e-4)) << "max diff " << (c - d).abs().max().item<double>();
  // (Without the average the replicas would differ when DiLoCo starts: the identity check would fail the run.)
  auto s2 = nlohmann::json::parse(read_file(work() / "dl_stages_warm" / "summary.json"));
  EXPECT_EQ(s2["outer_steps"].get<int>(), 2);
  // A stage's fragments are its own blocks: more fragments than a stage has blocks is refused naming the keys.
  auto [rc3, out3] = sh(cli + " launch --nproc 4 --" +
                        tiny("dl_bad", common + "--set parallel.pipeline_stages=2 --set dist.fragments=3"));
  EXPECT_NE(rc3, 0);
  EXPECT_NE(out3.find("dist.fragments = 3 but pipeline stage 0 owns 2 block(s)"), std::string::npos) << out3;
}

TEST_F(Distributed, AFrozenStageEndsThePipelineWithinTheDeadlineNamingTheMessage) {
  const std::string cli = TRIBUTARY_CLI;
  auto start = std::chrono::steady_clock::now();
  auto [rc, out] = sh("TRIBUTARY_FAIL_MODE=stop TRIBUTARY_FAIL_RANK=1 TRIBUTARY_FAIL_STEP=3 " + cli +
                      " launch --nproc 2 --grace 2 --" +
                      tiny("pp_frozen",
                           "--set model.num_layers=4 --set train.steps=50 --set train.batch_size=4 "
                           "--set dist.algorithm=ddp --set parallel.pipeline_stages=2 "
                           "--set parallel.micro_batches=2 --set dist.collective_timeout_s=4 "
                           "--set dist.store_timeout_s=4"));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(rc, 4) << out;
  EXPECT_NE(out.find("stage 0: gradient of micro-batch 0 at step 4 from stage 1"), std::string::npos) << out;
  EXPECT_NE(out.find("timed out after 4 s"), std::string::npos) << out;
  EXPECT_NE(out.find("rank 1 (pid"), std::string::npos) << out;
  EXPECT_LT(took, 40) << out;
}

TEST_F(Distributed, EveryMachineShowsItsOwnProgressAndHowItsPartEnded) {
  // Two launches of two workers: the second machine's console shows its first worker's step lines and a last line
  // saying where the run's outcome is, not only its start-up lines.
  const int port = free_tcp_port();
  auto node = [&](int n) {
    return fmt::format(
        "{} launch --nnodes 2 --node-rank {} --nproc 2 --master-port {} --{}", TRIBUTARY_CLI, n, port,
        tiny("machine_console", "--set train.steps=10 --set train.batch_size=4 --set dist.inner_steps=5"));
  };
  auto [rc, out] =
      sh("bash -c '" + node(0) + " > /dev/null 2>&1 & n0=$!; " + node(1) + "; rc=$?; wait $n0 || rc=1; exit $rc'");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("[rank 2] this machine: step     5/10"), std::string::npos) << out;
  EXPECT_NE(out.find("[rank 2] this machine: step    10/10"), std::string::npos) << out;
  EXPECT_EQ(out.find("[rank 3] this machine"), std::string::npos) << "one worker per machine speaks: " << out;
  EXPECT_NE(out.find("done on this machine: rank 2 took 10 steps"), std::string::npos) << out;
  EXPECT_EQ(out.find("run directory:"), std::string::npos) << "the run's own lines are the lead's: " << out;
}
