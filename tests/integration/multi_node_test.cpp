// Two machines on one: network namespaces joined by a veth pair give each `tributary launch` its own address
// (10.77.0.1 for node 0, 10.77.0.2 for node 1), so the multi-machine paths run for real — --nnodes, --master-addr,
// the store hosted by node 0's launch, Gloo listening on the address that routes to the master (or on
// GLOO_SOCKET_IFNAME's interface) — and a link can be cut (ip link set ... down). Skipped where namespaces cannot be
// made (not root, no CAP_NET_ADMIN, a container without them).
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include "launch_support.h"
#include "test_paths.h"  // generated: TRIBUTARY_CLI, TRIBUTARY_SOURCE_DIR, ...
#include "tributary/core/fs.h"

using namespace tributary;

using test_support::sh;
using test_support::tiny;
using test_support::work;

namespace {

class TwoMachines : public test_support::Distributed {
 protected:
  void SetUp() override {
    const int id = static_cast<int>(::getpid() % 100000);
    a_ = fmt::format("trib{}a", id);
    b_ = fmt::format("trib{}b", id);
    const std::string va = fmt::format("tv{}a", id), vb = fmt::format("tv{}b", id);
    link_ = vb;
    const std::string up = fmt::format(
        "ip netns add {a} && ip netns add {b} && ip link add {va} type veth peer name {vb} && "
        "ip link set {va} netns {a} && ip link set {vb} netns {b} && "
        "ip -n {a} addr add 10.77.0.1/24 dev {va} && ip -n {b} addr add 10.77.0.2/24 dev {vb} && "
        "ip -n {a} link set lo up && ip -n {b} link set lo up && "
        "ip -n {a} link set {va} up && ip -n {b} link set {vb} up",
        fmt::arg("a", a_), fmt::arg("b", b_), fmt::arg("va", va), fmt::arg("vb", vb));
    auto [rc, out] = sh(up);
    if (rc != 0) {
      TearDown();
      GTEST_SKIP() << "network namespaces are not permitted here: " << out;
    }
    made_ = true;
    if_a_ = va;
  }
  void TearDown() override {
    for (const auto& ns : {a_, b_})  // every process left in a namespace, then the namespace (and its veth end)
      sh(fmt::format("ip netns pids {0} 2>/dev/null | xargs -r kill -9; sleep 0.2; ip netns del {0} 2>/dev/null", ns));
  }

  // `tributary launch` on node `node` (0: in a_, 1: in b_) for `nproc` workers of `nnodes`.
  std::string launch(int node, int nproc, const std::string& run, const std::string& args,
                     const std::string& env = "") const {
    return fmt::format(
        "ip netns exec {} env {} {} launch --nproc {} --nnodes 2 --node-rank {} --master-addr 10.77.0.1 "
        "--master-port 29611 --grace 2 --{}",
        node == 0 ? a_ : b_, env.empty() ? "TRIBUTARY_NETNS_TEST=1" : env, TRIBUTARY_CLI, nproc, node, tiny(run, args));
  }

  // A shell script: once run `run`'s first outer step is in its metrics, node 1's link goes down (and, when
  // `back_after_s` > 0, comes back that much later). Clears the metrics of an earlier run first.
  std::string cut_after_first_outer_step(const std::string& run, int back_after_s = 0) const {
    const fs::path metrics = work() / run / "metrics.jsonl";
    fs::remove(metrics);
    std::string script = fmt::format(
        "for i in $(seq 600); do grep -q outer_step {} 2>/dev/null && break; sleep 0.1; done; ip -n {} link set {} "
        "down",
        metrics.string(), b_, link_);
    if (back_after_s > 0) script += fmt::format("; sleep {}; ip -n {} link set {} up", back_after_s, b_, link_);
    return script;
  }
  // Fault-tolerant DiLoCo with short deadlines, for the cut-link tests.
  static std::string ft_args(int steps, int inner_steps, int timeout_s) {
    return fmt::format(
        "--set train.steps={} --set train.batch_size=4 --set dist.inner_steps={} "
        "--set dist.fault_tolerant=true --set dist.heartbeat_timeout_s=2 "
        "--set dist.collective_timeout_s={} --set dist.store_timeout_s={}",
        steps, inner_steps, timeout_s, timeout_s);
  }

