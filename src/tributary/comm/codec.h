// Codecs for what crosses the network (pseudo-gradients, gradients). Values are fp32 on both ends: encode quantises
// only for the wire, decode returns fp32, and averaging happens in fp32 (Streaming DiLoCo / PRIME practice).
// encoded_bytes(n) is exact: it is what the byte accounting reports.
//   fp32      4n bytes                 lossless
//   fp16      2n                       |err| <= 2^-11 |x| in range
//   bf16      2n                       |err| <= 2^-8 |x|
//   int8      n + 4*256 (+4)           PRIME: step 6*sigma/256 around 0, a table of the mean value of each bin
//   fp4       ceil(n/2) + 4            E3M0: sign + 3-bit exponent, magnitudes scale*2^(e-7), e = 1..7, or 0
//   terngrad  ceil(n/4) + 4            s * sign(x) * Bernoulli(|x|/s), s = max|x|: unbiased, values in {-s, 0, s}
// Top-k and PowerSGD keep error-feedback state across rounds; they live in Exchange, not here.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tributary::comm {

class Codec {
 public:
  virtual ~Codec() = default;
  virtual std::string name() const = 0;
  virtual size_t encoded_bytes(int64_t numel) const = 0;
  // x: fp32, contiguous, 1-D, on CPU. out must hold encoded_bytes(x.numel()).
  virtual void encode(const torch::Tensor& x, uint8_t* out) const = 0;
  // Returns fp32 values of length numel.
  virtual torch::Tensor decode(const uint8_t* in, int64_t numel) const = 0;
};

// Error listing the names if unknown. `seed` feeds the stochastic codecs (terngrad).
std::unique_ptr<Codec> make_codec(const std::string& name, uint64_t seed = 0);
std::vector<std::string> codec_names();

}  // namespace tributary::comm
