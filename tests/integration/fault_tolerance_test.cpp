// Fault-tolerant DiLoCo and data parallel through `tributary launch` (which hosts the store, or names a `tributary
// store`): real processes killed with SIGKILL or frozen with SIGSTOP mid-round, rank 0 included, a whole machine of
// workers lost, healed restarts; bad updates rejected; elastic resume with another number of workers. Replicas are
// hash-checked after every outer step inside the run (a mismatch fails it), so a run that completes kept its
// survivors identical.
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <chrono>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "launch_support.h"
#include "report_check.h"
#include "test_paths.h"  // generated: TRIBUTARY_CLI, TRIBUTARY_SOURCE_DIR, ...
#include "tributary/core/error.h"
#include "tributary/core/fs.h"
#include "tributary/launch/launcher.h"

using namespace tributary;

using test_support::Distributed;
using test_support::sh;
using test_support::tiny;
using test_support::work;

namespace {

// 4 workers, H = 4, 16 steps: a fault injected at step 6 falls in the second round.
std::pair<int, std::string> ft_run(const std::string& env, const std::string& run, const std::string& extra = "",
                                   const std::string& launch_extra = "") {
  return sh(env + " " + std::string(TRIBUTARY_CLI) + " launch --nproc 4 --master-port 0 --max-failures 1 --grace 2 " +
            launch_extra + " --" +
            tiny(run,
                 "--set train.steps=16 --set train.batch_size=4 --set dist.inner_steps=4 "
                 "--set dist.fault_tolerant=true --set dist.heartbeat_timeout_s=2 "
                 "--set dist.collective_timeout_s=30 --set dist.store_timeout_s=30 " +
                     extra));
}

nlohmann::json summary_of(const std::string& run) {
  return nlohmann::json::parse(read_file(work() / run / "summary.json"));
}

// The participants' scores of every exchange of a robust run (metrics.jsonl's exchange lines), in order.
std::vector<nlohmann::json> scores_per_exchange(const std::string& run) {
  std::vector<nlohmann::json> out;
  std::istringstream in(read_file(work() / run / "metrics.jsonl"));
  for (std::string line; std::getline(in, line);)
    if (auto j = nlohmann::json::parse(line); j.contains("scores")) out.push_back(std::move(j["scores"]));
  return out;
}

// world_size of every outer step's metrics line, in order.
std::vector<int> world_sizes(const std::string& run) {
  std::vector<int> out;
  std::istringstream in(read_file(work() / run / "metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("outer_step")) out.push_back(j.at("world_size").get<int>());
  }
  return out;
}

void expect_survived(const std::string& run, int rc, const std::string& out, int dead) {
  ASSERT_EQ(rc, 0) << out;
  const auto s = summary_of(run);
  EXPECT_EQ(s["world_size"].get<int>(), 3);
  EXPECT_EQ(s["outer_steps"].get<int>(), 4) << "the discarded round is redone, not skipped";
  EXPECT_EQ(s["reformations"].get<int>(), 1) << out;
  EXPECT_EQ(s["steps"].get<int>(), 16);
  EXPECT_TRUE(std::isfinite(s["val_loss"].get<double>()));
  EXPECT_EQ(world_sizes(run), (std::vector<int>{4, 3, 3, 3})) << "metrics show the smaller world";
  EXPECT_NE(out.find(fmt::format("worker(s) {} dropped out", dead)), std::string::npos) << out;
  EXPECT_NE(out.find(fmt::format("discarded: worker(s) {} fell silent", dead)), std::string::npos)
      << "the round's log names the cause\n"
      << out;
}

}  // namespace

TEST_F(Distributed, FaultTolerantDilocoSurvivesAKilledWorker) {
  auto [rc, out] = ft_run("TRIBUTARY_FAIL_RANK=2 TRIBUTARY_FAIL_STEP=6", "ft_kill2");
  expect_survived("ft_kill2", rc, out, 2);
  // The run report shows the death: the members' count fell to 3 at the round it happened in; workers 0, 1 and 3
  // have their own lines to the end (worker 2's stop at its death); every section renders in a real browser.
  test_support::expect_report_opens(
      work() / "ft_kill2", {"4 -&gt; 3 workers", "<td>worker 3</td>", "<td>worker 2</td>", "Workers per round"},
      "overview loss workers communication timeline faults config");
}

TEST_F(Distributed, FaultTolerantDilocoSurvivesTheDeathOfRankZero) {
  // The store lives in launch, so rank 0 may die too; worker 1 then leads (metrics, evaluation, summary).
  auto [rc, out] = ft_run("TRIBUTARY_FAIL_RANK=0 TRIBUTARY_FAIL_STEP=6", "ft_kill0");
  expect_survived("ft_kill0", rc, out, 0);
  EXPECT_NE(out.find("worker 1 leads the run"), std::string::npos) << out;
}

TEST_F(Distributed, FaultTolerantDilocoHealsARestartedRankZeroFromAPeer) {
  // launch --max-restarts 1 restarts the killed rank 0; it joins at the first outer step after it asked, receives the
  // parameters, AdamW and outer state from the lead (worker 1 by then) and trains on: the world is 4 again, and the
  // replica hash check after the join and after every later outer step passes. 32 steps, every worker slowed 3x,
  // leave its start-up (slower on a loaded machine) several outer steps to join at: unslowed, once the fused kernels
  // ran multi-threaded, the survivors finished the run before the restarted process was up in 2 of 3 runs.
  auto [rc, out] = ft_run("TRIBUTARY_FAIL_RANK=0 TRIBUTARY_FAIL_STEP=6", "ft_heal0",
                          "--set train.steps=32 --set dist.slow_workers=0:3,1:3,2:3,3:3", "--max-restarts 1");
  ASSERT_EQ(rc, 0) << out;
  const auto s = summary_of("ft_heal0");
  EXPECT_EQ(s["world_size"].get<int>(), 4);
  EXPECT_EQ(s["outer_steps"].get<int>(), 8);
  EXPECT_EQ(s["reformations"].get<int>(), 2) << "dropped, then joined";
  const auto sizes = world_sizes("ft_heal0");
  ASSERT_EQ(sizes.size(), 8u);
  EXPECT_EQ(sizes[0], 4);
  EXPECT_EQ(sizes[1], 3) << "the round of the death is redone by three";
  EXPECT_EQ(sizes.back(), 4) << fmt::format("{}", fmt::join(sizes, ","));
  std::smatch m;
  // admitted after a round, or healed mid-round and a member from its next round on ("... (round xN) as ...")
  const std::regex joined(R"(worker 0 joined at step (\d+)( \(round x\d+\))? as rank 3 of 4)");
  ASSERT_TRUE(std::regex_search(out, m, joined)) << out;
  EXPECT_GE(std::stoi(m[1]), 8);
  EXPECT_NE(out.find("restarting it to rejoin the run"), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(work() / "ft_heal0" / "checkpoints" / "step-00000032" / "rank-3.model.safetensors"))
      << "the healed worker takes part in the checkpoint";
}

TEST_F(Distributed, FaultTolerantDilocoHealsARestartedWorkerMidRoundAndCountsItInThatRound) {
  // H = 20 and every worker slowed 10x, so a round outlasts a restart. Worker 2 dies at step 2 (early: on a loaded CI
  // machine the lead ran 14 steps ahead of a worker that died at step 6, and the heal fell on the boundary); launch
  // restarts it and it asks to join at once; the lead sends it its state at its next step (no round boundary needed),
  // the replacement trains on, and the lead's proposal before round x0's collective swaps the dead worker for it: no
  // round is discarded, every outer step averages four pseudo-gradients, and the hash check after each passes.
  // Heartbeat deadline 5 s (the kill is reported by launch at once): with 2 s a CI run's member took the lead, alive
  // but starved, for dead and proposed no change.
  auto [rc, out] = ft_run("TRIBUTARY_FAIL_RANK=2 TRIBUTARY_FAIL_STEP=2", "ft_midround",
                          "--set train.steps=20 --set dist.inner_steps=20 --set dist.heartbeat_timeout_s=5 "
                          "--set dist.slow_workers=0:10,1:10,2:10,3:10",
                          "--max-restarts 1");
  ASSERT_EQ(rc, 0) << out;
  const auto s = summary_of("ft_midround");
  EXPECT_EQ(s["world_size"].get<int>(), 4);
  EXPECT_EQ(s["outer_steps"].get<int>(), 1);
  EXPECT_EQ(s["reformations"].get<int>(), 1) << "one change of members: the replacement for its old self";
  EXPECT_EQ(s["tokens"].get<int64_t>(), 20 * 4 * 4 * 64) << "every step counted four workers";
  EXPECT_EQ(world_sizes("ft_midround"), (std::vector<int>{4}));
  EXPECT_EQ(out.find("discarded"), std::string::npos) << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex(R"(worker 2 healed from the lead at step (\d+))"))) << out;
  EXPECT_LT(std::stoi(m[1]), 20) << "healed inside the round of its death";
  EXPECT_NE(out.find("worker 2 joined at step 20 (round x0) as rank 3 of 4"), std::string::npos) << out;
}

