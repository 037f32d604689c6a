// A progress line for work that takes more than a few seconds (eval over a split, routing): "label  120/400 batches
// (30%)  52.1/s  ETA 5 s", rewritten in place on standard error when it is a terminal, at most twice a second; when it
// is not (a log, a pipe), a line of its own every 10 s, so that a log shows long work alive (work done within 10 s
// prints nothing there). done() (or the destructor) ends the line.
#pragma once

#include <cstdint>
#include <string>

#include "tributary/core/clock.h"

namespace tributary {

// The line's text after `seconds` for `done` of `total` units.
std::string progress_text(const std::string& label, int64_t done, int64_t total, const std::string& unit,
                          double seconds);

class Progress {
 public:
  // `log_every_s`: off a terminal, the seconds between lines.
  Progress(std::string label, int64_t total, std::string unit, double log_every_s = 10);
  ~Progress() { done(); }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void advance(int64_t n = 1);
  void done();

 private:
  std::string label_, unit_;
  int64_t total_, done_ = 0;
  bool shown_;  // standard error is a terminal
  bool ended_ = false;
  bool logged_ = false;  // not a terminal: a line was printed
  double log_every_s_;
  Clock::time_point start_ = Clock::now(), last_ = start_;
};

}  // namespace tributary
