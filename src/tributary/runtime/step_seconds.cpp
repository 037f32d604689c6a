#include "tributary/runtime/step_seconds.h"

#include <algorithm>
#include <vector>

#include "tributary/core/clock.h"
#include "tributary/runtime/step_runner.h"

namespace tributary {

double measure_step_seconds(Transformer& model, const RunConfig& config, torch::Device device, double slow_factor) {
  const auto& tc = config.train;
  const int64_t T = config.model.context;
  auto generator = at::detail::createCPUGenerator(uint64_t(0x1517));  // its own: the run's random numbers stay
  const auto tokens =
      at::randint(0, config.model.vocab_size, {tc.batch_size, T + 1}, generator, torch::kLong).to(device);
  const bool bf16 = tc.precision == "bf16";
  std::vector<double> seconds;
  for (int pass = 0; pass < 4; ++pass) {
    const auto start = Clock::now();
    for (int64_t micro = 0; micro < tc.grad_accum; ++micro) next_token_loss(model, tokens, bf16).backward();
    if (device.is_cuda()) torch::cuda::synchronize();
    if (pass > 0) seconds.push_back(seconds_since(start));  // the first warms the allocator and the kernels
  }
  for (auto& p : model.parameters()) p.mutable_grad() = torch::Tensor();
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2] * slow_factor;
}

}  // namespace tributary