TEST_F(Distributed, AFaultTolerantRunThatLostEveryWorkerEndsAsRunLostInsteadOfRestartingForever) {
  // All four workers die at step 2 (a whole cluster pre-empted). launch restarts them, but nobody holds the run's
  // state any more: the first replacement to see that exits with status 5, and launch stops the others instead of
  // restarting them (each used to wait for dist.store_timeout_s, then be restarted, up to --max-restarts).
  const auto start = std::chrono::steady_clock::now();
  auto [rc, out] = ft_run("TRIBUTARY_FAIL_RANK=0,1,2,3 TRIBUTARY_FAIL_STEP=2", "ft_all_lost", "", "--max-restarts 20");
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(rc, kRunLostStatus) << out;
  EXPECT_NE(out.find("no member of the run is left to heal from"), std::string::npos) << out;
  EXPECT_NE(out.find("found no live member to heal from"), std::string::npos) << out;
  int restarts = 0;
  for (size_t at = out.find("restarting it to rejoin"); at != std::string::npos;
       at = out.find("restarting it to rejoin", at + 1))
    ++restarts;
  EXPECT_LE(restarts, 4) << "each dead worker restarted once at most\n" << out;
  EXPECT_LT(took, 25.0) << "not the 30 s store deadline of a replacement\n" << out;
}

TEST_F(Distributed, AWorkerThatFailsAtStartUpIsNotRestarted) {
  // A mistake in the configuration fails every worker at start-up; restarting them would fail the same way, over and
  // over up to --max-restarts (it used to: 20 restarts in a row). launch restarts only after the run got going.
  auto [rc, out] = ft_run("", "ft_bad_config", "--set optim.warmup_steps=100", "--max-restarts 20");
  EXPECT_EQ(rc, kUserErrorStatus) << out;
  EXPECT_NE(out.find("optim.warmup_steps (100) is longer than train.steps (16)"), std::string::npos) << out;
  EXPECT_NE(out.find("--set optim.warmup_steps=1 "), std::string::npos) << out;  // what to set, for a short run
  EXPECT_NE(out.find("before the run got through start-up"), std::string::npos) << out;
  EXPECT_EQ(out.find("restarting it to rejoin"), std::string::npos) << out;
}

TEST_F(Distributed, AWorkerKilledAfterStartUpOfARunWithoutFaultToleranceStopsItInsteadOfStartingItOver) {
  // Without dist.fault_tolerant nobody set run/started, so launch (--max-restarts) took a death at step 6 for one
  // before start-up: it said "nothing was trained" and started the run again from step 0, throwing away its steps.
  auto [rc, out] = ft_run("TRIBUTARY_FAIL_RANK=1 TRIBUTARY_FAIL_STEP=6", "ft_fixed_killed",
                          "--set dist.fault_tolerant=false", "--max-restarts 1");
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("after the run got through start-up; the run is not fault tolerant"), std::string::npos) << out;
  EXPECT_NE(out.find("set dist.fault_tolerant = true"), std::string::npos) << out;
  EXPECT_EQ(out.find("nothing was trained"), std::string::npos) << out;
}

