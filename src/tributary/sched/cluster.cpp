#include "tributary/sched/cluster.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "tributary/core/error.h"
#include "tributary/core/fs.h"
#include "tributary/core/rng.h"

namespace tributary::sched {
namespace {

using json = nlohmann::json;

Matrix read_matrix(const json& j, const char* field, int n, const std::string& origin, bool positive) {
  if (!j.contains(field)) fail("{}: missing field '{}'", origin, field);
  const json& m = j[field];
  if (!m.is_array() || static_cast<int>(m.size()) != n)
    fail("{}: '{}' must be a {}x{} matrix, it has {} rows", origin, field, n, n, m.is_array() ? m.size() : 0);
  Matrix out(n);
  for (int i = 0; i < n; ++i) {
    if (!m[i].is_array() || static_cast<int>(m[i].size()) != n)
      fail("{}: '{}' row {} has {} entries, expected {} (the matrix must be square)", origin, field, i,
           m[i].is_array() ? m[i].size() : 0, n);
    for (int k = 0; k < n; ++k) {
      if (!m[i][k].is_number()) fail("{}: '{}'[{}][{}] is not a number", origin, field, i, k);
      double v = m[i][k].get<double>();
      if (!std::isfinite(v) || v < 0 || (positive && v <= 0 && i != k))
        fail("{}: '{}'[{}][{}] = {} must be {}", origin, field, i, k, v, positive ? "> 0" : ">= 0");
      out(i, k) = v;
    }
  }
  // The cost model is on an undirected graph: average the two directions.
  for (int i = 0; i < n; ++i)
    for (int k = i + 1; k < n; ++k) out(i, k) = out(k, i) = 0.5 * (out(i, k) + out(k, i));
  return out;
}

struct RegionSpec {
  std::string name;
  int devices;
  double tflops = 0, memory_gb = 0;
};

Cluster from_regions(std::string name, const std::vector<RegionSpec>& regions, const Matrix& lat, const Matrix& bw) {
  Cluster c;
  c.name = std::move(name);
  std::vector<int> region_of;
  for (size_t r = 0; r < regions.size(); ++r)
    for (int d = 0; d < regions[r].devices; ++d) {
      c.devices.push_back({regions[r].name, regions[r].tflops, regions[r].memory_gb});
      region_of.push_back(static_cast<int>(r));
    }
  const int n = c.size();
  c.latency_ms = Matrix(n);
  c.bandwidth_gbps = Matrix(n);
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < n; ++k) {
      c.latency_ms(i, k) = lat(region_of[i], region_of[k]);
      c.bandwidth_gbps(i, k) = bw(region_of[i], region_of[k]);
    }
  return c;
}

Matrix square(const std::vector<std::vector<double>>& rows) {
  Matrix m(static_cast<int>(rows.size()));
  for (int i = 0; i < m.n; ++i)
    for (int k = 0; k < m.n; ++k) m(i, k) = rows[i][k];
  return m;
}

// Regions with one intra value and one inter value.
Cluster uniform_regions(std::string name, const std::vector<RegionSpec>& regions, double lat_in, double bw_in,
                        double lat_out, double bw_out) {
  const int r = static_cast<int>(regions.size());
  Matrix lat(r, lat_out), bw(r, bw_out);
  for (int i = 0; i < r; ++i) {
    lat(i, i) = lat_in;
    bw(i, i) = bw_in;
  }
  return from_regions(std::move(name), regions, lat, bw);
}

std::vector<RegionSpec> numbered(const std::string& prefix, int count, int devices) {
  std::vector<RegionSpec> out;
  for (int i = 0; i < count; ++i)
    out.push_back({prefix + std::to_string(i), devices, 125, 16});  // V100: 125 TFLOP/s fp16, 16 GB
  return out;
}

}  // namespace

std::vector<std::string> preset_names() {
  return {"case1-datacenter-on-demand", "case2-datacenter-spot", "case3-multiple-datacenters", "case4-regional",
          "case5-worldwide"};
}

