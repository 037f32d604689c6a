#include "tributary/runtime/replica_checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <random>

#include "tributary/core/error.h"
#include "tributary/core/fs.h"

namespace tributary {

std::string replica_model_file(int rank) { return fmt::format("rank-{}.model.safetensors", rank); }
std::string replica_optim_file(int rank) { return fmt::format("rank-{}.optim.safetensors", rank); }
std::string replica_outer_file(int rank) { return fmt::format("rank-{}.outer.safetensors", rank); }
std::string replica_aux_file(int rank) { return fmt::format("rank-{}.aux_heads.safetensors", rank); }
std::string replica_codec_file(int rank) { return fmt::format("rank-{}.codec.safetensors", rank); }

bool stage_rank_state(const CheckpointPeers& peers, const fs::path& run_dir, int64_t step, const RankState& mine,
                      CheckpointContents& contents) {
  constexpr int kFiles = 5;  // model, optim, outer, aux heads, codec: the slots of a rank's row
  const bool lead = peers.rank == 0;
  const fs::path staging = staging_dir(run_dir, step);
  if (lead) {
    fs::remove_all(staging);
    fs::create_directories(staging);
  }
  peers.barrier();                        // the staging directory exists and is empty
  std::vector<StagedFile> files(kFiles);  // by slot; bytes = 0: none
  if (!lead) {
    files[0] = stage_file(staging, replica_model_file(peers.rank),
                          tensors_to_safetensors(mine.params, {{"format", "tributary-model"}}));
    files[1] = stage_file(staging, replica_optim_file(peers.rank),
                          tensors_to_safetensors(mine.optim_state, {{"format", "tributary-optim"}}));
    if (mine.outer)
      files[2] = stage_file(staging, replica_outer_file(peers.rank),
                            tensors_to_safetensors(*mine.outer, {{"format", "tributary-outer"}}));
    if (mine.aux && !mine.aux->empty())
      files[3] = stage_file(staging, replica_aux_file(peers.rank),
                            tensors_to_safetensors(*mine.aux, {{"format", "tributary-aux-heads"}}));
    if (mine.codec && !mine.codec->empty())
      files[4] = stage_file(staging, replica_codec_file(peers.rank),
                            tensors_to_safetensors(*mine.codec, {{"format", "tributary-codec-state"}}));
  } else {
    if (mine.outer) contents.extra_tensors.emplace_back(replica_outer_file(0), *mine.outer);
    if (mine.codec && !mine.codec->empty()) contents.extra_tensors.emplace_back(replica_codec_file(0), *mine.codec);
  }
  // One row per rank: loader epoch, cursor, then (bytes, xxh64) of each file it staged (zeros: none, and rank 0).
  auto row = torch::zeros({2 + 2 * kFiles}, torch::kInt64);
  auto r = row.accessor<int64_t, 1>();
  r[0] = static_cast<int64_t>(mine.position.epoch);
  r[1] = static_cast<int64_t>(mine.position.cursor);
  for (size_t i = 0; i < files.size(); ++i) {
    r[2 + 2 * i] = static_cast<int64_t>(files[i].bytes);
    r[3 + 2 * i] = static_cast<int64_t>(files[i].xxh64);
  }
  auto rows = peers.all_gather(row);
  if (!lead) return false;
  contents.state["world_size"] = peers.size;
  contents.state["loaders"] = nlohmann::json::array();
  for (int rank = 0; rank < peers.size; ++rank) {
    auto o = rows[size_t(rank)].accessor<int64_t, 1>();
    contents.state["loaders"].push_back({{"epoch", o[0]}, {"cursor", o[1]}});
    if (rank == 0) continue;
    const std::string names[kFiles] = {replica_model_file(rank), replica_optim_file(rank), replica_outer_file(rank),
                                       replica_aux_file(rank), replica_codec_file(rank)};
    for (int f = 0; f < kFiles; ++f)
      if (o[2 + 2 * f] != 0)
        contents.staged.push_back({names[f], static_cast<uint64_t>(o[2 + 2 * f]), static_cast<uint64_t>(o[3 + 2 * f])});
  }
  return true;
}

CheckpointPeers checkpoint_peers(Replicas& replicas) {
  return {.rank = replicas.rank(),
          .size = replicas.size(),
          .barrier = [&replicas] { replicas.barrier(); },
          .all_gather = [&replicas](const torch::Tensor& t) { return replicas.all_gather(t); }};
}

void require_shared_run_dir(const CheckpointPeers& peers, const fs::path& run_dir) {
  const fs::path probe = run_dir / ".tributary-shared-probe";
  auto token = torch::zeros({1}, torch::kInt64);
  if (peers.rank == 0) {
    std::random_device random;
    const uint64_t value = (uint64_t(random()) << 32) ^ uint64_t(random()) ^ uint64_t(::getpid());
    write_file(probe, fmt::format("{:016x}\n", value), /*sync=*/true);
    token[0] = static_cast<int64_t>(value);
  }
  const auto tokens = peers.all_gather(token);  // after rank 0 wrote it
  std::error_code ec;
  const std::string expected = fmt::format("{:016x}\n", static_cast<uint64_t>(tokens.front()[0].item<int64_t>()));
  const bool sees =
      fs::is_regular_file(probe, ec) && fs::file_size(probe, ec) == expected.size() && read_file(probe) == expected;
  auto mine = torch::full({1}, sees ? 1 : 0, torch::kInt64);
  const auto all = peers.all_gather(mine);
  std::vector<int> apart;
  for (int rank = 0; rank < peers.size; ++rank)
    if (all[size_t(rank)][0].item<int64_t>() == 0) apart.push_back(rank);
  peers.barrier();  // every rank read it before it goes
  if (peers.rank == 0) fs::remove(probe, ec);
  if (!apart.empty())
    fail(
        "train.run_dir '{}' is not shared: rank(s) {} do not see the file rank 0 wrote there. A multi-machine run "
        "checkpoints into one directory, which every machine must mount at the same path (NFS or the like); per-"
        "machine run directories are not supported yet for this kind of run (path-local DiPaCo needs none). "
        "Nothing was trained",
        run_dir.string(), fmt::join(apart, ", "));
}

bool stage_replica_state(Replicas& replicas, const fs::path& run_dir, int64_t step, const NamedTensors& params,
                         const NamedTensors& optim_state, LoaderPosition position, CheckpointContents& contents) {
  const CheckpointPeers peers = checkpoint_peers(replicas);
  const NamedTensors codec = replicas.codec_state();
  if (!stage_rank_state(peers, run_dir, step, {params, optim_state, position, nullptr, nullptr, &codec}, contents))
    return false;
  contents.state["replicas"] = replicas.sync().progress();
  auto outer = replicas.sync().outer_state();
  if (!outer.empty()) contents.extra_tensors.emplace_back("outer.safetensors", std::move(outer));
  return true;
}

}  // namespace tributary
