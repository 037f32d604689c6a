#include "tributary/runtime/rendezvous.h"

#include <chrono>

#include "tributary/core/error.h"

namespace tributary {

comm::Store rendezvous(const RunConfig& config, const DistEnv& env) {
  using std::chrono::milliseconds;
  const auto store_timeout = milliseconds(static_cast<int64_t>(config.dist.store_timeout_s * 1000));
  auto store = comm::Store::connect(env.master_addr, env.master_port, env.rank, env.world_size, env.use_agent_store,
                                    env.store_prefix + "/tributary", store_timeout);
  // Every rank publishes its resolved config; every rank compares all of them with rank 0's.
  store.set("config/" + std::to_string(env.rank), config.to_toml());
  std::vector<std::string> keys;
  for (int r = 0; r < env.world_size; ++r) keys.push_back("config/" + std::to_string(r));
  store.wait(keys, store_timeout,
             fmt::format("not every rank of {} reached the rendezvous", env.world_size));
  const auto reference = RunConfig::from_toml(store.get(keys[0]), "rank 0's config").schema().flatten();
  std::vector<std::string> problems;
  for (int r = 1; r < env.world_size; ++r) {
    auto other = RunConfig::from_toml(store.get(keys[r]), "rank config").schema().flatten();
    auto diffs = config_differences(reference, other, {"train.threads", "train.device", "dist.compute_nice"});
    if (!diffs.empty()) problems.push_back(fmt::format("rank {} differs from rank 0 in {}", r, fmt::join(diffs, ", ")));
  }
  if (!problems.empty())
    fail("workers disagree on the run configuration: {}. Start every worker with the same config and overrides",
         fmt::join(problems, "; "));
  return store;
}

}  // namespace tributary
