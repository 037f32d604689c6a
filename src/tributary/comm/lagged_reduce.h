// A sum over ranks that every rank starts each step and reads `lag` steps later (the pattern of the stop vote,
// comm/lagged_vote.h, for a vector of numbers): no rank waits for the others at the step it contributes, so a rank may
// run up to `lag` steps ahead of the slowest one before it blocks. Local parallelism's stages share their chunks'
// losses this way (parallel/local/local_stage.h). Every rank must call step() the same number of times.
// Its group has no emulated links: like the stop vote, a few floats per step, outside the WAN emulation.
#pragma once

#include <torch/torch.h>

#include <deque>
#include <optional>
#include <vector>

#include "tributary/comm/group.h"

namespace tributary::comm {

class LaggedReduce {
 public:
  LaggedReduce(const Store& store, int rank, int world_size, GroupOptions options, const std::string& prefix, int lag);
  ~LaggedReduce();
  LaggedReduce(const LaggedReduce&) = delete;
  LaggedReduce& operator=(const LaggedReduce&) = delete;

  int lag() const { return lag_; }
  // Contributes `mine` (same length on every rank) and returns the sum started `lag` calls earlier, if any.
  std::optional<std::vector<double>> step(const std::vector<double>& mine);
  // The sums still in flight, oldest first (the end of a run).
  std::vector<std::vector<double>> drain();

 private:
  struct Pending {
    torch::Tensor value;
    PendingCollective work;
  };
  static std::vector<double> finish(Pending& p);

  Group group_;
  std::deque<Pending> pending_;
  int lag_;
};

}  // namespace tributary::comm
