#include <gtest/gtest.h>

#include "tributary/optim/round_length.h"

using namespace tributary;

TEST(RoundLength, TheRampLengthensRoundsInProportionToTheRunSoFar) {
  RoundLength r(50, 100, 0);
  EXPECT_EQ(r.of_round(0), 1);
  EXPECT_EQ(r.of_round(1), 1);  // never shorter than one step
  EXPECT_EQ(r.of_round(10), 5);
  EXPECT_EQ(r.of_round(50), 25);
  EXPECT_EQ(r.of_round(99), 50);
  EXPECT_EQ(r.of_round(100), 50);
  EXPECT_EQ(r.of_round(5000), 50);
  EXPECT_EQ(RoundLength(50, 0, 0).of_round(0), 50);  // no ramp
}

TEST(RoundLength, QsrRaisesHAsTheLearningRateDecaysAndKeepsItAtZero) {
  RoundLength r(4, 0, 0.004);
  r.observe_lr(2e-3);
  EXPECT_EQ(r.of_round(0), 4);
  r.observe_lr(1e-3);
  EXPECT_EQ(r.of_round(7), 16);
  r.observe_lr(0);
  EXPECT_EQ(r.now(), 16);
  r.observe_lr(1e-2);  // never below H
  EXPECT_EQ(r.now(), 4);
}
