// Small deterministic RNG (SplitMix64) for data order and routing: its whole state is one integer, so it goes into a
// checkpoint as a number and resumes bit for bit. Torch's generator is used only for tensor initialisation/sampling.
#pragma once

#include <cstdint>
#include <vector>

namespace tributary {

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n) (n > 0), without modulo bias worth caring about for n << 2^64.
  uint64_t below(uint64_t n) { return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64); }
  uint64_t state() const { return state_; }

 private:
  uint64_t state_;
};

// Fisher-Yates permutation of 0..n-1, fully determined by seed.
std::vector<uint64_t> permutation(uint64_t n, uint64_t seed);

}  // namespace tributary
