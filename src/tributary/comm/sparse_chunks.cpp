#include "tributary/comm/sparse_chunks.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tributary/core/error.h"

namespace tributary::comm {
namespace {

int index_bits(int64_t length) {  // the fewest bits that address `length` positions (at least 1)
  int b = 1;
  while ((int64_t{1} << b) < length) ++b;
  return b;
}

// Encoder and decoder both call this, so a replica decodes exactly the value the sender subtracted from its error
// feedback.
// levels >= 2 (bits >= 2).
inline float level(float lo, float hi, int64_t j, int64_t levels) {
  return lo + (hi - lo) * (static_cast<float>(j) / static_cast<float>(levels - 1));
}

class BitWriter {
 public:
  explicit BitWriter(uint8_t* out) : out_(out) {}
  void put(uint64_t value, int bits) {
    acc_ |= value << fill_;
    fill_ += bits;
    for (; fill_ >= 8; fill_ -= 8, acc_ >>= 8) *out_++ = static_cast<uint8_t>(acc_ & 0xff);
  }
  void flush() {
    if (fill_ > 0) *out_++ = static_cast<uint8_t>(acc_ & 0xff);
    acc_ = 0;
    fill_ = 0;
  }

 private:
  uint8_t* out_;
  uint64_t acc_ = 0;
  int fill_ = 0;
};

class BitReader {
 public:
  explicit BitReader(const uint8_t* in) : in_(in) {}
  uint64_t get(int bits) {
    for (; fill_ < bits; fill_ += 8) acc_ |= uint64_t{*in_++} << fill_;
    const uint64_t value = acc_ & ((uint64_t{1} << bits) - 1);
    acc_ >>= bits;
    fill_ -= bits;
    return value;
  }

 private:
  const uint8_t* in_;
  uint64_t acc_ = 0;
  int fill_ = 0;
};

struct Chunk {
  int64_t begin, length, kept;
  int index_bits;
};

Chunk chunk_at(const SparseChunkOptions& o, int64_t numel, int64_t c) {
  const int64_t begin = c * o.chunk, length = std::min(o.chunk, numel - begin);
  return {begin, length, std::min(o.k, length), index_bits(length)};
}

int64_t num_chunks(const SparseChunkOptions& o, int64_t numel) { return (numel + o.chunk - 1) / o.chunk; }

}  // namespace

SparseChunks::SparseChunks(SparseChunkOptions options) : o_(options) {
  if (o_.chunk < 1 || o_.k < 1 || o_.k > o_.chunk)
    fail("sparse chunks: keep k = {} values of chunks of {}: k must be in 1..chunk", o_.k, o_.chunk);
  if (o_.bits < 2 || o_.bits > 8) fail("sparse chunks: {} bits per value; use 2 to 8", o_.bits);
}

int64_t SparseChunks::payload_bytes(int64_t numel) const {
  const int64_t chunks = num_chunks(o_, numel);
  int64_t bits = 0;
  if (chunks > 0) {
    const Chunk full = chunk_at(o_, numel, 0), last = chunk_at(o_, numel, chunks - 1);
    bits = (chunks - 1) * full.kept * (full.index_bits + o_.bits) + last.kept * (last.index_bits + o_.bits);
  }
  return 8 * chunks + (bits + 7) / 8;
}

torch::Tensor SparseChunks::encode(const torch::Tensor& x, torch::Tensor& sent) const {
  TRIB_CHECK(x.dim() == 1 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(), "(a flat fp32 vector)");
  const int64_t numel = x.numel(), chunks = num_chunks(o_, numel);
  sent = torch::zeros_like(x);
  auto payload = torch::empty({payload_bytes(numel)}, torch::kUInt8);
  if (numel == 0) return payload;
  // The k largest magnitudes of every chunk: the full chunks as one [chunks, chunk] top-k, the shorter last apart.
  const int64_t full = numel / o_.chunk;
  std::vector<torch::Tensor> picked;  // per group of chunks: [n, kept] indices inside the chunk
  if (full > 0)
    picked.push_back(std::get<1>(x.narrow(0, 0, full * o_.chunk).view({full, o_.chunk}).abs().topk(o_.k, 1)));
  if (full < chunks) {
    const Chunk last = chunk_at(o_, numel, full);
    picked.push_back(std::get<1>(x.narrow(0, last.begin, last.length).abs().topk(last.kept)).view({1, last.kept}));
  }
  const float* xp = x.data_ptr<float>();
  float* sp = sent.data_ptr<float>();
  uint8_t* header = payload.data_ptr<uint8_t>();
  BitWriter writer(header + 8 * chunks);
  const int64_t levels = int64_t{1} << (o_.bits - 1);
  int64_t c = 0;
  for (const auto& group : picked) {
    const auto idx = group.contiguous();
    const int64_t* ip = idx.data_ptr<int64_t>();
    for (int64_t row = 0; row < idx.size(0); ++row, ++c) {
      const Chunk ch = chunk_at(o_, numel, c);
      const int64_t* rp = ip + row * idx.size(1);
      float lo = INFINITY, hi = 0;
      for (int64_t i = 0; i < ch.kept; ++i) {
        const float m = std::fabs(xp[ch.begin + rp[i]]);
        lo = std::min(lo, m);
        hi = std::max(hi, m);
      }
      std::memcpy(header + 8 * c, &lo, 4);
      std::memcpy(header + 8 * c + 4, &hi, 4);
      for (int64_t i = 0; i < ch.kept; ++i) {
        const float v = xp[ch.begin + rp[i]];
        const float span = hi - lo;
        const int64_t j =
            span > 0 ? std::clamp<int64_t>(std::lround((std::fabs(v) - lo) / span * float(levels - 1)), 0, levels - 1)
                     : levels - 1;
        const bool negative = std::signbit(v);
        writer.put(static_cast<uint64_t>(rp[i]), ch.index_bits);
        writer.put(static_cast<uint64_t>(j) | (uint64_t{negative} << (o_.bits - 1)), o_.bits);
        const float m = level(lo, hi, j, levels);
        sp[ch.begin + rp[i]] = negative ? -m : m;
      }
    }
  }
  writer.flush();
  return payload;
}

void SparseChunks::decode_add(const torch::Tensor& payload, torch::Tensor& out) const {
  const int64_t numel = out.numel(), chunks = num_chunks(o_, numel);
  TRIB_CHECK_EQ(payload.numel(), payload_bytes(numel), "(payload bytes for the values)");
  TRIB_CHECK(out.scalar_type() == torch::kFloat32 && out.is_contiguous(), "(a flat fp32 vector)");
  const uint8_t* header = payload.data_ptr<uint8_t>();
  BitReader reader(header + 8 * chunks);
  float* op = out.data_ptr<float>();
  const int64_t levels = int64_t{1} << (o_.bits - 1);
  for (int64_t c = 0; c < chunks; ++c) {
    const Chunk ch = chunk_at(o_, numel, c);
    float lo, hi;
    std::memcpy(&lo, header + 8 * c, 4);
    std::memcpy(&hi, header + 8 * c + 4, 4);
    for (int64_t i = 0; i < ch.kept; ++i) {
      const auto index = static_cast<int64_t>(reader.get(ch.index_bits));
      const uint64_t code = reader.get(o_.bits);
      TRIB_CHECK(index < ch.length, "(an index outside its chunk: a corrupt payload)");
      const float m = level(lo, hi, static_cast<int64_t>(code & uint64_t(levels - 1)), levels);
      op[ch.begin + index] += (code >> (o_.bits - 1)) ? -m : m;
    }
  }
}

}  // namespace tributary::comm
