#include <gtest/gtest.h>

#include "tributary/comm/codec.h"
#include "tributary/core/error.h"

using namespace tributary;

namespace {
torch::Tensor round_trip(const comm::Codec& c, const torch::Tensor& x) {
  std::vector<uint8_t> wire(c.encoded_bytes(x.numel()));
  c.encode(x, wire.data());
  return c.decode(wire.data(), x.numel());
}
}  // namespace

TEST(Codec, ExactWireSizes) {
  for (int64_t n : {1, 2, 7, 1000}) {
    EXPECT_EQ(comm::make_codec("fp32")->encoded_bytes(n), size_t(4 * n));
    EXPECT_EQ(comm::make_codec("fp16")->encoded_bytes(n), size_t(2 * n));
    EXPECT_EQ(comm::make_codec("bf16")->encoded_bytes(n), size_t(2 * n));
    EXPECT_EQ(comm::make_codec("int8")->encoded_bytes(n), size_t(n + 1024));
    EXPECT_EQ(comm::make_codec("fp4")->encoded_bytes(n), size_t((n + 1) / 2 + 4));
    EXPECT_EQ(comm::make_codec("terngrad")->encoded_bytes(n), size_t((n + 3) / 4 + 4));
  }
  EXPECT_THROW(comm::make_codec("zip"), Error);
}

TEST(Codec, ErrorBounds) {
  torch::manual_seed(0);
  for (int trial = 0; trial < 5; ++trial) {
    auto x = torch::randn({4097}) * std::pow(10.0, trial - 2);
    EXPECT_TRUE(round_trip(*comm::make_codec("fp32"), x).equal(x));
    auto e16 = (round_trip(*comm::make_codec("fp16"), x) - x).abs();
    EXPECT_TRUE((e16 <= x.abs() * std::ldexp(1.0, -11) + 1e-7).all().item<bool>());
    auto eb = (round_trip(*comm::make_codec("bf16"), x) - x).abs();
    EXPECT_TRUE((eb <= x.abs() * std::ldexp(1.0, -8)).all().item<bool>());
    // int8: within +-3 sigma every value is within one quantisation step (6 sigma / 256) of its decoded value.
    double sigma = x.norm().item<double>() / std::sqrt(double(x.numel() - 1));
    auto e8 = (round_trip(*comm::make_codec("int8"), x) - x).abs();
    auto inside = x.abs() < 2.9 * sigma;
    EXPECT_LE(e8.masked_select(inside).max().item<double>(), 6 * sigma / 256 * 1.0001);
    // fp4: |err| <= |x|/3 for |x| >= scale/64, and <= scale/128 below.
    double scale = x.abs().max().item<double>();
    auto e4 = (round_trip(*comm::make_codec("fp4"), x) - x).abs();
    auto big = x.abs() >= scale / 64;
    EXPECT_TRUE((e4.masked_select(big) <= x.abs().masked_select(big) / 3 + 1e-12).all().item<bool>());
    EXPECT_LE(e4.masked_select(big.logical_not()).max().item<double>(), scale / 128 * 1.0001);
  }
}

TEST(Codec, SignsZerosAndDegenerateInputsSurvive) {
  auto x = torch::tensor({0.0f, -1.0f, 1.0f, 0.5f, -0.25f});
  auto y = round_trip(*comm::make_codec("fp4"), x);
  EXPECT_TRUE(y.equal(x)) << y;  // all exactly representable
  auto zeros = torch::zeros({9});
  for (const auto& name : comm::codec_names())
    EXPECT_TRUE(round_trip(*comm::make_codec(name), zeros).equal(zeros)) << name;
  // the int8 table keeps the mean of each bin: a constant vector comes back exactly
  auto c = torch::full({100}, 0.37f);
  EXPECT_TRUE(torch::allclose(round_trip(*comm::make_codec("int8"), c), c));
}

TEST(Codec, TernGradIsUnbiasedAndTernary) {
  torch::manual_seed(5);
  auto x = torch::randn({64});
  double s = x.abs().max().item<double>();
  auto codec = comm::make_codec("terngrad", 7);
  auto sum = torch::zeros({64});
  const int trials = 4000;
  for (int t = 0; t < trials; ++t) {
    auto y = round_trip(*codec, x);
    auto ternary = (y == 0) | ((y.abs() - s).abs() < 1e-6);
    ASSERT_TRUE(ternary.all().item<bool>());
    ASSERT_TRUE(((y == 0) | (y.sign() == x.sign())).all().item<bool>());
    sum += y;
  }
  // mean within ~4 standard errors: var = |x| s - x^2 <= s^2 / 4
  auto mean = sum / trials;
  EXPECT_LE((mean - x).abs().max().item<double>(), 4 * s / 2 / std::sqrt(double(trials)));
}