namespace {

// The pid of the worker of launch rank `rank` whose command line names `marker` (its run directory), or 0.
pid_t worker_pid(const std::string& marker, int rank) {
  std::error_code ec;
  for (const auto& proc : fs::directory_iterator("/proc", ec)) {
    const std::string pid = proc.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    try {
      const std::string cmdline = read_file(proc.path() / "cmdline"), environ = read_file(proc.path() / "environ");
      if (cmdline.find(marker) == std::string::npos || cmdline.find("launch") != std::string::npos) continue;
      if (environ.find(fmt::format("{}RANK={}{}", '\0', rank, '\0')) != std::string::npos) return std::stoi(pid);
    } catch (const std::exception&) {  // gone meanwhile
    }
  }
  return 0;
}

}  // namespace

// SIGKILLs the worker of rank `rank` whose command line holds `marker` as soon as it exists (within 30 s).
std::thread kill_once_it_exists(const std::string& marker, int rank, std::atomic<bool>& killed) {
  return std::thread([marker, rank, &killed] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      if (const pid_t pid = worker_pid(marker, rank)) {
        killed = ::kill(pid, SIGKILL) == 0;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
}

TEST_F(Distributed, AWorkerKilledInTheFirstSecondStartsTheRunAgainAndItCompletes) {
  // Fault tolerance from the first second (issue 46): rank 1 is SIGKILLed as soon as it exists, before the run got
  // through start-up. Nothing was trained, so launch (--max-restarts) stops the other and starts the whole run again
  // on a fresh store; the run completes, and trains what the run without the kill trains, bit for bit.
  auto [rc0, out0] = ft_run("", "ft_first_second_ref", "", "--max-restarts 1");
  ASSERT_EQ(rc0, 0) << out0;
  std::atomic<bool> killed{false};
  std::thread killer = kill_once_it_exists("ft_first_second_run", 1, killed);
  auto [rc, out] = ft_run("", "ft_first_second_run", "", "--max-restarts 1");
  killer.join();
  ASSERT_TRUE(killed.load()) << out;
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("before the run got through start-up (nothing was trained): stopping the others and starting "
                     "the run again"),
            std::string::npos)
      << out;
  EXPECT_TRUE(torch::equal(test_support::flat_params(work() / "ft_first_second_ref", 16),
                           test_support::flat_params(work() / "ft_first_second_run", 16)))
      << "the run started again trains what the run without the kill trains";
}

TEST_F(Distributed, AWorkerKilledInTheFirstSecondOnAnotherMachineStartsEveryMachineAgain) {
  // The same on two machines (two launches, --nnodes 2, one run secret): the second machine's rank 3 is SIGKILLed as
  // soon as it exists. Its launch asks every launch, through the run's store, to start the run again; the first
  // machine's launch stops its workers and starts them again too, under the next attempt's keys on the same store;
  // the run trains what the run without the kill trains. Before, the other machine's ranks waited at the rendezvous
  // until dist.store_timeout_s.
  write_file(work() / "mn_secret", "the secret of a run on two machines", false);
  auto two_machines = [&](const std::string& run) {
    const int port = free_tcp_port();
    auto node = [&](int n) {
      return fmt::format(
          "{} launch --nnodes 2 --node-rank {} --nproc 2 --master-port {} --secret-file {} "
          "--max-failures 1 --max-restarts 1 --grace 2 --{}",
          TRIBUTARY_CLI, n, port, (work() / "mn_secret").string(),
          tiny(run,
               "--set train.steps=16 --set train.batch_size=4 --set dist.inner_steps=4 "
               "--set dist.fault_tolerant=true --set dist.heartbeat_timeout_s=2 "
               "--set dist.collective_timeout_s=30 --set dist.store_timeout_s=30"));
    };
    return sh("bash -c '" + node(0) + " & n0=$!; " + node(1) + "; rc=$?; wait $n0 || rc=1; exit $rc'");
  };
  auto [rc0, out0] = two_machines("mn_first_second_ref");
  ASSERT_EQ(rc0, 0) << out0;
  std::atomic<bool> killed{false};
  std::thread killer = kill_once_it_exists("mn_first_second_run", 3, killed);
  auto [rc, out] = two_machines("mn_first_second_run");
  killer.join();
  ASSERT_TRUE(killed.load()) << out;
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("another machine's launch starts the run again"), std::string::npos) << out;
  EXPECT_TRUE(torch::equal(test_support::flat_params(work() / "mn_first_second_ref", 16),
                           test_support::flat_params(work() / "mn_first_second_run", 16)))
      << "the run started again on both machines trains what the run without the kill trains";
}

TEST_F(Distributed, AMachineStartedAgainAfterItsLaunchWasKilledJoinsTheRunItLeft) {
  // Two machines of two workers, fault tolerant. Machine 1's launch is SIGKILLed while the run trains (its workers die
  // with it), and the same command is started again. Its workers must come back as joiners: the members drop the dead
  // at their heartbeat deadline, heal the returning workers and finish with all four. Before, the new workers entered
  // a fresh rendezvous under the dead ranks' ids, their heartbeats kept the dead "alive", and the run hung (3 of 3);
  // with this test, before the fix, they failed, were restarted as joiners one by one and the run ended on 3.
  fs::remove_all(work() / "mn_return");  // its metrics, polled below, are this run's
  const int port = free_tcp_port();
  const std::string node1 = fmt::format(
      "{} launch --nnodes 2 --node-rank 1 --nproc 2 --master-port {} --max-failures 2 --max-restarts 2 --grace 2 --{}",
      TRIBUTARY_CLI, port,
      tiny("mn_return",
           "--set train.steps=120 --set train.batch_size=4 --set dist.inner_steps=4 "
           "--set dist.fault_tolerant=true --set dist.heartbeat_timeout_s=2 --set dist.collective_timeout_s=30 "
           "--set dist.store_timeout_s=30 --set dist.slow_workers=0:10,1:10,2:10,3:10"));
  std::string node0 = node1;
  node0.replace(node0.find("--node-rank 1"), 13, "--node-rank 0");
  const std::string metrics = (work() / "mn_return" / "metrics.jsonl").string();
  const std::string script = fmt::format(
      "({node0}) > {log}.node0 2>&1 & n0=$!; ({node1}) > {log}.node1 2>&1 & n1=$!; "
      "for i in $(seq 1200); do grep -q '\"step\": *[2-9][0-9][,}}]' {metrics} 2>/dev/null && break; sleep 0.1; done; "
      "kill -9 $n1; wait $n1; ({node1}) > {log}.again 2>&1; again=$?; wait $n0; rc=$?; "
      "cat {log}.node0 {log}.again; echo node0 exit $rc again exit $again; exit $(( rc + again ))",
      fmt::arg("node0", "exec " + node0), fmt::arg("node1", "exec " + node1), fmt::arg("metrics", metrics),
      fmt::arg("log", (work() / "mn_return").string()));
  write_file(work() / "mn_return.sh", script, false);
  auto [rc, out] = sh("timeout 300 bash " + (work() / "mn_return.sh").string());
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("is already going on: this machine's workers join it"), std::string::npos) << out;
  EXPECT_NE(out.find("dropped out"), std::string::npos) << "the members dropped the dead first\n" << out;
  for (int rank : {2, 3})
    EXPECT_TRUE(std::regex_search(out, std::regex(fmt::format(R"(worker {} joined at step \d+)", rank)))) << out;
  const auto s = summary_of("mn_return");
  EXPECT_EQ(s["steps"].get<int>(), 120);
  EXPECT_EQ(s["world_size"].get<int>(), 4) << "the returned machine's workers train to the end";
}

