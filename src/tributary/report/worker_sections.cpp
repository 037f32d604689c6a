// The run report's sections about workers and the network: per-worker throughput, communication per outer step, the
// compute/blocked timeline, and faults.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <algorithm>
#include <map>

#include <cmath>
#include <set>

#include "tributary/report/sections.h"

namespace tributary::report {
namespace {

constexpr size_t kMaxSpansPerWorker = 600;  // a long data-parallel run: the last ones (the page stays small)

bool is_exchange(const nlohmann::json& j) { return j.contains("comm_s") && j.contains("compute_s"); }

std::string worker_name(int rank) { return fmt::format("worker {}", rank); }

}  // namespace

Section workers_section(const RunFiles& run) {
  std::map<int, Lines> workers = run.workers;
  std::string intro;
  if (workers.empty() && !run.steps.empty()) {
    workers[0] = run.steps;
    intro = "<p>One process: its own numbers are the run's.</p>";
  }
  if (workers.empty()) return {"workers", "Workers", not_applicable("no step was logged")};
  std::vector<std::vector<std::string>> rows;
  std::vector<Series> speed;
  for (const auto& [rank, lines] : workers) {
    std::vector<double> tps, mfu;
    double compute = 0, blocked = 0, sent = 0;
    int64_t tasks = 0;
    std::set<int64_t> paths;
    Series s{worker_name(rank), {}};
    for (const auto& j : lines) {
      if (is_exchange(j)) {
        compute += number(j, "compute_s");
        blocked += number(j, "comm_s");
        sent += number(j, "bytes_sent");
      } else if (j.contains("tokens_per_s")) {
        tps.push_back(number(j, "tokens_per_s"));
        if (j.contains("mfu")) mfu.push_back(number(j, "mfu"));
        if (j.contains("path")) {
          ++tasks;
          paths.insert(int64_t(number(j, "path")));
        }
        s.points.emplace_back(number(j, j.contains("path") ? "round" : "step"), tps.back());
      }
    }
    const double share = compute + blocked > 0 ? 100 * blocked / (compute + blocked) : std::nan("");
    rows.push_back({worker_name(rank), fixed(median(tps), 0), mfu.empty() ? "-" : fixed(100 * median(mfu), 1),
                    fixed(compute, 1), fixed(blocked, 1), fixed(share, 1), short_number(sent),
                    run.tasks.empty() ? "-" : fmt::format("{} ({} paths)", tasks, paths.size())});
    speed.push_back(std::move(s));
  }
  const bool dipaco = !run.tasks.empty();
  return {"workers", "Workers",
          intro +
              table({"worker", "tokens/s (median)", "MFU % (median)", "compute s", "blocked s", "blocked %",
                     "bytes sent", "DiPaCo tasks"},
                    rows) +
              line_chart(speed, {"Tokens/s per worker", dipaco ? "round (one point per task)" : "step",
                                 "tokens/s (this worker)"})};
}

Section communication_section(const RunFiles& run) {
  const Lines& lines = run.rounds.empty() ? run.exchanges : run.rounds;
  if (lines.empty())
    return {"communication", "Communication",
            not_applicable("no exchange was logged: a single-process run (or one stopped before its first outer "
                           "step) sends nothing")};
  std::vector<Bar> bars;
  Series share{"blocked share of the round", {}, lines.size() < 60};
  for (const auto& j : lines) {
    const double s = number(j, "bytes_sent"), r = number(j, "bytes_recv"), c = number(j, "comm_s");
    // Labelled by step: a data-parallel warm-up logs several exchanges as outer step 0.
    bars.push_back({fmt::format("{}", int64_t(number(j, "step"))), {s / 1e6, r / 1e6}});
    const double compute = std::max(0.0, number(j, "compute_s"));  // older runs logged it below zero
    if (c + compute > 0) share.points.emplace_back(number(j, "step"), 100 * c / (c + compute));
  }
  const std::string compression = run.summary.is_object() ? run.summary.value("compression", std::string("-")) : "-";
  // DiLoCo's data-parallel warm-up logs its gradient averages as outer step 0, one line per logging interval: a row of
  // their own, so that the outer exchanges' median is theirs alone.
  enum class Lines { kWarmup, kExchanges, kAll };
  auto row = [&](const std::string& kind, Lines which) -> std::vector<std::string> {
    std::vector<double> sent_each;
    double recv = 0, comm = 0, modelled = 0;
    for (const auto& j : lines) {
      const bool warmup = number(j, "outer_step") == 0;
      if (which != Lines::kAll && warmup != (which == Lines::kWarmup)) continue;
      sent_each.push_back(number(j, "bytes_sent"));
      recv += number(j, "bytes_recv");
      comm += number(j, "comm_s");
      modelled += number(j, "modelled_link_s");
    }
    if (sent_each.empty()) return {};
    double sent = 0;
    for (double v : sent_each) sent += v;
    return {kind,
            fmt::format("{}", sent_each.size()),
            short_number(sent) + "B",
            short_number(recv) + "B",
            which == Lines::kAll ? "-" : short_number(median(sent_each)) + "B",
            fixed(comm, 2),
            fixed(modelled, 2),
            compression};
  };
  std::vector<std::vector<std::string>> rows;
  for (auto r : {row("data-parallel warm-up (logged intervals)", Lines::kWarmup), row("exchanges", Lines::kExchanges)})
    if (!r.empty()) rows.push_back(std::move(r));
  if (rows.size() == 2) rows.push_back(row("all", Lines::kAll));
  const std::string totals = table(
      {"", "lines", "sent (lead)", "received (lead)", "median sent per line", "blocked s", "modelled link s", "codec"},
      rows);
  return {
      "communication", "Communication",
      totals +
          bar_chart(bars, {"sent", "received"}, {"Traffic per exchange (lead worker)", "step of the exchange", "MB"}) +
          line_chart({share}, {"Share of each round spent blocked in communication", "step of the exchange", "%"})};
}

Section timeline_section(const RunFiles& run) {
  std::vector<std::string> rows;
  std::vector<Span> spans;
  for (const auto& [rank, lines] : run.workers) {
    std::vector<const nlohmann::json*> exchanges;
    for (const auto& j : lines)
      if (is_exchange(j) && j.contains("elapsed_s")) exchanges.push_back(&j);
    if (exchanges.empty()) continue;
    const size_t first = exchanges.size() > kMaxSpansPerWorker ? exchanges.size() - kMaxSpansPerWorker : 0;
    for (size_t i = first; i < exchanges.size(); ++i) {
      const auto& j = *exchanges[i];
      // The wall clock starts at 0: a round's time counted before the first step (start-up) is not drawn before it.
      const double end = number(j, "elapsed_s"), blocked = std::min(end, std::max(0.0, number(j, "comm_s")));
      const double compute = std::min(end - blocked, std::max(0.0, number(j, "compute_s")));
      spans.push_back({rows.size(), end - blocked - compute, end - blocked, 0});
      spans.push_back({rows.size(), end - blocked, end, 1});
    }
    rows.push_back(worker_name(rank));
  }
  if (rows.empty())
    return {"timeline", "Timeline",
            not_applicable(run.exchanges.empty() ? "a single-process run: nobody waits for anybody"
                                                 : "no per-worker files (workers/rank*.jsonl): this run was made "
                                                   "before they were written")};
  return {"timeline", "Timeline",
          "<p>Each outer step of each worker: training (its inner steps) then blocked in the exchange until the "
          "slowest worker's update arrived. Gaps are evaluations and checkpoints.</p>" +
              timeline(rows, spans, {"training", "blocked in communication"},
                       {"Outer steps per worker along the wall clock", "seconds since start", ""})};
}

Section faults_section(const RunFiles& run) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& e : run.events) {
    const std::string what = e.value("event", std::string());
    const std::string detail = what == "membership"
                                   ? fmt::format("{} -> {} workers", number(e, "members_before"), number(e, "members"))
                               : what == "lead" ? fmt::format("worker {} leads from here on", number(e, "lead_worker"))
                               : what == "heal" && e.contains("healed")
                                   ? fmt::format(
                                         "{} {} restarted and healed mid-round from the lead (it joins at the "
                                         "next round)",
                                         e.value("noun", std::string("worker")), e["healed"].dump())
                                   : e.dump();
    rows.push_back({fmt::format("{}", int64_t(number(e, "step"))), what, detail});
  }
  double rejected = 0;
  Series members{"workers in the round", {}, true};
  for (const auto& j : run.exchanges) {
    rejected += number(j, "rejected");
    if (j.contains("world_size")) members.points.emplace_back(number(j, "step"), number(j, "world_size"));
  }
  for (const auto& r : run.rounds) {  // DiPaCo: tasks of dead workers are dropped and re-queued
    if (r.contains("dropped") && r["dropped"].is_array() && !r["dropped"].empty())
      rows.push_back({fmt::format("{}", int64_t(number(r, "step"))), "dropped tasks", r["dropped"].dump()});
    if (r.contains("members") && r["members"].is_array())
      members.points.emplace_back(number(r, "round"), double(r["members"].size()));
  }
  const auto& s = run.summary;
  const double reformations = s.is_object() ? number(s, "reformations") : 0;
  rejected = std::max(rejected, s.is_object() ? number(s, "rejected") : 0.0);
  std::string html = table({"step", "event", "detail"},
                           rows.empty() ? std::vector<std::vector<std::string>>{{"-", "none",
                                                                                 "no "
                                                                                 "worker was lost or joined"}}
                                        : rows);
  html += table({"group re-formations", "updates rejected", "DiPaCo tasks dropped"},
                {{fixed(reformations, 0), fixed(rejected, 0),
                  s.is_object() && s.contains("tasks_dropped") ? fixed(number(s, "tasks_dropped"), 0) : "-"}});
  if (!members.points.empty())
    html += line_chart({members}, {"Workers per round", run.rounds.empty() ? "step" : "round", "workers"});
  return {"faults", "Faults and joins", html};
}

