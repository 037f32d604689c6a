// `tributary plan --calibrate`: the measured speed is the model's training rate on this machine.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "support/error_of.h"
#include "tributary/plan/plan_calibrate.h"

using namespace tributary;

TEST(PlanCalibrate, MeasuresTheConfiguredModelOnOneMicroBatch) {
  RunConfig config = RunConfig::from_toml(R"(
[model]
vocab_size = 97
num_layers = 2
width = 32
num_heads = 2
context = 16
[train]
batch_size = 8
threads = 1
[parallel]
micro_batches = 2
)",
                                          "calibrate.toml");
  const int threads_before = at::get_num_threads();
  const Calibration c = calibrate_speed(config, 3);
  at::set_num_threads(threads_before);
  EXPECT_EQ(c.sequences, 4);  // batch 8 over 2 micro-batches
  EXPECT_EQ(c.tokens, 4 * 16);
  EXPECT_EQ(c.threads, 1);
  EXPECT_EQ(c.repeats, 3);
  EXPECT_DOUBLE_EQ(c.parameters, double(config.model.num_parameters(97)));
  EXPECT_GT(c.tflops_min, 0);
  EXPECT_LE(c.tflops_min, c.tflops);
  EXPECT_LE(c.tflops, c.tflops_max);
  EXPECT_LT(c.tflops_max, 100);  // a 2-core CPU does not train at 100 TFLOP/s: the units are right
  EXPECT_NE(test_support::error_of([&] { calibrate_speed(config, 0); }).find("at least one repeat"), std::string::npos);
}
