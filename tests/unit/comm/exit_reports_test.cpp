// The exits launch reports, as a group reads them: only those since the group formed, all of them, and nothing
// (after the wait) when nobody reported one.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "tributary/comm/exit_reports.h"
#include "tributary/comm/store.h"

using namespace tributary;
using namespace std::chrono_literals;

TEST(ExitReports, AGroupNamesTheExitsReportedSinceItFormed) {
  auto store = comm::Store::in_memory();
  comm::report_exit(store, 3, "was killed by signal 9 (Killed)");  // before the group: an earlier incarnation's
  const comm::ExitWatch watch(store);
  EXPECT_EQ(watch.reported(0ms), "");
  comm::report_exit(store, 1, "exited with status 2 (an error in its input or config)");
  EXPECT_EQ(watch.reported(0ms),
            "rank 1 exited with status 2 (an error in its input or config), as its launch reported");
  comm::report_exit(store, 0, "was killed by signal 9 (Killed)");
  EXPECT_EQ(watch.reported(0ms),
            "rank 1 exited with status 2 (an error in its input or config); rank 0 was killed by "
            "signal 9 (Killed), as their launch reported");
}

TEST(ExitReports, TheReaderWaitsForAReportThatIsOnItsWay) {
  auto store = comm::Store::in_memory();
  const comm::ExitWatch watch(store);
  std::thread launch([&] {
    std::this_thread::sleep_for(100ms);
    comm::report_exit(store, 2, "was killed by signal 9 (Killed)");
  });
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(watch.reported(5s), "rank 2 was killed by signal 9 (Killed), as its launch reported");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);  // it returns when the report lands, not at the deadline
  launch.join();
  // Nobody else exits: the wait ends at its deadline with what came.
  comm::report_exit(store, 2, "again");
  const comm::ExitWatch later(store);
  EXPECT_EQ(later.reported(50ms), "");
  EXPECT_EQ(comm::ExitWatch().reported(50ms), "");  // a group of one reads nothing
}