// Three survivors of four trained to the end and took the final checkpoint together (no staging left behind).
void expect_final_checkpoint_by_three(const std::string& run) {
  const auto s = summary_of(run);
  EXPECT_EQ(s["steps"].get<int>(), 16);
  EXPECT_EQ(s["world_size"].get<int>(), 3);
  EXPECT_FALSE(s["val_loss"].is_null()) << "the lead evaluated";
  EXPECT_TRUE(fs::exists(work() / run / "checkpoints" / "step-00000016" / "model.safetensors"));
  EXPECT_FALSE(fs::exists(work() / run / "checkpoints" / "step-00000016.tmp-ranks"));
}

TEST_F(Distributed, ALeadKilledAfterTheLastRoundLeavesTheLivingToTakeTheFinalCheckpoint) {
  // Rank 0, the lead, dies after the last outer step, before the final evaluation and checkpoint (whose collectives
  // would find it gone): the members settle who is alive first, re-form without it, and the three survivors — worker
  // 1 leading — evaluate and write the checkpoint and the summary. Before, the checkpoint's all-gather failed on every
  // survivor and the run ended with status 4.
  auto [rc, out] = ft_run("TRIBUTARY_FAIL_RANK=0 TRIBUTARY_FAIL_CHECKPOINT=16", "ft_last_checkpoint");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("worker(s) 0 dropped out"), std::string::npos) << out;
  EXPECT_NE(out.find("worker 1 leads the run from step 16"), std::string::npos) << out;
  expect_final_checkpoint_by_three("ft_last_checkpoint");
}

TEST_F(Distributed, AWorkerKilledInsideTheFinalCheckpointLeavesTheLivingToTakeItAgain) {
  // Rank 2 dies as the final checkpoint begins, after the members agreed who takes it: the others' checkpoint
  // collectives give up at its death, the living settle without it and take the checkpoint again. Before, every
  // survivor failed with a NetworkError and the run ended with status 4 (benchmarks §21's "checkpoint" moment).
  auto [rc, out] = ft_run("TRIBUTARY_FAIL_RANK=2 TRIBUTARY_FAIL_IN_CHECKPOINT=16", "ft_in_checkpoint");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("the living settle and take it again"), std::string::npos) << out;
  EXPECT_NE(out.find("round ckpt16.1 discarded: worker(s) 2 fell silent"), std::string::npos) << out;
  expect_final_checkpoint_by_three("ft_in_checkpoint");
}

TEST_F(Distributed, FaultTolerantDilocoDropsAFrozenWorkerAtItsHeartbeatDeadline) {
  auto [rc, out] = ft_run("TRIBUTARY_FAIL_MODE=stop TRIBUTARY_FAIL_RANK=1 TRIBUTARY_FAIL_STEP=6", "ft_stop1");
  expect_survived("ft_stop1", rc, out, 1);
  // The survivors' collective is abandoned once the frozen worker's heartbeat is 2 s stale, not at the 30 s deadline.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex(R"(abandoned after ([0-9.]+) s)"))) << out;
  EXPECT_LT(std::stod(m[1]), 2.0 + 1.0) << out;
  EXPECT_NE(out.find("killing the stopped rank 1"), std::string::npos) << out;
}

TEST_F(Distributed, WithACodecOnTheWireAFrozenWorkerIsDroppedAtItsHeartbeatDeadline) {
  // int8's exchange is a quantised ring of point-to-point hops, not one collective: the hop that waits on the frozen
  // worker is aborted once its heartbeat is 2 s stale, as a collective is abandoned, not at the 30 s deadline.
  auto [rc, out] = ft_run("TRIBUTARY_FAIL_MODE=stop TRIBUTARY_FAIL_RANK=1 TRIBUTARY_FAIL_STEP=6", "ft_stop_int8",
                          "--set dist.compression=int8");
  expect_survived("ft_stop_int8", rc, out, 1);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex(R"(ring step .* abandoned after ([0-9.]+) s)"))) << out;
  EXPECT_LT(std::stod(m[1]), 2.0 + 1.0) << out;
}

TEST_F(Distributed, NonFiniteAndOversizedUpdatesAreRejected) {
  const std::string args = "--set dist.fault_tolerant=false --set dist.reject_norm_factor=5";
  auto [rc0, out0] = ft_run("", "reject_clean", args);
  ASSERT_EQ(rc0, 0) << out0;
  const double clean = summary_of("reject_clean")["val_loss"].get<double>();
  EXPECT_EQ(summary_of("reject_clean")["rejected"].get<int>(), 0);
  for (const std::string bad : {"nan", "scale100"}) {
    const std::string run = "reject_" + bad;
    auto [rc, out] = ft_run("TRIBUTARY_BAD_UPDATE_RANK=1 TRIBUTARY_BAD_UPDATE=" + bad, run, args);
    ASSERT_EQ(rc, 0) << out;
    const auto s = summary_of(run);
    EXPECT_EQ(s["rejected"].get<int>(), 4) << bad << ": rank 1's update in each of the 4 outer steps";
    EXPECT_NEAR(s["val_loss"].get<double>(), clean, 0.02 * clean) << bad;
    EXPECT_NE(out.find("rank 1's update refused in exchange"), std::string::npos) << out;
  }
  // Without the guard the same 100x update ruins the run: the check above can fail.
  auto [rc1, out1] = ft_run("TRIBUTARY_BAD_UPDATE_RANK=1 TRIBUTARY_BAD_UPDATE=scale100", "reject_off",
                            "--set dist.fault_tolerant=false");
  ASSERT_EQ(rc1, 0) << out1;
  EXPECT_GT(summary_of("reject_off")["val_loss"].get<double>(), 1.5 * clean);
}