  // Run `run` on both machines (`nproc` workers each, launches with `restart_flags`) while node 1's link goes down
  // after the first outer step and comes back 4 s later. Returns launch 0's status and output (with "node1 exit N"),
  // and node 1's output.
  struct CutRun {
    int rc;
    std::string out, node1;
  };
  CutRun cut_and_come_back(const std::string& run, int nproc, const std::string& args,
                           const std::string& restart_flags) const {
    const std::string cut = cut_after_first_outer_step(run, /*back_after_s=*/4);
    const std::string node1_log = (work() / (run + "_node1.log")).string();
    auto launch_restarting = [&](int node, const std::string& env) {
      std::string cmd = launch(node, nproc, run, args, env);
      return cmd.replace(cmd.find(" --grace 2 "), 11, " --grace 2 " + restart_flags + " ");
    };
    auto [rc, out] =
        sh(fmt::format("bash -c '{} > {} 2>&1 & n1=$!; ({}) > /dev/null 2>&1 & {}; rc=$?; wait $n1; "
                       "echo node1 exit $?; exit $rc'",
                       launch_restarting(1, ""), node1_log, cut, launch_restarting(0, "GLOO_SOCKET_IFNAME=" + if_a_)));
    return {rc, out, read_file(node1_log)};
  }

  std::string a_, b_, link_, if_a_;
  bool made_ = false;
};

nlohmann::json summary_of(const std::string& run) {
  return nlohmann::json::parse(read_file(work() / run / "summary.json"));
}

}  // namespace

TEST_F(TwoMachines, DataParallelTrainsAcrossTheLinkBetweenTwoMachines) {
  // Two workers per machine, each finding its address from the route to the master. Gloo used to listen on
  // 127.0.0.1 on every machine: a pair whose listening side was on the other machine never formed.
  const std::string args =
      "--set dist.algorithm=ddp --set train.steps=6 --set train.batch_size=4 "
      "--set dist.collective_timeout_s=30 --set dist.store_timeout_s=30";
  const std::string node1_log = (work() / "mn_ddp_node1.log").string();
  auto [rc, out] = sh(fmt::format("bash -c '{} > {} 2>&1 & n1=$!; {}; rc=$?; wait $n1; echo node1 exit $?; exit $rc'",
                                  launch(1, 2, "mn_ddp", args), node1_log, launch(0, 2, "mn_ddp", args)));
  ASSERT_EQ(rc, 0) << out << "\nnode 1:\n" << read_file(node1_log);
  EXPECT_NE(out.find("node1 exit 0"), std::string::npos) << out << "\nnode 1:\n" << read_file(node1_log);
  const auto s = summary_of("mn_ddp");
  EXPECT_EQ(s["world_size"].get<int>(), 4);
  EXPECT_EQ(s["steps"].get<int>(), 6);
  EXPECT_GT(s["bytes_sent"].get<double>(), 0);
}

TEST_F(TwoMachines, FaultTolerantDilocoOutlivesACutLinkToTheOtherMachine) {
  // Two workers per machine (node 0's name their interface: GLOO_SOCKET_IFNAME); once the first outer step is in the
  // metrics, node 1's link goes down. Its two workers
  // fall silent (no reset reaches anyone: a cut cable, not a dead process); node 0's two drop them at the heartbeat
  // deadline, re-form and finish the run.
  const std::string args = ft_args(24, 4, 30);
  const std::string cut = cut_after_first_outer_step("mn_cut");
  auto [rc, out] = sh(fmt::format("bash -c '{} > {} 2>&1 & ({}) > /dev/null 2>&1 & {}'", launch(1, 2, "mn_cut", args),
                                  (work() / "mn_cut_node1.log").string(), cut,
                                  launch(0, 2, "mn_cut", args, "GLOO_SOCKET_IFNAME=" + if_a_)));
  ASSERT_EQ(rc, 0) << out;
  const auto s = summary_of("mn_cut");
  EXPECT_EQ(s["steps"].get<int>(), 24);
  EXPECT_EQ(s["world_size"].get<int>(), 2) << "node 1's workers were dropped";
  EXPECT_GE(s["reformations"].get<int>(), 1);
  // The watcher's line, or — when the round found them silent first and re-formed before the watcher's next pass
  // (0.1 s) — the round's own.
  EXPECT_TRUE(out.find("has sent no heartbeat") != std::string::npos ||
              out.find("worker(s) 2, 3 fell silent (dead, frozen or cut off: no vote, no heartbeat)") !=
                  std::string::npos)
      << out;
}

