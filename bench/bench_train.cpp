// Training throughput of the C++ trainer's step (forward, backward, clip, AdamW) on random tokens, and the sgemm
// peak measured in the same process. Prints one JSON object; `./run bench` puts it next to PyTorch eager's numbers.
// Measures only: no assertion on time.
#include <torch/csrc/autograd/profiler_legacy.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "tributary/artifacts/inference.h"
#include "tributary/data/loader.h"
#include "tributary/model/cpu_allocator.h"
#include "tributary/model/transformer.h"
#include "tributary/optim/adamw.h"
#include "tributary/perf/flops.h"
#include "tributary/runtime/step_runner.h"

using namespace tributary;

int main(int argc, char** argv) {
  std::vector<std::string> overrides;
  int64_t steps = 10, warmup = 2;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc)
      steps = std::stoll(argv[++i]);
    else if (a == "--warmup" && i + 1 < argc)
      warmup = std::stoll(argv[++i]);
    else
      overrides.push_back(a);
  }
  RunConfig config = RunConfig::load("", overrides);
  if (config.model.vocab_size == 0) config.model.vocab_size = 257;
  configure_threads(config.train.threads);
  install_cpu_caching_allocator();  // as the CLI does (model/cpu_allocator.h)
  auto blas = check_blas();
  const torch::Device device = parse_device(config.train.device);  // --set train.device=cuda on a GPU machine
  torch::manual_seed(0);
  Transformer model(config.model);
  model.to(device);
  auto params = named_parameters_of(model);
  AdamW opt(params, {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1});
  const int64_t B = config.train.batch_size, T = config.model.context;
  // Random tokens through the trainer's own step (runtime/step_runner.h): loader, forward under the run's precision,
  // backward, clip, AdamW — and with train.cuda_graph=true the same step captured once and replayed.
  auto generator = at::detail::createCPUGenerator(0);
  const auto ids =
      at::randint(0, config.model.vocab_size, {std::max<int64_t>(64, 4 * B) * T + 1}, generator, torch::kInt64);
  const auto tokens =
      std::make_shared<const std::vector<uint32_t>>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel());
  BatchLoader loader(tokens, {.batch_size = B, .context = T, .seed = 0}, "bench");
  DenseStep dense(DenseStepParts{.model = model,
                                 .params = params,
                                 .optimizer = opt,
                                 .loader = loader,
                                 .device = device,
                                 .grad_clip = 1.0,
                                 .bf16 = config.train.precision == "bf16",
                                 .cuda_graph = config.train.cuda_graph});
  if (config.train.cuda_graph) warmup = std::max<int64_t>(warmup, 5);  // the eager runs and the capture: untimed
  int64_t done = 0;
  auto step = [&] { return dense.run(done++, 1e-3).loss; };  // reads the loss: the step's time is all in
  for (int64_t i = 0; i < warmup; ++i) step();
  std::vector<double> times;
  for (int64_t i = 0; i < steps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    step();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  if (const char* trace = std::getenv("TRIBUTARY_PROFILE")) {  // chrome trace of one more step, for digging
    torch::autograd::profiler::RecordProfile guard(trace);
    step();
  }
  std::sort(times.begin(), times.end());
  double median = times[times.size() / 2];
  double peak =
      measure_matmul_peak(device, 0, 6, config.train.precision == "bf16" ? torch::kBFloat16 : torch::kFloat32);
  double tps = double(B * T) / median;
  double fpt = training_flops_per_token(config.model, model.num_matmul_parameters());
  nlohmann::json out = {{"impl", "tributary-cpp"},
                        {"tokens_per_s", tps},
                        {"step_s_median", median},
                        {"peak_flops", peak},
                        {"flops_per_token", fpt},
                        {"mfu", tps * fpt / peak},
                        {"num_parameters", model.num_parameters()},
                        {"threads", at::get_num_threads()},
                        {"device", device.str()},
                        {"precision", config.train.precision},
                        {"cuda_graph", config.train.cuda_graph},
                        {"blas", blas.library},
                        {"cpu_cache_hits", cpu_cache_stats().hits},
                        {"cpu_cache_misses", cpu_cache_stats().misses}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
