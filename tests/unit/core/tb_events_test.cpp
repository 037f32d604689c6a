// TensorBoard event files: CRC-32C against its published check value, scalars written and decoded back, and damage
// found (a flipped byte fails the CRC, a cut file is truncated), naming the file and the record.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <tuple>
#include <vector>

#include "support/error_of.h"
#include "tributary/core/error.h"
#include "tributary/core/tb_events.h"

using namespace tributary;
using test_support::error_of;

namespace {

fs::path fresh_dir(const std::string& name) {
  const auto dir = fs::temp_directory_path() / ("tributary_tb_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  return dir;
}

// A fresh directory's event file holding `scalars` (tag, step, value), the writer closed.
fs::path write_events(const fs::path& dir, const std::vector<std::tuple<std::string, int64_t, double>>& scalars) {
  EventWriter w(dir);
  double wall = 1000.25;
  for (const auto& [tag, step, value] : scalars) w.scalar(tag, step, value, wall++);
  return w.path();
}

}  // namespace

TEST(TensorBoard, Crc32cMatchesTheCheckValue) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);  // RFC 3720's CRC-32C check value
  EXPECT_EQ(crc32c(""), 0u);
}

TEST(TensorBoard, ScalarsAreWrittenAndDecodedBack) {
  const auto dir = fresh_dir("roundtrip");
  const fs::path path = write_events(dir, {{"loss", 10, 2.5}, {"val_loss", 20, 1.75}, {"tokens_per_s", 20, 123456.0}});
  EXPECT_NE(path.filename().string().find("tfevents"), std::string::npos) << "TensorBoard looks for this name";
  const auto events = read_events(path);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].tag, "loss");
  EXPECT_EQ(events[0].step, 10);
  EXPECT_FLOAT_EQ(events[0].value, 2.5f);
  EXPECT_DOUBLE_EQ(events[0].wall_time, 1000.25);
  EXPECT_DOUBLE_EQ(events[1].wall_time, 1001.25);
  EXPECT_EQ(events[1].tag, "val_loss");
  EXPECT_EQ(events[1].step, 20);
  EXPECT_FLOAT_EQ(events[2].value, 123456.0f);
  fs::remove_all(dir);
}

TEST(TensorBoard, ADamagedFileIsAnErrorNamingItAndTheRecord) {
  const auto dir = fresh_dir("damaged");
  const fs::path path = write_events(dir, {{"loss", 1, 3.0}});
  std::string bytes = read_file(path);
  std::string flipped = bytes;
  flipped[flipped.size() - 6] ^= 0x01;  // inside the last record's data
  write_file(path, flipped, false);
  auto msg = error_of([&] { read_events(path); });
  EXPECT_NE(msg.find(path.string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("record 1: the data's CRC differs"), std::string::npos) << msg;
  write_file(path, bytes.substr(0, bytes.size() - 3), false);
  msg = error_of([&] { read_events(path); });
  EXPECT_NE(msg.find("record 1: truncated"), std::string::npos) << msg;
  fs::remove_all(dir);
}
