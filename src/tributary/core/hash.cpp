#include "tributary/core/hash.h"

#include <fmt/format.h>
#include <xxhash.h>

namespace tributary {

uint64_t hash64(const void* data, size_t size, uint64_t seed) { return XXH64(data, size, seed); }

std::string hex64(uint64_t value) { return fmt::format("{:016x}", value); }

Hasher::Hasher(uint64_t seed) : state_(XXH64_createState()) { XXH64_reset(static_cast<XXH64_state_t*>(state_), seed); }
Hasher::~Hasher() { XXH64_freeState(static_cast<XXH64_state_t*>(state_)); }
void Hasher::update(const void* data, size_t size) { XXH64_update(static_cast<XXH64_state_t*>(state_), data, size); }
uint64_t Hasher::digest() const { return XXH64_digest(static_cast<XXH64_state_t*>(state_)); }

}  // namespace tributary
