#include "tributary/core/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace tributary {

std::string progress_text(const std::string& label, int64_t done, int64_t total, const std::string& unit,
                          double seconds) {
  const double rate = seconds > 0 ? double(done) / seconds : 0;
  const double percent = total > 0 ? 100.0 * double(done) / double(total) : 0;
  std::string text = fmt::format("{}  {}/{} {} ({:.0f}%)", label, done, total, unit, percent);
  if (rate > 0) {
    text += fmt::format("  {:.1f}/s", rate);
    if (done < total) text += fmt::format("  ETA {:.0f} s", double(total - done) / rate);
  }
  return text;
}

Progress::Progress(std::string label, int64_t total, std::string unit, double log_every_s)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(std::max<int64_t>(total, 0)),
      shown_(::isatty(STDERR_FILENO) == 1),
      log_every_s_(log_every_s) {}

void Progress::advance(int64_t n) {
  done_ += n;
  if (ended_) return;
  const auto now = Clock::now();
  if (!shown_) {  // a log: a line every 10 s
    if (seconds_since(last_) < log_every_s_) return;
    last_ = now;
    logged_ = true;
    std::fprintf(stderr, "%s\n", progress_text(label_, done_, total_, unit_, seconds_since(start_)).c_str());
    std::fflush(stderr);
    return;
  }
  if (seconds_since(last_) < 0.5 && done_ < total_) return;
  last_ = now;
  std::fprintf(stderr, "\r%s\033[K", progress_text(label_, done_, total_, unit_, seconds_since(start_)).c_str());
  std::fflush(stderr);
}

void Progress::done() {
  if (ended_) return;
  ended_ = true;
  if (!shown_ && !logged_) return;
  std::fprintf(stderr, shown_ ? "\r%s\033[K\n" : "%s\n",
               progress_text(label_, done_, total_, unit_, seconds_since(start_)).c_str());
  std::fflush(stderr);
}

}  // namespace tributary
