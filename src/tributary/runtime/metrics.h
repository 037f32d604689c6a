// metrics.jsonl: one JSON object per line per logged step or evaluation, the source of every plot and report.
// Lines are flushed as written so a crash loses at most the line being written.
#pragma once

#include <cstdio>
#include <string>

#include "tributary/core/fs.h"

namespace tributary {

class MetricsWriter {
 public:
  // resume_step >= 0: keep only lines with step <= resume_step (a resumed run rewrites what came after its checkpoint).
  MetricsWriter(const fs::path& path, int64_t resume_step = -1);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  void write(const std::string& json_line);

 private:
  std::FILE* file_;
};

}  // namespace tributary
