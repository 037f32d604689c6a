// When a replica of asynchronous DiLoCo (runtime/sync/async_sync.h) ends a round: after dist.inner_steps steps, or —
// time-paced, dist.round_seconds > 0 — at its first step past the next of the wall-clock boundaries
// epoch + k x round_seconds, which every member shares (the run's first second, agreed on the store). Shared
// boundaries keep the members' updates meeting in one merge whatever each one's speed, and an evaluation or a slow
// step does not push a replica's rounds out of phase for the rest of the run. No LibTorch.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "tributary/core/clock.h"

namespace tributary {

class RoundPace {
 public:
  RoundPace(int64_t inner_steps, double round_seconds) : inner_steps_(inner_steps), round_seconds_(round_seconds) {}

  bool time_paced() const { return round_seconds_ > 0; }
  // Time-paced: the members' shared first second; the first round ends at the next boundary after `now`.
  void start(double epoch, double now) {
    epoch_ = epoch;
    end_s_ = next_boundary(epoch_, now, round_seconds_);
  }
  // One step taken, at `now` (wall seconds): true when it ends the round. The round's steps stay counted until
  // take(); a time-paced round's next boundary is set here.
  bool step(double now) {
    ++steps_;
    if (!time_paced()) return steps_ == inner_steps_;
    if (now < end_s_) return false;
    end_s_ = next_boundary(epoch_, now, round_seconds_);
    return true;
  }
  int64_t steps() const { return steps_; }             // in the round so far
  int64_t take() { return std::exchange(steps_, 0); }  // the round's steps, as its update is posted
  std::string describe() const {                       // for the start-up line
    if (round_seconds_ < 0)  // dist.round_seconds = -1, before the members agreed on the length
      return fmt::format("{} steps' time of the median replica (time-paced rounds, timed at start-up)", inner_steps_);
    return time_paced() ? fmt::format("{} s of training (time-paced rounds)", round_seconds_)
                        : fmt::format("{} steps", inner_steps_);
  }

 private:
  int64_t inner_steps_;
  double round_seconds_;
  double epoch_ = 0, end_s_ = 0;
  int64_t steps_ = 0;
};

}  // namespace tributary
