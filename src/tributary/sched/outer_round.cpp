#include "tributary/sched/outer_round.h"

#include <algorithm>
#include <cmath>

#include "tributary/core/error.h"

namespace tributary::sched {

namespace {

// Seconds for c GB between two devices: alpha + c / beta (ms -> s, GB -> Gbit).
double link_s(const Cluster& c, int a, int b, double gb, double share) {
  return c.latency_ms(a, b) / 1e3 + gb * 8.0 / (c.bandwidth_gbps(a, b) / share);
}

double all_gather_s(const Cluster& c, const std::vector<int>& group, double gb, double share) {
  double worst = 0;
  for (int d : group) {
    double sum = 0;
    for (int e : group)
      if (e != d) sum += link_s(c, d, e, gb, share);
    worst = std::max(worst, sum);
  }
  return worst;
}

double ring_all_reduce_s(const Cluster& c, const std::vector<int>& group, double gb) {
  const double n = double(group.size());
  double worst = 0;
  for (int d : group) {
    double sum = 0;
    for (int e : group)
      if (e != d) sum += 2 * link_s(c, d, e, gb / n, 1);
    worst = std::max(worst, sum);
  }
  return worst;
}

}  // namespace

double sparseloco_payload_gb(double parameters, int64_t chunk, int64_t k, int64_t bits) {
  const double chunks = std::ceil(parameters / double(chunk));
  const double index_bits = std::ceil(std::log2(double(chunk)));
  return (chunks * 8 + chunks * double(k) * (index_bits + double(bits)) / 8) / 1e9;
}

OuterRoundCost price_outer_round(const Cluster& cluster, const std::vector<Site>& sites, const OuterRoundInput& in) {
  if (sites.empty()) fail("no sites to price");
  const int n = sites.front().devices;
  double slowest = 0;
  for (const Site& s : sites) {
    if (s.devices != n)
      fail(
          "site '{}' has {} device(s) and '{}' {}: the sharded exchange pairs rank r of every site, so price sites of "
          "one size",
          s.region, s.devices, sites.front().region, n);
    for (int d = s.first_device; d < s.first_device + s.devices; ++d) {
      const double tflops = cluster.devices[size_t(d)].tflops;
      if (tflops <= 0) fail("device {} ({}) has no 'tflops': give every device one to price the compute", d, s.region);
      slowest = slowest == 0 ? tflops : std::min(slowest, tflops);
    }
  }
  OuterRoundCost cost;
  const double h = double(in.inner_steps);
  cost.compute_s = h * 6.0 * in.parameters * in.tokens_per_device / (slowest * 1e12);
  const double grads_gb = in.parameters * 4 / 1e9;
  for (const Site& s : sites) {
    std::vector<int> site;
    for (int d = s.first_device; d < s.first_device + s.devices; ++d) site.push_back(d);
    const double inside =
        n > 1 ? h * ring_all_reduce_s(cluster, site, grads_gb) + all_gather_s(cluster, site, grads_gb / n, 1) : 0;
    cost.inside_s = std::max(cost.inside_s, inside);
  }
  auto rank_group = [&](int r) {
    std::vector<int> g;
    for (const Site& s : sites) g.push_back(s.first_device + r);
    return g;
  };
  cost.leader_s = all_gather_s(cluster, rank_group(0), in.payload_gb, 1);
  for (int r = 0; r < n; ++r) {
    cost.sharded_s = std::max(cost.sharded_s, all_gather_s(cluster, rank_group(r), in.payload_gb / n, 1));
    cost.sharded_shared_s =
        std::max(cost.sharded_shared_s, all_gather_s(cluster, rank_group(r), in.payload_gb / n, double(n)));
  }
  return cost;
}

}  // namespace tributary::sched