Cluster preset(const std::string& name) {
  if (name == "case1-datacenter-on-demand") return uniform_regions(name, numbered("instance_", 8, 8), 0, 100, 0, 3.125);
  if (name == "case2-datacenter-spot") {
    auto regions = numbered("spot_instance_", 8, 4);
    for (int i = 0; i < 32; ++i) regions.push_back({"standalone_" + std::to_string(i), 1, 125, 16});
    Cluster c = uniform_regions(name, regions, 0, 100, 0, 1.25);
    for (auto& d : c.devices)
      if (d.region.rfind("standalone", 0) == 0) d.region = "standalone";
    return c;
  }
  if (name == "case3-multiple-datacenters")
    return uniform_regions(name, {{"Ohio", 32, 125, 16}, {"Virginia", 32, 125, 16}}, 1, 5, 11, 1.12);
  if (name == "case4-regional")
    return from_regions(
        name, {{"Virginia", 16, 125, 16}, {"Oregon", 16, 125, 16}, {"California", 16, 125, 16}, {"Ohio", 16, 125, 16}},
        square({{5, 67, 59, 11}, {67, 5, 12, 49}, {59, 12, 5, 52}, {11, 49, 52, 5}}),
        square({{2.0, 1.15, 1.05, 1.12}, {1.15, 2.0, 1.25, 1.1}, {1.05, 1.25, 2.0, 1.02}, {1.12, 1.1, 1.02, 2.0}}));
  if (name == "case5-worldwide") {
    std::vector<RegionSpec> cities;
    for (const char* city : {"Oregon", "Virginia", "Ohio", "Tokyo", "Seoul", "London", "Frankfurt", "Ireland"})
      cities.push_back({city, 8, 125, 16});
    return from_regions(name, cities,
                        square({{5, 67, 49, 96, 124, 136, 143, 124},
                                {67, 5, 11, 143, 172, 76, 90, 67},
                                {49, 11, 5, 130, 159, 86, 99, 77},
                                {96, 143, 130, 5, 34, 210, 223, 199},
                                {124, 172, 159, 34, 5, 238, 235, 228},
                                {136, 76, 86, 210, 238, 5, 14, 12},
                                {143, 90, 99, 223, 235, 14, 5, 24},
                                {124, 67, 77, 199, 228, 12, 24, 5}}),
                        square({{2.0, 0.79, 1.1, 0.523, 0.46, 0.42, 0.404, 0.482},
                                {0.79, 2.0, 1.12, 0.524, 0.5, 1.16, 1.02, 1.05},
                                {1.1, 1.12, 2.0, 0.694, 0.529, 1.05, 0.799, 1.14},
                                {0.523, 0.524, 0.694, 2.0, 1.1, 0.366, 0.36, 0.465},
                                {0.46, 0.5, 0.529, 1.1, 2.0, 0.342, 0.358, 0.335},
                                {0.42, 1.16, 1.05, 0.366, 0.342, 2.0, 1.14, 1.09},
                                {0.404, 1.02, 0.799, 0.36, 0.358, 1.14, 2.0, 1.08},
                                {0.482, 1.05, 1.14, 0.465, 0.335, 1.09, 1.08, 2.0}}));
  }
  std::string names;
  for (const auto& n : preset_names()) names += " " + n;
  fail("unknown cluster preset '{}' (presets:{}; or give a JSON file)", name, names);
}

namespace {
Cluster parse_cluster_json(const std::string& text, const std::string& origin);
}

// A wrong JSON type anywhere (a string where a number belongs, ...) is the user's file, not our bug: name the file.
Cluster parse_cluster(const std::string& text, const std::string& origin) {
  try {
    return parse_cluster_json(text, origin);
  } catch (const json::exception& e) {
    fail("{}: a value has the wrong type or shape ({}); see the README for the cluster format", origin, e.what());
  }
}

