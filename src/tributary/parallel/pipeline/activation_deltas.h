// AQ-SGD's activation compression (Wang, Yuan, ... Zhang, NeurIPS 2022): across one stage boundary both neighbours
// keep, per example (a window of token ids, which both know: every stage of a pipeline reads the same batch), the
// activation as it was last decoded. An example seen before travels as its change since then, at the delta wire's 4
// or 2 bits after the tile-wise Hadamard rotation (wire.h); as the model moves slowly between two visits, the change
// is small and so is its rounding error. An example seen for the first time travels as int8 (a scale per token).
// Sender and receiver run the same decoding on the same bytes, so their caches hold the same values.
//
// The cache is bounded (parallel.activation_cache_mb): once full, new examples are not cached and keep travelling as
// int8, which both ends decide alike without a word. It lives in memory; a restarted stage starts it empty, as does
// its neighbour's run of the same step (a pipeline restarts whole).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "tributary/parallel/pipeline/wire.h"

namespace tributary::pipeline {

// An example's key: a 64-bit hash (FNV-1a) of its window's `n` token ids.
uint64_t example_key(const int64_t* ids, int64_t n);

class ActivationDeltas {
 public:
  // `delta`: Hadamard4 or Hadamard2; `capacity_bytes`: the most the cached activations (fp32) may hold.
  ActivationDeltas(Wire delta, int64_t capacity_bytes);

  // The bytes of the message that carries rows with these keys, each of `tokens` x `width` values.
  int64_t message_bytes(const std::vector<uint64_t>& keys, int64_t tokens, int64_t width) const;
  // x: [rows, tokens, width], one row per key. Returns the message (uint8) and caches what the receiver decodes.
  torch::Tensor encode(const torch::Tensor& x, const std::vector<uint64_t>& keys);
  // The [rows, tokens, width] fp32 activations a message holds; caches them. Error if its size is not the keys'.
  torch::Tensor decode(const torch::Tensor& message, const std::vector<uint64_t>& keys, int64_t tokens, int64_t width);

  int64_t cached_bytes() const { return cached_bytes_; }
  int64_t entries() const { return int64_t(cache_.size()); }
  int64_t fresh_rows() const { return fresh_rows_; }  // rows sent or received as int8
  int64_t delta_rows() const { return delta_rows_; }  // as a change against the cache

 private:
  enum class Kind : char { fresh, fresh_cached, delta };
  // Each row's kind, in order: a key cached before it is a delta, a new one is cached while there is room (a key twice
  // in one message: the second is a delta against the first).
  std::vector<Kind> plan(const std::vector<uint64_t>& keys, int64_t row_bytes) const;
  int64_t row_message_bytes(Kind kind, int64_t tokens, int64_t width) const;
  // One row's bytes as the receiver reads them: the activation they decode to, cached as the plan says. The sender
  // calls it on what it sends, so both caches come from the same arithmetic on the same bytes.
  torch::Tensor absorb(Kind kind, uint64_t key, const torch::Tensor& bytes, int64_t tokens, int64_t width);

  Wire delta_;
  int64_t capacity_bytes_;
  std::unordered_map<uint64_t, torch::Tensor> cache_;  // [tokens, width] fp32
  int64_t cached_bytes_ = 0;
  int64_t fresh_rows_ = 0, delta_rows_ = 0;
};

}  // namespace tributary::pipeline
