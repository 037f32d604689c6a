#include "tributary/report/html_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "tributary/core/error.h"
#include "tributary/report/sections.h"

namespace tributary::report {
namespace {

constexpr const char* kStyle = R"(
body { font-family: sans-serif; margin: 24px auto; max-width: 1000px; color: #222; }
nav a { margin-right: 12px; }
section { border-top: 1px solid #ccc; margin-top: 24px; padding-top: 4px; }
table { border-collapse: collapse; margin: 8px 0; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { background: #f4f4f4; }
p.na { color: #666; font-style: italic; }
p.note { color: #a35; }
pre { background: #f7f7f7; padding: 8px; font-size: 12px; overflow-x: auto; }
svg.chart { display: block; margin: 8px 0; }
)";

// The page checks itself once loaded: every section has content (a chart, a table, a note of why not, or a listing)
// and no script error happened. A browser test reads the verdict from <body data-check>.
constexpr const char* kCheck = R"(
window.reportErrors = [];
window.addEventListener('error', function (e) { window.reportErrors.push(String(e.message)); });
document.addEventListener('DOMContentLoaded', function () {
  var sections = Array.prototype.slice.call(document.querySelectorAll('section'));
  var empty = sections.filter(function (s) { return !s.querySelector('svg.chart, table, p.na, pre'); });
  document.body.setAttribute('data-sections', sections.map(function (s) { return s.id; }).join(' '));
  document.body.setAttribute('data-charts', String(document.querySelectorAll('svg.chart').length));
  document.body.setAttribute('data-empty', empty.map(function (s) { return s.id; }).join(' '));
  document.body.setAttribute('data-errors', String(window.reportErrors.length));
  document.body.setAttribute('data-check', empty.length === 0 && window.reportErrors.length === 0 ? 'ok' : 'fail');
});
)";

Section config_section(const RunFiles& run) {
  return {"config", "Configuration",
          run.config_toml.empty() ? not_applicable("config.toml is missing from the run directory")
                                  : "<pre>" + html_escape(run.config_toml) + "</pre>"};
}

}  // namespace

std::string table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows) {
  std::string s = "<table><tr>";
  for (const auto& h : header) s += "<th>" + html_escape(h) + "</th>";
  s += "</tr>";
  for (const auto& row : rows) {
    s += "<tr>";
    for (const auto& cell : row) s += "<td>" + html_escape(cell) + "</td>";
    s += "</tr>";
  }
  return s + "</table>";
}

std::string not_applicable(const std::string& why) { return "<p class=\"na\">" + html_escape(why) + "</p>"; }

std::string fixed(double value, int digits) {
  return std::isfinite(value) ? fmt::format("{:.{}f}", value, digits) : std::string("-");
}

double median(std::vector<double> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return !std::isfinite(x); }), v.end());
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

Section overview_section(const RunFiles& run) {
  const auto& s = run.summary;
  std::vector<std::vector<std::string>> rows;
  auto row = [&](const std::string& what, const std::string& value) { rows.push_back({what, value}); };
  row("run directory", fs::absolute(run.dir).string());
  if (s.is_null()) {
    row("state", "unfinished: no summary.json (still running, stopped by a crash, or killed)");
    if (!run.steps.empty()) row("last logged step", fmt::format("{}", number(run.steps.back(), "step")));
  } else {
    auto has = [&](const char* key) { return s.contains(key) && s[key].is_number(); };
    row("algorithm", s.value("algorithm", std::string("?")));
    if (has("world_size")) row("workers", fmt::format("{}", s.value("world_size", 1)));
    if (s.contains("modules"))
      row("DiPaCo grid",
          fmt::format("{} ({} paths, {} rounds)", s.value("modules", ""), s.value("paths", 0), s.value("rounds", 0)));
    if (has("num_parameters")) row("parameters", short_number(number(s, "num_parameters")));
    if (has("steps"))
      row("steps", fmt::format("{}{}", s.value("steps", 0), s.value("stopped_early", false) ? " (stopped early)" : ""));
    if (has("tokens")) row("tokens", short_number(number(s, "tokens")));
    row("wall clock", fixed(number(s, "elapsed_s"), 1) + " s");
    if (has("tokens_per_s")) row("tokens/s (all workers)", short_number(number(s, "tokens_per_s")));
    if (has("mfu"))
      row("MFU", fixed(100 * std::min(1.0, number(s, "mfu")), 1) + " % of a matmul peak of " +
                     (has("peak_flops") ? fixed(number(s, "peak_flops") / 1e9, 1) + " GFLOP/s per worker" : "?") +
                     (s.contains("peak_source") && s["peak_source"].is_string()
                          ? " (" + s["peak_source"].get<std::string>() + ")"
                          : std::string()));
    row("validation loss", has("val_loss") ? fixed(number(s, "val_loss"), 4) : "not evaluated");
    if (has("val_loss") && has("val_bpb"))
      row("bits per byte", fixed(number(s, "val_bpb"), 3) + " (unigram " + fixed(number(s, "unigram_bpb"), 3) + ")");
    row(has("islands") ? "bytes sent across the islands (lead worker)" : "bytes sent (lead worker)",
        short_number(number(s, "bytes_sent")) + "B" +
            (s.contains("compression") ? " (" + s.value("compression", std::string()) + ")" : std::string()));
    if (has("outer_steps")) row("outer steps", fmt::format("{}", s.value("outer_steps", 0)));
    if (has("islands")) {  // which ranks form which island, and both kinds of traffic
      std::vector<std::string> islands;
      if (s.contains("island_ranks") && s["island_ranks"].is_array())
        for (size_t i = 0; i < s["island_ranks"].size(); ++i) {
          std::vector<std::string> members;
          for (const auto& r : s["island_ranks"][i])
            if (r.is_number_integer()) members.push_back(fmt::format("{}", r.get<int64_t>()));
          islands.push_back(fmt::format("island {}: ranks {}", i, fmt::join(members, ", ")));
        }
      row("islands", fmt::format("{}{}{}", s.value("islands", 0), islands.empty() ? "" : " (",
                                 islands.empty() ? "" : fmt::format("{})", fmt::join(islands, "; "))));
      if (s.contains("islands_across") && s["islands_across"].is_string())
        row("across the islands", s["islands_across"].get<std::string>());
      if (has("bytes_inside_island"))
        row("bytes sent inside its island (lead worker)", short_number(number(s, "bytes_inside_island")) + "B");
    }
  }
  std::string notes;
  for (const auto& n : run.notes) notes += "<p class=\"note\">" + html_escape(n) + "</p>";
  return {"overview", "Overview", table({"", ""}, rows) + notes};
}

Section loss_section(const RunFiles& run) {
  std::vector<Series> by_tokens, by_time;
  const std::string train_key = !run.steps.empty() && run.steps.front().contains("loss_avg") ? "loss_avg" : "loss";
  by_tokens.push_back({"train loss", xy(run.steps, "tokens", train_key)});
  by_time.push_back({"train loss", xy(run.steps, "elapsed_s", train_key)});
  by_tokens.push_back({"validation loss", xy(run.evals, "tokens", "val_loss"), true});
  by_time.push_back({"validation loss", xy(run.evals, "elapsed_s", "val_loss"), true});
  if (!run.tasks.empty()) {  // DiPaCo: the mean task loss per round, over the tokens trained up to that round
    std::map<int64_t, std::pair<double, int>> loss;
    std::map<int64_t, double> tokens;
    for (const auto& t : run.tasks) {
      const auto r = static_cast<int64_t>(number(t, "round"));
      loss[r].first += number(t, "loss");
      loss[r].second += 1;
      tokens[r] += number(t, "tokens");
    }
    Series mean{"mean task loss (per round)", {}, true};
    double seen = 0;
    std::map<int64_t, double> seen_after;
    for (const auto& [r, l] : loss) {
      seen += tokens[r];
      seen_after[r + 1] = seen;  // evaluation of round r+1 comes after its tasks
      mean.points.emplace_back(seen, l.first / l.second);
    }
    Series val{"validation loss (routed)", {}, true};
    for (const auto& e : run.evals)
      if (seen_after.count(int64_t(number(e, "round"))))
        val.points.emplace_back(seen_after[int64_t(number(e, "round"))], number(e, "val_loss"));
    by_tokens = {mean, val};
  }
  return {"loss", "Loss",
          line_chart(by_tokens, {"Loss vs tokens", "tokens (all workers)", "loss (nats/token)"}) +
              line_chart(by_time, {"Loss vs wall clock", "seconds since start", "loss (nats/token)"})};
}

std::string render_html(const RunFiles& run) {
  const std::vector<Section> sections = {overview_section(run),      loss_section(run),   workers_section(run),
                                         communication_section(run), merges_section(run), scores_section(run),
                                         timeline_section(run),      faults_section(run), dipaco_section(run),
                                         pipeline_section(run),      config_section(run)};
  std::string nav, body;
  for (const auto& s : sections) {
    if (!s.applies) continue;
    nav += fmt::format("<a href=\"#{}\">{}</a>", s.id, html_escape(s.title));
    body += fmt::format("<section id=\"{}\"><h2>{}</h2>{}</section>\n", s.id, html_escape(s.title), s.html);
  }
  const std::string name = html_escape(fs::absolute(run.dir).filename().string());
  return fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Tributary run: {0}"
      "</title><style>{1}</style><script>{2}</script></head>\n<body><h1>Tributary run: {0}</h1>"
      "<nav>{3}</nav>\n{4}</body></html>\n",
      name, kStyle, kCheck, nav, body);
}

fs::path write_report(const fs::path& run_dir, const fs::path& out) {
  const RunFiles run = read_run_files(run_dir);
  const fs::path target = out.empty() ? run_dir / "report.html" : out;
  if (!target.parent_path().empty() && !fs::is_directory(target.parent_path()))
    fail("--out {}: the directory '{}' does not exist", target.string(), target.parent_path().string());
  std::string page;
  try {
    page = render_html(run);
  } catch (const nlohmann::json::exception& e) {  // a hand-edited or foreign file: a key with another JSON type
    fail(
        "'{}': a value in its summary.json, metrics.jsonl or workers/ files has a JSON type train never writes ({}); "
        "nothing was written",
        run_dir.string(), e.what());
  }
  write_file_atomic(target, page);
  return target;
}

}  // namespace tributary::report
