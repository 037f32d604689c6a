#include "tributary/report/run_files.h"

#include <charconv>
#include <regex>
#include <sstream>

#include "tributary/core/error.h"

namespace tributary::report {
namespace {

// What the report reads of a run is what the run wrote: regular files (not a device such as /dev/zero, nor a pipe,
// however named), of a size it can hold.
constexpr uintmax_t kMaxRunFileBytes = uintmax_t(1) << 31;

std::string read_run_file(const fs::path& file) {
  std::error_code ec;
  if (!fs::is_regular_file(file, ec))
    fail("'{}' is not a regular file: the report reads only files a run wrote (remove it or point at another run)",
         file.string());
  const uintmax_t bytes = fs::file_size(file, ec);
  if (ec || bytes > kMaxRunFileBytes)
    fail("'{}' is {} bytes, more than the report reads ({} bytes): is it a run's file?", file.string(),
         ec ? std::string("of unknown size") : std::to_string(bytes), kMaxRunFileBytes);
  return read_file(file);
}

// Every line of a JSON-lines file. A line that does not parse is an error naming the file and line, unless it is the
// last one: a crash mid-write leaves a torn last line, which the report skips and mentions.
Lines read_lines(const fs::path& file, std::vector<std::string>& notes) {
  std::istringstream in(read_run_file(file));
  std::vector<std::string> raw;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) raw.push_back(line);
  Lines out;
  for (size_t i = 0; i < raw.size(); ++i) {
    auto j = nlohmann::json::parse(raw[i], nullptr, false);
    if (!j.is_discarded() && j.is_object()) {
      out.push_back(std::move(j));
      continue;
    }
    if (i + 1 < raw.size())
      fail("{} line {} is not a JSON object: is this a metrics file of `tributary train`? (it starts '{}')",
           file.string(), i + 1, raw[i].substr(0, 60));
    notes.push_back(fmt::format("{}: the last line is torn (a crash mid-write?) and was skipped", file.string()));
  }
  return out;
}

nlohmann::json read_json_or_null(const fs::path& file) {
  if (!fs::exists(file)) return nullptr;
  auto j = nlohmann::json::parse(read_run_file(file), nullptr, false);
  if (j.is_discarded() || !j.is_object())
    fail("{} is not a JSON object; remove it or rerun the step that wrote it", file.string());
  return j;
}

void sort_lead_lines(RunFiles& run, const Lines& lines) {
  for (const auto& j : lines) {
    if (j.contains("event")) {
      run.events.push_back(j);
    } else if (j.contains("path")) {
      run.tasks.push_back(j);
    } else if (j.contains("round_s")) {
      run.rounds.push_back(j);
    } else if (j.contains("val_loss")) {
      run.evals.push_back(j);
    } else if (j.contains("outer_step")) {
      run.exchanges.push_back(j);
    } else if (j.contains("loss")) {
      run.steps.push_back(j);
    }
  }
}

// rank -> file for files named like `pattern` (one number captured) in `dir`; a number no run's rank can be is
// skipped with a note.
std::map<int, fs::path> numbered_files(const fs::path& dir, const std::regex& pattern,
                                       std::vector<std::string>& notes) {
  std::map<int, fs::path> out;
  if (!fs::is_directory(dir)) return out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (!std::regex_match(name, m, pattern)) continue;
    const std::string digits = m[1].str();
    int rank = 0;
    const auto [end, err] = std::from_chars(digits.data(), digits.data() + digits.size(), rank);
    if (err != std::errc() || end != digits.data() + digits.size())
      notes.push_back(fmt::format("{}: not a rank a run has; skipped", entry.path().string()));
    else
      out[rank] = entry.path();
  }
  return out;
}

}  // namespace

double number(const nlohmann::json& j, const std::string& key, double fallback) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : fallback;
}

std::vector<std::pair<double, double>> xy(const Lines& lines, const std::string& x_key, const std::string& key) {
  std::vector<std::pair<double, double>> out;
  for (const auto& j : lines) {
    const auto x = j.find(x_key), y = j.find(key);
    if (x != j.end() && y != j.end() && x->is_number() && y->is_number())
      out.emplace_back(x->get<double>(), y->get<double>());
  }
  return out;
}

RunFiles read_run_files(const fs::path& dir) {
  if (!fs::is_directory(dir)) fail("'{}' is not a directory: give a run directory (train.run_dir)", dir.string());
  const fs::path metrics = dir / "metrics.jsonl";
  if (!fs::exists(metrics) && fs::is_directory(dir / "ranks"))
    fail(
        "'{}' is another machine's part of a run: it keeps its ranks' replica checkpoints (ranks/rank-R) and their "
        "lines (workers/), while the run's metrics.jsonl, summary.json and every worker's lines are in the lead's "
        "run directory on rank 0's machine (its train.run_dir): run `tributary report` there, or copy that directory "
        "here; `tributary eval {}` evaluates this machine's replica",
        dir.string(), dir.string());
  if (!fs::exists(metrics))
    fail(
        "'{}' is not a run directory: it has no metrics.jsonl (`tributary train` writes one into train.run_dir "
        "from its first logged step on)",
        dir.string());
  RunFiles run;
  run.dir = dir;
  const Lines lead = read_lines(metrics, run.notes);
  sort_lead_lines(run, lead);
  run.summary = read_json_or_null(dir / "summary.json");
  if (fs::exists(dir / "config.toml")) run.config_toml = read_run_file(dir / "config.toml");
  for (const auto& [rank, file] : numbered_files(dir / "workers", std::regex(R"(rank(\d+)\.jsonl)"), run.notes))
    run.workers[rank] = read_lines(file, run.notes);
  if (fs::exists(dir / "merges.jsonl")) run.merges = read_lines(dir / "merges.jsonl", run.notes);
  run.dipaco = read_json_or_null(dir / "dipaco.json");
  if (run.dipaco.is_null()) return run;
  // DiPaCo: the lead's own tasks and rounds are in metrics.jsonl, every other worker's in metrics-rank{R}.jsonl.
  for (const auto& j : lead)  // (the lead writes a round's line twice when it also worked in it: once is enough)
    if ((j.contains("path") || j.contains("round_s")) && (run.workers[0].empty() || run.workers[0].back() != j))
      run.workers[0].push_back(j);
  for (const auto& [rank, file] : numbered_files(dir, std::regex(R"(metrics-rank(\d+)\.jsonl)"), run.notes)) {
    run.workers[rank] = read_lines(file, run.notes);
    for (const auto& j : run.workers[rank])
      if (j.contains("path")) run.tasks.push_back(j);
  }
  const std::string routes = run.dipaco.value("routes", std::string());
  if (!routes.empty() && fs::exists(fs::path(routes) / "report.json"))
    run.routes = read_json_or_null(fs::path(routes) / "report.json");
  return run;
}

}  // namespace tributary::report
