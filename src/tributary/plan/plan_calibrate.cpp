#include "tributary/plan/plan_calibrate.h"

#include <algorithm>
#include <chrono>

#include "tributary/artifacts/inference.h"
#include "tributary/core/error.h"
#include "tributary/core/progress.h"
#include "tributary/data/dataset.h"
#include "tributary/model/transformer.h"
#include "tributary/perf/flops.h"

namespace tributary {

Calibration calibrate_speed(const RunConfig& config, int repeats) {
  if (repeats < 1) fail("calibration needs at least one repeat, got {}", repeats);
  ModelConfig model_config = config.model;
  if (model_config.vocab_size == 0) model_config.vocab_size = Dataset::open(config.data.dir).vocab_size();  // as train
  const torch::Device device = parse_device(config.train.device);
  Calibration c;
  c.threads = configure_threads(config.train.threads);
  c.device = device.str();
  c.repeats = repeats;
  c.sequences = std::max<int64_t>(1, config.train.batch_size / config.parallel.micro_batches);
  c.tokens = c.sequences * model_config.context;
  c.parameters = double(model_config.num_parameters(model_config.vocab_size));
  Transformer model(model_config);  // the model's own initialisation: speed does not depend on the values
  model.to(device);
  auto gen = at::detail::createCPUGenerator(7);
  const auto tokens =
      at::randint(model_config.vocab_size, {c.sequences, model_config.context + 1}, gen, torch::kInt64).to(device);
  const auto input = tokens.narrow(1, 0, model_config.context), target = tokens.narrow(1, 1, model_config.context);
  auto step = [&] {
    model.zero_grad();
    Transformer::loss(model.forward(input), target).backward();
    if (device.is_cuda()) torch::cuda::synchronize();
  };
  step();  // warm-up: allocations, first-touch
  std::vector<double> rates;
  Progress progress("plan --calibrate", repeats, "steps");  // a large model's steps take seconds each
  for (int r = 0; r < repeats; ++r, progress.advance()) {
    const auto start = std::chrono::steady_clock::now();
    step();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    rates.push_back(6.0 * c.parameters * double(c.tokens) / s / 1e12);
  }
  std::sort(rates.begin(), rates.end());
  c.tflops = rates[rates.size() / 2];
  c.tflops_min = rates.front();
  c.tflops_max = rates.back();
  return c;
}

}  // namespace tributary
