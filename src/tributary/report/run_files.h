// What `tributary report` reads from a run directory, sorted by kind of line. Every file a run writes is optional but
// one: a run is a directory with metrics.jsonl (written from the first logged step on). Sources:
//   metrics.jsonl           the lead's lines: steps (loss, tokens/s, MFU), evaluations (val_loss), exchanges
//                           (outer_step, bytes, compute/comm seconds), events (membership, lead), DiPaCo tasks (path)
//   workers/rank{R}.jsonl   each worker's own steps and exchanges (distributed runs; runtime/run_report.h)
//   metrics-rank{R}.jsonl   a DiPaCo worker's tasks and rounds (runtime/dipaco/worker.cpp)
//   merges.jsonl            asynchronous DiLoCo's merges (runtime/sync/async_sync.h), whoever merged them
//   summary.json, config.toml, dipaco.json and the routes' report.json (DiPaCo)
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tributary/core/fs.h"

namespace tributary::report {

using Lines = std::vector<nlohmann::json>;

struct RunFiles {
  fs::path dir;
  nlohmann::json summary;                                // null: the run has not finished (or crashed)
  std::string config_toml;                               // "" when absent
  Lines steps, evals, exchanges, events, tasks, rounds;  // from metrics.jsonl (tasks/rounds: DiPaCo, every worker)
  std::map<int, Lines> workers;    // rank -> its own lines (workers/rank{R}.jsonl; DiPaCo: rounds and tasks)
  Lines merges;                    // merges.jsonl (asynchronous DiLoCo), empty otherwise
  nlohmann::json dipaco;           // dipaco.json or null
  nlohmann::json routes;           // the routes directory's report.json or null
  std::vector<std::string> notes;  // what was skipped (a torn last line of a crashed run), shown on the page
};

// Error naming the directory when it is not a run, and the file and line of a line that is not JSON (a torn last
// line, as a crash mid-write leaves, is skipped with a note instead).
RunFiles read_run_files(const fs::path& dir);

// The numbers of `key` in `lines` as (x, y) pairs, x from `x_key`; lines missing either are left out.
std::vector<std::pair<double, double>> xy(const Lines& lines, const std::string& x_key, const std::string& key);
double number(const nlohmann::json& j, const std::string& key, double fallback = 0.0);

}  // namespace tributary::report