// A participant holding the run's secret sends its update negated (train --adversary 1:sign_flip): it passes the
// norm test, the median keeps it from moving the model, and its cosine with the aggregate (metrics' scores) stays
// below dist.min_score, so it is evicted after dist.evict_after exchanges, told why, and refused from then on; no
// honest worker is refused. A malformed --adversary names the flag.
TEST_F(Distributed, ALyingReplicaIsOutvotedScoredAndEvicted) {
  const std::string args =
      "--set dist.fault_tolerant=false --set dist.aggregate=median --set dist.reject_norm_factor=10 "
      "--set dist.evict_after=2 --set dist.min_score=0";
  auto [rc0, out0] = ft_run("", "robust_clean", args);
  ASSERT_EQ(rc0, 0) << out0;
  const double clean = summary_of("robust_clean")["val_loss"].get<double>();
  auto [rc, out] = ft_run("", "robust_sign_flip", args + " --adversary 1:sign_flip");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("rank 1 evicted in exchange 2"), std::string::npos) << out;
  EXPECT_NE(out.find("was evicted by the others"), std::string::npos) << out;
  EXPECT_EQ(summary_of("robust_sign_flip")["rejected"].get<int>(), 2) << "exchanges 3 and 4 refuse it";
  const auto scores = scores_per_exchange("robust_sign_flip");
  EXPECT_EQ(scores.size(), 4u);
  for (const auto& s : scores) {
    for (const char* honest : {"0", "2", "3"}) EXPECT_GT(s[honest].get<double>(), 0) << s;
    EXPECT_LT(s["1"].get<double>(), 0) << s;
  }
  EXPECT_NEAR(summary_of("robust_sign_flip")["val_loss"].get<double>(), clean, 0.03 * clean);
  // The report shows every participant's score per exchange, and the liar refused twice.
  test_support::expect_report_opens(work() / "robust_sign_flip",
                                    {"Participants' scores", "<td>participant 1</td><td>4</td><td>2</td>"},
                                    "overview loss workers communication scores timeline faults config");
  auto [rc2, out2] = sh(std::string(TRIBUTARY_CLI) + " train --adversary 1:lies 2>&1");
  EXPECT_NE(rc2, 0);
  EXPECT_NE(out2.find("--adversary '1:lies': 'lies' is not a kind"), std::string::npos) << out2;
}

// Fault tolerant and robust: worker 1 negates its update and is evicted at exchange 2; worker 2 is then killed,
// restarted by its launch and healed. The verdicts travel with the heal, so the replacement refuses worker 1 as the
// members do: every later outer step's replica hash check passes (a replacement that accepted worker 1's update would
// apply another median than the members, and the check would stop the run), and worker 1 stays refused to the end.
TEST_F(Distributed, AnEvictionOutlivesAHealedWorker) {
  auto [rc, out] = ft_run("TRIBUTARY_FAIL_RANK=2 TRIBUTARY_FAIL_STEP=10", "ft_evicted_heal",
                          "--set train.steps=32 --set dist.slow_workers=0:3,1:3,2:3,3:3 --set dist.aggregate=median "
                          "--set dist.evict_after=2 --set dist.min_score=0 --adversary 1:sign_flip",
                          "--max-restarts 1");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("worker 1 evicted in exchange 2"), std::string::npos) << out;
  const std::regex joined(R"(worker 2 (joined at step \d+|healed from the lead at step \d+))");
  EXPECT_TRUE(std::regex_search(out, joined)) << out;
  const auto s = summary_of("ft_evicted_heal");
  EXPECT_EQ(s["world_size"].get<int>(), 4) << out;
  EXPECT_EQ(s["outer_steps"].get<int>(), 8);
  const auto scores = scores_per_exchange("ft_evicted_heal");
  ASSERT_FALSE(scores.empty());
  EXPECT_EQ(scores.back()["1"].get<double>(), -1) << "refused to the end: " << scores.back();
}

// dist.score = "loss" (Covenant's Gauntlet): every update is judged by three other replicas by the loss it alone brings
// on a probe batch none of its senders could choose (at its weight in the mean). The negated update raises that loss,
// and its rating, moving a quarter of the way to -1 each exchange, falls below dist.min_score at the third: refused
// there, the reason naming the rating; with its cosine with the aggregate below min_score in the first two, that is
// its third strike, and it is evicted. The honest keep ratings near 1 and the model ends where the honest run's does.
TEST_F(Distributed, ALiarIsRatedByTheLossItsUpdateBringsAndEvicted) {
  const std::string args =
      "--set dist.fault_tolerant=false --set dist.aggregate=median --set dist.score=loss --set dist.evict_after=3 "
      "--set dist.min_score=0.2";
  auto [rc, out] = ft_run("", "loss_scored", args + " --adversary 1:sign_flip");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("rank 1's update refused in exchange 3 (3 of 4 accepted, dist.aggregate = median): a loss "
                     "rating of"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("rank 1 evicted in exchange 3"), std::string::npos) << out;
  EXPECT_EQ(summary_of("loss_scored")["rejected"].get<int>(), 2) << "exchanges 3 and 4 refuse it";
  const auto scores = scores_per_exchange("loss_scored");
  ASSERT_EQ(scores.size(), 4u);
  for (size_t x = 0; x < scores.size(); ++x) {
    for (const char* honest : {"0", "2", "3"}) EXPECT_GT(scores[x][honest].get<double>(), 0.5) << scores[x];
    EXPECT_LT(scores[x]["1"].get<double>(), x >= 2 ? -0.99 : 0.8 - 0.5 * double(x))
        << "exchange " << x + 1 << ": " << scores[x];
  }
  auto [rc0, out0] = ft_run("", "loss_scored_clean", args);
  ASSERT_EQ(rc0, 0) << out0;
  EXPECT_EQ(out0.find("refused"), std::string::npos) << "no honest update is refused\n" << out0;
  const double clean = summary_of("loss_scored_clean")["val_loss"].get<double>();
  EXPECT_NEAR(summary_of("loss_scored")["val_loss"].get<double>(), clean, 0.03 * clean);
}

