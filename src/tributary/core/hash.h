// Content hashes (xxHash64): shard and checkpoint checksums, document ids for the train/validation split.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tributary {

uint64_t hash64(const void* data, size_t size, uint64_t seed = 0);
inline uint64_t hash64(std::string_view s, uint64_t seed = 0) { return hash64(s.data(), s.size(), seed); }
std::string hex64(uint64_t value);

// Streaming hash for data that does not fit in one buffer.
class Hasher {
 public:
  explicit Hasher(uint64_t seed = 0);
  ~Hasher();
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;
  void update(const void* data, size_t size);
  uint64_t digest() const;

 private:
  void* state_;
};

}  // namespace tributary
