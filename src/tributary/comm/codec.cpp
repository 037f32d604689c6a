#include "tributary/comm/codec.h"

#include <cmath>
#include <cstring>

#include "tributary/core/error.h"
#include "tributary/core/rng.h"

namespace tributary::comm {
namespace {

// Codecs with a per-tensor scale (the largest magnitude) carry it as the first 4 bytes.
float write_max_abs_scale(const torch::Tensor& x, uint8_t* out) {
  const float* v = x.data_ptr<float>();
  float scale = 0;
  for (int64_t i = 0; i < x.numel(); ++i) scale = std::max(scale, std::abs(v[i]));
  std::memcpy(out, &scale, 4);
  return scale;
}

float read_scale(const uint8_t* in) {
  float scale;
  std::memcpy(&scale, in, 4);
  return scale;
}

class Fp32Codec final : public Codec {
 public:
  std::string name() const override { return "fp32"; }
  size_t encoded_bytes(int64_t n) const override { return static_cast<size_t>(n) * 4; }
  void encode(const torch::Tensor& x, uint8_t* out) const override {
    std::memcpy(out, x.data_ptr<float>(), encoded_bytes(x.numel()));
  }
  torch::Tensor decode(const uint8_t* in, int64_t n) const override {
    auto out = torch::empty({n}, torch::kFloat32);
    std::memcpy(out.data_ptr<float>(), in, encoded_bytes(n));
    return out;
  }
};

class HalfCodec final : public Codec {
 public:
  explicit HalfCodec(torch::ScalarType type) : type_(type) {}
  std::string name() const override { return type_ == torch::kFloat16 ? "fp16" : "bf16"; }
  size_t encoded_bytes(int64_t n) const override { return static_cast<size_t>(n) * 2; }
  void encode(const torch::Tensor& x, uint8_t* out) const override {
    auto h = x.to(type_).contiguous();
    std::memcpy(out, h.data_ptr(), encoded_bytes(x.numel()));
  }
  torch::Tensor decode(const uint8_t* in, int64_t n) const override {
    auto h = torch::empty({n}, type_);
    std::memcpy(h.data_ptr(), in, encoded_bytes(n));
    return h.to(torch::kFloat32);
  }

