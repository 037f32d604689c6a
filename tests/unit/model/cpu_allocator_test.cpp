// The CPU tensor cache (model/cpu_allocator.h): a freed large block is handed to the next tensor of its size, small
// ones are not cached, and the idle bytes never exceed the cap. Installing it here leaves it installed for the tests
// that run after this one in the same process, which exercises it further.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "tributary/model/cpu_allocator.h"

using namespace tributary;

namespace {
constexpr int64_t kMiB = int64_t(1) << 20;
torch::Tensor floats(int64_t bytes) { return torch::empty({bytes / 4}); }
}  // namespace

TEST(CpuAllocator, ReusesAFreedBlockOfTheSameSizeAndKeepsTheCap) {
  ASSERT_TRUE(install_cpu_caching_allocator(64 * kMiB));
  release_cpu_cache();
  const auto before = cpu_cache_stats();
  ASSERT_EQ(before.cap_bytes, size_t(64 * kMiB));

  void* first;
  {
    auto t = floats(kMiB);
    first = t.data_ptr();
  }
  EXPECT_EQ(cpu_cache_stats().cached_bytes, size_t(kMiB));
  {
    auto t = floats(kMiB).fill_(2.0f);
    EXPECT_EQ(t.data_ptr(), first) << "a freed 1 MiB block is handed to the next 1 MiB tensor";
    EXPECT_EQ(t.sum().item<float>(), 2.0f * float(kMiB / 4));
  }
  EXPECT_EQ(cpu_cache_stats().hits, before.hits + 1);

  {
    auto small = floats(1024);  // below kMinCachedBytes: straight to the C allocator
    small.fill_(1.0f);
  }
  EXPECT_EQ(cpu_cache_stats().cached_bytes, size_t(kMiB));

  {  // three 30 MiB blocks freed against a 64 MiB cap: the third evicts others to fit
    auto a = floats(30 * kMiB), b = floats(30 * kMiB), c = floats(30 * kMiB);
  }
  auto after = cpu_cache_stats();
  EXPECT_LE(after.cached_bytes, after.cap_bytes);
  EXPECT_EQ(after.cached_bytes, size_t(60 * kMiB)) << "the small 1 MiB block went first, then one 30 MiB block";

  { auto huge = floats(100 * kMiB); }  // larger than the cap: freed, not cached
  EXPECT_EQ(cpu_cache_stats().cached_bytes, size_t(60 * kMiB));

  release_cpu_cache();
  EXPECT_EQ(cpu_cache_stats().cached_bytes, 0u);
}

TEST(CpuAllocator, TensorsComputeTheSameThroughTheCache) {
  ASSERT_TRUE(install_cpu_caching_allocator(64 * kMiB));
  torch::manual_seed(3);
  auto a = torch::randn({300, 200}), b = torch::randn({200, 100});
  auto want = torch::matmul(a.to(torch::kFloat64), b.to(torch::kFloat64));
  const int64_t hits = cpu_cache_stats().hits;
  for (int i = 0; i < 3; ++i) {  // the second and third products reuse the first one's freed blocks
    auto got = torch::matmul(a, b).to(torch::kFloat64);
    EXPECT_TRUE(torch::allclose(got, want, 1e-4, 1e-4));
  }
  EXPECT_GE(cpu_cache_stats().hits, hits + 2);
}

TEST(CpuAllocator, OutOfMemoryReleasesTheCacheAndSaysHowMuchWasAsked) {
  ASSERT_TRUE(install_cpu_caching_allocator(64 * kMiB));
  { auto t = floats(2 * kMiB); }
  ASSERT_GE(cpu_cache_stats().cached_bytes, size_t(2 * kMiB));
  try {
    auto t = torch::empty({int64_t(1) << 50});  // 4 PiB: more than any address space holds
    FAIL() << "a 4 PiB tensor was allocated";
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    EXPECT_NE(msg.find("CPU out of memory"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(int64_t(4) << 50)), std::string::npos) << "names the bytes asked: " << msg;
  }
  EXPECT_EQ(cpu_cache_stats().cached_bytes, 0u) << "the idle blocks went back before giving up";
}
