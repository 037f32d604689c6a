#include "tributary/comm/link_model.h"

#include <algorithm>

#include <fmt/format.h>

#include "tributary/core/error.h"

namespace tributary::comm {

LinkModel LinkModel::uniform(double bytes_per_s, double latency_s, int num_ranks) {
  LinkModel l;
  l.num_ranks = num_ranks;
  l.latency_s.assign(static_cast<size_t>(num_ranks) * num_ranks, latency_s);
  l.bytes_per_s.assign(static_cast<size_t>(num_ranks) * num_ranks, bytes_per_s);
  return l;
}

LinkModel LinkModel::subset(const std::vector<int>& members) const {
  LinkModel l;
  l.num_ranks = static_cast<int>(members.size());
  for (int a : members)
    for (int b : members) {
      TRIB_CHECK(a >= 0 && a < num_ranks && b >= 0 && b < num_ranks, "link subset member out of range");
      l.latency_s.push_back(latency(a, b));
      l.bytes_per_s.push_back(bandwidth(a, b));
    }
  return l;
}

// One ring step: every rank sends `chunk_bytes` to its neighbour at once; the slowest edge sets the time.
double LinkModel::ring_step_s(double chunk_bytes) const {
  const int n = num_ranks;
  double step = 0;
  for (int r = 0; r < n; ++r) {
    const int next = (r + 1) % n;
    step = std::max(step, latency_s[r * n + next] + chunk_bytes / bytes_per_s[r * n + next]);
  }
  return step;
}

double LinkModel::ring_allreduce_s(double bytes) const {
  return num_ranks < 2 ? 0.0 : 2.0 * (num_ranks - 1) * ring_step_s(bytes / num_ranks);
}

double LinkModel::direct_exchange_s(double bytes) const {
  double worst = 0;
  for (int a = 0; a < num_ranks; ++a)
    for (int b = 0; b < num_ranks; ++b)
      if (a != b) worst = std::max(worst, latency(a, b) + bytes / bandwidth(a, b));
  return worst;
}

double LinkModel::allreduce_s(double bytes) const {
  const double ring = ring_allreduce_s(bytes);
  return bytes <= kSmallPayloadBytes ? std::min(ring, direct_exchange_s(bytes)) : ring;
}

double LinkModel::allgather_s(double bytes_per_rank) const {
  const double ring = ring_allgather_s(bytes_per_rank);
  return bytes_per_rank <= kSmallPayloadBytes ? std::min(ring, direct_exchange_s(bytes_per_rank)) : ring;
}

double LinkModel::ring_allgather_s(double bytes_per_rank) const {
  return num_ranks < 2 ? 0.0 : (num_ranks - 1) * ring_step_s(bytes_per_rank);
}

std::string LinkModel::describe() const {
  double min_bw = 1e300, max_lat = 0;
  for (int a = 0; a < num_ranks; ++a)
    for (int b = 0; b < num_ranks; ++b)
      if (a != b) {
        min_bw = std::min(min_bw, bytes_per_s[a * num_ranks + b]);
        max_lat = std::max(max_lat, latency_s[a * num_ranks + b]);
      }
  return fmt::format("emulated WAN: slowest link {:.1f} Mbit/s, highest latency {:.0f} ms", min_bw * 8 / 1e6,
                     max_lat * 1e3);
}

}  // namespace tributary::comm
