// Whether CUDA graphs pay for the trainer's step (issue 43): the whole step (zero_grad, forward under the run's
// precision, loss, backward, clip, AdamW) launched op by op, then captured once as a CUDA graph and replayed, on the
// same model, batch and random tokens. The step reads nothing back to the host but the loss after it (the clip scales
// by min(1, max_norm / norm) on the device), which is what a captured step needs; tokens/s of both are printed as one
// JSON object. Built only where LibTorch has CUDA. Measures only: no assertion on time.
//   bench_step_graph [--steps N] KEY=VALUE...   (keys as bench_train's; train.device must be a CUDA device)
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>

#include "tributary/model/autocast.h"
#include "tributary/model/transformer.h"
#include "tributary/optim/adamw.h"
#include "tributary/runtime/inference.h"

using namespace tributary;

namespace {

double median_tokens_per_s(std::vector<double> times, int64_t tokens) {
  std::sort(times.begin(), times.end());
  return double(tokens) / times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> overrides;
  int64_t steps = 20;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc)
      steps = std::stoll(argv[++i]);
    else
      overrides.push_back(a);
  }
  RunConfig config = RunConfig::load("", overrides);
  if (config.model.vocab_size == 0) config.model.vocab_size = 257;
  const torch::Device device = parse_device(config.train.device);
  if (!device.is_cuda()) {
    std::fprintf(stderr, "bench_step_graph: train.device must be cuda (got '%s')\n", config.train.device.c_str());
    return 2;
  }
  torch::manual_seed(0);
  Transformer model(config.model);
  model.to(device);
  auto params = named_parameters_of(model);
  AdamW opt(params, {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1});
  std::vector<torch::Tensor> grads;
  const int64_t B = config.train.batch_size, T = config.model.context;
  const auto tokens = torch::randint(0, config.model.vocab_size, {B, T + 1}, torch::kInt64).to(device);
  const bool bf16 = config.train.precision == "bf16";
  auto step = [&]() {
    opt.zero_grad();
    torch::Tensor logits;
    {
      const Autocast autocast(bf16, device.type());
      logits = model.forward(tokens.narrow(1, 0, T));
    }
    auto loss = Transformer::loss(bf16 ? logits.to(torch::kFloat32) : logits, tokens.narrow(1, 1, T));
    loss.backward();
    {
      torch::NoGradGuard no_grad;
      if (grads.empty())
        for (const auto& [name, p] : params) grads.push_back(p.grad());
      const auto norm = torch::stack(at::_foreach_norm(grads, 2)).norm(2);
      at::_foreach_mul_(grads, torch::clamp_max(1.0 / (norm + 1e-6), 1.0));  // clip to norm 1 without a host read
    }
    opt.step(1e-3);
    return loss;
  };
  auto timed = [&](const std::function<torch::Tensor()>& run) {
    std::vector<double> times;
    for (int64_t i = 0; i < steps; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      run().item<double>();  // synchronizes: the step's time is all in
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return median_tokens_per_s(times, B * T);
  };

  // Op by op, on a side stream as the capture will be (and warming the allocator and cuBLAS for it).
  const auto side = c10::cuda::getStreamFromPool();
  torch::cuda::synchronize();
  torch::Tensor captured_loss;
  at::cuda::CUDAGraph graph;
  double eager = 0;
  {
    const c10::cuda::CUDAStreamGuard guard(side);
    for (int i = 0; i < 3; ++i) step();
    eager = timed(step);
    torch::cuda::synchronize();
    graph.capture_begin();
    captured_loss = step();
    graph.capture_end();
  }
  for (int i = 0; i < 3; ++i) graph.replay();
  const double replayed = timed([&] {
    graph.replay();
    return captured_loss;
  });
  nlohmann::json out = {{"impl", "tributary-cpp-graph"},
                        {"tokens_per_s_eager", eager},
                        {"tokens_per_s_graph", replayed},
                        {"graph_over_eager", replayed / eager},
                        {"precision", config.train.precision},
                        {"device", device.str()},
                        {"final_loss", captured_loss.item<double>()}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
