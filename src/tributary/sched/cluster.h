// A cluster for the scheduler: devices (compute rate, memory, region) and the latency/bandwidth between every pair.
// Loaded from JSON in either of two forms, both validated with errors that name the field:
//   full matrices (the format of shared/reference/networks/*.json):
//     {"latency_ms": [[...] x N], "bandwidth_gbps": [[...] x N], "device_regions": [...N names],   (regions optional)
//      "devices": [{"tflops": 125, "memory_gb": 16}, ...]}                                           (optional)
//   per region, intra-region values on the diagonal:
//     {"regions": [{"name": "Ohio", "devices": 32, "tflops": 125, "memory_gb": 16}, ...],
//      "latency_ms": [[...] x R], "bandwidth_gbps": [[...] x R]}
// The paper's five scenarios are built in (presets()); their matrices equal the shared reference files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tributary::sched {

// Dense symmetric matrix of doubles.
struct Matrix {
  int n = 0;
  std::vector<double> v;
  Matrix() = default;
  explicit Matrix(int size, double fill = 0) : n(size), v(static_cast<size_t>(size) * size, fill) {}
  double& operator()(int i, int j) { return v[static_cast<size_t>(i) * n + j]; }
  double operator()(int i, int j) const { return v[static_cast<size_t>(i) * n + j]; }
};

struct Device {
  std::string region;
  double tflops = 0;     // sustained compute rate; 0 = unknown
  double memory_gb = 0;  // 0 = unknown
};

// Devices one plan can place: two n x n matrices and the GA's work grow with n^2; a larger file is refused early.
constexpr int64_t kMaxDevices = 4096;

struct Cluster {
  std::string name;
  std::vector<Device> devices;
  Matrix latency_ms;      // symmetric, averaged from the file's two directions
  Matrix bandwidth_gbps;  // symmetric, > 0 off the diagonal

  int size() const { return static_cast<int>(devices.size()); }
};

Cluster load_cluster(const std::string& path);  // file or preset name
Cluster parse_cluster(const std::string& json_text, const std::string& origin);
std::vector<std::string> preset_names();
Cluster preset(const std::string& name);  // Error listing the presets if unknown

// Relabels devices by a seeded random permutation (real clusters do not number devices by location).
// Returns the shuffled cluster; original_id[new_id] tells where each device came from.
Cluster shuffle_ids(const Cluster& cluster, uint64_t seed, std::vector<int>* original_id = nullptr);

}  // namespace tributary::sched
