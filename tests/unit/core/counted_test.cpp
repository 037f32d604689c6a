// counted: the noun follows the count ("1 level", "2 levels", "0 documents").
#include <gtest/gtest.h>

#include "tributary/core/counted.h"

using namespace tributary;

TEST(Counted, TheNounFollowsTheCount) {
  EXPECT_EQ(counted(1, "level"), "1 level");
  EXPECT_EQ(counted(2, "level"), "2 levels");
  EXPECT_EQ(counted(0, "document"), "0 documents");
}
