// Local parallelism across processes through `tributary launch` (parallel/local/local_stage.h): a run resumes bit for
// bit, auxiliary heads included, and a stage that stops answering ends the run within the deadline.
#include <gtest/gtest.h>

#include <chrono>

#include "launch_support.h"
#include "test_paths.h"  // generated: TRIBUTARY_CLI, TRIBUTARY_SOURCE_DIR, ...

using namespace tributary::test_support;

namespace {

const std::string kStages =
    "--set model.num_layers=4 --set train.steps=6 --set train.batch_size=4 "
    "--set parallel.pipeline_stages=2 --set parallel.micro_batches=2 --set local.chunks=2 ";

}  // namespace

TEST_F(Distributed, LocalStagesResumeBitForBitWithTheirHeads) {
  // 2 pipelines x 2 local stages with DiLoCo per stage (H = 4), overlapping chunks (the second chunk's loss trains the
  // last block of the first) and private-block heads: stopped after step 3 (mid-round, when the replicas' heads
  // differ) and resumed, every file of the last checkpoint equals the uninterrupted run's, each rank's heads included.
  expect_resume_bit_exact(std::string(TRIBUTARY_CLI) + " launch --nproc 4 --", "local_resume",
                          kStages +
                              "--set local.mode=overlapping --set local.aux_head=blocks "
                              "--set dist.algorithm=diloco --set dist.inner_steps=4",
                          3, 6,
                          {"model.safetensors", "optim.safetensors", "aux_heads.safetensors",
                           "rank-0.outer.safetensors", "rank-3.model.safetensors", "rank-3.optim.safetensors",
                           "rank-3.outer.safetensors", "rank-3.aux_heads.safetensors"});
}

TEST_F(Distributed, AFrozenLocalStageEndsTheRunWithinTheDeadline) {
  const auto start = std::chrono::steady_clock::now();
  auto [rc, out] = sh("TRIBUTARY_FAIL_MODE=stop TRIBUTARY_FAIL_RANK=1 TRIBUTARY_FAIL_STEP=3 " +
                      std::string(TRIBUTARY_CLI) + " launch --nproc 2 --grace 2 --" +
                      tiny("local_frozen", kStages + "--set train.steps=50 --set dist.collective_timeout_s=4 "
                                                     "--set dist.store_timeout_s=4"));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(rc, 4) << out;
  EXPECT_NE(out.find("timed out after 4 s"), std::string::npos) << out;
  EXPECT_NE(out.find("rank 1 (pid"), std::string::npos) << out;
  EXPECT_LT(took, 40) << out;
}
