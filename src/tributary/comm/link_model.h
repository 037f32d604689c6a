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
  double ring_allreduce_s(double bytes) const;
  double ring_allgather_s(double bytes_per_rank) const;
  double ring_step_s(double chunk_bytes) const;
  std::string describe() const;
};

}  // namespace tributary::comm