TEST_F(TwoMachines, ACutMachineComesBackWhenItsLinkDoesAndRejoinsTheRun) {
  // One worker per machine; node 1's link is down for 4 s, then back, and both launches may restart workers. Node 1's
  // worker is dropped (node 0's goes on alone), finds it was declared dead when the link is back, exits, and its
  // launch restarts it although none of that machine's workers is left running (a launch used to restart a worker
  // only while another of its own machine's ran, so a machine that lost all its workers gave up); it heals from node
  // 0's and rejoins: the run ends with both.
  // Node 0's worker runs 3x slower (dist.slow_workers): alone, on an idle machine, it trained the 1000 steps in 5 s
  // and the run ended before node 1's restarted worker could reach the store (seen once).
  const auto [rc, out, node1] =
      cut_and_come_back("mn_back", 1, ft_args(1000, 10, 20) + " --set dist.slow_workers=0:3", "--max-restarts 4");
  ASSERT_EQ(rc, 0) << out << "\nnode 1:\n" << node1;
  EXPECT_NE(out.find("node1 exit 0"), std::string::npos) << out << "\nnode 1:\n" << node1;
  const auto s = summary_of("mn_back");
  EXPECT_EQ(s["steps"].get<int>(), 1000);
  EXPECT_EQ(s["world_size"].get<int>(), 2) << "node 1's worker rejoined\n" << out << "\nnode 1:\n" << node1;
  EXPECT_NE(out.find("worker(s) 1 dropped out"), std::string::npos) << out;
  EXPECT_NE(node1.find("launch: rank 1 (pid"), std::string::npos) << node1;
  EXPECT_NE(node1.find("restarting it to rejoin the run"), std::string::npos) << node1;
  EXPECT_NE(node1.find("worker 1 joined at step"), std::string::npos) << node1;
}

TEST_F(TwoMachines, AFaultTolerantIslandCutOffComesBackWhenItsLinkDoesAndRejoinsTheRun) {
  // Fault-tolerant islands, one per machine of two workers (launch --restart-island); node 1's link is down for 4 s,
  // then back. Island 1 is dropped (island 0 goes on alone); when the link is back its ranks find they were left
  // out, their launch starts the island again, and its rank 0 heals from island 0's: the run ends with both islands.
  const auto [rc, out, node1] = cut_and_come_back(
      "mn_island_back", 2,
      ft_args(500, 10, 20) + " --set parallel.islands=machines --set dist.slow_workers=0:3,1:3,2:3,3:3",
      "--max-restarts 4 --restart-island");
  ASSERT_EQ(rc, 0) << out << "\nnode 1:\n" << node1;
  EXPECT_NE(out.find("node1 exit 0"), std::string::npos) << out << "\nnode 1:\n" << node1;
  EXPECT_NE(out.find("island(s) 1 dropped out"), std::string::npos) << out;
  EXPECT_NE(node1.find("starting this machine's island again"), std::string::npos) << node1;
  EXPECT_NE(node1.find("island 1 joined at step"), std::string::npos) << node1;
  const auto s = summary_of("mn_island_back");
  EXPECT_EQ(s["steps"].get<int>(), 500);  // island 1 is back by step 90-180
  const fs::path ckpt = work() / "mn_island_back" / "checkpoints" / "step-00000500";
  ASSERT_TRUE(fs::exists(ckpt / "rank-1.model.safetensors")) << "island 1 takes part in the final checkpoint";
  EXPECT_EQ(read_file(ckpt / "model.safetensors"), read_file(ckpt / "rank-1.model.safetensors"));
}

TEST_F(TwoMachines, IslandsTrainAcrossARateLimitedLinkBetweenTwoMachines) {
  // Two workers per machine, one island per machine (parallel.islands = machines); the link between the machines is
  // limited to 20 Mbit/s each way (tc tbf). Inside a machine the island averages every step over loopback; only the
  // sharded pseudo-gradients cross the link: each rank of rank 0's island sends its half of the model per outer step.
  for (const auto& [ns, dev] : {std::pair{a_, if_a_}, std::pair{b_, link_}}) {
    auto [rc, out] =
        sh(fmt::format("ip netns exec {} tc qdisc add dev {} root tbf rate 20mbit burst 32kb latency 1s", ns, dev));
    if (rc != 0) GTEST_SKIP() << "tc is not permitted here: " << out;
  }
  const std::string args =
      "--set parallel.islands=machines --set train.steps=12 --set train.batch_size=4 --set dist.inner_steps=4 "
      "--set dist.collective_timeout_s=60 --set dist.store_timeout_s=60";
  const std::string node1_log = (work() / "mn_islands_node1.log").string();
  auto [rc, out] = sh(fmt::format("bash -c '{} > {} 2>&1 & n1=$!; {}; rc=$?; wait $n1; echo node1 exit $?; exit $rc'",
                                  launch(1, 2, "mn_islands", args), node1_log,
                                  launch(0, 2, "mn_islands", args, "GLOO_SOCKET_IFNAME=" + if_a_)));
  ASSERT_EQ(rc, 0) << out << "\nnode 1:\n" << read_file(node1_log);
  EXPECT_NE(out.find("node1 exit 0"), std::string::npos) << out << "\nnode 1:\n" << read_file(node1_log);
  EXPECT_NE(out.find("layout: 2 islands of 2/2 ranks"), std::string::npos) << out;
  const auto s = summary_of("mn_islands");
  EXPECT_EQ(s["islands"].get<int>(), 2);
  EXPECT_EQ(s["outer_steps"].get<int>(), 3);
  // Across: rank 0's shard (about half the model) every 4 steps; inside: every gradient every step.
  EXPECT_GT(s["bytes_sent"].get<double>(), 0);
  EXPECT_GT(s["bytes_inside_island"].get<double>(), 4 * s["bytes_sent"].get<double>());
}

