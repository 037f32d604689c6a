// The run report's sections about how the model was split: DiPaCo's paths (losses, routing) and pipeline or
// local-parallel stages (per-stage times, per-chunk losses).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <charconv>
#include <cmath>
#include <map>

#include "tributary/core/error.h"
#include "tributary/report/sections.h"

namespace tributary::report {
namespace {

// "4x4" -> {4, 4}; a path id is mixed-radix with level 0 most significant (model/path_grid.h). `origin` names the file
// in the error a grid that is not one gets.
std::vector<int64_t> grid_of(const nlohmann::json& modules, const fs::path& origin) {
  constexpr int64_t kMaxPaths = int64_t(1) << 20;
  auto refuse = [&] {
    fail("{}: \"modules\" is {}, not a grid of modules per level such as \"4x4\" (at most {} paths)", origin.string(),
         modules.dump().substr(0, 60), kMaxPaths);
  };
  if (!modules.is_string()) refuse();
  const std::string text = modules.get<std::string>();
  std::vector<int64_t> k;
  int64_t paths = 1;
  size_t at = 0;
  while (true) {
    const size_t x = text.find('x', at);
    const std::string part = text.substr(at, x == std::string::npos ? std::string::npos : x - at);
    int64_t n = 0;
    const auto [end, err] = std::from_chars(part.data(), part.data() + part.size(), n);
    if (part.empty() || err != std::errc() || end != part.data() + part.size() || n < 1 || n > kMaxPaths / paths)
      refuse();
    paths *= n;
    k.push_back(n);
    if (x == std::string::npos) break;
    at = x + 1;
  }
  return k;
}

std::string modules_of(int64_t path, const std::vector<int64_t>& k) {
  std::vector<std::string> parts(k.size());
  for (size_t l = k.size(); l-- > 0;) {
    parts[l] = fmt::format("L{}.m{}", l, path % k[l]);
    path /= k[l];
  }
  return fmt::format("{}", fmt::join(parts, " "));
}

// The routes' report.json: how the training shards of each domain were assigned to paths (percent of the domain).
std::string routing_table(const nlohmann::json& routes, int64_t paths) {
  if (!routes.is_object() || !routes.contains("domains") || !routes.contains("confusion_train"))
    return not_applicable("the routes directory's report.json is not on this machine: no routing table");
  std::vector<std::string> header = {"domain \\ path"};
  for (int64_t p = 0; p < paths; ++p) header.push_back(fmt::format("{}", p));
  std::vector<std::vector<std::string>> rows;
  const auto& domains = routes["domains"];
  const auto& counts = routes["confusion_train"];
  for (size_t d = 0; d < domains.size() && d < counts.size(); ++d) {
    double total = 0;
    for (const auto& c : counts[d]) total += c.get<double>();
    std::vector<std::string> row = {domains[d].get<std::string>()};
    for (const auto& c : counts[d]) row.push_back(total > 0 ? fixed(100 * c.get<double>() / total, 0) : "-");
    rows.push_back(std::move(row));
  }
  return "<p>Share of each domain's training sequences routed to each path (%):</p>" + table(header, rows);
}

// One series per element of the array `key` of each step line ("stage 0", "stage 1", ...), over the steps.
std::vector<Series> per_index(const Lines& steps, const char* key, const char* name) {
  std::vector<Series> out;
  for (const auto& j : steps) {
    const auto& v = j[key];
    for (size_t i = 0; i < v.size(); ++i) {
      if (out.size() <= i) out.push_back({fmt::format("{} {}", name, i), {}});
      out[i].points.emplace_back(number(j, "step"), v[i].get<double>());
    }
  }
  return out;
}

}  // namespace

Section dipaco_section(const RunFiles& run) {
  if (run.dipaco.is_null()) return {"dipaco", "DiPaCo paths", "", false};
  const auto k =
      grid_of(run.dipaco.contains("modules") ? run.dipaco["modules"] : nlohmann::json("1"), run.dir / "dipaco.json");
  int64_t paths = 1;
  for (int64_t n : k) paths *= n;
  const auto& s = run.summary;
  std::map<int64_t, std::vector<const nlohmann::json*>> tasks;
  for (const auto& t : run.tasks) tasks[int64_t(number(t, "path"))].push_back(&t);
  std::vector<std::vector<std::string>> rows;
  std::vector<Series> curves;
  for (int64_t p = 0; p < paths; ++p) {
    auto at = [&](const char* key) {
      return s.is_object() && s.contains(key) && s[key].is_array() && size_t(p) < s[key].size()
                 ? s[key][p].get<double>()
                 : std::nan("");
    };
    const double units = at("units_per_path");
    const auto& mine = tasks[p];
    Series curve{fmt::format("path {}", p), {}, true};
    for (const auto* t : mine) curve.points.emplace_back(number(*t, "round"), number(*t, "loss"));
    rows.push_back({fmt::format("{}", p), modules_of(p, k), fixed(units, 0),
                    units > 0 ? fixed(at("loss_per_path"), 4) : "-", fmt::format("{}", mine.size()),
                    mine.empty() ? "-" : fixed(number(*mine.back(), "loss"), 4),
                    mine.empty() ? "-" : fixed(number(*mine.back(), "holdout_loss", std::nan("")), 4)});
    if (!curve.points.empty()) curves.push_back(std::move(curve));
  }
  return {"dipaco", "DiPaCo paths",
          fmt::format("<p>Grid {} ({} paths), {} rounds.</p>", html_escape(fmt::format("{}", fmt::join(k, "x"))), paths,
                      run.dipaco.value("round", 0)) +
              table({"path", "modules", "validation units routed", "routed val loss", "tasks trained",
                     "last train loss", "last holdout loss"},
                    rows) +
              line_chart(curves, {"Train loss of each path's tasks", "round", "loss"}) +
              routing_table(run.routes, paths)};
}

Section pipeline_section(const RunFiles& run) {
  std::string html;
  const auto& s = run.summary;
  if (s.is_object() && s.contains("stages") && s["stages"].is_array()) {
    std::vector<std::vector<std::string>> rows;
    std::vector<Bar> bars;
    int stage = 0;
    for (const auto& st : s["stages"]) {
      rows.push_back({fmt::format("stage {}", stage), fixed(number(st, "compute_s"), 2),
                      fixed(number(st, "blocked_s"), 2), fixed(100 * number(st, "bubble"), 1),
                      short_number(number(st, "activation_bytes")), short_number(number(st, "gradient_bytes")),
                      short_number(number(st, "sync_bytes")), fixed(number(st, "peak_rss_mb"), 0)});
      bars.push_back({fmt::format("stage {}", stage++), {number(st, "compute_s"), number(st, "blocked_s")}});
    }
    html += table({"stage", "compute s", "blocked s", "bubble %", "activations sent", "gradients sent", "replica sync",
                   "peak RSS MB"},
                  rows) +
            bar_chart(bars, {"compute", "blocked"}, {"Pipeline 0: seconds per stage", "stage", "seconds"});
  }
  if (!run.steps.empty() && run.steps.front().contains("stage_step_s"))
    html += line_chart(per_index(run.steps, "stage_step_s", "stage"),
                       {"Local parallelism: step seconds per stage", "step", "seconds"});
  if (!run.steps.empty() && run.steps.front().contains("chunk_losses"))
    html += line_chart(per_index(run.steps, "chunk_losses", "chunk"),
                       {"Local parallelism: each chunk's own loss", "step", "loss"});
  return {"pipeline", "Pipeline stages", html, !html.empty()};
}

}  // namespace tributary::report