// Identities (comm/identity.h): with launch --secret-file F each rank has its own key pair F.identity-<rank>, made on
// first start; `tributary identity` prints its public key. An admission list with ranks 0-2's keys admits them and
// the robust exchange's updates are signed and checked (the run completes, nothing refused); without rank 3's key
// the rendezvous refuses rank 3 by name and every rank stops with that reason.
TEST_F(Distributed, OnlyAdmittedIdentitiesJoinAndSignTheirUpdates) {
  const fs::path dir = work() / "identities";
  fs::create_directories(dir);
  const fs::path secret = dir / "run.secret";
  sh("head -c 32 /dev/urandom > " + secret.string());
  const std::string cli = TRIBUTARY_CLI;
  std::string keys;
  for (int r = 0; r < 4; ++r) {
    auto [rc, out] = sh(cli + " identity --file " + secret.string() + ".identity-" + std::to_string(r));
    ASSERT_EQ(rc, 0) << out;
    ASSERT_GE(out.size(), 64u) << out;
    keys += out.substr(out.size() - 65, 64) + "\n";
  }
  const std::string admitted = (dir / "admitted").string();
  std::ofstream(admitted) << keys;
  auto run = [&](const std::string& name) {
    return ft_run("", name,
                  "--set dist.fault_tolerant=false --set dist.aggregate=median --set dist.admission=" + admitted,
                  "--secret-file " + secret.string());
  };
  auto [rc, out] = run("identities_all");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(summary_of("identities_all")["rejected"].get<int>(), 0) << out;
  EXPECT_EQ(out.find("not signed by that participant's identity"), std::string::npos) << out;
  std::ofstream(admitted) << keys.substr(0, 3 * 65);  // rank 3's key left out
  auto [rc2, out2] = run("identities_three");
  EXPECT_NE(rc2, 0);
  EXPECT_NE(out2.find("rank 3: this participant's identity"), std::string::npos) << out2;
  EXPECT_NE(out2.find("is not on the run's admission list"), std::string::npos) << out2;
}

// world_size of every data-parallel exchange line in the metrics (one per log_every steps), in order.
static std::vector<int> exchange_world_sizes(const std::string& run) {
  std::vector<int> out;
  std::istringstream in(read_file(work() / run / "metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("world_size") && j.contains("bytes_sent")) out.push_back(j.at("world_size").get<int>());
  }
  return out;
}

TEST_F(Distributed, FaultTolerantDataParallelCompletesTheStepOfADeathAndHealsTheWorker) {
  // Every data-parallel step is a round: worker 2 dies in step 6's; the three survivors redo that one round over their
  // own gradients (the step is completed, not lost), re-shard the data and go on; the restarted worker joins at a
  // step boundary, healed from the lead, and the replica check (after the join) passes.
  auto [rc, out] = ft_run("TRIBUTARY_FAIL_RANK=2 TRIBUTARY_FAIL_STEP=6", "ft_ddp",
                          "--set dist.algorithm=ddp "
                          "--set train.steps=40 --set train.log_every=1",
                          "--max-restarts 1");
  ASSERT_EQ(rc, 0) << out;
  const auto s = summary_of("ft_ddp");
  EXPECT_EQ(s["steps"].get<int>(), 40);
  EXPECT_EQ(s["world_size"].get<int>(), 4) << "the restarted worker joined";
  EXPECT_EQ(s["reformations"].get<int>(), 2) << "dropped, then joined";
  EXPECT_TRUE(std::isfinite(s["val_loss"].get<double>()));
  std::smatch m;
  const std::string text = out;
  const std::regex discard(R"(worker 0: round (\S+) discarded)");
  const auto discarded = std::distance(std::sregex_iterator(text.begin(), text.end(), discard), std::sregex_iterator());
  EXPECT_EQ(discarded, 1) << "at most one step redone per failure\n" << out;
  EXPECT_NE(out.find("discarded: worker(s) 2 fell silent"), std::string::npos) << out;
  // launch reports the kill to the store: the survivors drop worker 2 at once, not at its 2 s heartbeat deadline
  EXPECT_NE(out.find("worker 2 exited (its launch reported the death)"), std::string::npos) << out;
  EXPECT_EQ(out.find("worker 2 has sent no heartbeat"), std::string::npos) << out;
  EXPECT_NE(out.find("data re-sharded over 3 worker(s) (was 4)"), std::string::npos) << out;
  EXPECT_NE(out.find("data re-sharded over 4 worker(s) (was 3)"), std::string::npos) << out;
  ASSERT_TRUE(std::regex_search(out, m, std::regex(R"(worker 2 joined at step (\d+) as rank 3 of 4)"))) << out;
  const auto sizes = exchange_world_sizes("ft_ddp");
  ASSERT_FALSE(sizes.empty());
  EXPECT_EQ(sizes.front(), 4);
  EXPECT_NE(std::find(sizes.begin(), sizes.end(), 3), sizes.end()) << "metrics show the smaller world";
  EXPECT_EQ(sizes.back(), 4);
}

TEST_F(Distributed, FaultTolerantStreamingDilocoWithOverlapSurvivesAKilledWorker) {
  // Two fragments (syncs at 4, 8, ... and 6, 10, ...), each exchange overlapping the next inner step. Worker 1 dies
  // after step 9: the exchange sent at step 10 runs on the communication thread while the survivors train step 11,
  // fails there, re-forms and is redone by three; it lands at step 11 on every survivor (the round's outcome is taken
  // when it lands, not when the communication thread decided it). The hash check after every landed outer step
  // keeps passing.
  auto [rc, out] = ft_run("TRIBUTARY_FAIL_RANK=1 TRIBUTARY_FAIL_STEP=9", "ft_stream",
                          "--set dist.fragments=2 --set dist.overlap_steps=1");
  ASSERT_EQ(rc, 0) << out;
  const auto s = summary_of("ft_stream");
  EXPECT_EQ(s["steps"].get<int>(), 16);
  EXPECT_EQ(s["world_size"].get<int>(), 3);
  EXPECT_EQ(s["outer_steps"].get<int>(), 8) << "4 per fragment: the discarded round is redone, not skipped";
  EXPECT_EQ(s["reformations"].get<int>(), 1) << out;
  EXPECT_TRUE(std::isfinite(s["val_loss"].get<double>()));
  const auto sizes = world_sizes("ft_stream");
  ASSERT_EQ(sizes.size(), 7u) << "one line per step with a landing; both fragments land at step 16\n"
                              << fmt::format("{}", fmt::join(sizes, ","));
  EXPECT_EQ(sizes.front(), 4);
  EXPECT_EQ(sizes.back(), 3) << "metrics show the smaller world";
  EXPECT_NE(out.find("worker(s) 1 dropped out"), std::string::npos) << out;
  EXPECT_NE(out.find("discarded: worker(s) 1 fell silent"), std::string::npos) << out;
}

TEST_F(Distributed, FaultTolerantDilocoWarmUpCompletesTheStepOfADeathAndHealsTheWorkerIntoIt) {
  // DiLoCo's data-parallel warm-up (32 steps) is fault tolerant like data parallel: worker 3 dies in step 4's round,
  // the survivors complete that step; the restarted worker joins during the warm-up (as a data-parallel replica) and
  // goes on into the streaming DiLoCo phase with the others. Every worker is slowed 4x so the warm-up outlasts the
  // restart.
  auto [rc, out] = ft_run("TRIBUTARY_FAIL_RANK=3 TRIBUTARY_FAIL_STEP=4", "ft_warm",
                          "--set train.steps=48 --set dist.warmup_ddp_steps=32 --set dist.fragments=2 "
                          "--set dist.overlap_steps=1 --set dist.slow_workers=0:4,1:4,2:4,3:4",
                          "--max-restarts 1");
  ASSERT_EQ(rc, 0) << out;
  const auto s = summary_of("ft_warm");
  EXPECT_EQ(s["steps"].get<int>(), 48);
  EXPECT_EQ(s["world_size"].get<int>(), 4) << "the restarted worker joined";
  EXPECT_EQ(s["reformations"].get<int>(), 2) << "dropped, then joined";
  EXPECT_EQ(s["outer_steps"].get<int>(), 8) << "16 DiLoCo steps, 2 fragments, H = 4";
  const std::string text = out;
  const std::regex discard(R"(worker 0: round (\S+) discarded)");
  EXPECT_EQ(std::distance(std::sregex_iterator(text.begin(), text.end(), discard), std::sregex_iterator()), 1)
      << "one step redone for the death\n"
      << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex(R"(worker 3 joined at step (\d+) as rank 3 of 4)"))) << out;
  EXPECT_LT(std::stoi(m[1]), 32) << "joined during the warm-up\n" << out;
  // Exchange lines: 6 of the warm-up (every 5 steps; the first after the death shows 3), then 7 DiLoCo steps with a
  // landing (both fragments land at step 48), all by the four.
  const auto sizes = world_sizes("ft_warm");
  ASSERT_EQ(sizes.size(), 13u) << fmt::format("{}", fmt::join(sizes, ","));
  EXPECT_EQ(sizes.front(), 3) << "the warm-up went on with three";
  EXPECT_EQ(std::vector<int>(sizes.end() - 7, sizes.end()), std::vector<int>(7, 4)) << "every outer step by the four";
}

