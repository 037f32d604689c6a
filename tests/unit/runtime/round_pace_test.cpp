// When an asynchronous replica ends a round (runtime/sync/round_pace.h): by steps, or at the wall-clock boundaries
// every member shares.
#include <gtest/gtest.h>

#include "tributary/runtime/sync/round_pace.h"

using namespace tributary;

TEST(RoundPace, ByStepsARoundEndsEveryInnerStepsAndAnEarlyTakeStartsANewOne) {
  RoundPace pace(3, 0);
  EXPECT_FALSE(pace.time_paced());
  EXPECT_FALSE(pace.step(0));
  EXPECT_FALSE(pace.step(0));
  EXPECT_TRUE(pace.step(0));
  EXPECT_EQ(pace.take(), 3);
  EXPECT_FALSE(pace.step(0));
  EXPECT_EQ(pace.take(), 1) << "a read posts the round so far";
  EXPECT_FALSE(pace.step(0));
  EXPECT_FALSE(pace.step(0));
  EXPECT_TRUE(pace.step(0)) << "the next round is a whole one";
  EXPECT_EQ(pace.describe(), "3 steps");
}

TEST(RoundPace, TimePacedRoundsEndAtTheSharedBoundariesWhateverEachMembersSpeedOrLateStart) {
  // Epoch 100, rounds of 6 s: boundaries at 106, 112, 118, ... A member that starts late (at 104.5) and steps every
  // 1.1 s, and one that starts on time and steps every 2.5 s, both end rounds at the first step past each boundary.
  RoundPace fast(10, 6), slow(10, 6);
  fast.start(100, 104.5);
  slow.start(100, 100.2);
  std::vector<int> fast_ends, slow_ends;
  for (double t = 104.5 + 1.1; t < 128; t += 1.1)
    if (fast.step(t)) fast_ends.push_back(int((t - 100) / 6));
  for (double t = 100.2 + 2.5; t < 128; t += 2.5)
    if (slow.step(t)) slow_ends.push_back(int((t - 100) / 6));
  EXPECT_EQ(fast_ends, (std::vector<int>{1, 2, 3, 4})) << "one round end per boundary passed";
  EXPECT_EQ(slow_ends, (std::vector<int>{1, 2, 3, 4}));
  // A step that runs over two boundaries ends one round, and the next ends at the boundary after it.
  RoundPace late(10, 6);
  late.start(100, 100);
  EXPECT_TRUE(late.step(119));
  EXPECT_FALSE(late.step(123.9));
  EXPECT_TRUE(late.step(124));
  EXPECT_EQ(late.describe(), "6 s of training (time-paced rounds)");
}
