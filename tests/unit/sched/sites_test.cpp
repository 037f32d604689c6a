// Islands from a cluster file's regions (sched/sites.h), without processes.
#include <gtest/gtest.h>

#include "support/error_of.h"
#include "tributary/sched/sites.h"

using namespace tributary;
using namespace tributary::sched;
using tributary::test_support::error_of;

TEST(Sites, RegionsInDeviceOrderAreTheIslands) {
  const Cluster c = parse_cluster(
      R"({"regions": [{"name": "ohio", "devices": 4}, {"name": "oregon", "devices": 4}, {"name": "tokyo", "devices": 2}],
          "latency_ms": [[0.1, 20, 100], [20, 0.1, 90], [100, 90, 0.1]],
          "bandwidth_gbps": [[10, 1, 0.1], [1, 10, 0.1], [0.1, 0.1, 10]]})",
      "c.json");
  const auto sites = sites_of(c, "c.json");
  ASSERT_EQ(sites.size(), 3u);
  EXPECT_EQ(sites[1].region, "oregon");
  EXPECT_EQ(sites[1].first_device, 4);
  EXPECT_EQ(islands_key(sites), "4,4,2");
}

TEST(Sites, ARegionSplitByAnotherIsRefusedNamingIt) {
  const Cluster c = parse_cluster(
      R"({"latency_ms": [[0, 1, 1], [1, 0, 1], [1, 1, 0]], "bandwidth_gbps": [[10, 1, 1], [1, 10, 1], [1, 1, 10]],
          "device_regions": ["a", "b", "a"]})",
      "c.json");
  EXPECT_NE(error_of([&] { sites_of(c, "c.json"); }).find("region 'a' has devices 0 and 2"), std::string::npos);
}
