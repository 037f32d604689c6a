// metrics.jsonl: one JSON object per line per logged step or evaluation, the source of every plot and report.
// Lines are flushed as written so a crash loses at most the line being written. With a TensorBoard directory, every
// number of every line (but "step", the x axis) is also a scalar of that name at that step (core/tb_events.h).
#pragma once

#include <cstdio>
#include <memory>
#include <string>

#include "tributary/core/fs.h"
#include "tributary/core/tb_events.h"

namespace tributary {

class MetricsWriter {
 public:
  // resume_step >= 0: keep only lines with step <= resume_step (a resumed run rewrites what came after its checkpoint).
  MetricsWriter(const fs::path& path, int64_t resume_step = -1, const fs::path& tensorboard_dir = {});
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  void write(const std::string& json_line);

 private:
  std::FILE* file_;
  std::unique_ptr<EventWriter> tensorboard_;
};

}  // namespace tributary
