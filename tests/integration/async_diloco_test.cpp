// Asynchronous DiLoCo through `tributary launch`: real processes, the run's store as the update board. The merger's
// process is killed (SIGKILL) and another replica takes its term over from the last commit; a killed replica
// restarted by launch starts from the newest version and its updates are merged again; the run ends by tokens.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "launch_support.h"
#include "test_paths.h"
#include "tributary/artifacts/checkpoint.h"
#include "tributary/core/fs.h"

using namespace tributary;

using test_support::Distributed;
using test_support::sh;
using test_support::tiny;
using test_support::work;

namespace {

// 3 replicas, H = 5, each slowed 4x so that the run outlasts a heartbeat deadline and a restart.
std::pair<int, std::string> async_run(const std::string& env, const std::string& run, const std::string& launch_extra) {
  return sh(env + " " + std::string(TRIBUTARY_CLI) + " launch --nproc 3 --master-port 0 --max-failures 1 --grace 2 " +
            launch_extra + " --" +
            tiny(run,
                 "--set dist.algorithm=async_diloco --set train.steps=300 --set train.batch_size=4 "
                 "--set dist.inner_steps=5 --set dist.heartbeat_timeout_s=2 --set dist.store_timeout_s=30 "
                 "--set dist.slow_workers=0:4,1:4,2:4"));
}

std::vector<nlohmann::json> merges_of(const std::string& run) {
  std::vector<nlohmann::json> out;
  std::istringstream in(read_file(work() / run / "merges.jsonl"));
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

// `nproc` workers of `sets` stopped at their 20th step (--stop-after-step 20: the lead writes its checkpoint), then
// --resume'd: what the stopped run's checkpoint kept (its state.json and directory), the merges it wrote, and the
// resumed run's output. `ok` is false (with the failure reported) when either run failed or no checkpoint was kept.
struct StopAndResume {
  bool ok = false;
  fs::path ckpt;
  nlohmann::json state;
  int64_t kept = 0;  // the tokens the checkpoint's merges held
  size_t merges_before = 0;
  std::string resumed;  // the resumed run's output
};

StopAndResume stop_and_resume(const std::string& run, int nproc, const std::string& sets) {
  StopAndResume r;
  const std::string cli = fmt::format("{} launch --nproc {} --master-port 0 --", TRIBUTARY_CLI, nproc);
  auto [rc, out] = sh(cli + tiny(run, sets) + " --stop-after-step 20");
  if (rc != 0) {
    ADD_FAILURE() << "the stopped run failed:\n" << out;
    return r;
  }
  const auto steps = checkpoint_steps(work() / run);
  if (steps.empty()) {
    ADD_FAILURE() << "no checkpoint kept:\n" << out;
    return r;
  }
  r.ckpt = checkpoint_dir(work() / run, steps.back());
  r.state = nlohmann::json::parse(read_file(r.ckpt / "state.json"));
  if (!r.state.contains("async")) {
    ADD_FAILURE() << "no \"async\" block: " << r.state.dump();
    return r;
  }
  r.kept = r.state["async"]["tokens"].get<int64_t>();
  r.merges_before = merges_of(run).size();
  std::tie(rc, r.resumed) = sh(cli + tiny(run, sets) + " --resume");
  if (rc != 0) {
    ADD_FAILURE() << "the resumed run failed:\n" << r.resumed;
    return r;
  }
  EXPECT_NE(r.resumed.find(fmt::format("{} tokens merged): every replica starts from the lead's", r.kept)),
            std::string::npos)
      << r.resumed;
  r.ok = true;
  return r;
}

// Versions 2, 3, ... each committed once, whoever merged them.
void expect_consecutive(const std::vector<nlohmann::json>& merges) {
  for (size_t i = 0; i < merges.size(); ++i) EXPECT_EQ(merges[i]["version"].get<int64_t>(), int64_t(i) + 2);
}

}  // namespace

TEST_F(Distributed, AsyncDilocoGoesOnWhenItsMergerIsKilledAndAnotherTakesOverFromTheLastCommit) {
  // Replica 2 holds the merging term (the last rank); it is killed at its 60th step and not restarted.
  auto [rc, out] = async_run("TRIBUTARY_FAIL_RANK=2 TRIBUTARY_FAIL_STEP=60", "async_merger_killed", "");
  ASSERT_EQ(rc, 0) << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex(R"(the merger \(replica 2\) fell silent; replica (\d) merges)")))
      << out;
  const auto merges = merges_of("async_merger_killed");
  ASSERT_GT(merges.size(), 4u);
  expect_consecutive(merges);
  std::set<int> mergers;
  for (const auto& j : merges) mergers.insert(j["merger"].get<int>());
  EXPECT_EQ(mergers, (std::set<int>{2, std::stoi(m[1])})) << "both mergers' versions are in merges.jsonl";
  EXPECT_TRUE(merges.back()["done"].get<bool>());
  EXPECT_GE(merges.back()["tokens"].get<int64_t>(), 300 * 3 * 4 * 64) << "the run ends by its tokens";
  const auto summary = nlohmann::json::parse(read_file(work() / "async_merger_killed" / "summary.json"));
  EXPECT_EQ(summary["algorithm"], "async_diloco");
  EXPECT_LT(summary["val_bpb"].get<double>(), summary["unigram_bpb"].get<double>());
}

