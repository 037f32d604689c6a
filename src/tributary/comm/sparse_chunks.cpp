#include "tributary/comm/sparse_chunks.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "tributary/core/error.h"

namespace tributary::comm {
namespace {

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

// A chunk's kept positions travel as buckets of 2^offset_bits values, about length / kept each (so about one kept
// value per bucket): every bucket's count in unary (kept ones and one zero per bucket), then each kept value's offset
// inside its bucket. log2(length / kept) + 2 bits per position where a plain index costs log2(length): 8 against 12 at
// 64 of 4096. The size does not depend on where the values are, so every replica's payload has the same length.
struct Chunk {
  int64_t begin, length, kept, buckets;
  int offset_bits;
  int64_t bits(int code_bits) const { return kept + buckets + kept * (offset_bits + code_bits); }
};

Chunk chunk_at(const SparseChunkOptions& o, int64_t numel, int64_t c) {
  const int64_t begin = c * o.chunk, length = std::min(o.chunk, numel - begin), kept = std::min(o.k, length);
  const int offset_bits = std::bit_width(uint64_t(length / kept)) - 1;  // floor(log2), length >= kept
  return {begin, length, kept, (length + (int64_t{1} << offset_bits) - 1) >> offset_bits, offset_bits};
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
    bits = (chunks - 1) * full.bits(o_.bits) + last.bits(o_.bits);
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
      std::vector<int64_t> kept(ip + row * idx.size(1), ip + row * idx.size(1) + ch.kept);
      std::sort(kept.begin(), kept.end());  // positions in order: bucket by bucket
      float lo = INFINITY, hi = 0;
      for (const int64_t i : kept) {
        const float m = std::fabs(xp[ch.begin + i]);
        lo = std::min(lo, m);
        hi = std::max(hi, m);
      }
      std::memcpy(header + 8 * c, &lo, 4);
      std::memcpy(header + 8 * c + 4, &hi, 4);
      for (size_t i = 0, b = 0; b < size_t(ch.buckets); ++b) {
        for (; i < kept.size() && size_t(kept[i] >> ch.offset_bits) == b; ++i) writer.put(1, 1);
        writer.put(0, 1);
      }
      const uint64_t offset_mask = (uint64_t{1} << ch.offset_bits) - 1;
      for (const int64_t i : kept) {
        const float v = xp[ch.begin + i];
        const float span = hi - lo;
        const int64_t j =
            span > 0 ? std::clamp<int64_t>(std::lround((std::fabs(v) - lo) / span * float(levels - 1)), 0, levels - 1)
                     : levels - 1;
        const bool negative = std::signbit(v);
        writer.put(static_cast<uint64_t>(i) & offset_mask, ch.offset_bits);
        writer.put(static_cast<uint64_t>(j) | (uint64_t{negative} << (o_.bits - 1)), o_.bits);
        const float m = level(lo, hi, j, levels);
        sp[ch.begin + i] = negative ? -m : m;
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
    std::vector<int64_t> bucket_of;  // the bucket of each kept value, in order
    bucket_of.reserve(size_t(ch.kept));
    for (int64_t b = 0; b < ch.buckets; ++b)
      while (reader.get(1) == 1) {
        if (int64_t(bucket_of.size()) == ch.kept)
          fail(
              "a sparse payload names more than {} positions in chunk {}: it is corrupt or encoded with other "
              "dist.sparse_* settings",
              ch.kept, c);
        bucket_of.push_back(b);
      }
    if (int64_t(bucket_of.size()) != ch.kept)
      fail(
          "a sparse payload names {} positions in chunk {} where it keeps {}: it is corrupt or encoded with other "
          "dist.sparse_* settings",
          bucket_of.size(), c, ch.kept);
    for (const int64_t b : bucket_of) {
      const auto index = (b << ch.offset_bits) + static_cast<int64_t>(reader.get(ch.offset_bits));
      const uint64_t code = reader.get(o_.bits);
      if (index >= ch.length)
        fail("a sparse payload names position {} in chunk {} of {} values: it is corrupt", index, c, ch.length);
      const float m = level(lo, hi, static_cast<int64_t>(code & uint64_t(levels - 1)), levels);
      op[ch.begin + index] += (code >> (o_.bits - 1)) ? -m : m;
    }
  }
}

}  // namespace tributary::comm