TEST_F(Distributed, ElasticResumeOfFourWorkerCheckpointsWithFewerWorkers) {
  const std::string args =
      "--set train.steps=16 --set train.batch_size=4 --set dist.inner_steps=4 "
      "--set train.checkpoint_every=8";
  auto launch = [](int n) {
    return std::string(TRIBUTARY_CLI) + fmt::format(" launch --nproc {} --master-port 0 --", n);
  };
  auto [rc, out] = sh(launch(4) + tiny("elastic4", args + " --stop-after-step 8"));
  ASSERT_EQ(rc, 0) << out;
  const auto ckpt = work() / "elastic4" / "checkpoints" / "step-00000008";
  ASSERT_TRUE(fs::exists(ckpt / "rank-3.model.safetensors")) << out;
  for (int n : {2, 3}) {
    const std::string run = fmt::format("elastic{}", n);
    auto [rc2, out2] = sh(launch(n) + tiny(run, args + " --resume " + ckpt.string()));
    ASSERT_EQ(rc2, 0) << out2;
    EXPECT_NE(out2.find(fmt::format("resuming a checkpoint of 4 worker(s) with {}", n)), std::string::npos) << out2;
    const auto s = summary_of(run);
    EXPECT_EQ(s["steps"].get<int>(), 16);
    EXPECT_EQ(s["world_size"].get<int>(), n);
    EXPECT_EQ(s["outer_steps"].get<int>(), 4) << "the outer loop's count continues";
    EXPECT_TRUE(std::isfinite(s["val_loss"].get<double>()));
    EXPECT_TRUE(
        fs::exists(work() / run / "checkpoints" / "step-00000016" / fmt::format("rank-{}.model.safetensors", n - 1)));
  }
  // Data parallel the same way: 4 workers stopped at step 4, resumed by 3.
  const std::string ddp = "--set train.steps=8 --set train.batch_size=4 --set dist.algorithm=ddp";
  auto [rc3, out3] = sh(launch(4) + tiny("elastic_ddp4", ddp + " --stop-after-step 4"));
  ASSERT_EQ(rc3, 0) << out3;
  auto [rc4, out4] =
      sh(launch(3) + tiny("elastic_ddp3",
                          ddp + " --resume " + (work() / "elastic_ddp4" / "checkpoints" / "step-00000004").string()));
  ASSERT_EQ(rc4, 0) << out4;
  EXPECT_NE(out4.find("resuming a checkpoint of 4 worker(s) with 3"), std::string::npos) << out4;
  EXPECT_EQ(summary_of("elastic_ddp3")["world_size"].get<int>(), 3);
}