TEST_F(Distributed, AsyncDilocoTakesARestartedReplicaBackFromTheNewestVersion) {
  auto [rc, out] = async_run("TRIBUTARY_FAIL_RANK=1 TRIBUTARY_FAIL_STEP=60", "async_rejoin", "--max-restarts 1");
  ASSERT_EQ(rc, 0) << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex(R"(replica 1 joins the asynchronous run at version (\d+))"))) << out;
  const int64_t joined_at = std::stoll(m[1]);
  EXPECT_GT(joined_at, 1) << "it started from a merged version, not the initial model";
  const auto merges = merges_of("async_rejoin");
  expect_consecutive(merges);
  int64_t merged_after = 0;
  for (const auto& j : merges)
    if (j["version"].get<int64_t>() > joined_at)
      for (const auto& u : j["merged"]) merged_after += u["replica"] == 1;
  EXPECT_GT(merged_after, 0) << "the restarted replica's updates were merged again";
  EXPECT_TRUE(merges.back()["done"].get<bool>());
}

TEST_F(Distributed, AsyncIslandsTrainDataParallelInsideAndNeverWaitForEachOtherAcross) {
  // Two islands of two ranks; island 1's ranks are 3x slower. Inside an island the ranks average their gradients
  // every step (and are checked identical after every adoption); across, each island's rank 0 posts its round and
  // adopts the newest version without waiting: the fast island takes more steps than train.steps while the slow one
  // lags, and the run ends when the merges took in the run's tokens.
  auto [rc, out] = sh(std::string(TRIBUTARY_CLI) + " launch --nproc 4 --master-port 0 --" +
                      tiny("async_islands",
                           "--set dist.algorithm=async_diloco --set parallel.islands=2 --set train.steps=120 "
                           "--set train.batch_size=4 --set dist.inner_steps=5 --set dist.heartbeat_timeout_s=5 "
                           "--set dist.store_timeout_s=30 --set dist.slow_workers=2:3,3:3"));
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("2 islands: data parallel inside"), std::string::npos) << out;
  const auto merges = merges_of("async_islands");
  ASSERT_GT(merges.size(), 4u) << out;
  expect_consecutive(merges);
  std::set<int> posters;
  for (const auto& j : merges)
    for (const auto& u : j["merged"]) posters.insert(u["replica"].get<int>());
  EXPECT_EQ(posters, (std::set<int>{0, 1})) << "both islands' updates are merged";
  EXPECT_TRUE(merges.back()["done"].get<bool>());
  EXPECT_GE(merges.back()["tokens"].get<int64_t>(), 60 * 4 * 4 * 64) << "the run ends by its tokens";
  const auto summary = nlohmann::json::parse(read_file(work() / "async_islands" / "summary.json"));
  EXPECT_EQ(summary["algorithm"], "islands+async_diloco");
  EXPECT_GT(summary["steps"].get<int64_t>(), 60) << "the fast island (the lead's) did not wait for the slow one";
  EXPECT_GT(summary["bytes_inside_island"].get<double>(), 0) << "data parallel inside the island";
  EXPECT_LT(summary["val_bpb"].get<double>(), summary["unigram_bpb"].get<double>());
}

TEST_F(Distributed, AsyncIslandsResumeFromTheLeadsCheckpoint) {
  // Two islands of two ranks (ZeRO-1 inside each): the lead's checkpoint holds the global model, its island's whole
  // AdamW state (gathered from both ranks) and the merged tokens; --resume starts every rank of both islands from it
  // and the merges go on to the run's token budget.
  const auto r = stop_and_resume(
      "async_islands_resume", 4,
      "--set dist.algorithm=async_diloco --set parallel.islands=2 --set train.steps=40 --set train.batch_size=4 "
      "--set dist.inner_steps=5 --set dist.heartbeat_timeout_s=5 --set dist.store_timeout_s=30 "
      "--set parallel.shard_optimizer=true --set dist.slow_workers=0:3,1:3,2:3,3:3");
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.state["world_size"], 4) << "the ranks', not the islands'";
  const auto merges = merges_of("async_islands_resume");
  ASSERT_GT(merges.size(), r.merges_before) << "the resumed run's merges are appended";
  EXPECT_GT(merges[r.merges_before]["tokens"].get<int64_t>(), r.kept);
  EXPECT_TRUE(merges.back()["done"].get<bool>());
  EXPECT_GE(merges.back()["tokens"].get<int64_t>(), 40 * 4 * 4 * 64) << "the run's budget, over its four ranks";
}

