// Compute accounting: the sgemm peak of this machine measured in-process, FLOPs per token of a model, and a check
// that LibTorch is using an optimized BLAS (Debian's reference BLAS is ~10x slower and silently so).
#pragma once

#include <torch/torch.h>

#include <string>

#include "tributary/config/run_config.h"

namespace tributary {

// Best-of-N matmul rate (FLOP/s) on `device` with the current intra-op thread count, in fp32 or (for bf16 runs' MFU)
// bf16. n = 0 picks the size: 1024 on a CPU, 8192 on a GPU (a 1024^3 product is too short to fill an H100 and would
// understate its peak).
double measure_matmul_peak(const torch::Device& device, int64_t n = 0, int repeats = 6,
                           torch::ScalarType dtype = torch::kFloat32);

// The fp32 matmul rate sustained over a window of `seconds` (same sizes): every product completed in the window
// counts. For workers that measure at once while sharing a machine: a best-of-N catches moments when the others are
// between products (4 workers on 2 cores each read 84 GFLOP/s, 1.4x the machine's whole peak), a common window sees
// the contention training will have.
double measure_matmul_sustained(const torch::Device& device, double seconds, int64_t n = 0);

// The peak MFU divides by, kept per machine. A measurement on a busy machine (other runs, a test suite) comes out low —
// 10-27 GFLOP/s where an idle core gives 176 — and an MFU against it above 100%. The best rate measured for `key`
// (peak_key: the processor, the dtype, the threads and the workers sharing the machine) is kept in a small JSON file:
// $TRIBUTARY_PEAK_CACHE, else $XDG_CACHE_HOME/tributary/matmul-peak.json, else ~/.cache/tributary/matmul-peak.json.
// Returns the larger of `measured` and the kept value, and keeps it; a file that cannot be read is replaced, one that
// cannot be written is skipped (a warning): the run never fails for it.
struct KnownPeak {
  double flops = 0;
  double measured = 0;  // this run's own measurement
  std::string file;     // where the best is kept ("" when it could not be)
  bool from_file() const { return flops > measured; }
};
KnownPeak best_known_peak(double measured, const std::string& key);
std::string peak_key(const torch::Device& device, torch::ScalarType dtype, int64_t threads, int workers);
// The start-up line's words for `peak`: its value and which measurement it is.
std::string describe_peak(const KnownPeak& peak);

// Training FLOPs per token (forward + backward): 6 * matmul parameters + 6 * layers * heads * head_dim * context
// (the attention score and value matmuls over a causal context; see shared/reference/ecosystem.md, PaLM appendix B).
double training_flops_per_token(const ModelConfig& config, int64_t num_matmul_parameters);

// The shared object that provides libblas.so.3 in this process ("" if none), and whether it is an optimized one.
struct BlasInfo {
  std::string library;
  bool optimized;
};
BlasInfo blas_info();
// Logs a loud warning when the reference BLAS is loaded. Returns the info.
BlasInfo check_blas();

// Sets intra-op threads: `threads` if > 0, else the hardware threads shared by the local workers (so N workers on
// one machine do not oversubscribe it). Returns the count in use.
int64_t configure_threads(int64_t threads, int local_world_size = 1);

}  // namespace tributary