// Asynchronous DiLoCo: per replica, its updates merged, their mean staleness, lag and weight and the merges it was late
// for; the tokens merged over time (goodput); the last merges, who was in and who was late.
Section merges_section(const RunFiles& run) {
  if (run.merges.empty()) return {"merges", "Asynchronous merges", "", false};
  struct Replica {
    int64_t updates = 0, late = 0;
    double staleness = 0, lag = 0, weight = 0;
  };
  std::map<int, Replica> replicas;
  Series tokens{"tokens merged", {}, run.merges.size() < 60};
  const double t0 = number(run.merges.front(), "time");
  std::vector<std::vector<std::string>> last;
  for (const auto& m : run.merges) {
    std::vector<std::string> in;
    if (m.contains("merged") && m["merged"].is_array())
      for (const auto& u : m["merged"]) {
        Replica& r = replicas[int(number(u, "replica"))];
        r.updates += 1;
        r.staleness += number(u, "staleness");
        r.lag += number(u, "lag");
        r.weight += number(u, "weight");
        in.push_back(fmt::format("{} (s {}, w {:.2f})", int(number(u, "replica")), int(number(u, "staleness")),
                                 number(u, "weight")));
      }
    std::vector<std::string> late;
    if (m.contains("late") && m["late"].is_array())
      for (const auto& r : m["late"])
        if (r.is_number_integer()) {
          replicas[r.get<int>()].late += 1;
          late.push_back(std::to_string(r.get<int>()));
        }
    tokens.points.emplace_back(number(m, "time") - t0, number(m, "tokens"));
    last.push_back({fmt::format("{}", int64_t(number(m, "version"))), fmt::format("{}", int(number(m, "merger"))),
                    fmt::format("{}", fmt::join(in, ", ")), fmt::format("{}", fmt::join(late, ", ")),
                    short_number(number(m, "tokens"))});
  }
  std::vector<std::vector<std::string>> rows;
  for (const auto& [rank, r] : replicas)
    rows.push_back({fmt::format("replica {}", rank), fmt::format("{}", r.updates),
                    r.updates ? fixed(r.staleness / double(r.updates), 2) : "-",
                    r.updates ? fixed(r.lag / double(r.updates), 2) : "-",
                    r.updates ? fixed(r.weight / double(r.updates), 2) : "-", fmt::format("{}", r.late)});
  if (last.size() > 20) last.erase(last.begin(), last.end() - 20);
  const double span = tokens.points.back().first;
  const std::string goodput =
      span > 0 ? fmt::format("<p>{} merges, {} tokens merged in {:.0f} s: {} tokens/s of goodput.</p>",
                             run.merges.size(), short_number(tokens.points.back().second), span,
                             short_number(tokens.points.back().second / span))
               : std::string();
  return {"merges", "Asynchronous merges",
          goodput +
              table({"replica", "updates merged", "mean staleness (merges)", "mean lag (rounds)", "mean weight",
                     "merges it was late for"},
                    rows) +
              line_chart({tokens}, {"Tokens merged", "seconds since the first merge", "tokens"}) +
              table({"version", "merger", "in (staleness, weight)", "late", "tokens merged"}, last)};
}

}  // namespace tributary::report

