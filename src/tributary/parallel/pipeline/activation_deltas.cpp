#include "tributary/parallel/pipeline/activation_deltas.h"

#include <unordered_set>

#include "tributary/core/error.h"

namespace tributary::pipeline {

uint64_t example_key(const int64_t* ids, int64_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int64_t i = 0; i < n; ++i) {
    auto v = static_cast<uint64_t>(ids[i]);
    for (int b = 0; b < 8; ++b, v >>= 8) {
      h ^= v & 0xff;
      h *= 0x100000001b3ull;
    }
  }
  return h;
}

ActivationDeltas::ActivationDeltas(Wire delta, int64_t capacity_bytes)
    : delta_(delta), capacity_bytes_(capacity_bytes) {
  TRIB_CHECK(delta == Wire::Hadamard4 || delta == Wire::Hadamard2, "(a delta travels at 4 or 2 bits)");
}

std::vector<ActivationDeltas::Kind> ActivationDeltas::plan(const std::vector<uint64_t>& keys, int64_t row_bytes) const {
  std::vector<Kind> kinds;
  kinds.reserve(keys.size());
  std::unordered_set<uint64_t> added;
  int64_t bytes = cached_bytes_;
  for (const uint64_t k : keys) {
    if (cache_.count(k) || added.count(k)) {
      kinds.push_back(Kind::delta);
    } else if (bytes + row_bytes <= capacity_bytes_) {
      kinds.push_back(Kind::fresh_cached);
      added.insert(k);
      bytes += row_bytes;
    } else {
      kinds.push_back(Kind::fresh);
    }
  }
  return kinds;
}

int64_t ActivationDeltas::row_message_bytes(Kind kind, int64_t tokens, int64_t width) const {
  return kind == Kind::delta ? wire_bytes(delta_, tokens, width) : wire_bytes(Wire::Int8, tokens, width);
}

int64_t ActivationDeltas::message_bytes(const std::vector<uint64_t>& keys, int64_t tokens, int64_t width) const {
  int64_t bytes = 0;
  for (const Kind kind : plan(keys, tokens * width * 4)) bytes += row_message_bytes(kind, tokens, width);
  return bytes;
}

torch::Tensor ActivationDeltas::absorb(Kind kind, uint64_t key, const torch::Tensor& bytes, int64_t tokens,
                                       int64_t width) {
  if (kind == Kind::delta) {
    ++delta_rows_;
    return cache_.at(key).add_(wire_decode(bytes, delta_, {tokens, width}));
  }
  ++fresh_rows_;
  auto row = wire_decode(bytes, Wire::Int8, {tokens, width});
  if (kind == Kind::fresh_cached) {
    cache_[key] = row.clone();
    cached_bytes_ += tokens * width * 4;
  }
  return row;
}

torch::Tensor ActivationDeltas::encode(const torch::Tensor& x, const std::vector<uint64_t>& keys) {
  torch::NoGradGuard no_grad;
  auto cpu = x.detach().to(torch::kCPU, torch::kFloat32).contiguous();
  TRIB_CHECK(cpu.dim() == 3 && cpu.size(0) == int64_t(keys.size()), "(one key per row of [rows, tokens, width])");
  const int64_t tokens = cpu.size(1), width = cpu.size(2);
  const auto kinds = plan(keys, tokens * width * 4);
  std::vector<torch::Tensor> parts;
  for (size_t i = 0; i < keys.size(); ++i) {
    const auto row = cpu[int64_t(i)];
    parts.push_back(kinds[i] == Kind::delta ? wire_encode(row - cache_.at(keys[i]), delta_)
                                            : wire_encode(row, Wire::Int8));
    absorb(kinds[i], keys[i], parts.back(), tokens, width);  // the sender caches what the receiver will
  }
  return torch::cat(parts);
}

torch::Tensor ActivationDeltas::decode(const torch::Tensor& message, const std::vector<uint64_t>& keys, int64_t tokens,
                                       int64_t width) {
  const int64_t expected = message_bytes(keys, tokens, width);
  if (message.numel() != expected)
    fail(
        "an activation message of {} bytes where its {} examples need {}: the neighbouring stage's cache "
        "(parallel.activation_cache_mb) or format differs from this one's",
        message.numel(), keys.size(), expected);
  const auto kinds = plan(keys, tokens * width * 4);
  auto out = torch::empty({int64_t(keys.size()), tokens, width}, torch::kFloat32);
  int64_t offset = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    const int64_t n = row_message_bytes(kinds[i], tokens, width);
    out[int64_t(i)].copy_(absorb(kinds[i], keys[i], message.narrow(0, offset, n).contiguous(), tokens, width));
    offset += n;
  }
  return out;
}

}  // namespace tributary::pipeline
