// A multi-machine run's directory (issue 46, item 3): two launches ("machines") in working directories of their own
// stand for two hosts without a shared filesystem. Each machine keeps its own ranks' checkpoints; rank 0 keeps the
// model, summary.json and every worker's lines; --resume continues bit for bit from the per-machine directories.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <tuple>
#include <vector>

#include "launch_support.h"
#include "test_paths.h"  // generated: TRIBUTARY_CLI, TRIBUTARY_SOURCE_DIR, ...
#include "tributary/core/fs.h"
#include "tributary/launch/launcher.h"

using namespace tributary;

using test_support::Distributed;
using test_support::sh;
using test_support::tiny;
using test_support::work;

TEST_F(Distributed, MachinesWithoutASharedRunDirectoryEachKeepTheirOwnAndResumeBitForBit) {
  // Before, the run was refused at start-up (and before that, lost at its final checkpoint: "cannot write file
  // .../step-00000040.tmp-ranks/rank-1.model.safetensors").
  const std::string cli = TRIBUTARY_CLI;
  const std::string args =
      "--set train.steps=40 --set dist.algorithm=diloco --set dist.inner_steps=10 --set train.checkpoint_every=10 "
      "--set train.keep_checkpoints=5";
  // The same relative train.run_dir in each machine's own working directory.
  auto node = [&](int n, int port, const std::string& extra) {
    const fs::path host = work() / fmt::format("host{}", n);
    fs::create_directories(host);
    return fmt::format("cd {} && {} launch --nnodes 2 --node-rank {} --nproc 1 --master-port {} --grace 2 --{}",
                       host.string(), cli, n, port, tiny("unused", args + " --set train.run_dir=run " + extra));
  };
  auto both = [&](const std::string& extra) {
    const int port = free_tcp_port();
    return sh("bash -c '" + node(0, port, extra) + " & n0=$!; " + node(1, port, extra) +
              "; rc1=$?; wait $n0; rc0=$?; echo exits $rc0 $rc1; exit $((rc0 + rc1))'");
  };
  auto [rc, out] = both("--stop-after-step 20");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("is not shared with rank(s) 1"), std::string::npos) << out;
  const fs::path lead = work() / "host0" / "run", own = work() / "host1" / "run" / "ranks" / "rank-1";
  EXPECT_TRUE(fs::exists(lead / "checkpoints" / "step-00000020" / "manifest.json")) << out;
  EXPECT_TRUE(fs::exists(own / "checkpoints" / "step-00000020" / "manifest.json")) << out;
  EXPECT_FALSE(fs::exists(lead / "checkpoints" / "step-00000020" / "rank-1.model.safetensors"));
  EXPECT_TRUE(fs::exists(lead / "workers" / "rank1.jsonl")) << "rank 0 keeps every worker's lines";
  EXPECT_EQ(read_file(lead / "workers" / "rank1.jsonl"),
            read_file(work() / "host1" / "run" / "workers" / "rank1.jsonl"));
  // Machine 1's own directory: eval reads its replica, report says where the run's report is (issue 66, item 3).
  const fs::path other = work() / "host1" / "run";
  auto [rc_eval, out_eval] =
      sh(fmt::format("{} eval {} --data {} --batches 2", cli, other.string(), test_support::data().string()));
  EXPECT_EQ(rc_eval, 0) << out_eval;
  EXPECT_NE(out_eval.find("keeps the replica(s) of rank(s) 1 (ranks/rank-R)"), std::string::npos) << out_eval;
  auto [rc_report, out_report] = sh(fmt::format("{} report {}", cli, other.string()));
  EXPECT_EQ(rc_report, 2) << out_report;
  EXPECT_NE(out_report.find("is another machine's part of a run"), std::string::npos) << out_report;
  EXPECT_NE(out_report.find("run `tributary report` there"), std::string::npos) << out_report;
  // Machine 1 lost its newest checkpoint (killed while it wrote it): both resume from the newest one they both hold.
  fs::remove_all(own / "checkpoints" / "step-00000020");
  auto [rc2, out2] = both("--resume");
  ASSERT_EQ(rc2, 0) << out2;
  EXPECT_NE(out2.find("step 10 is the newest checkpoint every rank holds"), std::string::npos) << out2;
  EXPECT_NE(out2.find("at step 10"), std::string::npos) << out2;
  EXPECT_TRUE(fs::exists(lead / "summary.json")) << out2;

  // The same two launches sharing one directory, uninterrupted: the same model and the same replica of rank 1.
  auto shared = [&](int n, int p) {
    return fmt::format("{} launch --nnodes 2 --node-rank {} --nproc 1 --master-port {} --grace 2 --{}", cli, n, p,
                       tiny("together", args));
  };
  const int port2 = free_tcp_port();
  auto [rc3, out3] =
      sh("bash -c '" + shared(0, port2) + " & n0=$!; " + shared(1, port2) + "; rc1=$?; wait $n0 || rc1=1; exit $rc1'");
  ASSERT_EQ(rc3, 0) << out3;
  EXPECT_EQ(out3.find("is not shared"), std::string::npos) << out3;
  EXPECT_FALSE(fs::exists(work() / "together" / ".tributary-shared-probe")) << "the probe is removed";
  const fs::path together = work() / "together";
  for (const auto& [mine, theirs, file] : std::vector<std::tuple<fs::path, std::string, std::string>>{
           {lead, "model.safetensors", "model.safetensors"},
           {lead, "outer.safetensors", "outer.safetensors"},
           {own, "model.safetensors", "rank-1.model.safetensors"},
           {own, "optim.safetensors", "rank-1.optim.safetensors"}}) {
    auto a = test_support::flat_params(mine, 40, theirs), b = test_support::flat_params(together, 40, file);
    EXPECT_TRUE(torch::equal(a, b)) << mine << " " << theirs << " vs " << file;
  }
}

