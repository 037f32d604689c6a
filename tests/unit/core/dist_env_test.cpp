#include <gtest/gtest.h>

#include "tributary/core/error.h"
#include "tributary/launch/dist_env.h"

using namespace tributary;

TEST(DistEnv, SingleProcessByDefault) {
  DistEnv d = resolve_dist_env({{"HOME", "/root"}});
  EXPECT_EQ(d.world_size, 1);
  EXPECT_FALSE(d.distributed());
}

TEST(DistEnv, TorchrunWithAgentStore) {
  DistEnv d = resolve_dist_env({{"RANK", "3"},
                                {"WORLD_SIZE", "8"},
                                {"LOCAL_RANK", "1"},
                                {"LOCAL_WORLD_SIZE", "2"},
                                {"MASTER_ADDR", "10.1.2.3"},
                                {"MASTER_PORT", "29600"},
                                {"TORCHELASTIC_RUN_ID", "x"},
                                {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                {"TORCHELASTIC_RESTART_COUNT", "2"},
                                {"SLURM_PROCID", "7"},
                                {"SLURM_NTASKS", "9"}});
  EXPECT_EQ(d.source, "torchrun");
  EXPECT_EQ(d.rank, 3);
  EXPECT_EQ(d.world_size, 8);
  EXPECT_EQ(d.local_rank, 1);
  EXPECT_EQ(d.master_addr, "10.1.2.3");
  EXPECT_EQ(d.master_port, 29600);
  EXPECT_TRUE(d.use_agent_store);
  EXPECT_EQ(d.store_prefix, "/worker/attempt_2");
}

TEST(DistEnv, Slurm) {
  DistEnv d = resolve_dist_env({{"SLURM_PROCID", "5"},
                                {"SLURM_NTASKS", "6"},
                                {"SLURM_LOCALID", "1"},
                                {"SLURM_JOB_NODELIST", "gpu-[07-09,12],cpu1"},
                                {"SLURM_NTASKS_PER_NODE", "2(x3)"}});
  EXPECT_EQ(d.source, "slurm");
  EXPECT_EQ(d.rank, 5);
  EXPECT_EQ(d.world_size, 6);
  EXPECT_EQ(d.local_rank, 1);
  EXPECT_EQ(d.local_world_size, 2);
  EXPECT_EQ(d.master_addr, "gpu-07");
  EXPECT_EQ(first_slurm_host("a,b"), "a");
  EXPECT_EQ(first_slurm_host("n[3,5]"), "n3");
}

TEST(DistEnv, BadValuesNameTheVariable) {
  try {
    resolve_dist_env({{"RANK", "two"}, {"WORLD_SIZE", "4"}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("RANK"), std::string::npos);
  }
  EXPECT_THROW(resolve_dist_env({{"RANK", "4"}, {"WORLD_SIZE", "4"}}), Error);
}

TEST(DistEnv, AStrayRankAndWorldSizeIsRefusedNotAWaitForPeers) {
  // Issue 12 item 8: RANK/WORLD_SIZE left in a shell made a plain `train` host a store and wait 600 s.
  try {
    resolve_dist_env({{"RANK", "0"}, {"WORLD_SIZE", "2"}});
    FAIL() << "a stray RANK/WORLD_SIZE was taken for a distributed run";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unset RANK and WORLD_SIZE"), std::string::npos) << e.what();
  }
  // Set by hand with the store's address, by launch, or a world of one: accepted.
  EXPECT_EQ(resolve_dist_env({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "10.0.0.1"}}).world_size, 2);
  EXPECT_EQ(resolve_dist_env({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"TRIBUTARY_LAUNCHED", "1"}}).rank, 1);
  EXPECT_EQ(resolve_dist_env({{"RANK", "0"}, {"WORLD_SIZE", "1"}}).world_size, 1);
}
