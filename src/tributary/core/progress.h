// A progress line for work that takes more than a few seconds (eval over a split, routing): "label  120/400 batches
// (30%)  52.1/s  ETA 5 s", rewritten in place on standard error when it is a terminal, at most twice a second; nothing
// at all when it is not (logs, pipes, tests). done() (or the destructor) ends the line.
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
  Progress(std::string label, int64_t total, std::string unit);
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
  Clock::time_point start_ = Clock::now(), last_ = start_;
};

}  // namespace tributary