TEST_F(Distributed, FaultTolerantRunOutlivesTheWholeMachineOfRankZeroWithAStandaloneStore) {
  // `tributary store` serves the run's store; two launches ("machines", two workers each) name it with --store.
  // Machine 0's workers (ranks 0 and 1) die together at step 6 and its launch gives up; machine 1's workers re-form,
  // worker 2 leads, and the run completes. With node 0's launch hosting the store, this loss ended the run.
  const int port = free_tcp_port();
  const std::string cli = TRIBUTARY_CLI, store = fmt::format("127.0.0.1:{}", port);
  const std::string args =
      "--set train.steps=16 --set train.batch_size=4 --set dist.inner_steps=4 "
      "--set dist.fault_tolerant=true --set dist.heartbeat_timeout_s=2 "
      "--set dist.collective_timeout_s=30 --set dist.store_timeout_s=30";
  auto node = [&](int n) {
    return fmt::format("{} launch --nnodes 2 --node-rank {} --nproc 2 --store {} --grace 2 --{}", cli, n, store,
                       tiny("ft_store", args));
  };
  const std::string script = fmt::format(
      "{cli} store --port {port} > {log}.store 2>&1 & st=$!; "
      "for i in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && break; sleep 0.1; done; "
      "TRIBUTARY_FAIL_RANK=0,1 TRIBUTARY_FAIL_STEP=6 {node0} > {log}.node0 2>&1 & n0=$!; "
      "{node1}; rc=$?; wait $n0; echo node0 exit $?; kill $st; wait $st; echo store exit $?; exit $rc",
      fmt::arg("cli", cli), fmt::arg("port", port), fmt::arg("log", (work() / "ft_store").string()),
      fmt::arg("node0", node(0)), fmt::arg("node1", node(1)));
  auto [rc, out] = sh("bash -c '" + script + "'");
  ASSERT_EQ(rc, 0) << out;
  const auto s = summary_of("ft_store");
  EXPECT_EQ(s["steps"].get<int>(), 16);
  EXPECT_EQ(s["world_size"].get<int>(), 2);
  EXPECT_EQ(world_sizes("ft_store"), (std::vector<int>{4, 2, 2, 2}));
  EXPECT_NE(out.find("worker 2 leads the run"), std::string::npos) << out;
  EXPECT_EQ(out.find("node0 exit 0"), std::string::npos) << "machine 0's launch lost its workers\n" << out;
  EXPECT_NE(out.find("store exit 0"), std::string::npos) << out;
  // A --store where nothing answers is reported by launch at once, naming what to start.
  auto [rc2, out2] = sh(cli + " launch --nproc 1 --store 127.0.0.1:1 -- train");
  EXPECT_NE(rc2, 0);
  EXPECT_NE(out2.find("nothing answers at 127.0.0.1:1 (--store): start `tributary store --port 1`"), std::string::npos)
      << out2;
}

TEST_F(Distributed, ADeathBeforeStartUpStopsTheRunAtOnceInsteadOfWaitingAtTheRendezvous) {
  // Issue 46, item 5: a worker killed in its first second was "tolerated" by launch while rank 0 waited out the
  // rendezvous (dist.store_timeout_s) and exited 4. --max-failures covers deaths after start-up; before it, launch
  // stops the run at once and says why.
  const std::string cmd = std::string(TRIBUTARY_CLI) + " launch --nproc 2 --master-port 0 --max-failures 1 --" +
                          tiny("ft_early",
                               "--set train.steps=8 --set train.batch_size=4 --set dist.inner_steps=4 "
                               "--set dist.fault_tolerant=true --set dist.store_timeout_s=120");
  const std::string log = (work() / "ft_early.log").string();
  // Launch's first child to appear is a worker still loading; it dies at once. (Waiting for the child rather than a
  // fixed time: a slow machine may not have forked any worker yet, and killing launch itself proves nothing.)
  auto [rc, out] = sh("(" + cmd + " > " + log +
                      " 2>&1 & l=$!; for i in $(seq 400); do w=$(pgrep -P $l | head -1); [ -n \"$w\" ] && break; "
                      "sleep 0.025; done; kill -9 $w; wait $l; echo exit=$?; cat " +
                      log + ")");
  EXPECT_EQ(out.find("exit=0"), std::string::npos) << out;
  EXPECT_NE(out.find("before the run got through start-up"), std::string::npos) << out;
  EXPECT_EQ(out.find("tolerated"), std::string::npos) << "the survivors would wait out the rendezvous: " << out;
}

TEST_F(Distributed, AFrozenStoreHostEndsItsWorkersAtTheStoreDeadline) {
  // Issue 46's fault matrix: launch (the store's host) stopped with SIGSTOP left its workers blocked in the store
  // client's recv() with no deadline, for as long as anyone watched. Now each store call has one: the store's
  // timeout (5 s here) + 10 s, then the worker ends with status 4 naming the call.
  const std::string cli = TRIBUTARY_CLI;
  const fs::path metrics = work() / "frozen_host" / "metrics.jsonl";
  fs::remove(metrics);
  const std::string run = fmt::format(
      "{} launch --nproc 2 --grace 2 --max-failures 1 --{}", cli,
      tiny("frozen_host",
           "--set dist.algorithm=diloco --set train.steps=4000 --set train.batch_size=4 --set dist.inner_steps=5 "
           "--set dist.fault_tolerant=true --set dist.heartbeat_timeout_s=4 --set dist.store_timeout_s=5 "
           "--set dist.slow_workers=0:2,1:2"));
  auto [rc, out] = sh(fmt::format(
      "bash -c '{} > /dev/null 2>&1 & L=$!; for i in $(seq 600); do grep -q outer_step {} 2>/dev/null && break; "
      "sleep 0.1; done; kids=$(pgrep -P $L); kill -STOP $L; for i in $(seq 600); do alive=0; for k in $kids; do "
      "grep -qv \" Z \" /proc/$k/stat 2>/dev/null && alive=1; done; [ $alive = 0 ] && break; sleep 0.1; done; "
      "echo workers gone after $i; kill -CONT $L; wait $L; echo launch exit $?'",
      run, metrics.string()));
  int tenths = -1, launch_rc = -1;
  ASSERT_NE(out.find("workers gone after"), std::string::npos) << out;
  ASSERT_NE(out.find("launch exit"), std::string::npos) << out;
  ASSERT_EQ(std::sscanf(out.c_str() + out.find("workers gone after"), "workers gone after %d", &tenths), 1) << out;
  ASSERT_EQ(std::sscanf(out.c_str() + out.find("launch exit"), "launch exit %d", &launch_rc), 1) << out;
  EXPECT_LT(tenths, 400) << "the workers outlived the store's deadline by far\n" << out;
  EXPECT_NE(launch_rc, 0) << out;
}
