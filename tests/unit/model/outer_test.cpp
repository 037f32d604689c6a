// The outer step against a hand-computed reference (torch.optim.SGD(nesterov=True) semantics).
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "tributary/optim/outer.h"

using namespace tributary;

TEST(OuterOptimizer, NesterovStepsMatchHandComputation) {
  auto p = torch::tensor({1.0f, -2.0f});
  NamedTensors local = {{"w", p}};
  OuterOptimizer outer(local, {.lr = 0.5, .momentum = 0.9});
  // replica moved to (0.8, -1.5): delta = (0.2, -0.5). buf = delta; update = delta + 0.9 buf = 1.9 delta
  local[0].second.copy_(torch::tensor({0.8f, -1.5f}));
  auto delta = outer.pseudo_gradient(local);
  EXPECT_TRUE(torch::allclose(delta[0], torch::tensor({0.2f, -0.5f})));
  outer.step(delta, local);
  // global = (1, -2) - 0.5 * 1.9 * (0.2, -0.5) = (0.81, -1.525)
  EXPECT_TRUE(torch::allclose(outer.global()[0].second, torch::tensor({0.81f, -1.525f})));
  EXPECT_TRUE(local[0].second.equal(outer.global()[0].second)) << "every replica restarts from the new global";
  // second round: delta2 = (0.1, 0.1); buf = 0.9 * (0.2, -0.5) + (0.1, 0.1) = (0.28, -0.35)
  // update = delta2 + 0.9 buf = (0.352, -0.215); global = (0.81, -1.525) - 0.5 update = (0.634, -1.4175)
  std::vector<torch::Tensor> delta2 = {torch::tensor({0.1f, 0.1f})};
  outer.step(delta2, local);
  EXPECT_TRUE(torch::allclose(outer.global()[0].second, torch::tensor({0.634f, -1.4175f})));
  EXPECT_TRUE(torch::allclose(outer.state()[0].second, torch::tensor({0.28f, -0.35f})));
}

TEST(OuterOptimizer, LrOneNoMomentumIsAveraging) {
  NamedTensors local = {{"w", torch::tensor({4.0f})}};
  OuterOptimizer outer(local, {.lr = 1.0, .momentum = 0.0});
  std::vector<torch::Tensor> avg_delta = {torch::tensor({1.5f})};  // replicas at 2 and 3 -> deltas 2 and 1
  outer.step(avg_delta, local);
  EXPECT_FLOAT_EQ(local[0].second.item<float>(), 2.5f);
}

// A model on a GPU: the outer state stays in pinned host memory (the GPU holds one model) and three rounds step it as
// the same rounds on the CPU do, bit for bit (the copies are asynchronous; the arithmetic is the host's either way).
TEST(OuterOptimizer, OnTheGpuTheStateIsPinnedHostMemoryAndStepsAsOnTheCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device (a CPU build of LibTorch, or no GPU)";
  torch::manual_seed(3);
  const auto start = torch::randn({64, 48});
  NamedTensors cpu = {{"w", start.clone()}}, gpu = {{"w", start.to(torch::kCUDA)}};
  OuterOptimizer on_cpu(cpu, {.lr = 0.7, .momentum = 0.9}), on_gpu(gpu, {.lr = 0.7, .momentum = 0.9});
  for (const auto& tensors : {on_gpu.global(), on_gpu.state()}) {
    EXPECT_TRUE(tensors[0].second.device().is_cpu());
    EXPECT_TRUE(tensors[0].second.is_pinned());
  }
  for (int round = 0; round < 3; ++round) {
    const auto moved = torch::randn({64, 48}) * 0.01;
    cpu[0].second.add_(moved);
    gpu[0].second.add_(moved.to(torch::kCUDA));
    on_cpu.step(on_cpu.pseudo_gradient(cpu), cpu);
    on_gpu.step(on_gpu.pseudo_gradient(gpu), gpu);
    EXPECT_TRUE(on_gpu.global()[0].second.equal(on_cpu.global()[0].second)) << "round " << round;
    EXPECT_TRUE(gpu[0].second.cpu().equal(cpu[0].second)) << "round " << round;
  }
}
