// Islands from a cluster file's regions (sched/sites.h), without processes.
#include <gtest/gtest.h>

#include <unistd.h>

#include <optional>
#include <utility>
#include <vector>

#include "support/error_of.h"
#include "tributary/core/fs.h"
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

// `plan --sites --out` writes the islands as a placement file; parallel.placement reads them back. A pipeline
// placement is not an islands one; a file that is neither is refused naming it.
TEST(Sites, AnIslandsPlacementRoundTripsAndBadOnesAreRefused) {
  const fs::path dir = fs::temp_directory_path() / ("trib_sites_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto file = [&](const std::string& name, const std::string& text) {
    write_file(dir / name, text, false);
    return (dir / name).string();
  };
  const std::vector<Site> sites{{"ohio", 0, 4}, {"tokyo", 4, 2}};
  const std::string written = file("islands.json", island_placement_json(sites));
  EXPECT_EQ(read_island_placement(written), std::optional<std::string>("4,2"));
  EXPECT_NE(read_file(written).find(R"("region": "tokyo")"), std::string::npos);
  EXPECT_EQ(read_island_placement(file("pipeline.json", R"({"d_dp": 1, "d_pp": 2, "pipelines": [[0, 1]]})")),
            std::nullopt);
  for (const auto& [text, names] : std::vector<std::pair<std::string, std::string>>{
           {"{not json", "is not a placement file"},
           {R"({"kind": "rings", "islands": [2]})", "placement kind \"rings\""},
           {R"({"kind": "islands", "islands": []})", "must list the islands' sizes"},
           {R"({"kind": "islands", "islands": [2, 0]})", "island size 0"},
           {R"({"kind": "islands", "islands": [4096, 4096]})", "more than 4,096"}}) {
    const std::string message = error_of([&] { read_island_placement(file("bad.json", text)); });
    EXPECT_NE(message.find(names), std::string::npos) << text << " -> " << message;
    EXPECT_NE(message.find("bad.json"), std::string::npos) << message;
  }
  fs::remove_all(dir);
}
