// Fault-tolerant islands (runtime/sync/island_sync.h, dist.fault_tolerant): two machines' launches (--nnodes 2,
// --restart-island), each machine's two workers one island. The islands are the quorum's members; a rank lost inside an
// island takes the island out, its launch starts the island again, and it rejoins from the peer island. Real processes,
// real c10d on loopback; the run hash-checks the islands' replicas after every outer step (and an island's ranks after
// each), so a run that completes kept them identical.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
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

// `count` machines of `nproc` workers on loopback, one island each; `env` before every launch, `launch_extra` on each.
std::pair<int, std::string> islands_on_machines(const std::string& run, int count, int nproc, const std::string& extra,
                                                const std::string& launch_extra, const std::string& env = "") {
  const int port = free_tcp_port();
  auto node = [&](int n) {
    return fmt::format("{} {} launch --nnodes {} --node-rank {} --nproc {} --master-port {} --grace 2 {} --{}", env,
                       TRIBUTARY_CLI, count, n, nproc, port, launch_extra,
                       tiny(run,
                            "--set train.steps=24 --set train.batch_size=4 --set dist.inner_steps=4 "
                            "--set parallel.islands=machines --set dist.heartbeat_timeout_s=2 "
                            "--set dist.collective_timeout_s=30 --set dist.store_timeout_s=30 " +
                                extra));
  };
  std::string script;
  for (int n = 0; n + 1 < count; ++n) script += node(n) + " & pids=\"$pids $!\"; ";
  return sh("bash -c '" + script + node(count - 1) + "; rc=$?; for p in $pids; do wait $p || rc=1; done; exit $rc'");
}

// Two machines of two workers, one island each.
std::pair<int, std::string> two_islands(const std::string& run, const std::string& extra,
                                        const std::string& launch_extra, const std::string& env = "") {
  return islands_on_machines(run, 2, 2, extra, launch_extra, env);
}

const std::string kFaultTolerant = "--set dist.fault_tolerant=true";
const std::string kRestartIsland = "--max-restarts 1 --restart-island";

fs::path final_checkpoint(const std::string& run) { return work() / run / "checkpoints" / "step-00000024"; }

}  // namespace

TEST_F(Distributed, FaultTolerantIslandsWithoutAFaultTrainWhatIslandsTrain) {
  // The islands' ranks 0 exchanging the whole model through the quorum's rounds give what the sharded exchange gives
  // (fp32: a sum of two is exact either way); ZeRO-1 (on in the fault-tolerant run) changes nothing, bit for bit.
  auto [rc, out] = two_islands("fti_plain", "--set parallel.shard_optimizer=false", "");
  ASSERT_EQ(rc, 0) << out;
  auto [rc2, out2] = two_islands("fti_ft", kFaultTolerant, kRestartIsland);
  ASSERT_EQ(rc2, 0) << out2;
  EXPECT_NE(out2.find("the islands are the quorum's members"), std::string::npos) << out2;
  EXPECT_NE(out2.find("AdamW moments sharded (ZeRO-1)"), std::string::npos) << out2;
  EXPECT_EQ(read_file(final_checkpoint("fti_plain") / "model.safetensors"),
            read_file(final_checkpoint("fti_ft") / "model.safetensors"));
}

TEST_F(Distributed, ARankLostInsideAnIslandTakesItsIslandOutAndItRejoinsFromAPeerIsland) {
  // Rank 1 (island 0's second rank; island 0 leads the run) is SIGKILLed at step 6. Its launch kills island 0's rank 0
  // and starts both again as the island's life 1; island 1 redoes the round alone, leads, and admits island 0 back,
  // whose rank 0 heals from island 1's rank 0 (its AdamW state gathered from island 1's two ZeRO-1 shards) and hands
  // the state to its own rank 1. The run completes with both islands, and the final checkpoint holds both islands'
  // replicas, byte for byte the same.
  // Every worker slowed 3x: the restarted island's start-up (slower on a loaded machine) has outer steps to join at.
  auto [rc, out] = two_islands("fti_kill", kFaultTolerant + " --set dist.slow_workers=0:3,1:3,2:3,3:3", kRestartIsland,
                               "TRIBUTARY_FAIL_RANK=1 TRIBUTARY_FAIL_STEP=6");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("starting this machine's island again as its life 1"), std::string::npos) << out;
  EXPECT_NE(out.find("island(s) 0 dropped out"), std::string::npos) << out;
  EXPECT_NE(out.find("island 1 leads the run"), std::string::npos) << out;
  EXPECT_NE(out.find("island 0 joined at step"), std::string::npos) << out;
  const auto events = membership_events("fti_kill");
  ASSERT_EQ(events.size(), 2u) << out;
  EXPECT_EQ(events[0], std::make_pair(2, 1)) << "island 0 out";
  EXPECT_EQ(events[1], std::make_pair(1, 2)) << "island 0 back";
  const auto summary = nlohmann::json::parse(read_file(work() / "fti_kill" / "summary.json"));
  EXPECT_EQ(summary["steps"].get<int>(), 24);
  const fs::path ckpt = final_checkpoint("fti_kill");
  ASSERT_TRUE(fs::exists(ckpt / "rank-1.model.safetensors")) << "the healed island takes part in the checkpoint";
  EXPECT_EQ(read_file(ckpt / "model.safetensors"), read_file(ckpt / "rank-1.model.safetensors"))
      << "the islands' replicas are one after the last outer step";
}

