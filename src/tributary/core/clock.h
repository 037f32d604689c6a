// Wall-clock intervals for timing lines and accounting (steady clock: never jumps with the system time).
#pragma once

#include <chrono>

namespace tributary {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace tributary