namespace {
Cluster parse_cluster_json(const std::string& text, const std::string& origin) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) fail("{}: not a JSON object", origin);
  if (j.contains("regions")) {
    const json& rs = j["regions"];
    if (!rs.is_array() || rs.empty()) fail("{}: 'regions' must be a non-empty array", origin);
    std::vector<RegionSpec> regions;
    for (size_t r = 0; r < rs.size(); ++r) {
      const json& x = rs[r];
      if (!x.is_object() || !x.contains("devices") || !x["devices"].is_number_integer() ||
          x["devices"].get<int64_t>() <= 0 || x["devices"].get<int64_t>() > kMaxDevices)
        fail("{}: regions[{}].devices must be an integer from 1 to {}", origin, r, kMaxDevices);
      regions.push_back({x.value("name", "region" + std::to_string(r)), x["devices"].get<int>(), x.value("tflops", 0.0),
                         x.value("memory_gb", 0.0)});
    }
    int64_t total = 0;
    for (const auto& spec : regions) total += spec.devices;
    if (total > kMaxDevices) fail("{}: {} devices in all; the scheduler plans at most {}", origin, total, kMaxDevices);
    const int r = static_cast<int>(regions.size());
    Cluster c = from_regions(j.value("name", origin), regions, read_matrix(j, "latency_ms", r, origin, false),
                             read_matrix(j, "bandwidth_gbps", r, origin, true));
    return c;
  }
  if (!j.contains("latency_ms") || !j["latency_ms"].is_array())
    fail("{}: needs 'latency_ms' and 'bandwidth_gbps' matrices (per device, or per region with 'regions')", origin);
  if (j["latency_ms"].size() > static_cast<size_t>(kMaxDevices))
    fail("{}: {} devices; the scheduler plans at most {}", origin, j["latency_ms"].size(), kMaxDevices);
  const int n = static_cast<int>(j["latency_ms"].size());
  if (n < 2) fail("{}: a cluster needs at least 2 devices", origin);
  Cluster c;
  c.name = j.value("name", origin);
  c.latency_ms = read_matrix(j, "latency_ms", n, origin, false);
  c.bandwidth_gbps = read_matrix(j, "bandwidth_gbps", n, origin, true);
  c.devices.resize(static_cast<size_t>(n));
  if (j.contains("device_regions")) {
    const json& r = j["device_regions"];
    if (!r.is_array() || static_cast<int>(r.size()) != n)
      fail("{}: 'device_regions' has {} entries for {} devices", origin, r.is_array() ? r.size() : 0, n);
    for (int i = 0; i < n; ++i) c.devices[i].region = r[i].is_string() ? r[i].get<std::string>() : "";
  }
  if (j.contains("devices")) {
    const json& d = j["devices"];
    if (!d.is_array() || static_cast<int>(d.size()) != n)
      fail("{}: 'devices' has {} entries for {} devices", origin, d.is_array() ? d.size() : 0, n);
    for (int i = 0; i < n; ++i) {
      c.devices[i].tflops = d[i].value("tflops", 0.0);
      c.devices[i].memory_gb = d[i].value("memory_gb", 0.0);
      if (c.devices[i].tflops < 0 || c.devices[i].memory_gb < 0)
        fail("{}: devices[{}] has a negative tflops or memory_gb", origin, i);
    }
  }
  return c;
}
}  // namespace

Cluster load_cluster(const std::string& path) {
  if (!fs::exists(path)) {
    for (const auto& n : preset_names())
      if (n == path) return preset(n);
    fail("cluster '{}' is neither a file nor a preset ({})", path, fmt::join(preset_names(), ", "));
  }
  return parse_cluster(read_file(path), path);
}

Cluster shuffle_ids(const Cluster& cluster, uint64_t seed, std::vector<int>* original_id) {
  const int n = cluster.size();
  auto perm = permutation(static_cast<uint64_t>(n), seed);  // perm[new] = old
  Cluster out = cluster;
  for (int a = 0; a < n; ++a) {
    out.devices[a] = cluster.devices[perm[a]];
    for (int b = 0; b < n; ++b) {
      out.latency_ms(a, b) = cluster.latency_ms(static_cast<int>(perm[a]), static_cast<int>(perm[b]));
      out.bandwidth_gbps(a, b) = cluster.bandwidth_gbps(static_cast<int>(perm[a]), static_cast<int>(perm[b]));
    }
  }
  if (original_id) original_id->assign(perm.begin(), perm.end());
  return out;
}

}  // namespace tributary::sched