TEST_F(Distributed, AnIslandRestartedMidRoundIsHealedAndCountsInThatRound) {
  // H = 20 and every worker slowed 10x, so the round outlasts the island's restart: rank 3 (island 1's second) dies at
  // step 2, island 1 starts again and asks to join; island 0's rank 0 heals it mid-round (its AdamW state gathered
  // from its island's ZeRO-1 shards: both of island 0's ranks take part) and the healed island's pseudo-gradient
  // counts in round x0 already: no round is redone.
  auto [rc, out] = two_islands("fti_midround",
                               kFaultTolerant +
                                   " --set train.steps=20 --set dist.inner_steps=20 --set dist.heartbeat_timeout_s=5 "
                                   "--set dist.slow_workers=0:10,1:10,2:10,3:10",
                               kRestartIsland, "TRIBUTARY_FAIL_RANK=3 TRIBUTARY_FAIL_STEP=2");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("island 1 healed from the lead at step"), std::string::npos) << out;
  EXPECT_NE(out.find("island 1 joined at step 20 (round x0)"), std::string::npos) << out;
  const fs::path ckpt = work() / "fti_midround" / "checkpoints" / "step-00000020";
  ASSERT_TRUE(fs::exists(ckpt / "rank-1.model.safetensors")) << out;
  EXPECT_EQ(read_file(ckpt / "model.safetensors"), read_file(ckpt / "rank-1.model.safetensors"));
}

TEST_F(Distributed, AnIslandEvictedStaysEvictedAfterAnotherIslandIsHealed) {
  // Three machines of one rank, one island each. Island 1 flips the sign of its updates: rated by the loss its update
  // brings on a probe batch (dist.score = loss: the islands' leads exchange the whole model), it is refused and
  // evicted at exchange 3. Island 2's rank is killed at step 10; its launch starts it again and the lead heals it with
  // the rule's verdicts and ratings, so it refuses island 1 as the others do: the three islands end with one model.
  auto [rc, out] =
      islands_on_machines("fti_evicted", 3, 1,
                          kFaultTolerant +
                              " --set train.steps=32 --set dist.slow_workers=0:3,1:3,2:3 "
                              "--set dist.aggregate=median --set dist.evict_after=3 --set dist.min_score=0.2 "
                              "--set dist.score=loss --adversary 1:sign_flip",
                          kRestartIsland, "TRIBUTARY_FAIL_RANK=2 TRIBUTARY_FAIL_STEP=10");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("island 1's update refused in exchange 3 (1 of 2 accepted, dist.aggregate = median): a loss "
                     "rating of"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("island 1 evicted in exchange 3"), std::string::npos) << out;
  EXPECT_NE(out.find("island 2 joined at step"), std::string::npos) << out;
  const fs::path ckpt = work() / "fti_evicted" / "checkpoints" / "step-00000032";
  ASSERT_TRUE(fs::exists(ckpt / "rank-2.model.safetensors")) << out;
  EXPECT_EQ(read_file(ckpt / "model.safetensors"), read_file(ckpt / "rank-2.model.safetensors"))
      << "the healed island judged island 1 otherwise than the others";
}

TEST_F(Distributed, AStopAskedOfAnIslandsOtherRankStopsTheRun) {
  // SIGTERM to rank 1 alone (island 0's second rank) at step 6: its wish is its island's, which island 0's rank 0
  // votes with in the next round; every rank stops after that outer step, with a checkpoint to resume from.
  auto [rc, out] = two_islands("fti_term", kFaultTolerant, kRestartIsland,
                               "TRIBUTARY_FAIL_RANK=1 TRIBUTARY_FAIL_STEP=6 TRIBUTARY_FAIL_MODE=term");
  ASSERT_EQ(rc, 0) << out;
  const auto summary = nlohmann::json::parse(read_file(work() / "fti_term" / "summary.json"));
  EXPECT_TRUE(summary["stopped_early"].get<bool>()) << out;
  EXPECT_LT(summary["steps"].get<int>(), 24);
  EXPECT_TRUE(fs::exists(work() / "fti_term" / "checkpoints" / fmt::format("step-{:08d}", summary["steps"].get<int>()) /
                         "model.safetensors"))
      << out;
}

TEST_F(Distributed, FaultTolerantIslandsThatCannotRestartAsAWholeAreRefusedBeforeTraining) {
  // An island of two on a machine of four: a machine's launch could not start the island alone.
  auto [rc, out] = sh(fmt::format("{} launch --nproc 4 --master-port 0 --{}", TRIBUTARY_CLI,
                                  tiny("fti_bad", "--set train.steps=4 --set parallel.islands=2 " + kFaultTolerant)));
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("each island must be one machine's workers"), std::string::npos) << out;
  // One island per machine, but launched without --restart-island.
  auto [rc2, out2] = two_islands("fti_bad2", kFaultTolerant, "");
  EXPECT_NE(rc2, 0);
  EXPECT_NE(out2.find("launch --restart-island --max-restarts N"), std::string::npos) << out2;
  // --restart-island on one machine: no other island would hold the run meanwhile.
  auto [rc3, out3] = sh(fmt::format("{} launch --nproc 2 --master-port 0 --max-restarts 1 --restart-island --{}",
                                    TRIBUTARY_CLI, tiny("fti_bad3", "--set train.steps=4")));
  EXPECT_NE(rc3, 0);
  EXPECT_NE(out3.find("--restart-island starts this machine's island again"), std::string::npos) << out3;
  // --restart-island for a run that is not fault-tolerant islands: its restarted workers could not rejoin.
  auto [rc4, out4] = two_islands("fti_bad4", "", kRestartIsland);
  EXPECT_NE(rc4, 0);
  EXPECT_NE(out4.find("only fault-tolerant islands can take back"), std::string::npos) << out4;
  EXPECT_FALSE(fs::exists(work() / "fti_bad" / "checkpoints"));
  EXPECT_FALSE(fs::exists(work() / "fti_bad2" / "checkpoints"));
}
