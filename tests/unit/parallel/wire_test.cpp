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
    }
  }
  EXPECT_EQ(wire_bytes(Wire::Int8, 10, 64), 10 * 64 + 40);
  auto zeros = torch::zeros({2, 8});  // an all-zero row has no scale to divide by
  EXPECT_TRUE(torch::equal(wire_decode(wire_encode(zeros, Wire::Int8), Wire::Int8, {2, 8}), zeros));
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