TEST_F(Distributed, AMachineWithOtherDataAtTheSamePathIsRefusedBeforeTraining) {
  // Issue 46, item 1: a worker training on other data at the same data.dir joined a run and raised its loss unseen.
  const std::string cli = TRIBUTARY_CLI;
  for (int n : {0, 1}) {
    const fs::path host = work() / fmt::format("datahost{}", n);
    fs::remove_all(host);
    fs::create_directories(host);
    fs::copy(test_support::data(), host / "data", fs::copy_options::recursive);
  }
  // Machine 1's dataset says something else in its dataset.json (it opens and trains as well as the other).
  const fs::path other = work() / "datahost1" / "data" / "dataset.json";
  std::string meta = read_file(other);
  meta.replace(meta.find("\"val_permille\""), 14, "\"val_permille\" ");
  write_file(other, meta);
  auto node = [&](int n, int port) {
    return fmt::format("cd {} && {} launch --nnodes 2 --node-rank {} --nproc 1 --master-port {} --grace 2 --{}",
                       (work() / fmt::format("datahost{}", n)).string(), cli, n, port,
                       tiny("unused", "--set train.steps=10 --set train.run_dir=run --set data.dir=data"));
  };
  const int port = free_tcp_port();
  auto [rc, out] =
      sh("bash -c '" + node(0, port) + " & n0=$!; " + node(1, port) + "; rc1=$?; wait $n0; exit $(( $? + rc1 ))'");
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("rank(s) 1 hold other data than rank 0 at data.dir = 'data'"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(work() / "datahost0" / "run" / "checkpoints")) << "it trained";
  // The same copy on both machines trains.
  write_file(other, read_file(work() / "datahost0" / "data" / "dataset.json"));
  const int port2 = free_tcp_port();
  auto [rc2, out2] =
      sh("bash -c '" + node(0, port2) + " & n0=$!; " + node(1, port2) + "; rc1=$?; wait $n0; exit $(( $? + rc1 ))'");
  EXPECT_EQ(rc2, 0) << out2;
}
