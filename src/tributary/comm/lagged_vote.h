// Agreeing on a stop (SIGINT/SIGTERM on any rank) at one step on every rank, without waiting for DiLoCo's next outer
// step and without a blocking round trip per step.
//
// Every rank calls step() once per training step. It starts a one-float all-reduce of "this rank wants to stop" on a
// process group of its own and reads the result of the one started `lag` steps earlier (comm/lagged_reduce.h): every
// rank issues the same sequence, so every rank sees the same result at the same step, and the vote lands `lag` steps
// after the signal. The all-reduce has `lag` steps to cross the network, so it adds no waiting on links faster than
// lag step-times. Cost: 8 bytes per step per rank, outside the exchange's byte accounting and WAN emulation (which
// model the pseudo-gradient traffic).
#pragma once

#include "tributary/comm/lagged_reduce.h"

namespace tributary::comm {

class LaggedVote {
 public:
  LaggedVote(const Store& store, int rank, int world_size, GroupOptions options, int lag = 2)
      : sum_(store, rank, world_size, std::move(options), "stop-vote", lag) {}

  // This rank's wish for this step; true on every rank at the same step once any rank wished to stop.
  bool step(bool local_stop) {
    const auto votes = sum_.step({local_stop ? 1.0 : 0.0});
    return votes && (*votes)[0] > 0;
  }

 private:
  LaggedReduce sum_;
};

}  // namespace tributary::comm
