// The pipeline's wire formats (parallel/pipeline/wire.h): sizes, round trips within the format's rounding, and
// refusals.
#include <gtest/gtest.h>

#include "tributary/core/error.h"
#include "tributary/parallel/pipeline/wire.h"

using namespace tributary;
using namespace tributary::pipeline;

TEST(Wire, RoundTripsWithinTheFormatsRounding) {
  torch::manual_seed(1);
  auto x = torch::randn({3, 5, 16}) * torch::linspace(0.01, 100, 16);  // rows of very different ranges
  for (Wire wire : {Wire::Fp32, Wire::Fp16, Wire::Bf16, Wire::Int8}) {
    auto sent = wire_encode(x, wire);
    EXPECT_EQ(sent.numel() * int64_t(sent.element_size()), wire_bytes(wire, 15, 16));
    auto buffer = wire_buffer(wire, {3, 5, 16});
    ASSERT_EQ(buffer.numel() * int64_t(buffer.element_size()), wire_bytes(wire, 15, 16));
    buffer.copy_(sent);
    auto back = wire_decode(buffer, wire, {3, 5, 16});
    ASSERT_EQ(back.sizes(), x.sizes());
    ASSERT_EQ(back.scalar_type(), torch::kFloat32);
    auto err = (back - x).abs();
    auto row_max = x.abs().amax(-1, true);
    switch (wire) {
      case Wire::Fp32:
        EXPECT_TRUE(torch::equal(back, x));
        break;
      case Wire::Fp16:
        EXPECT_TRUE((err <= x.abs() * 1e-3 + 1e-7).all().item<bool>());
        break;
      case Wire::Bf16:
        EXPECT_TRUE((err <= x.abs() * 8e-3 + 1e-30).all().item<bool>());
        break;
      case Wire::Int8:
        EXPECT_TRUE((err <= row_max / 254 * 1.0001).all().item<bool>());
        break;
      case Wire::Hadamard4:
      case Wire::Hadamard2:
        break;  // HadamardFormatsSendFourOrTwoBitsWithinTheirErrorBounds
      case Wire::Aq4:
      case Wire::Aq2:
        break;  // activation_deltas_test.cpp
    }
  }
  EXPECT_EQ(wire_bytes(Wire::Int8, 10, 64), 10 * 64 + 40);
  auto zeros = torch::zeros({2, 8});  // an all-zero row has no scale to divide by
  EXPECT_TRUE(torch::equal(wire_decode(wire_encode(zeros, Wire::Int8), Wire::Int8, {2, 8}), zeros));
}

// 4 and 2 bits after the tile-wise Hadamard rotation: sizes (C / 2 or C / 4 bytes per token plus a scale per 64
// values, the last tile padded), the error of each format on activations shaped as a transformer's are (Gaussian
// rows, one channel 50x larger: the outlier the rotation spreads), and bit-exact zeros.
TEST(Wire, HadamardFormatsSendFourOrTwoBitsWithinTheirErrorBounds) {
  EXPECT_EQ(wire_bytes(Wire::Hadamard4, 10, 256), 10 * (128 + 4 * 4));
  EXPECT_EQ(wire_bytes(Wire::Hadamard2, 10, 256), 10 * (64 + 4 * 4));
  EXPECT_EQ(wire_bytes(Wire::Hadamard4, 3, 100), 3 * (64 + 2 * 4)) << "100 values: two tiles, the second padded";
  torch::manual_seed(2);
  auto x = torch::randn({4, 16, 256});
  x.select(2, 17).mul_(50);  // an outlier channel
  for (const auto& [wire, bound] :
       std::vector<std::pair<Wire, double>>{{Wire::Hadamard4, 0.16}, {Wire::Hadamard2, 0.5}}) {
    SCOPED_TRACE(int(wire));
    auto sent = wire_encode(x, wire);
    ASSERT_EQ(sent.numel(), wire_bytes(wire, 64, 256));
    auto buffer = wire_buffer(wire, {4, 16, 256});
    buffer.copy_(sent);
    const auto back = wire_decode(buffer, wire, {4, 16, 256});
    ASSERT_EQ(back.sizes(), x.sizes());
    // Relative error per token row: the rotation makes it about the same whatever the row's range.
    const auto rel = (back - x).norm(2, -1) / x.norm(2, -1);
    EXPECT_LT(rel.max().item<double>(), bound) << "median " << rel.median().item<double>();
    EXPECT_GT(rel.min().item<double>(), 0) << "nothing was rounded";
    const auto odd = torch::randn({5, 100});  // a width that is no multiple of the tile
    EXPECT_LT(((wire_decode(wire_encode(odd, wire), wire, {5, 100}) - odd).norm() / odd.norm()).item<double>(), bound);
    const auto zeros = torch::zeros({2, 64});
    EXPECT_TRUE(torch::equal(wire_decode(wire_encode(zeros, wire), wire, {2, 64}), zeros));
  }
  // With a seed the rounding is stochastic: each message is off by more than to-the-nearest, but not on average
  // (unbiased: the mean of many messages' values closes in on the sent one), and one seed rounds the same way twice.
  const auto y = torch::randn({8, 256});
  auto mean = torch::zeros_like(y);
  for (uint64_t seed = 1; seed <= 64; ++seed)
    mean += wire_decode(wire_encode(y, Wire::Hadamard4, seed), Wire::Hadamard4, {8, 256}) / 64;
  const auto nearest = wire_decode(wire_encode(y, Wire::Hadamard4), Wire::Hadamard4, {8, 256});
  EXPECT_LT((mean - y).norm().item<double>(), 0.5 * (nearest - y).norm().item<double>());
  EXPECT_TRUE(torch::equal(wire_encode(y, Wire::Hadamard4, 7), wire_encode(y, Wire::Hadamard4, 7)));
  // Against int8 with one scale per row: 1.8x fewer bytes for the 4-bit format (7.1x fewer than fp32).
  EXPECT_LT(wire_bytes(Wire::Hadamard4, 64, 256) * 1.7, wire_bytes(Wire::Int8, 64, 256));
}

TEST(Wire, UnknownFormatsAreRefusedNamingTheKey) {
  EXPECT_EQ(parse_wire("int8", "k"), Wire::Int8);
  try {
    parse_wire("fp8", "parallel.activation_compression");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.activation_compression = 'fp8'"), std::string::npos) << e.what();
  }
}