TEST_F(TwoMachines, MachinesWithTheirOwnRunDirectoriesSurviveAKillAndResume) {
  // Two workers per machine, DiLoCo, each machine with its own train.run_dir (no shared filesystem). Once node 1's
  // ranks hold their step-20 checkpoint, node 1's launch is killed (kill -9: its workers go with it, and node 0's
  // fail their next collective). Both launches then --resume from the newest step every rank holds and finish.
  const std::string args =
      "--set dist.algorithm=diloco --set train.steps=60 --set train.batch_size=4 --set dist.inner_steps=5 "
      "--set train.checkpoint_every=10 --set train.keep_checkpoints=10 --set dist.collective_timeout_s=20 "
      "--set dist.store_timeout_s=20 --set dist.slow_workers=0:2";
  const fs::path dir0 = work() / "mn_own0", dir1 = work() / "mn_own1";
  // Both machines hold the same secret file: every store value is sealed (comm/sealed_store.h).
  const fs::path secret = work() / "mn_own.secret";
  write_file(secret, "thirty-two bytes of the run secret!");
  auto node = [&](int n, const std::string& extra) {
    std::string cmd = launch(n, 2, "mn_own",
                             fmt::format("{} --set train.run_dir={} {}", args, (n == 0 ? dir0 : dir1).string(), extra),
                             n == 0 ? "GLOO_SOCKET_IFNAME=" + if_a_ : "");
    return cmd.replace(cmd.find(" --grace 2 "), 11, " --grace 2 --secret-file " + secret.string() + " ");
  };
  const fs::path marker = dir1 / "ranks" / "rank-3" / "checkpoints" / "step-00000020" / "manifest.json";
  fs::remove_all(dir1);
  const std::string node1_log = (work() / "mn_own_node1.log").string();
  auto [rc, out] = sh(fmt::format(
      "bash -c '{} > {} 2>&1 & n1=$!; (for i in $(seq 600); do test -e {} && break; sleep 0.05; done; kill -9 $n1) & "
      "{}; echo node0 exit $?'",
      node(1, ""), node1_log, marker.string(), node(0, "")));
  EXPECT_TRUE(fs::exists(marker)) << out << "\nnode 1:\n" << read_file(node1_log);
  EXPECT_EQ(out.find("node0 exit 0"), std::string::npos) << "node 0 finished without node 1\n" << out;
  EXPECT_NE(out.find("is not shared with rank(s) 2, 3"), std::string::npos) << out;
  EXPECT_EQ(out.find("no run secret"), std::string::npos) << out;
  ASSERT_FALSE(fs::exists(dir0 / "summary.json")) << out;

  auto [rc2, out2] = sh(fmt::format("bash -c '{} > {} 2>&1 & n1=$!; {}; rc=$?; wait $n1; echo node1 exit $?; exit $rc'",
                                    node(1, "--resume"), node1_log, node(0, "--resume")));
  ASSERT_EQ(rc2, 0) << out2 << "\nnode 1:\n" << read_file(node1_log);
  EXPECT_NE(out2.find("node1 exit 0"), std::string::npos) << out2 << "\nnode 1:\n" << read_file(node1_log);
  EXPECT_NE(out2.find("resumed from"), std::string::npos) << out2;
  EXPECT_EQ(summary_of("mn_own0")["steps"].get<int>(), 60);
  for (int rank : {2, 3}) {
    EXPECT_TRUE(fs::exists(dir1 / "ranks" / fmt::format("rank-{}", rank) / "checkpoints" / "step-00000060"));
    EXPECT_TRUE(fs::exists(dir0 / "workers" / fmt::format("rank{}.jsonl", rank)))
        << "rank 0 keeps every worker's lines";
  }
  EXPECT_TRUE(fs::exists(dir0 / "checkpoints" / "step-00000060" / "manifest.json"));
}
