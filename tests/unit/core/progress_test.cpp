// The progress line of long work (core/progress.h): what it says, and what it writes off a terminal (a log).
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "tributary/core/progress.h"

using namespace tributary;

TEST(Progress, TheLineSaysHowFarHowFastAndHowLongToGo) {
  EXPECT_EQ(progress_text("eval: val", 120, 400, "batches", 2.0), "eval: val  120/400 batches (30%)  60.0/s  ETA 5 s");
  EXPECT_EQ(progress_text("eval: val", 400, 400, "batches", 8.0), "eval: val  400/400 batches (100%)  50.0/s");
  EXPECT_EQ(progress_text("route", 0, 10, "units", 0.0), "route  0/10 units (0%)");
  EXPECT_EQ(progress_text("route", 0, 0, "units", 1.0), "route  0/0 units (0%)");
}

TEST(Progress, OffATerminalShortWorkWritesNothing) {
  // ctest's standard error is a pipe or a file, as a log's would be.
  testing::internal::CaptureStderr();
  {
    Progress progress("quiet", 3, "steps");
    for (int i = 0; i < 3; ++i) progress.advance();
  }
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

TEST(Progress, OffATerminalLongWorkWritesALineNowAndThen) {
  // Issue 66, item 19: in a log, eval (50 s) and route (minutes) looked hung. A line every log_every_s (10 s; 50 ms
  // here), and the last one when it ends.
  testing::internal::CaptureStderr();
  {
    Progress progress("long", 4, "units", 0.05);
    for (int i = 0; i < 4; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(60));
      progress.advance();
    }
  }
  const std::string out = testing::internal::GetCapturedStderr();
  EXPECT_NE(out.find("long  1/4 units (25%)"), std::string::npos) << out;
  EXPECT_NE(out.find("long  4/4 units (100%)"), std::string::npos) << out;
  EXPECT_EQ(out.find('\r'), std::string::npos) << "plain lines, no carriage return: " << out;
}
