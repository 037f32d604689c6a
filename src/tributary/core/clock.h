// Wall-clock intervals for timing lines and accounting (steady clock: never jumps with the system time), and the one
// clock the machines of a run share (the system clock, kept within milliseconds of each other by NTP).
#pragma once

#include <chrono>
#include <cmath>

namespace tributary {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Seconds since 1970 on the system clock.
inline double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The first boundary epoch + k x period (k >= 1) later than `now`: processes that share `epoch` end their periods at
// the same instants, whenever each of them started or however long its last period ran over.
inline double next_boundary(double epoch, double now, double period) {
  return epoch + (std::floor((now - epoch) / period) + 1) * period;
}

}  // namespace tributary
