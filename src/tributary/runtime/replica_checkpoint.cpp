#include "tributary/runtime/replica_checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <iterator>
#include <optional>
#include <random>
#include <set>

#include "tributary/core/error.h"
#include "tributary/core/fs.h"
#include "tributary/core/log.h"
#include "tributary/runtime/run_report.h"

namespace tributary {

std::string replica_model_file(int rank) { return fmt::format("rank-{}.model.safetensors", rank); }
std::string replica_optim_file(int rank) { return fmt::format("rank-{}.optim.safetensors", rank); }
std::string replica_outer_file(int rank) { return fmt::format("rank-{}.outer.safetensors", rank); }

ReplicaResume replica_resume(const LoadedCheckpoint& ckpt, const std::string& outer_file) {
  ReplicaResume resume{.progress = ckpt.state.at("replicas")};
  if (ckpt.has(outer_file)) resume.outer = ckpt.tensors(outer_file);
  return resume;
}
std::string replica_aux_file(int rank) { return fmt::format("rank-{}.aux_heads.safetensors", rank); }
std::string replica_codec_file(int rank) { return fmt::format("rank-{}.codec.safetensors", rank); }

fs::path own_run_dir(const fs::path& run_dir, int rank) { return run_dir / "ranks" / fmt::format("rank-{}", rank); }

fs::path publish_dir(const fs::path& run_dir, const CheckpointContents& contents) {
  const auto it = contents.state.find("replica_rank");
  return it == contents.state.end() ? run_dir : own_run_dir(run_dir, it->get<int>());
}

namespace {

constexpr const char* kLeadToken = ".lead-token";

// A rank's files by slot of its row: model, optim, outer, aux heads, codec.
std::array<std::string, 5> rank_files(int rank) {
  return {replica_model_file(rank), replica_optim_file(rank), replica_outer_file(rank), replica_aux_file(rank),
          replica_codec_file(rank)};
}

uint64_t random_token() {
  std::random_device random;
  return (uint64_t(random()) << 32) ^ uint64_t(random()) ^ uint64_t(::getpid());
}

// Whether `file` holds exactly `token` (as rank 0 wrote it): the same directory as rank 0's.
bool holds_token(const fs::path& file, uint64_t token) {
  std::error_code ec;
  const std::string expected = fmt::format("{:016x}\n", token);
  return fs::is_regular_file(file, ec) && fs::file_size(file, ec) == expected.size() && read_file(file) == expected;
}

// Rank 0 writes a token into `dir` and every rank learns it; true where this rank reads it back. Collective.
bool sees_lead_dir(const CheckpointPeers& peers, const fs::path& file) {
  auto token = torch::zeros({1}, torch::kInt64);
  if (peers.rank == 0) {
    const uint64_t value = random_token();
    write_file(file, fmt::format("{:016x}\n", value), /*sync=*/true);
    token[0] = static_cast<int64_t>(value);
  }
  const auto tokens = peers.all_gather(token);  // after rank 0 wrote it
  return peers.rank == 0 || holds_token(file, static_cast<uint64_t>(tokens.front()[0].item<int64_t>()));
}

// The ranks keeping their own directory send rank 0 their workers/rank{R}.jsonl (padded to the longest: one
// all-gather), which rank 0 writes into its run directory. `lines_bytes[R]` > 0 only for those ranks.
void gather_worker_lines(const CheckpointPeers& peers, const fs::path& run_dir, const std::vector<int64_t>& lines_bytes,
                         bool own) {
  const int64_t longest = *std::max_element(lines_bytes.begin(), lines_bytes.end());
  if (longest == 0) return;
  auto mine = torch::zeros({longest}, torch::kUInt8);
  if (own && lines_bytes[size_t(peers.rank)] > 0) {
    const std::string text = read_file(worker_lines_file(run_dir, peers.rank));
    std::memcpy(mine.data_ptr(), text.data(), std::min<size_t>(text.size(), size_t(lines_bytes[size_t(peers.rank)])));
  }
  const auto all = peers.all_gather(mine);
  if (peers.rank != 0) return;
  for (int rank = 1; rank < peers.size; ++rank)
    if (lines_bytes[size_t(rank)] > 0) {
      fs::create_directories(worker_lines_file(run_dir, rank).parent_path());
      write_file_atomic(
          worker_lines_file(run_dir, rank),
          std::string_view(static_cast<const char*>(all[size_t(rank)].data_ptr()), size_t(lines_bytes[size_t(rank)])));
    }
}

}  // namespace

bool stage_rank_state(const CheckpointPeers& peers, const fs::path& run_dir, int64_t step, const RankState& mine,
                      CheckpointContents& contents) {
  constexpr int kFiles = 5;  // model, optim, outer, aux heads, codec: the slots of a rank's row
  const bool lead = peers.rank == 0;
  const fs::path staging = staging_dir(run_dir, step);
  if (lead) {
    fs::remove_all(staging);
    fs::create_directories(staging);
  }
  // The staging directory exists and is empty; a rank that cannot see it keeps its own checkpoint.
  const bool own = !sees_lead_dir(peers, staging / kLeadToken);
  std::vector<StagedFile> files(kFiles);  // by slot; bytes = 0: none
  const auto names = rank_files(peers.rank);
  if (!lead && !own) {
    files[0] = stage_file(staging, names[0], tensors_to_safetensors(mine.params, {{"format", "tributary-model"}}));
    files[1] = stage_file(staging, names[1], tensors_to_safetensors(mine.optim_state, {{"format", "tributary-optim"}}));
    if (mine.outer)
      files[2] = stage_file(staging, names[2], tensors_to_safetensors(*mine.outer, {{"format", "tributary-outer"}}));
    if (mine.aux && !mine.aux->empty())
      files[3] = stage_file(staging, names[3], tensors_to_safetensors(*mine.aux, {{"format", "tributary-aux-heads"}}));
    if (mine.codec && !mine.codec->empty())
      files[4] =
          stage_file(staging, names[4], tensors_to_safetensors(*mine.codec, {{"format", "tributary-codec-state"}}));
  } else {  // this rank publishes: its model/optim are the checkpoint's, the rest its rank's files
    contents.model = mine.params;
    contents.optim = mine.optim_state;
    if (mine.outer) contents.extra_tensors.emplace_back(names[2], *mine.outer);
    if (own && mine.aux && !mine.aux->empty()) contents.extra_tensors.emplace_back(names[3], *mine.aux);
    if (mine.codec && !mine.codec->empty()) contents.extra_tensors.emplace_back(names[4], *mine.codec);
  }
  // One row per rank: loader epoch, cursor, whether it keeps its own directory and the size of its lines there, then
  // (bytes, xxh64) of each file it staged (zeros: none, and the ranks that publish).
  constexpr int kHead = 4;
  auto row = torch::zeros({kHead + 2 * kFiles}, torch::kInt64);
  auto r = row.accessor<int64_t, 1>();
  r[0] = static_cast<int64_t>(mine.position.epoch);
  r[1] = static_cast<int64_t>(mine.position.cursor);
  r[2] = own ? 1 : 0;
  std::error_code ec;
  if (own && fs::is_regular_file(worker_lines_file(run_dir, peers.rank), ec))
    r[3] = static_cast<int64_t>(fs::file_size(worker_lines_file(run_dir, peers.rank), ec));
  for (size_t i = 0; i < files.size(); ++i) {
    r[kHead + 2 * i] = static_cast<int64_t>(files[i].bytes);
    r[kHead + 1 + 2 * i] = static_cast<int64_t>(files[i].xxh64);
  }
  const auto rows = peers.all_gather(row);
  if (lead) fs::remove(staging / kLeadToken, ec);  // every rank has read it
  std::vector<int64_t> lines_bytes;
  std::vector<int> apart;
  for (const auto& o : rows) {
    lines_bytes.push_back(o[3].item<int64_t>());
    if (o[2].item<int64_t>() != 0) apart.push_back(int(lines_bytes.size()) - 1);
  }
  gather_worker_lines(peers, run_dir, lines_bytes, own);
  if (!lead && !own) return false;
  contents.state["world_size"] = peers.size;
  contents.state["loaders"] = nlohmann::json::array();
  for (int rank = 0; rank < peers.size; ++rank) {
    auto o = rows[size_t(rank)].accessor<int64_t, 1>();
    contents.state["loaders"].push_back({{"epoch", o[0]}, {"cursor", o[1]}});
    if (!lead || rank == 0) continue;
    const auto theirs = rank_files(rank);
    for (int f = 0; f < kFiles; ++f)
      if (o[kHead + 2 * f] != 0)
        contents.staged.push_back(
            {theirs[f], static_cast<uint64_t>(o[kHead + 2 * f]), static_cast<uint64_t>(o[kHead + 1 + 2 * f])});
  }
  if (own) contents.state["replica_rank"] = peers.rank;
  if (lead && !apart.empty()) contents.state["own_run_dirs"] = apart;  // their state is on their machines
  if (lead && contents.staged.empty()) fs::remove_all(staging, ec);    // nobody staged: save_checkpoint's own temp
  return true;
}

CheckpointPeers group_peers(comm::Group& world) {
  return {.rank = world.rank(),
          .size = world.size(),
          .barrier = [&world] { world.barrier(); },
          .all_gather = [&world](const torch::Tensor& t) { return world.all_gather(t); }};
}

std::vector<int> ranks_apart_from_lead(const CheckpointPeers& peers, const fs::path& run_dir) {
  const fs::path probe = run_dir / ".tributary-shared-probe";
  const auto sees = torch::full({1}, sees_lead_dir(peers, probe) ? int64_t(1) : int64_t(0), torch::kInt64);
  const auto all = peers.all_gather(sees);
  std::error_code ec;
  if (peers.rank == 0) fs::remove(probe, ec);  // every rank has read it
  std::vector<int> apart;
  for (int rank = 0; rank < peers.size; ++rank)
    if (all[size_t(rank)][0].item<int64_t>() == 0) apart.push_back(rank);
  return apart;
}

int64_t check_run_dirs(const CheckpointPeers& peers, const fs::path& run_dir,
                       const std::vector<int64_t>& resume_steps) {
  constexpr int64_t kSteps = 32;  // the newest checkpoints a rank offers; more are kept only by keep_checkpoints > 32
  const fs::path probe = run_dir / ".tributary-shared-probe";
  const bool sees = sees_lead_dir(peers, probe);
  auto mine = torch::full({1 + kSteps}, int64_t(-1), torch::kInt64);
  mine[0] = sees ? 1 : 0;
  const size_t offered = std::min<size_t>(resume_steps.size(), kSteps);
  for (size_t i = 0; i < offered; ++i) mine[1 + int64_t(i)] = resume_steps[resume_steps.size() - offered + i];
  const auto all = peers.all_gather(mine);
  std::error_code ec;
  if (peers.rank == 0) fs::remove(probe, ec);  // every rank has read it
  std::vector<int> apart;
  std::vector<std::string> newest;
  std::optional<std::set<int64_t>> common;  // the steps every rank can resume from
  for (int rank = 0; rank < peers.size; ++rank) {
    const auto row = all[size_t(rank)];
    if (row[0].item<int64_t>() == 0) apart.push_back(rank);
    std::set<int64_t> steps;
    for (int64_t i = 1; i <= kSteps; ++i)
      if (row[i].item<int64_t>() >= 0) steps.insert(row[i].item<int64_t>());
    newest.push_back(
        fmt::format("rank {}: {}", rank, steps.empty() ? "none" : fmt::format("step {}", *steps.rbegin())));
    if (!common) {
      common = steps;
    } else {
      std::set<int64_t> both;
      std::set_intersection(common->begin(), common->end(), steps.begin(), steps.end(),
                            std::inserter(both, both.end()));
      common = both;
    }
  }
  if (!apart.empty() && peers.rank == 0)
    log::info(
        "train.run_dir '{}' is not shared with rank(s) {} (another machine, no shared filesystem): each keeps its own "
        "replica's checkpoints in its machine's train.run_dir/ranks/rank-R; this one keeps the model, summary.json "
        "and every worker's lines",
        run_dir.string(), fmt::join(apart, ", "));
  if (!apart.empty() && !sees)
    log::info("rank {}: checkpoints in '{}'", peers.rank, own_run_dir(run_dir, peers.rank).string());
  if (resume_steps.empty()) return -1;
  if (common->empty())
    fail(
        "--resume: no checkpoint step is held by every rank (newest: {}); each rank resumes from its machine's "
        "train.run_dir ('{}', or ranks/rank-R there for a rank that does not share rank 0's). Start over with "
        "--overwrite, or copy the missing checkpoints",
        fmt::join(newest, ", "), run_dir.string());
  const int64_t step = *common->rbegin();
  if (peers.rank == 0 && step != resume_steps.back())
    log::warn("--resume: step {} is the newest checkpoint every rank holds ({}); resuming there", step,
              fmt::join(newest, ", "));
  return step;
}

}  // namespace tributary
