#include "tributary/perf/flops.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "tributary/core/fs.h"
#include "tributary/core/log.h"
#include "tributary/perf/platform.h"

namespace tributary {

namespace {

// Two random n x n fp32 operands and an output on `device`, from a private generator (measuring must not advance the
// global RNG: resume would diverge otherwise), after one warm-up product (it allocates the BLAS buffers).
struct MatmulProbe {
  torch::Tensor a, b, c;
  bool cuda;
  MatmulProbe(const torch::Device& device, int64_t n, torch::ScalarType dtype = torch::kFloat32)
      : cuda(device.is_cuda()) {
    auto opts = torch::TensorOptions().device(device).dtype(dtype);
    auto gen = at::detail::createCPUGenerator(42);
    a = at::randn({n, n}, gen, torch::kFloat32).to(opts);
    b = at::randn({n, n}, gen, torch::kFloat32).to(opts);
    c = torch::empty({n, n}, opts);
    run();
  }
  void run() {
    torch::mm_out(c, a, b);
    if (cuda) torch::cuda::synchronize();
  }
  double flops() const { return 2.0 * double(a.size(0)) * double(a.size(0)) * double(a.size(0)); }
};

int64_t probe_size(const torch::Device& device, int64_t n) { return n > 0 ? n : device.is_cuda() ? 8192 : 1024; }

}  // namespace

double measure_matmul_peak(const torch::Device& device, int64_t n, int repeats, torch::ScalarType dtype) {
  torch::NoGradGuard no_grad;
  MatmulProbe probe(device, probe_size(device, n), dtype);
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    auto start = std::chrono::steady_clock::now();
    probe.run();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, probe.flops() / s);
  }
  return best;
}

double measure_matmul_sustained(const torch::Device& device, double seconds, int64_t n) {
  torch::NoGradGuard no_grad;
  MatmulProbe probe(device, probe_size(device, n));
  const auto start = std::chrono::steady_clock::now();
  int64_t products = 0;
  double elapsed = 0;
  do {
    probe.run();
    ++products;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } while (elapsed < seconds);
  return probe.flops() * double(products) / elapsed;
}

namespace {

fs::path peak_cache_file() {
  if (const char* file = std::getenv("TRIBUTARY_PEAK_CACHE"); file && *file) return file;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return fs::path(xdg) / "tributary/matmul-peak.json";
  if (const char* home = std::getenv("HOME"); home && *home)
    return fs::path(home) / ".cache/tributary/matmul-peak.json";
  return {};
}

std::string processor_name() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) return line.substr(line.find(':') + 2);
  return "cpu";
}

}  // namespace

std::string peak_key(const torch::Device& device, torch::ScalarType dtype, int64_t threads, int workers) {
  return fmt::format("{}|{}|{} threads|{} workers", device.is_cuda() ? device.str() : processor_name(),
                     c10::toString(dtype), threads, workers);
}

KnownPeak best_known_peak(double measured, const std::string& key) {
  KnownPeak peak{.flops = measured, .measured = measured, .file = peak_cache_file().string()};
  if (peak.file.empty()) return peak;
  nlohmann::json kept = nlohmann::json::object();
  std::error_code ec;
  if (fs::is_regular_file(peak.file, ec) && fs::file_size(peak.file, ec) < (1 << 20)) {
    std::ifstream in(peak.file);
    kept = nlohmann::json::parse(in, nullptr, false);
    if (!kept.is_object()) kept = nlohmann::json::object();  // unreadable: replaced below
  }
  if (kept.contains(key) && kept[key].is_number() && kept[key].get<double>() > measured &&
      std::isfinite(kept[key].get<double>()))
    peak.flops = kept[key].get<double>();
  if (peak.flops > measured) return peak;
  kept[key] = measured;
  try {
    fs::create_directories(fs::path(peak.file).parent_path());
    write_file_atomic(peak.file, kept.dump(2) + "\n");
  } catch (const std::exception& e) {
    log::warn("the matmul peak is not kept for later runs ({}): {}", peak.file, e.what());
    peak.file.clear();
  }
  return peak;
}

std::string describe_peak(const KnownPeak& peak) {
  if (peak.from_file())
    return fmt::format("{:.1f} GFLOP/s, the best this machine gave (kept in {}; {:.1f} measured now, under load)",
                       peak.flops / 1e9, peak.file, peak.measured / 1e9);
  return fmt::format("{:.1f} GFLOP/s, measured now", peak.flops / 1e9);
}

double training_flops_per_token(const ModelConfig& config, int64_t num_matmul_parameters) {
  return 6.0 * double(num_matmul_parameters) +
         6.0 * double(config.num_layers * config.num_heads * config.head_dim() * config.context);
}

BlasInfo blas_info() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  BlasInfo info{"", false};
  while (std::getline(maps, line)) {
    auto pos = line.find('/');
    if (pos == std::string::npos) continue;
    std::string path = line.substr(pos);
    if (path.find("openblas") != std::string::npos || path.find("libmkl") != std::string::npos ||
        path.find("libblis") != std::string::npos) {
      return {path, true};
    }
    if (path.find("libblas.so") != std::string::npos) info.library = path;
  }
  // No shared BLAS mapped at all: LibTorch carries its own (PyTorch's x86 wheels link MKL inside), which is
  // optimized. Only a mapped reference libblas.so is the slow case worth a warning.
  if (info.library.empty()) return {libtorch_blas() + " (inside LibTorch)", true};
  return info;
}

BlasInfo check_blas() {
  BlasInfo info = blas_info();
  if (!info.optimized) {
    log::warn("==================================================================================");
    log::warn("SLOW BLAS: LibTorch is using '{}', not an optimized BLAS.", info.library);
    log::warn("Matrix multiplies run ~10x slower. Fix: build on PyTorch's own wheel (pip install torch; ./run setup");
    log::warn("uses it), which carries its BLAS inside, or select OpenBLAS for libblas.so.3 (update-alternatives).");
    log::warn("==================================================================================");
  } else if (info.library.find("openblas-pthread") != std::string::npos && at::get_num_threads() > 1) {
    log::warn(
        "OpenBLAS's pthread flavour ('{}') runs its own thread pool beside LibTorch's OpenMP one: on a busy "
        "machine they spin against each other (training steps 1.35-1.6x slower on 2 cores). Fix: build on "
        "PyTorch's own wheel (./run setup), or select libopenblas0-openmp.",
        info.library);
  }
  return info;
}

int64_t configure_threads(int64_t threads, int local_world_size) {
  int64_t n = threads > 0
                  ? threads
                  : std::max<int64_t>(1, int64_t(std::thread::hardware_concurrency()) / std::max(1, local_world_size));
  at::set_num_threads(static_cast<int>(n));
  return n;
}

}  // namespace tributary
