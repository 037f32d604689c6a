#include <gtest/gtest.h>

#include <fstream>

#include "tributary/core/error.h"
#include "tributary/data/shard.h"

using namespace tributary;

namespace {
fs::path temp(const std::string& name) { return fs::temp_directory_path() / ("trib_shard_" + name); }

Shard sample(uint32_t max_id) {
  Shard s;
  for (uint32_t i = 0; i < 1000; ++i) s.tokens.push_back((i * 7919u) % (max_id + 1));
  s.docs = {{0, 400, 0}, {400, 600, 3}};
  return s;
}

std::string error_reading(const fs::path& p) {
  try {
    Shard::read(p);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Shard, RoundTripU16AndU32) {
  for (uint32_t max_id : {256u, 100000u}) {
    auto p = temp("rt.bin");
    Shard s = sample(max_id);
    s.write(p, max_id);
    Shard r = Shard::read(p);
    EXPECT_EQ(r.tokens, s.tokens);
    ASSERT_EQ(r.docs.size(), 2u);
    EXPECT_EQ(r.docs[1].first_token, 400u);
    EXPECT_EQ(r.docs[1].domain, 3u);
    EXPECT_EQ(fs::file_size(p), 64 + 2 * 16 + 1000 * (max_id < 65536 ? 2 : 4));
    fs::remove(p);
  }
}

TEST(Shard, TruncationAndCorruptionNameTheFile) {
  auto p = temp("bad.bin");
  sample(256).write(p, 256);
  std::string bytes;
  {
    std::ifstream in(p, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto write = [&](const std::string& b) { std::ofstream(p, std::ios::binary | std::ios::trunc) << b; };

  write(bytes.substr(0, bytes.size() - 1));
  auto msg = error_reading(p);
  EXPECT_NE(msg.find(p.string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;

  std::string flipped = bytes;
  flipped[bytes.size() - 10] ^= 0x01;
  write(flipped);
  msg = error_reading(p);
  EXPECT_NE(msg.find("checksum"), std::string::npos) << msg;

  std::string bad_table = bytes;
  bad_table[64 + 3] ^= 0x40;
  write(bad_table);
  EXPECT_NE(error_reading(p).find("corrupted"), std::string::npos);

  write("not a shard at all, just some text that is long enough to hold a header .......");
  EXPECT_NE(error_reading(p).find("magic"), std::string::npos);
  fs::remove(p);
  EXPECT_NE(error_reading(p).find("cannot read"), std::string::npos);
}
