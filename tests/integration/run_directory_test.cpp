// A multi-machine run's directory (issue 46, item 3): the multi-process checkpoint stages every rank's files in rank
// 0's train.run_dir, so each machine must see that directory at the same path. Two launches ("machines") in
// directories of their own stand for two hosts without a shared filesystem.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "launch_support.h"
#include "test_paths.h"  // generated: TRIBUTARY_CLI, TRIBUTARY_SOURCE_DIR, ...
#include "tributary/core/fs.h"
#include "tributary/runtime/launcher.h"

using namespace tributary;

using test_support::Distributed;
using test_support::sh;
using test_support::tiny;
using test_support::work;

TEST_F(Distributed, MachinesWithoutASharedRunDirectoryAreToldAtStartUpNotAtTheFinalCheckpoint) {
  // Before, both machines trained to the end, then the final checkpoint failed on rank 1 ("cannot write file
  // .../step-00000040.tmp-ranks/rank-1.model.safetensors") and the run was lost: no checkpoint, no summary.
  const std::string cli = TRIBUTARY_CLI;
  const int port = free_tcp_port();
  // The same relative train.run_dir in each machine's own working directory (the config check compares the key).
  auto node = [&](int n) {
    const fs::path host = work() / fmt::format("host{}", n);
    fs::create_directories(host);
    return fmt::format("cd {} && {} launch --nnodes 2 --node-rank {} --nproc 1 --master-port {} --grace 2 --{}",
                       host.string(), cli, n, port,
                       tiny("unused",
                            "--set train.steps=40 --set dist.algorithm=diloco --set dist.inner_steps=10 "
                            "--set train.run_dir=run"));
  };
  const auto start = std::chrono::steady_clock::now();
  auto [rc, out] = sh("bash -c '" + node(0) + " & n0=$!; " + node(1) + "; rc1=$?; wait $n0; echo exits $? $rc1'");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(out.find("is not shared: rank(s) 1 do not see the file rank 0 wrote there"), std::string::npos) << out;
  int rc0 = 0, rc1 = 0;
  ASSERT_EQ(std::sscanf(out.c_str() + std::min(out.size(), out.rfind("exits ")), "exits %d %d", &rc0, &rc1), 2) << out;
  EXPECT_NE(rc0, 0) << "machine 0's launch reported success\n" << out;
  EXPECT_NE(rc1, 0) << "machine 1's launch reported success\n" << out;
  EXPECT_EQ(out.find("cannot write file"), std::string::npos) << "found at the checkpoint, not at start-up\n" << out;
  EXPECT_FALSE(fs::exists(work() / "host0" / "run" / "checkpoints")) << "it trained";
  EXPECT_FALSE(fs::exists(work() / "host0" / "run" / "summary.json"));
  EXPECT_LT(seconds, 60) << out;
  // The same two launches sharing one directory train and checkpoint.
  auto shared = [&](int n, int p) {
    return fmt::format("{} launch --nnodes 2 --node-rank {} --nproc 1 --master-port {} --grace 2 --{}", cli, n, p,
                       tiny("together", "--set train.steps=20 --set dist.algorithm=diloco --set dist.inner_steps=10"));
  };
  const int port2 = free_tcp_port();
  auto [rc2, out2] =
      sh("bash -c '" + shared(0, port2) + " & n0=$!; " + shared(1, port2) + "; rc1=$?; wait $n0 || rc1=1; exit $rc1'");
  ASSERT_EQ(rc2, 0) << out2;
  EXPECT_TRUE(fs::exists(work() / "together" / "checkpoints" / "step-00000020" / "manifest.json")) << out2;
  EXPECT_FALSE(fs::exists(work() / "together" / ".tributary-shared-probe")) << "the probe is removed";
}
