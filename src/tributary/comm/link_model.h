// The emulated WAN between the ranks of a group: per-pair latency and bandwidth, and what a ring collective takes on
// them (exchange.h says what is and is not modelled). Built from a spec or cluster file by runtime/wan.h: comm/ does
// not read the scheduler's files.
#pragma once

#include <string>
#include <vector>

namespace tributary::comm {

struct LinkModel {
  int num_ranks = 0;
  std::vector<double> latency_s;    // num_ranks^2
  std::vector<double> bytes_per_s;  // num_ranks^2

  static LinkModel uniform(double bytes_per_s, double latency_s, int num_ranks);  // every pair alike
  // The links among `members` (indices into this model), renumbered 0..members.size()-1 in that order: a group's
  // view of the world's links.
  LinkModel subset(const std::vector<int>& members) const;
  double latency(int a, int b) const { return latency_s[size_t(a) * size_t(num_ranks) + size_t(b)]; }
  double bandwidth(int a, int b) const { return bytes_per_s[size_t(a) * size_t(num_ranks) + size_t(b)]; }
  // One message of `bytes` from a to b, point to point (a store's value, a fetched module).
  double transfer_s(int a, int b, double bytes) const { return latency(a, b) + bytes / bandwidth(a, b); }
  double ring_allreduce_s(double bytes) const;
  double ring_allgather_s(double bytes_per_rank) const;
  double ring_step_s(double chunk_bytes) const;
  // Every rank sends `bytes` to every other rank at once (the slowest pair's latency + bytes / bandwidth).
  double direct_exchange_s(double bytes) const;
  // What Group's collectives are modelled to take: a small payload (scalars: a loss, a norm, a vote) goes as one
  // direct exchange, as a latency-bound implementation sends it (one latency instead of a ring's 2 (N-1)); larger
  // payloads go as a ring all-reduce.
  static constexpr double kSmallPayloadBytes = 64 * 1024;
  double allreduce_s(double bytes) const;
  double allgather_s(double bytes_per_rank) const;  // likewise: direct when small, else a ring
  std::string describe() const;
};

}  // namespace tributary::comm
