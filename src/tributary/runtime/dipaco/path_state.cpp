#include "tributary/runtime/dipaco/path_state.h"

#include <limits>
#include <nlohmann/json.hpp>

#include "tributary/core/error.h"
#include "tributary/runtime/dipaco/modules.h"
#include "tributary/runtime/dipaco/module_depot.h"
#include "tributary/runtime/json_file.h"

namespace tributary {
namespace {

std::string inner_key(int64_t path, int64_t round) { return fmt::format("inner/p{}/r{}", path, round); }
std::string best_key(int64_t path, const char* what) { return fmt::format("best/p{}/{}", path, what); }

}  // namespace

PathState::PathState(fs::path run_dir, ModuleDepot* depot) : run_dir_(std::move(run_dir)), depot_(depot) {
  fs::create_directories(run_dir_ / "inner");
  fs::create_directories(run_dir_ / "best");
}

fs::path PathState::inner_file(int64_t path, int64_t round) const {
  return run_dir_ / "inner" / fmt::format("path-{}.round-{}.safetensors", path, round);
}

fs::path PathState::best_json(int64_t path) const { return run_dir_ / "best" / fmt::format("path-{}.json", path); }

std::optional<safetensors::File> PathState::inner(int64_t path, int64_t round) {
  if (round < 0) return std::nullopt;
  if (depot_ && saved_here_.count({path, round}) && fs::exists(inner_file(path, round)))
    return safetensors::File::load(inner_file(path, round));  // this worker's own: nothing to fetch
  if (depot_)
    if (auto bytes = depot_->get(inner_key(path, round)))
      return safetensors::File::parse(std::move(*bytes), fmt::format("path {}'s AdamW state from the store", path));
  if (fs::exists(inner_file(path, round))) return safetensors::File::load(inner_file(path, round));
  return std::nullopt;
}

void PathState::save_inner(int64_t path, int64_t round, const std::string& bytes) {
  if (depot_) {
    depot_->put(inner_key(path, round), bytes);
    if (round > 1) depot_->remove(inner_key(path, round - 2));
  }
  write_file_atomic(inner_file(path, round), bytes);
  saved_here_.insert({path, round});
  if (round > 1) {
    fs::remove(inner_file(path, round - 2));
    saved_here_.erase({path, round - 2});
  }
}

double PathState::best_holdout(int64_t path) {
  const auto parse = [](const nlohmann::json& j) { return j.at("holdout_loss").get<double>(); };
  if (depot_)
    if (auto json = depot_->get(best_key(path, "json"))) return parse(nlohmann::json::parse(*json));
  if (!fs::exists(best_json(path))) return std::numeric_limits<double>::infinity();
  return with_json_file(best_json(path), "remove it (it is rewritten by the next round)", parse);
}

void PathState::save_best(int64_t path, int64_t round, double holdout, const std::string& params) {
  const std::string json = nlohmann::json{{"round", round}, {"holdout_loss", holdout}}.dump();
  if (depot_) {
    depot_->put(best_key(path, "params"), params);
    depot_->put(best_key(path, "json"), json);
  }
  write_file_atomic(best_path_file(run_dir_, path), params);
  write_file_atomic(best_json(path), json);
}

void PathState::gather_best(int64_t num_paths) {
  if (!depot_) return;
  for (int64_t p = 0; p < num_paths; ++p) {
    auto params = depot_->get(best_key(p, "params"));
    auto json = depot_->get(best_key(p, "json"));
    if (!params || !json) continue;  // a path with no held-out slice, or none trained yet
    write_file_atomic(best_path_file(run_dir_, p), *params);
    write_file_atomic(best_json(p), *json);
  }
}

void PathState::republish_inner(int64_t num_paths, int64_t round) {
  if (!depot_ || round < 0) return;
  for (int64_t p = 0; p < num_paths; ++p)
    if (fs::exists(inner_file(p, round))) depot_->put(inner_key(p, round), read_file(inner_file(p, round)));
}

void PathState::republish_best(int64_t num_paths) {
  if (!depot_) return;
  const auto round_of = [](const nlohmann::json& j) { return j.at("round").get<int64_t>(); };
  for (int64_t p = 0; p < num_paths; ++p) {
    if (!fs::exists(best_json(p)) || !fs::exists(best_path_file(run_dir_, p))) continue;
    const int64_t mine = with_json_file(best_json(p), "remove it (it is rewritten by the next round)", round_of);
    if (auto theirs = depot_->get(best_key(p, "json")))
      if (round_of(nlohmann::json::parse(*theirs)) >= mine) continue;
    depot_->put(best_key(p, "params"), read_file(best_path_file(run_dir_, p)));
    depot_->put(best_key(p, "json"), read_file(best_json(p)));
  }
}

}  // namespace tributary
