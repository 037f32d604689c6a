#include <gtest/gtest.h>

#include <cstring>

#include "tributary/core/error.h"
#include "tributary/core/safetensors.h"

using namespace tributary;
using safetensors::DType;

namespace {
std::string sample() {
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  std::vector<int64_t> b = {7, -8};
  return safetensors::serialize(
      {{"a", DType::F32, {2, 3}, a.data(), a.size() * 4}, {"b", DType::I64, {2}, b.data(), 16}}, {{"format", "test"}});
}
}  // namespace

TEST(Safetensors, RoundTrip) {
  auto f = safetensors::File::parse(sample(), "mem");
  ASSERT_TRUE(f.contains("a"));
  const auto& a = f.at("a");
  EXPECT_EQ(a.dtype, DType::F32);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
  float v[6];
  std::memcpy(v, a.data, 24);
  EXPECT_EQ(v[5], 6.0f);
  int64_t w[2];
  std::memcpy(w, f.at("b").data, 16);
  EXPECT_EQ(w[1], -8);
  EXPECT_EQ(f.metadata().at("format"), "test");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data) % 8, 0u) << "data should be 8-byte aligned";
}

TEST(Safetensors, EveryTruncationIsRefused) {
  std::string bytes = sample();
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_THROW(safetensors::File::parse(bytes.substr(0, n), "cut.safetensors"), Error) << "length " << n;
  }
}

TEST(Safetensors, HostileHeadersAreRefused) {
  auto with_header = [](const std::string& json, size_t data_bytes) {
    std::string out(8, '\0');
    uint64_t n = json.size();
    std::memcpy(out.data(), &n, 8);
    return out + json + std::string(data_bytes, '\0');
  };
  // shape x dtype disagrees with the byte range
  EXPECT_THROW(
      safetensors::File::parse(with_header(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), "m"),
      Error);
  // overlapping ranges
  EXPECT_THROW(
      safetensors::File::parse(
          with_header(
              R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"y":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
              12),
          "m"),
      Error);
  // unknown dtype, negative dim, header length beyond the file
  EXPECT_THROW(
      safetensors::File::parse(with_header(R"({"x":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})", 4), "m"),
      Error);
  EXPECT_THROW(
      safetensors::File::parse(with_header(R"({"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4), "m"),
      Error);
  // Issue 46, item 6: a zero dimension beside one of 2^64-1 holds no bytes, and read as an int64 size it was -1
  EXPECT_THROW(
      safetensors::File::parse(
          with_header(R"({"x":{"dtype":"F32","shape":[0,18446744073709551615],"data_offsets":[0,0]}})", 0), "m"),
      Error);
  std::string bad(8, '\xff');
  EXPECT_THROW(safetensors::File::parse(bad + "{}", "m"), Error);
  try {
    safetensors::File::parse("abc", "weights.safetensors");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("weights.safetensors"), std::string::npos);
  }
}
