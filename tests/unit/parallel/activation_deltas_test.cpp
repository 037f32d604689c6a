// AQ-SGD's activation deltas (parallel/pipeline/activation_deltas.h): a sender's and a receiver's cache, as two
// neighbouring stages hold them, against the examples' true activations.
#include <gtest/gtest.h>

#include "tributary/core/error.h"
#include "tributary/parallel/pipeline/activation_deltas.h"

using namespace tributary;
using namespace tributary::pipeline;

namespace {
constexpr int64_t kTokens = 8, kWidth = 128, kRowBytes = kTokens * kWidth * 4;

double relative_error(const torch::Tensor& got, const torch::Tensor& want) {
  return ((got - want).norm() / want.norm()).item<double>();
}
}  // namespace

TEST(ActivationDeltas, ARevisitedExampleTravelsAsItsChangeAndLandsCloserEachVisit) {
  ActivationDeltas sender(Wire::Hadamard4, 1 << 20), receiver(Wire::Hadamard4, 1 << 20);
  torch::manual_seed(3);
  const std::vector<uint64_t> keys = {11, 22, 33};
  auto x = torch::randn({3, kTokens, kWidth});
  const int64_t int8_bytes = 3 * wire_bytes(Wire::Int8, kTokens, kWidth);
  const int64_t delta_bytes = 3 * wire_bytes(Wire::Hadamard4, kTokens, kWidth);
  double last_error = 0;
  for (int visit = 0; visit < 4; ++visit) {
    SCOPED_TRACE(visit);
    if (visit > 0) x = x + 0.01 * torch::randn({3, kTokens, kWidth});  // the model moved a little since
    const int64_t expected = visit == 0 ? int8_bytes : delta_bytes;
    EXPECT_EQ(sender.message_bytes(keys, kTokens, kWidth), expected);
    EXPECT_EQ(receiver.message_bytes(keys, kTokens, kWidth), expected);
    const auto message = sender.encode(x, keys);
    ASSERT_EQ(message.numel(), expected);
    const auto got = receiver.decode(message, keys, kTokens, kWidth);
    const double error = relative_error(got, x);
    if (visit == 0) {
      EXPECT_LT(error, 0.01) << "int8 on the first visit";
    } else {
      // A plain 4-bit message of x is ~10% off; the change of a 1% move, at 4 bits, adds ~0.1% to what was cached.
      EXPECT_LT(error, 0.006);
      if (visit > 1) {
        EXPECT_LT(error, last_error * 1.5) << "the error does not grow from visit to visit";
      }
    }
    last_error = error;
  }
  EXPECT_EQ(sender.entries(), 3);
  EXPECT_EQ(receiver.cached_bytes(), 3 * kRowBytes);
  EXPECT_EQ(receiver.fresh_rows(), 3);
  EXPECT_EQ(receiver.delta_rows(), 9);
  const auto plain = wire_decode(wire_encode(x, Wire::Hadamard4), Wire::Hadamard4, {3, kTokens, kWidth});
  EXPECT_GT(relative_error(plain, x), 10 * last_error) << "4 bits alone are far coarser than 4-bit changes";
}

TEST(ActivationDeltas, ABoundedCacheSendsNewExamplesAsInt8AndBothEndsAgree) {
  // Room for one example: the first is cached, the second (and the third, new) never are; a key twice in one
  // message is a change against its first row.
  ActivationDeltas sender(Wire::Hadamard2, kRowBytes), receiver(Wire::Hadamard2, kRowBytes);
  const int64_t int8_row = wire_bytes(Wire::Int8, kTokens, kWidth),
                delta_row = wire_bytes(Wire::Hadamard2, kTokens, kWidth);
  auto x = torch::randn({3, kTokens, kWidth});
  EXPECT_EQ(sender.message_bytes({1, 2, 1}, kTokens, kWidth), 2 * int8_row + delta_row);
  auto got = receiver.decode(sender.encode(x, {1, 2, 1}), {1, 2, 1}, kTokens, kWidth);
  EXPECT_EQ(receiver.entries(), 1);
  EXPECT_EQ(sender.message_bytes({2, 3, 1}, kTokens, kWidth), 2 * int8_row + delta_row);
  got = receiver.decode(sender.encode(x, {2, 3, 1}), {2, 3, 1}, kTokens, kWidth);
  EXPECT_LT(relative_error(got[0], x[0]), 0.01) << "example 2, still int8";
  EXPECT_EQ(sender.entries(), 1);
  EXPECT_EQ(receiver.cached_bytes(), kRowBytes);
}

TEST(ActivationDeltas, AMessageOfAnotherSizeIsRefusedNamingTheCache) {
  ActivationDeltas receiver(Wire::Hadamard4, 1 << 20);
  try {
    receiver.decode(torch::zeros({10}, torch::kUInt8), {1}, kTokens, kWidth);
    ADD_FAILURE() << "decoded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.activation_cache_mb"), std::string::npos) << e.what();
  }
  EXPECT_NE(example_key(std::vector<int64_t>{1, 2, 3}.data(), 3), example_key(std::vector<int64_t>{1, 2, 4}.data(), 3));
}
