// The graphed step (train.cuda_graph; runtime/step_graph.h, runtime/step_runner.cpp). On the CPU the graph's body runs
// eagerly every step, which checks the arithmetic a graph captures (the loss summed on the device, the clip without a
// host read, AdamW's step split into prepare and launch) against the eager DenseStep. On a GPU the body is captured
// after its warm-up and replayed, against the eager step on the same GPU. The learning rate changes every step, so a
// replay that kept the captured step's rate would show.
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "support/lcg_tokens.h"
#include "support/tiny_model.h"
#include "tributary/config/run_config.h"
#include "tributary/core/error.h"
#include "tributary/data/loader.h"
#include "tributary/model/transformer.h"
#include "tributary/optim/adamw.h"
#include "tributary/runtime/step_graph.h"
#include "tributary/runtime/step_runner.h"

using namespace tributary;

namespace {

struct Trained {
  std::vector<double> losses, norms;
  std::vector<torch::Tensor> params;
};

Trained train(const torch::Device& device, bool graphed, int64_t accum, AdamWKernel kernel, int64_t steps) {
  static const auto tokens = test_support::lcg_tokens(4000, 61, 7);
  torch::manual_seed(1);
  Transformer model(test_support::tiny_model());
  model.to(device);
  auto params = named_parameters_of(model);
  AdamW opt(params, {.weight_decay = 0.1, .kernel = kernel});
  BatchLoader loader(tokens, {.batch_size = 4, .context = test_support::tiny_model().context, .seed = 3}, "test");
  DenseStep step(DenseStepParts{.model = model,
                                .params = params,
                                .optimizer = opt,
                                .loader = loader,
                                .device = device,
                                .grad_accum = accum,
                                .grad_clip = 0.5,
                                .cuda_graph = graphed});
  Trained out;
  for (int64_t s = 0; s < steps; ++s) {
    const auto result = step.run(s, 2e-3 * double(s + 1));
    out.losses.push_back(result.loss);
    out.norms.push_back(result.grad_norm);
  }
  EXPECT_EQ(opt.num_steps(), steps);
  for (const auto& [name, p] : params) out.params.push_back(p.detach().to(torch::kCPU).clone());
  return out;
}

void expect_same_training(const Trained& got, const Trained& want, double rtol, double atol, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < got.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], want.losses[i], rtol * std::abs(want.losses[i])) << what << " loss of step " << i + 1;
    EXPECT_NEAR(got.norms[i], want.norms[i], rtol * std::abs(want.norms[i])) << what << " norm of step " << i + 1;
  }
  for (size_t i = 0; i < got.params.size(); ++i)
    EXPECT_TRUE(torch::allclose(got.params[i], want.params[i], rtol, atol))
        << what << " parameter " << i << " off by " << (got.params[i] - want.params[i]).abs().max().item<double>();
}

}  // namespace

TEST(StepGraph, TheGraphedStepTrainsAsTheEagerStepDoes) {
  for (const int64_t accum : {1, 2}) {
    // Both on ATen's fused AdamW, so that only the step's own arithmetic differs.
    const auto eager = train(torch::kCPU, false, accum, AdamWKernel::kATenFused, 6);
    const auto graphed = train(torch::kCPU, true, accum, AdamWKernel::kATenFused, 6);
    EXPECT_GT(eager.losses.front() - eager.losses.back(), 0.05) << "it trains";
    expect_same_training(graphed, eager, 1e-5, 1e-6, "grad_accum " + std::to_string(accum));
  }
}

TEST(StepGraph, OnTheGpuTheCapturedStepReplaysAsTheEagerStepDoes) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device (a CPU build of LibTorch, or no GPU)";
  for (const int64_t accum : {1, 2}) {  // 3 eager warm-up steps, the capture, then replays
    const auto eager = train(torch::kCUDA, false, accum, AdamWKernel::kAuto, 9);
    const auto graphed = train(torch::kCUDA, true, accum, AdamWKernel::kAuto, 9);
    expect_same_training(graphed, eager, 1e-4, 1e-5, "GPU, grad_accum " + std::to_string(accum));
  }
}

TEST(StepGraph, OnlyAGpuRunCapturesAndTheConfigSaysSo) {
  StepGraph cpu(torch::kCPU);
  int bodies = 0;
  for (int i = 0; i < 5; ++i) cpu.run([] {}, [&] { ++bodies; });
  EXPECT_EQ(bodies, 5) << "without CUDA the body runs every time";
  EXPECT_FALSE(cpu.captured());
  try {
    RunConfig::load("", {"train.cuda_graph=true"});
    ADD_FAILURE() << "train.cuda_graph on the CPU was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.device = cuda"), std::string::npos) << e.what();
  }
  try {
    RunConfig::load("", {"train.cuda_graph=true", "train.device=cuda", "parallel.pipeline_stages=2"});
    ADD_FAILURE() << "train.cuda_graph with pipeline stages was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("set train.cuda_graph = false"), std::string::npos) << e.what();
  }
}
