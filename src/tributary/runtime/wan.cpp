#include "tributary/runtime/wan.h"

#include <regex>

#include "tributary/core/error.h"
#include "tributary/core/fs.h"
#include "tributary/sched/cluster.h"

namespace tributary {
namespace {

double parse_rate_bits(const std::string& s, const std::string& spec) {
  std::smatch m;
  if (!std::regex_match(s, m, std::regex(R"(\s*([0-9.]+)\s*([KkMmGg]?)(bit|bps|b)?(/s)?\s*)")))
    fail("dist.wan = '{}': cannot read the bandwidth '{}' (e.g. 10Mbit)", spec, s);
  double v = std::stod(m[1]);
  char u = m[2].length() ? static_cast<char>(std::tolower(m[2].str()[0])) : ' ';
  return v * (u == 'k' ? 1e3 : u == 'm' ? 1e6 : u == 'g' ? 1e9 : 1.0);
}

double parse_time_s(const std::string& s, const std::string& spec) {
  std::smatch m;
  if (!std::regex_match(s, m, std::regex(R"(\s*([0-9.]+)\s*(ms|us|s)\s*)")))
    fail("dist.wan = '{}': cannot read the latency '{}' (e.g. 100ms)", spec, s);
  double v = std::stod(m[1]);
  return m[2] == "ms" ? v / 1e3 : m[2] == "us" ? v / 1e6 : v;
}

}  // namespace

comm::LinkModel wan_link_model(const std::string& spec, int n) {
  std::vector<int> first(static_cast<size_t>(std::max(n, 0)));
  for (int r = 0; r < n; ++r) first[size_t(r)] = r;
  return wan_link_model(spec, first);
}

comm::LinkModel wan_link_model(const std::string& spec, const std::vector<int>& device_of_rank) {
  const int n = static_cast<int>(device_of_rank.size());
  comm::LinkModel l;
  l.num_ranks = n;
  l.latency_s.assign(static_cast<size_t>(n) * n, 0.0);
  l.bytes_per_s.assign(static_cast<size_t>(n) * n, 0.0);
  auto comma = spec.find(',');
  if (comma != std::string::npos && !fs::exists(spec)) {
    double bits = parse_rate_bits(spec.substr(0, comma), spec);
    double lat = parse_time_s(spec.substr(comma + 1), spec);
    if (bits <= 0) fail("dist.wan = '{}': bandwidth must be > 0", spec);
    return comm::LinkModel::uniform(bits / 8.0, lat, n);
  }
  sched::Cluster c = sched::load_cluster(spec);
  if (c.size() < n) fail("dist.wan = '{}' describes {} devices but the run has {} ranks", spec, c.size(), n);
  for (int d : device_of_rank)
    if (d < 0 || d >= c.size())
      fail(
          "dist.wan = '{}' describes {} devices but a rank is placed on device {} (parallel.placement): plan and "
          "train with the same cluster file",
          spec, c.size(), d);
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b) {
      const int da = device_of_rank[size_t(a)], db = device_of_rank[size_t(b)];
      l.latency_s[a * n + b] = c.latency_ms(da, db) / 1e3;
      l.bytes_per_s[a * n + b] = c.bandwidth_gbps(da, db) * 1e9 / 8.0;
    }
  return l;
}

std::optional<comm::LinkModel> wan_link_model_or_none(const std::string& spec, int num_ranks) {
  if (spec.empty()) return std::nullopt;
  return wan_link_model(spec, num_ranks);
}

std::optional<comm::LinkModel> wan_link_model_or_none(const std::string& spec, const std::vector<int>& device_of_rank) {
  if (spec.empty()) return std::nullopt;
  return wan_link_model(spec, device_of_rank);
}

}  // namespace tributary
