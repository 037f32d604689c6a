#include "tributary/sched/sites.h"

#include <fmt/format.h>

#include "tributary/core/error.h"

namespace tributary::sched {

std::vector<Site> sites_of(const Cluster& cluster, const std::string& origin) {
  std::vector<Site> sites;
  for (int d = 0; d < cluster.size(); ++d) {
    const std::string& region = cluster.devices[size_t(d)].region;
    if (region.empty())
      fail("'{}': device {} has no region; islands come from the regions (\"device_regions\" or \"regions\")", origin,
           d);
    if (!sites.empty() && sites.back().region == region) {
      sites.back().devices += 1;
      continue;
    }
    for (const Site& s : sites)
      if (s.region == region)
        fail(
            "'{}': region '{}' has devices {} and {} with others between them; a launch numbers a site's ranks "
            "consecutively, so list each region's devices together",
            origin, region, s.first_device + s.devices - 1, d);
    sites.push_back({region, d, 1});
  }
  return sites;
}

std::string islands_key(const std::vector<Site>& sites) {
  std::string key;
  for (const Site& s : sites) key += (key.empty() ? "" : ",") + std::to_string(s.devices);
  return key;
}

}  // namespace tributary::sched
