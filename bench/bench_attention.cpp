// Causal attention, forward + backward, per sequence length: the composite path the model used before (full-square
// bmm(q, k^T), the fused causal softmax, bmm(att, v)) and LibTorch's own at::scaled_dot_product_attention (causal;
// its CPU flash kernel) against the blocked lower-triangle kernel (model/causal_attention), on the default model's
// head shape (head dim 64, 4 heads) at a fixed 4,096 tokens per step. Prints one JSON line per measurement and a
// table; `./run bench` runs it. Measures only.
#include <fmt/format.h>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "tributary/model/causal_attention.h"
#include "tributary/model/fused_ops.h"
#include "tributary/perf/flops.h"

using namespace tributary;

namespace {

double median_seconds(const std::function<void()>& f, int reps) {
  f();  // warm-up: allocator, BLAS buffers
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

std::string spread(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return fmt::format("{:.2f} [{:.2f}-{:.2f}]", v[v.size() / 2], v.front(), v.back());
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 9, pairs = 3;
  int64_t tokens = 4096, heads = 4, D = 64, threads = 0, block = 0;
  std::vector<int64_t> lengths{128, 256, 512, 1024};
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--reps")
      reps = std::stoi(argv[i + 1]);  // timed calls per measurement (median)
    else if (a == "--pairs")
      pairs = std::stoi(argv[i + 1]);  // composite/blocked measurements, alternating
    else if (a == "--threads")
      threads = std::stoll(argv[i + 1]);
    else if (a == "--block")
      block = std::stoll(argv[i + 1]);  // query rows per block (0: the kernel's choice)
    else if (a == "--T")
      lengths = {std::stoll(argv[i + 1])};
  }
  configure_threads(threads);
  std::vector<std::string> table;
  for (int64_t T : lengths) {
    const int64_t N = tokens / T * heads;
    torch::manual_seed(0);
    auto q = (torch::randn({N, T, D}) / 8).set_requires_grad(true);
    auto k = torch::randn({N, T, D}).set_requires_grad(true);
    auto v = torch::randn({N, T, D}).set_requires_grad(true);
    auto dy = torch::randn({N, T, D});
    auto step = [&](const std::function<torch::Tensor()>& f) {
      return [&, f] {
        q.mutable_grad() = k.mutable_grad() = v.mutable_grad() = torch::Tensor();
        f().backward(dy);
      };
    };
    // flops of the useful (lower-triangle) work: 2 forward + 4 backward products of N x T(T+1)/2 x D multiply-adds.
    const double useful = 6.0 * 2.0 * double(N) * double(T * (T + 1) / 2) * double(D);
    std::vector<double> composite, blocked, sdpa, ratio, sdpa_ratio;
    for (int p = 0; p < pairs; ++p) {
      composite.push_back(
          median_seconds(step([&] { return torch::bmm(causal_softmax(torch::bmm(q, k.transpose(1, 2))), v); }), reps));
      blocked.push_back(median_seconds(step([&] { return causal_attention(q, k, v, block); }), reps));
      sdpa.push_back(median_seconds(step([&] {  // q carries the scale, as in the model: scale 1
                                      return at::scaled_dot_product_attention(q.unsqueeze(0), k.unsqueeze(0),
                                                                              v.unsqueeze(0), {}, 0.0, true, 1.0)
                                          .squeeze(0);
                                    }),
                                    reps));
      ratio.push_back(composite.back() / blocked.back());
      sdpa_ratio.push_back(sdpa.back() / blocked.back());
      nlohmann::json row = {{"T", T},
                            {"heads_x_batch", N},
                            {"head_dim", D},
                            {"composite_s", composite.back()},
                            {"blocked_s", blocked.back()},
                            {"sdpa_s", sdpa.back()},
                            {"threads", at::get_num_threads()},
                            {"block", block > 0 ? block : kCausalAttentionBlock}};
      std::printf("%s\n", row.dump().c_str());
      std::fflush(stdout);
    }
    std::sort(composite.begin(), composite.end());
    std::sort(blocked.begin(), blocked.end());
    std::sort(sdpa.begin(), sdpa.end());
    const double c = composite[pairs / 2], b = blocked[pairs / 2], s = sdpa[pairs / 2];
    table.push_back(
        fmt::format("T {:5d}  composite {:7.1f} ms ({:5.1f} GFLOP/s useful)  SDPA {:7.1f} ms ({:5.1f})  "
                    "blocked {:7.1f} ms ({:5.1f})  blocked vs composite {}  vs SDPA {}",
                    T, 1e3 * c, useful / c / 1e9, 1e3 * s, useful / s / 1e9, 1e3 * b, useful / b / 1e9, spread(ratio),
                    spread(sdpa_ratio)));
  }
  std::printf(
      "causal attention forward + backward, %ld tokens x %ld heads, head dim %ld, %d threads; median of %d "
      "calls, %d alternating pairs, speed-up median [min-max]:\n",
      long(tokens), long(heads), long(D), at::get_num_threads(), reps, pairs);
  for (const auto& line : table) std::printf("  %s\n", line.c_str());
  return 0;
}
