// A fixed stream of token ids for tests that need a loader but no corpus: a 64-bit LCG (Knuth's MMIX constants), its
// top 5 bits mod the vocabulary. Deterministic for (n, vocab, seed).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace test_support {

inline std::shared_ptr<const std::vector<uint32_t>> lcg_tokens(size_t n, uint32_t vocab, uint64_t seed) {
  std::vector<uint32_t> v(n);
  uint64_t x = seed;
  for (auto& id : v)
    id = static_cast<uint32_t>((x = x * 6364136223846793005ULL + 1442695040888963407ULL) >> 59) % vocab;
  return std::make_shared<const std::vector<uint32_t>>(std::move(v));
}

}  // namespace test_support
