// DiLoCo's outer step as the host pays it, per round: the local parameters brought to host memory and the
// pseudo-gradient (global - local), the Nesterov step on the global parameters, and the new global parameters copied
// back into the model. Ours (optim/outer.h: pinned host state and asynchronous copies for a model on a GPU) against
// the plain way in the same process (pageable host state, each copy waited for). On the CPU the copies are nothing
// and both measure the host's arithmetic. Prints one JSON line per measurement and a summary. Measures only.
//   bench_outer [--device cpu|cuda] [--layers L] [--width W] [--heads H] [--vocab V] [--reps R] [--threads N]
#include <fmt/format.h>
#include <torch/cuda.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "tributary/model/tensor_io.h"
#include "tributary/model/transformer.h"
#include "tributary/optim/outer.h"
#include "tributary/perf/flops.h"

using namespace tributary;

namespace {

using Seconds = std::vector<double>;

// One round's three phases, each timed to its end on the device.
struct Round {
  std::function<void()> down, step, up;
};

void sync(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize();
}

// The three phases' seconds (down, step, up).
std::array<double, 3> time_round(const Round& r, const torch::Device& device) {
  std::array<double, 3> seconds{};
  for (auto [phase, out] : {std::pair{&r.down, &seconds[0]}, {&r.step, &seconds[1]}, {&r.up, &seconds[2]}}) {
    sync(device);
    const auto t0 = std::chrono::steady_clock::now();
    (*phase)();
    sync(device);
    *out = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return seconds;
}

double median(Seconds v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string ms(const Seconds& v) {
  return fmt::format("{:.1f} [{:.1f}-{:.1f}]", 1e3 * median(v), 1e3 * *std::min_element(v.begin(), v.end()),
                     1e3 * *std::max_element(v.begin(), v.end()));
}

}  // namespace

int main(int argc, char** argv) {
  ModelConfig mc;
  mc.vocab_size = 4096;
  int reps = 5;
  int64_t threads = 0;
  std::string device_name = "cpu";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--device") device_name = v;
    if (a == "--layers") mc.num_layers = std::stoll(v);
    if (a == "--width") mc.width = std::stoll(v);
    if (a == "--heads") mc.num_heads = std::stoll(v);
    if (a == "--vocab") mc.vocab_size = std::stoll(v);
    if (a == "--reps") reps = std::stoi(v);
    if (a == "--threads") threads = std::stoll(v);
  }
  configure_threads(threads);
  const torch::Device device(device_name);
  torch::manual_seed(0);
  Transformer model(mc);
  model.to(device);
  NamedTensors local = named_parameters_of(model);
  int64_t numel = 0;
  for (const auto& [name, p] : local) numel += p.numel();

  torch::NoGradGuard no_grad;
  OuterOptimizer ours(local, {.lr = 0.7, .momentum = 0.9});
  // The plain way: pageable host state, each copy waited for (what the outer step did before pinned memory).
  std::vector<torch::Tensor> global, momentum;
  for (const auto& [name, p] : local) {
    global.push_back(p.detach().to(torch::kCPU, torch::kFloat32).clone());
    momentum.push_back(torch::zeros_like(global.back()));
  }
  std::vector<torch::Tensor> delta;
  const Round plain{[&] {
                      delta.clear();
                      for (size_t i = 0; i < local.size(); ++i)
                        delta.push_back(global[i] - local[i].second.to(torch::kCPU, torch::kFloat32));
                    },
                    [&] {
                      for (size_t i = 0; i < local.size(); ++i) {
                        momentum[i].mul_(0.9).add_(delta[i]);
                        global[i].sub_(delta[i] + 0.9 * momentum[i], 0.7);
                      }
                    },
                    [&] {
                      for (size_t i = 0; i < local.size(); ++i)
                        local[i].second.copy_(global[i].to(local[i].second.device()));
                    }};
  const Round pinned{[&] { delta = ours.pseudo_gradient(local); }, [&] { ours.apply(delta); },
                     [&] { ours.copy_to(local); }};

  std::map<std::string, std::array<Seconds, 3>> times;
  for (int r = 0; r <= reps; ++r) {  // round 0 warms up (allocations, the staging copy)
    for (const auto& [name, round] : {std::pair{"plain", &plain}, {"ours", &pinned}}) {
      const std::array<double, 3> seconds = time_round(*round, device);
      if (r == 0) continue;
      for (int k = 0; k < 3; ++k) times[name][k].push_back(seconds[k]);
    }
  }
  fmt::print("outer step of {} parameters ({:.0f} MB fp32) on {}, {} threads, {} rounds; median [min-max] ms\n", numel,
             numel * 4 / 1e6, device_name, at::get_num_threads(), reps);
  for (const auto& [name, t] : times) {
    fmt::print("  {:5}  down + pseudo-gradient {}  Nesterov step {}  up {}\n", name, ms(t[0]), ms(t[1]), ms(t[2]));
    fmt::print("{}\n", nlohmann::json{{"bench", "outer"},
                                      {"way", name},
                                      {"device", device_name},
                                      {"parameters", numel},
                                      {"down_s", median(t[0])},
                                      {"step_s", median(t[1])},
                                      {"up_s", median(t[2])}}
                           .dump());
  }
}
