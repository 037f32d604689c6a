#include "tributary/model/cpu_allocator.h"

#include <c10/core/CPUAllocator.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "tributary/core/error.h"

namespace tributary {

namespace {

// Every block carries its size in a header of one alignment unit before the data, so the deleter (which LibTorch
// calls with the data pointer only) knows whether the block is cacheable and in which bucket it belongs.
constexpr size_t kAlignment = 64;

class CachingCpuAllocator final : public c10::Allocator {
 public:
  explicit CachingCpuAllocator(size_t cap) { stats_.cap_bytes = cap; }

  c10::DataPtr allocate(size_t n) override { return allocate_block(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  CpuCacheStats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  void clear() const {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [size, blocks] : idle_)
      for (void* base : blocks) std::free(base);
    idle_.clear();
    stats_.cached_bytes = 0;
  }

  static CachingCpuAllocator* instance;

 private:
  c10::DataPtr allocate_block(size_t n) const {
    if (n == 0) return {nullptr, nullptr, &release, c10::Device(c10::DeviceType::CPU)};
    void* base = n >= kMinCachedBytes ? take(n) : nullptr;
    if (!base) {
      base = fresh(n);
      std::memcpy(base, &n, sizeof n);
    }
    void* data = static_cast<char*>(base) + kAlignment;
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }

  // A block from the C allocator; when that fails, the idle blocks go back to it and it is asked once more (as the
  // CUDA caching allocator frees its cache before reporting out of memory).
  void* fresh(size_t n) const {
    void* base = nullptr;
    const bool too_big = n > SIZE_MAX - kAlignment;
    if (!too_big && posix_memalign(&base, kAlignment, n + kAlignment) == 0) return base;
    const size_t idle = stats().cached_bytes;
    clear();
    if (!too_big && posix_memalign(&base, kAlignment, n + kAlignment) == 0) return base;
    TORCH_CHECK(false, "CPU out of memory: could not allocate ", n, " bytes for a tensor (", idle,
                " bytes of idle cached blocks were released first). Use a smaller batch or model, or fewer workers "
                "per machine.");
  }

  void* take(size_t n) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = idle_.find(n);
    if (it == idle_.end()) {
      stats_.misses += 1;
      return nullptr;
    }
    void* base = it->second.back();
    it->second.pop_back();
    if (it->second.empty()) idle_.erase(it);  // no empty buckets: keep() evicts from the first one
    stats_.cached_bytes -= n;
    stats_.hits += 1;
    return base;
  }

  static void release(void* data) {
    if (!data) return;
    void* base = static_cast<char*>(data) - kAlignment;
    size_t n;
    std::memcpy(&n, base, sizeof n);
    if (n < kMinCachedBytes || !instance->keep(base, n)) std::free(base);
  }

  // Caches a freed block unless it alone exceeds the cap; evicts the smallest idle blocks to make room.
  bool keep(void* base, size_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    if (n > stats_.cap_bytes) return false;
    while (stats_.cached_bytes + n > stats_.cap_bytes) {  // n <= cap: some block is idle while this holds
      auto smallest = idle_.begin();
      std::free(smallest->second.back());
      smallest->second.pop_back();
      stats_.cached_bytes -= smallest->first;
      if (smallest->second.empty()) idle_.erase(smallest);
    }
    idle_[n].push_back(base);
    stats_.cached_bytes += n;
    return true;
  }

  mutable std::mutex mu_;
  // By exact size, never an empty bucket: a step reuses the sizes it freed.
  mutable std::map<size_t, std::vector<void*>> idle_;
  mutable CpuCacheStats stats_;
};

CachingCpuAllocator* CachingCpuAllocator::instance = nullptr;

int64_t cap_from_environment() {
  const char* mb = std::getenv("TRIBUTARY_CPU_CACHE_MB");
  if (!mb || !*mb) return int64_t(2) << 30;
  char* end = nullptr;
  const long long v = std::strtoll(mb, &end, 10);
  if (*end != '\0' || v < 0 || v > (int64_t(1) << 30))
    fail("TRIBUTARY_CPU_CACHE_MB='{}' is not a size in MiB (0 turns the CPU tensor cache off)", mb);
  return int64_t(v) << 20;
}

}  // namespace

bool install_cpu_caching_allocator(int64_t cap_bytes) {
  static std::once_flag once;
  static bool installed = false;
  std::call_once(once, [&] {
    const int64_t cap = cap_bytes >= 0 ? cap_bytes : cap_from_environment();
    if (cap == 0) return;
    // Never destroyed: tensors may outlive main's locals and free into it during static destruction.
    CachingCpuAllocator::instance = new CachingCpuAllocator(size_t(cap));
    c10::SetCPUAllocator(CachingCpuAllocator::instance, /*priority=*/1);
    installed = true;
  });
  return installed;
}

CpuCacheStats cpu_cache_stats() {
  return CachingCpuAllocator::instance ? CachingCpuAllocator::instance->stats() : CpuCacheStats{};
}

void release_cpu_cache() {
  if (CachingCpuAllocator::instance) CachingCpuAllocator::instance->clear();
}

}  // namespace tributary
