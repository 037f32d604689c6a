#include <gtest/gtest.h>

#include <numeric>
#include <set>

#include "tributary/core/error.h"
#include "tributary/data/loader.h"

using namespace tributary;

namespace {
std::shared_ptr<const std::vector<uint32_t>> ramp(size_t n) {
  auto v = std::make_shared<std::vector<uint32_t>>(n);
  std::iota(v->begin(), v->end(), 0);
  return v;
}
}  // namespace

TEST(BatchLoader, WindowsAreContiguousAndCoverAnEpoch) {
  BatchLoader loader(ramp(1000), {.batch_size = 3, .context = 8, .seed = 5}, "test");
  EXPECT_EQ(loader.num_windows(), 124);  // (1000 - 1) / 8
  std::set<int64_t> starts;
  std::vector<int64_t> batch(3 * 9);
  for (int step = 0; step < 41; ++step) {  // 41 * 3 = 123 windows
    loader.next(batch.data());
    for (int b = 0; b < 3; ++b) {
      EXPECT_EQ(batch[b * 9] % 8, 0);
      for (int t = 1; t < 9; ++t) EXPECT_EQ(batch[b * 9 + t], batch[b * 9] + t) << "targets are inputs shifted by one";
      starts.insert(batch[b * 9]);
    }
  }
  EXPECT_EQ(starts.size(), 123u) << "no window repeats within an epoch";
}

TEST(BatchLoader, SeedFixesOrderAndPositionResumes) {
  auto tokens = ramp(5000);
  LoaderOptions o{.batch_size = 4, .context = 16, .seed = 9};
  BatchLoader a(tokens, o, "t"), b(tokens, o, "t");
  std::vector<int64_t> x(4 * 17), y(4 * 17);
  for (int i = 0; i < 200; ++i) {  // crosses epoch boundaries
    a.next(x.data());
    b.next(y.data());
    EXPECT_EQ(x, y);
  }
  BatchLoader c(tokens, o, "t");
  c.set_position(a.position());
  for (int i = 0; i < 50; ++i) {
    a.next(x.data());
    c.next(y.data());
    ASSERT_EQ(x, y) << "resumed loader diverged at batch " << i;
  }
  BatchLoader d(tokens, {.batch_size = 4, .context = 16, .seed = 10}, "t");
  a.set_position({0, 0});
  a.next(x.data());
  d.next(y.data());
  EXPECT_NE(x, y) << "another seed gives another order";
}

TEST(BatchLoader, ReplicasTakeDisjointWindows) {
  auto tokens = ramp(4000);
  std::set<int64_t> seen;
  for (int64_t rank = 0; rank < 2; ++rank) {
    BatchLoader l(tokens, {.batch_size = 2, .context = 10, .seed = 1, .rank = rank, .world_size = 2}, "t");
    std::vector<int64_t> x(2 * 11);
    for (int i = 0; i < 50; ++i) {
      l.next(x.data());
      for (int b = 0; b < 2; ++b) EXPECT_TRUE(seen.insert(x[b * 11]).second);
    }
  }
}

TEST(BatchLoader, TooLittleDataIsAClearError) {
  try {
    BatchLoader(ramp(100), {.batch_size = 8, .context = 32}, "'data/x' val");
    FAIL();
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("'data/x' val"), std::string::npos) << msg;
    EXPECT_NE(msg.find("batch"), std::string::npos) << msg;
  }
}
