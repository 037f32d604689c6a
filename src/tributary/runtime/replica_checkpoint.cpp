#include "tributary/runtime/replica_checkpoint.h"

#include <fmt/format.h>

namespace tributary {

std::string replica_model_file(int rank) { return fmt::format("rank-{}.model.safetensors", rank); }
std::string replica_optim_file(int rank) { return fmt::format("rank-{}.optim.safetensors", rank); }

bool stage_replica_state(Replicas& replicas, const fs::path& run_dir, int64_t step, const NamedTensors& params,
                         const NamedTensors& optim_state, LoaderPosition position, CheckpointContents& contents) {
  const bool lead = replicas.rank() == 0;
  const fs::path staging = staging_dir(run_dir, step);
  if (lead) {
    fs::remove_all(staging);
    fs::create_directories(staging);
  }
  replicas.barrier();  // the staging directory exists and is empty
  std::vector<StagedFile> mine;
  if (!lead) {
    mine.push_back(stage_file(staging, replica_model_file(replicas.rank()),
                              tensors_to_safetensors(params, {{"format", "tributary-model"}})));
    mine.push_back(stage_file(staging, replica_optim_file(replicas.rank()),
                              tensors_to_safetensors(optim_state, {{"format", "tributary-optim"}})));
  }
  // One row per rank: loader epoch, cursor, then (bytes, xxh64) of its two files (zeros for rank 0).
  auto row = torch::zeros({6}, torch::kInt64);
  auto r = row.accessor<int64_t, 1>();
  r[0] = static_cast<int64_t>(position.epoch);
  r[1] = static_cast<int64_t>(position.cursor);
  for (size_t i = 0; i < mine.size(); ++i) {
    r[2 + 2 * i] = static_cast<int64_t>(mine[i].bytes);
    r[3 + 2 * i] = static_cast<int64_t>(mine[i].xxh64);
  }
  auto rows = replicas.all_gather(row);
  if (!lead) return false;
  contents.state["world_size"] = replicas.size();
  contents.state["loaders"] = nlohmann::json::array();
  for (int rank = 0; rank < replicas.size(); ++rank) {
    auto o = rows[rank].accessor<int64_t, 1>();
    contents.state["loaders"].push_back({{"epoch", o[0]}, {"cursor", o[1]}});
    if (rank == 0) continue;
    contents.staged.push_back({replica_model_file(rank), static_cast<uint64_t>(o[2]), static_cast<uint64_t>(o[3])});
    contents.staged.push_back({replica_optim_file(rank), static_cast<uint64_t>(o[4]), static_cast<uint64_t>(o[5])});
  }
  contents.state["replicas"] = replicas.progress();
  auto outer = replicas.outer_state();
  if (!outer.empty()) contents.extra_tensors.emplace_back("outer.safetensors", std::move(outer));
  return true;
}

}  // namespace tributary
