// dist.wan -> the emulated links of a run's ranks: "10Mbit,100ms" (also Kbit/Gbit, ms/s/us) for every pair, or a
// cluster JSON file (sched/ formats) or preset name whose first num_ranks devices are the ranks. Errors name dist.wan.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tributary/comm/link_model.h"

namespace tributary {

comm::LinkModel wan_link_model(const std::string& spec, int num_ranks);
// Rank r emulates cluster device device_of_rank[r] (a placement's cluster_device); a uniform spec ignores it.
comm::LinkModel wan_link_model(const std::string& spec, const std::vector<int>& device_of_rank);
std::optional<comm::LinkModel> wan_link_model_or_none(const std::string& spec, int num_ranks);  // "" -> none
std::optional<comm::LinkModel> wan_link_model_or_none(const std::string& spec, const std::vector<int>& device_of_rank);

}  // namespace tributary