 private:
  torch::ScalarType type_;
};

// PRIME's int8: sigma = ||x|| / sqrt(n - 1), step = 6 sigma / 256, q = clamp(round(x / step) + 128, 0, 255); the
// decoder maps each code to the mean of the original values that fell in its bin (a 256-entry table on the wire).
class Int8Codec final : public Codec {
 public:
  std::string name() const override { return "int8"; }
  size_t encoded_bytes(int64_t n) const override { return static_cast<size_t>(n) + 256 * 4; }
  void encode(const torch::Tensor& x, uint8_t* out) const override {
    const int64_t n = x.numel();
    const float* v = x.data_ptr<float>();
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += double(v[i]) * v[i];
    const double sigma = n > 1 ? std::sqrt(ss / double(n - 1)) : std::abs(n ? v[0] : 0.0f);
    const double step = sigma > 0 ? 6.0 * sigma / 256.0 : 1.0;
    double sum[256] = {0};
    int64_t count[256] = {0};
    uint8_t* codes = out + 256 * 4;
    for (int64_t i = 0; i < n; ++i) {
      int q = static_cast<int>(std::lround(v[i] / step)) + 128;
      q = std::clamp(q, 0, 255);
      codes[i] = static_cast<uint8_t>(q);
      sum[q] += v[i];
      count[q] += 1;
    }
    for (int q = 0; q < 256; ++q) {
      float mean = count[q] ? static_cast<float>(sum[q] / double(count[q])) : static_cast<float>((q - 128) * step);
      std::memcpy(out + 4 * q, &mean, 4);
    }
  }
  torch::Tensor decode(const uint8_t* in, int64_t n) const override {
    float table[256];
    std::memcpy(table, in, sizeof(table));
    auto out = torch::empty({n}, torch::kFloat32);
    float* o = out.data_ptr<float>();
    const uint8_t* codes = in + 256 * 4;
    for (int64_t i = 0; i < n; ++i) o[i] = table[codes[i]];
    return out;
  }
};

// FP4 E3M0 with a per-tensor scale (the largest magnitude): code = sign << 3 | e, value = sign * scale * 2^(e - 7)
// for e in 1..7 and 0 for e = 0. Magnitudes are rounded to the nearest representable value (geometric midpoints
// would bias small values; arithmetic midpoints keep |err| <= |x| / 3 within range).
class Fp4Codec final : public Codec {
 public:
  std::string name() const override { return "fp4"; }
  size_t encoded_bytes(int64_t n) const override { return static_cast<size_t>((n + 1) / 2) + 4; }
  void encode(const torch::Tensor& x, uint8_t* out) const override {
    const int64_t n = x.numel();
    const float* v = x.data_ptr<float>();
    const float scale = write_max_abs_scale(x, out);
    uint8_t* codes = out + 4;
    std::memset(codes, 0, static_cast<size_t>((n + 1) / 2));
    for (int64_t i = 0; i < n; ++i) {
      uint8_t code = 0;
      if (scale > 0) {
        const float r = std::abs(v[i]) / scale;  // in [0, 1]
        int best = 0;
        float best_err = r;  // e = 0 encodes zero
        for (int e = 1; e <= 7; ++e) {
          float err = std::abs(r - std::ldexp(1.0f, e - 7));
          if (err < best_err) {
            best_err = err;
            best = e;
          }
        }
        code = static_cast<uint8_t>(best | (v[i] < 0 ? 8 : 0));
      }
      codes[i / 2] |= static_cast<uint8_t>(code << (4 * (i % 2)));
    }
  }
  torch::Tensor decode(const uint8_t* in, int64_t n) const override {
    const float scale = read_scale(in);
    auto out = torch::empty({n}, torch::kFloat32);
    float* o = out.data_ptr<float>();
    const uint8_t* codes = in + 4;
    for (int64_t i = 0; i < n; ++i) {
      uint8_t code = (codes[i / 2] >> (4 * (i % 2))) & 0xF;
      int e = code & 7;
      float mag = e == 0 ? 0.0f : scale * std::ldexp(1.0f, e - 7);
      o[i] = (code & 8) ? -mag : mag;
    }
    return out;
  }
};

// TernGrad (arXiv 1705.07878): x ~ s * sign(x) * Bernoulli(|x| / s) with s = max |x| -- unbiased, 2 bits a value.
// Stochastic: each encode draws from its own SplitMix64 stream (seeded per codec instance and call), so runs with
// the same seed are reproducible.
class TernGradCodec final : public Codec {
 public:
  explicit TernGradCodec(uint64_t seed) : rng_(seed) {}
  std::string name() const override { return "terngrad"; }
  size_t encoded_bytes(int64_t n) const override { return static_cast<size_t>((n + 3) / 4) + 4; }
  void encode(const torch::Tensor& x, uint8_t* out) const override {
    const int64_t n = x.numel();
    const float* v = x.data_ptr<float>();
    const float scale = write_max_abs_scale(x, out);
    uint8_t* codes = out + 4;
    std::memset(codes, 0, static_cast<size_t>((n + 3) / 4));
    SplitMix64 rng(rng_.next());  // a fresh stream per call, derived from the codec's seed
    for (int64_t i = 0; i < n; ++i) {
      const double u = double(rng.next() >> 11) * 0x1.0p-53;
      uint8_t code = 0;
      if (scale > 0 && u < std::abs(v[i]) / scale) code = v[i] < 0 ? 2 : 1;
      codes[i / 4] |= static_cast<uint8_t>(code << (2 * (i % 4)));
    }
  }
  torch::Tensor decode(const uint8_t* in, int64_t n) const override {
    const float scale = read_scale(in);
    auto out = torch::empty({n}, torch::kFloat32);
    float* o = out.data_ptr<float>();
    const uint8_t* codes = in + 4;
    for (int64_t i = 0; i < n; ++i) {
      uint8_t code = (codes[i / 4] >> (2 * (i % 4))) & 3;
      o[i] = code == 1 ? scale : code == 2 ? -scale : 0.0f;
    }
    return out;
  }

 private:
  mutable SplitMix64 rng_;
};

}  // namespace

std::vector<std::string> codec_names() { return {"fp32", "fp16", "bf16", "int8", "fp4", "terngrad"}; }

std::unique_ptr<Codec> make_codec(const std::string& name, uint64_t seed) {
  if (name == "fp32" || name == "none") return std::make_unique<Fp32Codec>();
  if (name == "fp16") return std::make_unique<HalfCodec>(torch::kFloat16);
  if (name == "bf16") return std::make_unique<HalfCodec>(torch::kBFloat16);
  if (name == "int8") return std::make_unique<Int8Codec>();
  if (name == "fp4") return std::make_unique<Fp4Codec>();
  if (name == "terngrad") return std::make_unique<TernGradCodec>(seed);
  fail("unknown compression '{}' (dist.compression: one of fp32, fp16, bf16, int8, fp4, terngrad, topk, powersgd)",
       name);
}

}  // namespace tributary::comm
