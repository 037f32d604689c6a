// SparseLoCo's wire format for pseudo-gradients (arXiv 2508.15706; shared/reference/diloco-dipaco.md): the flat
// vector is cut into chunks of `chunk` values; of each chunk only the k largest magnitudes travel, each as its
// position and a `bits`-bit code (sign + (bits - 1)-bit magnitude on a uniform grid between the chunk's smallest and
// largest kept magnitude, two fp32 per chunk). Positions travel bucketed (sparse_chunks.cpp): log2(chunk / k) + 2
// bits each instead of a log2(chunk)-bit index.
// At 4096 / 64 / 2 bits: 64 x (8 + 2) bits + 64 bits per 4096 values = 0.17 bit per value, 186x below fp32.
// Error feedback (what was not sent, kept by the sender and decayed) lives in Exchange, which owns the rounds.
// Decoding is plain arithmetic on the payload's bytes, so every replica decodes a payload to the same floats.
//
// Payload layout (little-endian, exactly payload_bytes(numel) bytes): per chunk (lo, hi) as fp32; then one
// bitstream, LSB first, per chunk in order: each bucket's count of kept values in unary (ones, then a zero), then
// each kept value's (offset in its bucket, code) in position order.
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace tributary::comm {

struct SparseChunkOptions {
  int64_t chunk = 4096;  // values per chunk (SparseLoCo: a 64 x 64 tile; here a run of the flat bucket)
  int64_t k = 64;        // values kept per chunk (a shorter last chunk keeps min(k, its length))
  int bits = 2;          // bits per kept value, 2-8: sign + (bits - 1) magnitude bits
};

class SparseChunks {
 public:
  explicit SparseChunks(SparseChunkOptions options);  // Error naming the bad value
  const SparseChunkOptions& options() const { return o_; }

  int64_t payload_bytes(int64_t numel) const;
  // x: fp32, 1-D, contiguous, CPU. Returns the payload and writes into `sent` (zeroed, x's shape) the values a
  // replica decodes from it, so the sender can keep x - sent as its error feedback.
  torch::Tensor encode(const torch::Tensor& x, torch::Tensor& sent) const;
  // Adds the values decoded from `payload` (encode's, for `out.numel()` values) into `out`.
  void decode_add(const torch::Tensor& payload, torch::Tensor& out) const;

 private:
  SparseChunkOptions o_;
};

}  // namespace tributary::comm
