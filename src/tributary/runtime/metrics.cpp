#include "tributary/runtime/metrics.h"

#include <chrono>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tributary/core/error.h"

namespace tributary {

MetricsWriter::MetricsWriter(const fs::path& path, int64_t resume_step, const fs::path& tensorboard_dir) {
  if (resume_step >= 0 && fs::exists(path)) {
    std::istringstream in(read_file(path));
    std::string line, kept;
    while (std::getline(in, line)) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_discarded() && j.value("step", int64_t{0}) <= resume_step) kept += line + "\n";
    }
    write_file_atomic(path, kept);
  } else if (resume_step < 0 && fs::exists(path)) {
    fs::remove(path);
  }
  file_ = std::fopen(path.c_str(), "a");
  if (!file_) fail("cannot open '{}' for writing", path.string());
  if (!tensorboard_dir.empty()) tensorboard_ = std::make_unique<EventWriter>(tensorboard_dir);
}

MetricsWriter::~MetricsWriter() { std::fclose(file_); }

void MetricsWriter::write(const std::string& json_line) {
  std::fputs(json_line.c_str(), file_);
  std::fputc('\n', file_);
  std::fflush(file_);
  if (!tensorboard_) return;
  const auto j = nlohmann::json::parse(json_line, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("step")) return;
  const auto step = j.at("step").get<int64_t>();
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  for (const auto& [key, value] : j.items())
    if (key != "step" && value.is_number()) tensorboard_->scalar(key, step, value.get<double>(), now);
  tensorboard_->flush();
}

}  // namespace tributary
