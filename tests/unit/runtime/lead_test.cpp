// The lead of a run whose members change (runtime/ft/lead.h): the first member, taken over once, never taken back.
#include "tributary/runtime/ft/lead.h"

#include <gtest/gtest.h>

using tributary::Lead;

TEST(Lead, TheFirstMemberLeadsAndATakeOverIsSaidOnce) {
  Lead zero(0, true), one(1, false), two(2, false);
  EXPECT_FALSE(zero.follow({0, 1, 2}));
  EXPECT_TRUE(zero.is());
  EXPECT_TRUE(one.follow({1, 2}));  // worker 0 died
  EXPECT_TRUE(one.is());
  EXPECT_FALSE(one.follow({1, 2}));  // still leading: not a new take-over
  EXPECT_FALSE(two.follow({1, 2}));
  EXPECT_FALSE(two.is());
}

TEST(Lead, ARejoinedWorkerZeroDoesNotTakeTheLeadBack) {
  Lead zero(0, false), one(1, true);  // worker 0 restarted and joined: joiners come after the members
  EXPECT_FALSE(zero.follow({1, 2, 0}));
  EXPECT_FALSE(zero.is());
  EXPECT_FALSE(one.follow({1, 2, 0}));
  EXPECT_TRUE(one.is());
}
