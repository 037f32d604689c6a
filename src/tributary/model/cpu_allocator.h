// A caching allocator for CPU tensors: large blocks freed by one step are handed to the next instead of going back to
// the kernel.
//
// Why: LibTorch's CPU allocator is malloc, and glibc serves blocks above its mmap threshold with fresh mappings that
// the kernel faults in and zeroes page by page on first touch, every step: the 6-layer benchmark model took ~560,000
// page faults in 12 steps, ~5% of its step time (GLIBC_TUNABLES=glibc.malloc.hugetlb=1, 12x fewer faults, ran
// 5% faster; docs/benchmarks.md §1). A training step allocates the same sizes every time, so reusing exact sizes
// hits nearly always; it is the CUDA caching allocator's idea on the host.
//
// Contract: install once, early in main (tensors allocated before keep their own deleter and are freed by it).
// Blocks of at least kMinCachedBytes are cached by exact size; smaller ones go straight to the C allocator. The
// cache holds at most `cap_bytes` (a freed block that would overflow it evicts others, smallest first, or is freed
// if it alone is larger), so idle memory is bounded whatever shapes a program allocates. Memory from the cache is
// uninitialized, as torch::empty promises. Thread-safe. TRIBUTARY_CPU_CACHE_MB sets the cap (0 turns caching off).
#pragma once

#include <cstddef>
#include <cstdint>

namespace tributary {

inline constexpr size_t kMinCachedBytes = 64 * 1024;

struct CpuCacheStats {
  int64_t hits = 0, misses = 0;  // allocations of cacheable size served from the cache / from the C allocator
  size_t cached_bytes = 0;       // held idle now
  size_t cap_bytes = 0;
};

// Makes the caching allocator LibTorch's CPU allocator (idempotent; the first call's cap wins). cap_bytes < 0: the
// cap from TRIBUTARY_CPU_CACHE_MB, else 2 GiB. Returns false when caching is off (cap 0) and nothing was installed.
bool install_cpu_caching_allocator(int64_t cap_bytes = -1);

CpuCacheStats cpu_cache_stats();

// Frees every idle cached block (tests start from an empty cache with it; an allocation that fails does it too).
void release_cpu_cache();

}  // namespace tributary
