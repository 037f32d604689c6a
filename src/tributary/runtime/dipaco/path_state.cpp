#include "tributary/runtime/dipaco/path_state.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>

#include "tributary/artifacts/json_file.h"
#include "tributary/artifacts/modules.h"
#include "tributary/comm/store.h"
#include "tributary/core/error.h"
#include "tributary/core/log.h"
#include "tributary/runtime/dipaco/module_depot.h"
#include "tributary/runtime/dipaco/state_server.h"

namespace tributary {
namespace {

std::string inner_key(int64_t path, int64_t round) { return fmt::format("inner/p{}/r{}", path, round); }
std::string holder_key(int64_t path, int64_t round) { return inner_key(path, round) + "/holder"; }
std::string best_key(int64_t path, const char* what) { return fmt::format("best/p{}/{}", path, what); }
std::string best_name(int64_t path) { return fmt::format("best/p{}", path); }  // what a holder is asked for

}  // namespace

PathState::PathState(fs::path run_dir, ModuleDepot* depot, PathStateOptions options)
    : run_dir_(std::move(run_dir)), depot_(depot), options_(options) {
  fs::create_directories(run_dir_ / "inner");
  fs::create_directories(run_dir_ / "best");
}

PathState::~PathState() = default;

void PathState::serve(comm::Store connection) {
  server_ = std::make_unique<StateServer>(std::move(connection), options_.self,
                                          [this](const std::string& what) { return lookup(what); });
}

double PathState::take_served_bytes() { return server_ ? server_->take_served_bytes() : 0.0; }

fs::path PathState::inner_file(int64_t path, int64_t round) const {
  return run_dir_ / "inner" / fmt::format("path-{}.round-{}.safetensors", path, round);
}

fs::path PathState::best_json(int64_t path) const { return run_dir_ / "best" / fmt::format("path-{}.json", path); }

// Runs on the server's thread: reads files only (the main thread replaces them atomically or removes old rounds).
std::optional<std::string> PathState::lookup(const std::string& what) const {
  long long p = 0, r = 0;
  fs::path file;
  if (std::sscanf(what.c_str(), "inner/p%lld/r%lld", &p, &r) == 2)
    file = inner_file(p, r);
  else if (std::sscanf(what.c_str(), "best/p%lld", &p) == 1)
    file = best_path_file(run_dir_, p);
  if (file.empty() || !fs::exists(file)) return std::nullopt;
  return read_file(file);
}

std::optional<std::string> PathState::from_holder(int holder, const std::string& what) {
  if (holder == options_.self) return lookup(what);
  if (!is_live(holder)) return std::nullopt;
  return depot_->ask(holder, what, options_.ask_timeout);
}

std::optional<safetensors::File> PathState::inner(int64_t path, int64_t round) {
  if (round < 0) return std::nullopt;
  if (depot_ && saved_here_.count({path, round}) && fs::exists(inner_file(path, round)))
    return safetensors::File::load(inner_file(path, round));  // this worker's own: nothing to fetch
  if (depot_ && options_.on_request) {
    if (auto holder = depot_->get(holder_key(path, round))) {
      if (auto bytes = from_holder(std::stoi(*holder), inner_key(path, round)))
        return safetensors::File::parse(std::move(*bytes),
                                        fmt::format("path {}'s AdamW state from worker {}", path, *holder));
      log::warn("DiPaCo: path {} continues with fresh AdamW state (its holder, worker {}, did not hand it over)", path,
                *holder);
      return std::nullopt;
    }
  } else if (depot_) {
    if (auto bytes = depot_->get(inner_key(path, round)))
      return safetensors::File::parse(std::move(*bytes), fmt::format("path {}'s AdamW state from the store", path));
  }
  if (fs::exists(inner_file(path, round))) return safetensors::File::load(inner_file(path, round));
  return std::nullopt;
}

void PathState::save_inner(int64_t path, int64_t round, const std::string& bytes) {
  write_file_atomic(inner_file(path, round), bytes);  // before the store names this worker as its holder
  if (depot_) {
    if (options_.on_request)
      depot_->put(holder_key(path, round), std::to_string(options_.self));
    else
      depot_->put(inner_key(path, round), bytes);
    if (round > 1) depot_->remove(options_.on_request ? holder_key(path, round - 2) : inner_key(path, round - 2));
  }
  saved_here_.insert({path, round});
  if (round > 1) {
    fs::remove(inner_file(path, round - 2));
    saved_here_.erase({path, round - 2});
  }
}

double PathState::best_holdout(int64_t path) {
  const auto parse = [](const nlohmann::json& j) { return j.at("holdout_loss").get<double>(); };
  if (depot_)
    if (auto json = depot_->get(best_key(path, "json"))) {
      const auto record = nlohmann::json::parse(*json);
      // A copy held by a dead worker is gone: the path's next task makes the copy (also a discarded task's re-run).
      if (options_.on_request && !is_live(record.value("holder", options_.self)))
        return std::numeric_limits<double>::infinity();
      return parse(record);
    }
  if (!fs::exists(best_json(path))) return std::numeric_limits<double>::infinity();
  return with_json_file(best_json(path), "remove it (it is rewritten by the next round)", parse);
}

void PathState::save_best(int64_t path, int64_t round, double holdout, const std::string& params) {
  const std::string json =
      nlohmann::json{{"round", round}, {"holdout_loss", holdout}, {"holder", options_.self}}.dump();
  write_file_atomic(best_path_file(run_dir_, path), params);
  write_file_atomic(best_json(path), json);
  if (depot_) {
    if (!options_.on_request) depot_->put(best_key(path, "params"), params);
    depot_->put(best_key(path, "json"), json);
  }
}

void PathState::gather_best(int64_t num_paths) {
  if (!depot_) return;
  for (int64_t p = 0; p < num_paths; ++p) {
    auto json = depot_->get(best_key(p, "json"));
    if (!json) continue;  // a path with no held-out slice, or none trained yet
    std::optional<std::string> params;
    if (options_.on_request) {
      const int holder = nlohmann::json::parse(*json).value("holder", options_.self);
      params = from_holder(holder, best_name(p));
      if (!params) {
        log::warn(
            "DiPaCo: path {}'s early-stopping copy was held by worker {}, which did not hand it over: the "
            "early-stopped evaluation uses the copy this directory holds, or the path's final modules",
            p, holder);
        continue;
      }
    } else {
      params = depot_->get(best_key(p, "params"));
      if (!params) continue;
    }
    write_file_atomic(best_path_file(run_dir_, p), *params);
    write_file_atomic(best_json(p), *json);
  }
}

void PathState::republish_inner(int64_t num_paths, int64_t round) {
  if (!depot_ || round < 0) return;
  for (int64_t p = 0; p < num_paths; ++p) {
    if (!fs::exists(inner_file(p, round))) continue;
    if (options_.on_request)
      depot_->put(holder_key(p, round), std::to_string(options_.self));
    else
      depot_->put(inner_key(p, round), read_file(inner_file(p, round)));
  }
}

void PathState::republish_best(int64_t num_paths) {
  if (!depot_) return;
  const auto read_json = [](const nlohmann::json& j) { return j; };
  for (int64_t p = 0; p < num_paths; ++p) {
    if (!fs::exists(best_json(p)) || !fs::exists(best_path_file(run_dir_, p))) continue;
    nlohmann::json mine = with_json_file(best_json(p), "remove it (it is rewritten by the next round)", read_json);
    if (auto theirs = depot_->get(best_key(p, "json")))
      if (nlohmann::json::parse(*theirs).at("round").get<int64_t>() >= mine.at("round").get<int64_t>()) continue;
    mine["holder"] = options_.self;  // the copy in this directory, whoever made it
    if (!options_.on_request) depot_->put(best_key(p, "params"), read_file(best_path_file(run_dir_, p)));
    depot_->put(best_key(p, "json"), mine.dump());
  }
}

}  // namespace tributary
