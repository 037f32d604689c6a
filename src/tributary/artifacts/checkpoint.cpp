#include "tributary/artifacts/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <system_error>

#include "tributary/core/error.h"
#include "tributary/core/hash.h"
#include "tributary/core/log.h"

namespace tributary {
namespace {

constexpr const char* kManifest = "manifest.json";

std::optional<int64_t> step_of(const fs::path& dir) {
  std::string name = dir.filename().string();
  if (name.rfind("step-", 0) != 0 || name.find('.') != std::string::npos) return std::nullopt;
  try {
    return std::stoll(name.substr(5));
  } catch (...) {
    return std::nullopt;
  }
}

std::vector<std::pair<int64_t, fs::path>> complete_checkpoints(const fs::path& run_dir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  fs::path root = run_dir / "checkpoints";
  if (!fs::is_directory(root)) return out;
  // Another rank may be clearing the directory right now (rank 0 starting over with --overwrite while the others
  // look): what is gone was not there.
  std::error_code gone;
  for (fs::directory_iterator it(root, gone), end; !gone && it != end; it.increment(gone)) {
    auto step = step_of(it->path());
    if (step && fs::exists(it->path() / kManifest)) out.emplace_back(*step, it->path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

fs::path staging_dir(const fs::path& run_dir, int64_t step) {
  return run_dir / "checkpoints" / fmt::format("step-{:08d}.tmp-ranks", step);
}

StagedFile stage_file(const fs::path& dir, const std::string& name, const std::string& bytes) {
  write_file(dir / name, bytes, /*sync=*/true);
  return {name, bytes.size(), hash64(bytes)};
}

fs::path save_checkpoint(const fs::path& run_dir, int64_t step, const CheckpointContents& contents, int64_t keep) {
  fs::path root = run_dir / "checkpoints";
  fs::create_directories(root);
  fs::path final_dir = checkpoint_dir(run_dir, step);
  const bool staged = !contents.staged.empty();
  fs::path tmp = staged ? staging_dir(run_dir, step) : root / fmt::format("step-{:08d}.tmp-{}", step, ::getpid());
  if (!staged) fs::remove_all(tmp);
  fs::create_directories(tmp);

  nlohmann::json files = nlohmann::json::object();
  for (const auto& f : contents.staged) {
    if (!fs::exists(tmp / f.name) || fs::file_size(tmp / f.name) != f.bytes)
      fail(
          "checkpoint of step {}: '{}' written by another rank is missing or incomplete in '{}'. Multi-machine runs "
          "need train.run_dir on a filesystem every machine shares",
          step, f.name, tmp.string());
    files[f.name] = {{"bytes", f.bytes}, {"xxh64", hex64(f.xxh64)}};
  }
  auto put = [&](const std::string& name, const std::string& bytes) {
    auto f = stage_file(tmp, name, bytes);
    files[name] = {{"bytes", f.bytes}, {"xxh64", hex64(f.xxh64)}};
  };
  put("model.safetensors", tensors_to_safetensors(contents.model, {{"format", "tributary-model"}}));
  put("optim.safetensors", tensors_to_safetensors(contents.optim, {{"format", "tributary-optim"}}));
  put("state.json", contents.state.dump(2) + "\n");
  put("config.toml", contents.config_toml);
  for (const auto& file : contents.tokenizer_files) put(file.filename().string(), read_file(file));
  for (const auto& [name, tensors] : contents.extra_tensors)
    put(name, tensors_to_safetensors(tensors, {{"format", "tributary-state"}}));
  nlohmann::json manifest = {{"format", "tributary-checkpoint"}, {"version", 1}, {"step", step}, {"files", files}};
  write_file(tmp / kManifest, manifest.dump(2) + "\n", /*sync=*/true);
  fsync_path(tmp);
  if (fs::exists(final_dir)) fs::remove_all(final_dir);  // re-saving the same step (e.g. after a resume)
  rename_durable(tmp, final_dir);

  auto all = complete_checkpoints(run_dir);
  for (size_t i = 0; i + static_cast<size_t>(keep) < all.size(); ++i) fs::remove_all(all[i].second);
  // Leftovers of writers that crashed mid-write.
  for (const auto& e : fs::directory_iterator(root))
    if (e.path().filename().string().find(".tmp-") != std::string::npos &&
        e.path().filename().string().find(fmt::format(".tmp-{}", ::getpid())) == std::string::npos)
      fs::remove_all(e.path());
  return final_dir;
}

std::vector<int64_t> checkpoint_steps(const fs::path& run_dir) {
  std::vector<int64_t> steps;
  for (const auto& [step, dir] : complete_checkpoints(run_dir)) steps.push_back(step);
  return steps;
}

fs::path checkpoint_dir(const fs::path& run_dir, int64_t step) {
  return run_dir / "checkpoints" / fmt::format("step-{:08d}", step);
}

std::optional<fs::path> latest_checkpoint(const fs::path& run_dir) {
  auto all = complete_checkpoints(run_dir);
  if (all.empty()) return std::nullopt;
  return all.back().second;
}

namespace {

// Another machine's part of a run without a shared filesystem (runtime/replica_checkpoint.h, own_run_dir): its
// ranks' replicas under ranks/rank-R, lowest rank first, each with a complete checkpoint.
std::vector<std::pair<int, fs::path>> own_replicas(const fs::path& run_dir) {
  std::vector<std::pair<int, fs::path>> out;
  if (!fs::is_directory(run_dir / "ranks")) return out;
  for (const auto& e : fs::directory_iterator(run_dir / "ranks")) {
    const std::string name = e.path().filename().string();
    if (name.rfind("rank-", 0) != 0 || name.size() > 14 ||
        !std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; }) || name.size() == 5)
      continue;
    if (auto latest = latest_checkpoint(e.path())) out.emplace_back(std::stoi(name.substr(5)), *latest);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

LoadedCheckpoint load_checkpoint(const fs::path& path) {
  fs::path dir = path;
  if (!fs::exists(dir / kManifest)) {
    if (fs::is_directory(dir / "checkpoints")) {
      auto latest = latest_checkpoint(dir);
      if (!latest) fail("run directory '{}' has no complete checkpoint (no step-*/manifest.json)", dir.string());
      dir = *latest;
    } else if (const auto own = own_replicas(dir); !own.empty()) {
      std::vector<int> ranks;
      for (const auto& [rank, latest] : own) ranks.push_back(rank);
      log::info(
          "'{}' is this machine's part of a run: it keeps the replica(s) of rank(s) {} (ranks/rank-R); reading rank "
          "{}'s newest checkpoint '{}' (the run's model, summary.json and report are in the lead's run directory, "
          "on rank 0's machine)",
          dir.string(), fmt::join(ranks, ", "), own.front().first, own.front().second.string());
      dir = own.front().second;
    } else if (fs::is_directory(dir) && step_of(dir)) {
      fail("'{}' is an incomplete checkpoint (no manifest.json: the writer stopped mid-write); use an earlier one",
           dir.string());
    } else {
      fail("'{}' is neither a checkpoint directory nor a run directory with checkpoints", dir.string());
    }
  }
  auto manifest = nlohmann::json::parse(read_file(dir / kManifest), nullptr, false);
  if (!manifest.is_object() || manifest.value("format", nlohmann::json()) != "tributary-checkpoint" ||
      !manifest.contains("files") || !manifest["files"].is_object())
    fail("'{}' is not a valid checkpoint manifest", (dir / kManifest).string());
  std::map<std::string, std::string> contents;
  for (auto it = manifest["files"].begin(); it != manifest["files"].end(); ++it) {
    // Each entry: a file of this directory (no path out of it) with its size and checksum.
    if (it.key().empty() || it.key().find('/') != std::string::npos || it.key() == "." || it.key() == ".." ||
        !it->is_object() || !it->contains("bytes") || !(*it)["bytes"].is_number_unsigned() || !it->contains("xxh64") ||
        !(*it)["xxh64"].is_string())
      fail("'{}': entry '{}' is not a file of the checkpoint with its bytes and xxh64; use an earlier checkpoint",
           (dir / kManifest).string(), it.key());
    fs::path file = dir / it.key();
    if (!fs::exists(file)) fail("checkpoint '{}' is missing '{}' listed in its manifest", dir.string(), it.key());
    std::string bytes = read_file(file);
    if (bytes.size() != it->value("bytes", size_t{0}) || hex64(hash64(bytes)) != it->value("xxh64", ""))
      fail("checkpoint file '{}' is corrupted (size or checksum differs from manifest.json); use an earlier checkpoint",
           file.string());
    contents[it.key()] = std::move(bytes);
  }
  for (const char* required : {"model.safetensors", "optim.safetensors", "state.json", "config.toml"})
    if (!contents.count(required)) fail("checkpoint '{}' has no {}", dir.string(), required);
  auto state = nlohmann::json::parse(contents["state.json"], nullptr, false);
  if (state.is_discarded() || !state.is_object()) fail("'{}' is not a JSON object", (dir / "state.json").string());
  // Every reader takes the step: a hand-edited or foreign state.json is named, not a crash. (Resume checks the
  // optimizer fields it needs itself: an exported path has none.)
  if (!state.contains("step") || !state["step"].is_number_integer() || state["step"].get<int64_t>() < 0)
    fail("'{}' has no non-negative integer 'step'; use another checkpoint", (dir / "state.json").string());
  if (contents["config.toml"].find("[model]") == std::string::npos)
    fail("'{}' holds no [model] table (empty or foreign); use another checkpoint", (dir / "config.toml").string());
  LoadedCheckpoint out{
      dir,
      safetensors::File::parse(std::move(contents["model.safetensors"]), (dir / "model.safetensors").string()),
      safetensors::File::parse(std::move(contents["optim.safetensors"]), (dir / "optim.safetensors").string()),
      std::move(state),
      contents["config.toml"],
      {}};
  for (auto& [name, bytes] : contents)
    if (name != "model.safetensors" && name != "optim.safetensors" && name != "state.json" && name != "config.toml")
      out.other_files[name] = std::move(bytes);
  return out;
}

safetensors::File LoadedCheckpoint::tensors(const std::string& name) const {
  auto it = other_files.find(name);
  if (it == other_files.end()) fail("checkpoint '{}' has no {}", dir.string(), name);
  return safetensors::File::parse(std::string(it->second), (dir / name).string());
}

}  // namespace tributary
