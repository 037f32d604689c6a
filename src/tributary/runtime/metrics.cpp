#include "tributary/runtime/metrics.h"

#include <nlohmann/json.hpp>
#include <sstream>

#include "tributary/core/error.h"

namespace tributary {

MetricsWriter::MetricsWriter(const fs::path& path, int64_t resume_step) {
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
}

MetricsWriter::~MetricsWriter() { std::fclose(file_); }

void MetricsWriter::write(const std::string& json_line) {
  std::fputs(json_line.c_str(), file_);
  std::fputc('\n', file_);
  std::fflush(file_);
}

}  // namespace tributary