namespace tributary::report {

// Robust aggregation (dist.aggregate): every participant's score per exchange (its update's cosine with the round's
// aggregate, or with dist.score = "loss" its loss rating; -1 when refused), as metrics.jsonl's exchange lines carry
// them.
Section scores_section(const RunFiles& run) {
  std::map<std::string, Series> by_participant;
  struct Tally {
    int64_t exchanges = 0, refused = 0;
    double sum = 0, lowest = 1;
  };
  std::map<std::string, Tally> tallies;
  for (const auto& line : run.exchanges) {
    if (!line.contains("scores") || !line["scores"].is_object()) continue;
    const double x = number(line, "outer_step", number(line, "step"));
    for (const auto& [id, value] : line["scores"].items()) {
      if (!value.is_number()) continue;
      const double score = value.get<double>();
      Series& series = by_participant[id];
      series.name = "participant " + id;
      series.points.emplace_back(x, score);
      Tally& t = tallies[id];
      t.exchanges += 1;
      t.refused += score == -1 ? 1 : 0;
      if (score != -1) t.sum += score;
      t.lowest = std::min(t.lowest, score);
    }
  }
  if (by_participant.empty()) return {"scores", "Participants' scores", "", false};
  std::vector<Series> series;
  std::vector<std::vector<std::string>> rows;
  for (auto& [id, s] : by_participant) {
    const Tally& t = tallies[id];
    const int64_t accepted = t.exchanges - t.refused;
    rows.push_back({"participant " + id, fmt::format("{}", t.exchanges), fmt::format("{}", t.refused),
                    accepted ? fixed(t.sum / double(accepted), 3) : "-", fixed(t.lowest, 3)});
    series.push_back(std::move(s));
  }
  return {"scores", "Participants' scores",
          "<p>Each update's cosine with the round's robust aggregate (dist.aggregate), or with dist.score = loss its "
          "participant's rating by the loss its updates bring on probe batches (1: as much as the round's median "
          "update); -1: refused that exchange (a check, a low rating, or evicted).</p>" +
              table({"participant", "exchanges", "refused", "mean score when accepted", "lowest"}, rows) +
              line_chart(series, {"Scores per exchange", "outer step", "score"})};
}

}  // namespace tributary::report
