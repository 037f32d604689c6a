#include <gtest/gtest.h>

#include "tributary/optim/schedule.h"

using namespace tributary;

TEST(CosineSchedule, WarmupPeakAndFloor) {
  CosineSchedule s{1.0, 10, 110, 0.1};
  EXPECT_DOUBLE_EQ(s.lr(0), 0.1);
  EXPECT_DOUBLE_EQ(s.lr(9), 1.0);
  EXPECT_DOUBLE_EQ(s.lr(10), 1.0);
  EXPECT_NEAR(s.lr(60), 0.55, 1e-12);  // halfway through the decay
  EXPECT_NEAR(s.lr(110), 0.1, 1e-12);
  for (int64_t i = 10; i < 110; ++i) EXPECT_GE(s.lr(i), s.lr(i + 1));
}
