// TensorBoard scalars without TensorFlow: an event file is a sequence of records
//   uint64 length | uint32 masked CRC-32C of the length | data | uint32 masked CRC-32C of the data
// (little-endian; mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8), each record's data a protobuf `Event`:
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }   Value { string tag = 1; float simple_value = 2; }
// The first record carries file_version "brain.Event:2". TensorBoard reads every file whose name contains
// "tfevents" under the directory it is pointed at (here RUN/tb/). No Debian package provides a writer; the format is
// small enough to own, and read_events() decodes it back (CRCs checked) so tests can prove a file is well formed.
// No LibTorch.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "tributary/core/fs.h"

namespace tributary {

uint32_t crc32c(std::string_view data);

struct ScalarEvent {
  double wall_time = 0;
  int64_t step = 0;
  std::string tag;
  float value = 0;
};

class EventWriter {
 public:
  // Creates `dir` and a new file events.out.tfevents.<seconds>.<host>.<pid> in it (a resumed run adds a file).
  explicit EventWriter(const fs::path& dir);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  void scalar(const std::string& tag, int64_t step, double value, double wall_time);
  void flush();  // records reach the file at once; a crash loses at most the record being written
  const fs::path& path() const { return path_; }

 private:
  void record(const std::string& event);
  fs::path path_;
  std::FILE* file_ = nullptr;
};

// Every scalar of an event file, in order. Error naming the file and the record on a bad length, CRC or protobuf.
std::vector<ScalarEvent> read_events(const fs::path& path);

}  // namespace tributary
