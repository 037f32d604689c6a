// next_boundary: processes that share an epoch end their periods together however late each started or ran over.
#include <gtest/gtest.h>

#include "tributary/core/clock.h"

using namespace tributary;

TEST(NextBoundary, ProcessesThatShareAnEpochEndTheirPeriodsAtTheSameInstants) {
  const double epoch = 1000, period = 6;
  EXPECT_DOUBLE_EQ(next_boundary(epoch, 1000, period), 1006) << "a period starting on the epoch is a whole one";
  EXPECT_DOUBLE_EQ(next_boundary(epoch, 1002.5, period), 1006) << "one that started late ends with the others";
  EXPECT_DOUBLE_EQ(next_boundary(epoch, 1006, period), 1012) << "the boundary itself starts the next period";
  EXPECT_DOUBLE_EQ(next_boundary(epoch, 1013.9, period), 1018)
      << "a period that ran past a boundary (a slow step, an evaluation) ends at the next one, not 6 s later";
  EXPECT_DOUBLE_EQ(next_boundary(epoch, 999.5, period), 1000) << "a clock slightly behind the epoch's writer";
}