TEST_F(Distributed, TimePacedAsyncRoundsGiveAFastReplicaMoreStepsPerRoundAndASlowOneFewer) {
  // dist.round_seconds: every replica posts after the same time of training, so replica 2 (4x slower) posts as often
  // as the others with fewer steps per round, and each update counts the tokens it trained on. -1: the round's
  // length is measured at start-up, dist.inner_steps steps of the median replica (a fast one: 2 of the 3).
  auto [rc, out] = sh(std::string(TRIBUTARY_CLI) + " launch --nproc 3 --master-port 0 --" +
                      tiny("async_paced",
                           "--set dist.algorithm=async_diloco --set train.steps=120 --set train.batch_size=4 "
                           "--set dist.round_seconds=-1 --set dist.inner_steps=20 --set dist.heartbeat_timeout_s=5 "
                           "--set dist.store_timeout_s=30 --set dist.slow_workers=2:4"));
  ASSERT_EQ(rc, 0) << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      out, m,
      std::regex(R"(a step takes ([0-9.]+), ([0-9.]+), ([0-9.]+) s on the replicas; a round lasts ([0-9.]+) s)")))
      << out;
  std::vector<double> steps = {std::stod(m[1]), std::stod(m[2]), std::stod(m[3])};
  std::sort(steps.begin(), steps.end());
  EXPECT_NEAR(std::stod(m[4]), 20 * steps[1], 0.002) << "twenty steps of the median replica\n" << out;
  std::map<int, std::vector<int64_t>> tokens;  // per replica, its updates' tokens
  for (const auto& j : merges_of("async_paced"))
    for (const auto& u : j["merged"]) tokens[u["replica"].get<int>()].push_back(u["tokens"].get<int64_t>());
  auto median = [](std::vector<int64_t> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? int64_t{0} : v[v.size() / 2];
  };
  ASSERT_EQ(tokens.size(), 3u) << out;
  const int64_t fast = median(tokens[0]), slow = median(tokens[2]);
  EXPECT_GT(fast, 2 * slow) << "a round of the fast replica holds more steps than one of the slow replica (" << fast
                            << " vs " << slow << " tokens)";
  EXPECT_GE(tokens[2].size() * 2, tokens[0].size()) << "the slow replica posts about as often";
}

TEST_F(Distributed, AsyncDilocoResumesFromTheLeadsCheckpointAndEndsAtTheSameTokenBudget) {
  // --stop-after-step 20: every replica stops at its 20th step and the lead writes its checkpoint (the global model,
  // the version's outer momenta, the tokens merged). --resume: every replica starts from it, and the merges go on
  // from those tokens to the budget of train.steps x replicas, appending to merges.jsonl. Every replica runs 3x slower:
  // 20 steps at full speed (0.3 s) could end before a replica that started late had posted, and no merge was kept.
  const auto r = stop_and_resume(
      "async_resume", 3,
      "--set dist.algorithm=async_diloco --set train.steps=60 --set train.batch_size=4 --set dist.inner_steps=5 "
      "--set dist.heartbeat_timeout_s=5 --set dist.store_timeout_s=30 --set dist.outer_lr=0.7 "
      "--set dist.outer_momentum=0.9 --set dist.slow_workers=0:3,1:3,2:3");
  ASSERT_TRUE(r.ok);
  const int64_t kept = r.kept;
  EXPECT_GT(kept, 0) << r.state.dump();
  EXPECT_TRUE(fs::exists(r.ckpt / "async_outer.safetensors"));
  EXPECT_NE(r.resumed.find("resuming asynchronous DiLoCo from"), std::string::npos) << r.resumed;
  const auto merges = merges_of("async_resume");
  const size_t merges_before = r.merges_before;
  ASSERT_GT(merges.size(), merges_before) << "the resumed run's merges are appended";
  const auto& first_resumed = merges[merges_before];
  EXPECT_EQ(first_resumed["version"].get<int64_t>(), 2) << "a new board, from version 1";
  EXPECT_GT(first_resumed["tokens"].get<int64_t>(), kept) << "merged on top of the tokens the checkpoint kept";
  EXPECT_TRUE(merges.back()["done"].get<bool>());
  const int64_t budget = 60 * 3 * 4 * 64;  // train.steps x replicas x (batch x context)
  EXPECT_GE(merges.back()["tokens"].get<int64_t>(), budget);
  EXPECT_LT(merges.back()["tokens"].get<int64_t>(), budget + 3 * 5 * 4 * 64 * 2) << "not a second budget";
  const auto summary = nlohmann::json::parse(read_file(work() / "async_resume" / "summary.json"));
  EXPECT_LT(summary["val_bpb"].get<double>(), summary["unigram_bpb"].get<double>());
}
