#include "tributary/perf/platform.h"

#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <torch/cuda.h>
#include <torch/version.h>
#ifdef TRIBUTARY_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include <fmt/format.h>

#include <sstream>

#include "tributary/core/counted.h"

namespace tributary {
namespace {

// at::show_config() is LibTorch's build summary, one "  - Key: value" or "KEY=value" item per line; the BLAS it
// names is the one every matrix multiply goes through.
std::string config_value(const std::string& config, const std::string& key) {
  std::istringstream lines(config);
  std::string line;
  while (std::getline(lines, line)) {
    const auto at = line.find(key + "=");
    if (at == std::string::npos) continue;
    std::string value = line.substr(at + key.size() + 1);
    const auto end = value.find_first_of(", ");
    return end == std::string::npos ? value : value.substr(0, end);
  }
  return "unknown";
}

std::string cuda_line() {
  if (!torch::cuda::is_available()) return "not available (a CPU build of LibTorch, or no CUDA driver or device)";
  const auto count = torch::cuda::device_count();
  std::string names;
#ifdef TRIBUTARY_WITH_CUDA
  for (int i = 0; i < int(count); ++i)
    names += fmt::format("{}{}", i ? ", " : ": ", at::cuda::getDeviceProperties(i)->name);
#endif
  return counted(int64_t(count), "device") + names;
}

}  // namespace

std::string libtorch_blas() { return config_value(at::show_config(), "BLAS_INFO"); }

std::string platform_report() {
  const std::string config = at::show_config();
  return fmt::format(
      "tributary {}\n"
      "LibTorch  {}\n"
      "BLAS      {}; LAPACK {}\n"
      "threads   {} intra-op ({} backend), {} inter-op\n"
      "CUDA      {}\n",
      TRIBUTARY_VERSION, TORCH_VERSION, config_value(config, "BLAS_INFO"), config_value(config, "LAPACK_INFO"),
      at::get_num_threads(), at::get_parallel_info().find("OpenMP") != std::string::npos ? "OpenMP" : "native",
      at::get_num_interop_threads(), cuda_line());
}

}  // namespace tributary
