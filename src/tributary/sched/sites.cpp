#include "tributary/sched/sites.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "tributary/core/error.h"
#include "tributary/core/fs.h"

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

std::string island_placement_json(const std::vector<Site>& sites) {
  nlohmann::json islands = nlohmann::json::array(), regions = nlohmann::json::array(), ranks = nlohmann::json::array();
  for (size_t i = 0; i < sites.size(); ++i) {
    islands.push_back(sites[i].devices);
    regions.push_back(sites[i].region);
    for (int d = 0; d < sites[i].devices; ++d)
      ranks.push_back({{"rank", sites[i].first_device + d}, {"island", i}, {"region", sites[i].region}});
  }
  return nlohmann::json{{"kind", "islands"}, {"islands", islands}, {"regions", regions}, {"ranks", ranks}}.dump(2) +
         "\n";
}

std::optional<std::string> read_island_placement(const std::string& path) {
  const std::string remedy = fmt::format("write it with `tributary plan <cluster> --sites --out {}`", path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    fail("'{}' is not a placement file ({}); {}", path, e.what(), remedy);
  }
  if (!j.is_object() || !j.contains("kind")) return std::nullopt;  // a pipeline placement
  if (j.at("kind") != "islands")
    fail("'{}': placement kind {} is not one this version reads (\"islands\", or a pipeline placement); {}", path,
         j.at("kind").dump(), remedy);
  const auto& sizes = j.contains("islands") ? j.at("islands") : nlohmann::json();
  if (!sizes.is_array() || sizes.empty() || sizes.size() > 4096)
    fail("'{}': \"islands\" must list the islands' sizes (e.g. [4, 4]); {}", path, remedy);
  std::string key;
  int64_t total = 0;
  for (const auto& size : sizes) {
    if (!size.is_number_integer() || size.get<int64_t>() < 1 || size.get<int64_t>() > 4096)
      fail("'{}': island size {} is not a count of ranks (1..4096); {}", path, size.dump(), remedy);
    total += size.get<int64_t>();
    key += (key.empty() ? "" : ",") + std::to_string(size.get<int64_t>());
  }
  if (total > 4096) fail("'{}': the islands hold {} ranks, more than 4,096; {}", path, total, remedy);
  return key;
}

}  // namespace tributary::sched
