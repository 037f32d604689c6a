// The MFU and tokens/s a run prints and writes (runtime/run_report.h): the world's rate over the last completed
// round, against the peak of the workers the run was launched with — never the lead's own step rate times the world,
// which read 102-155% in DiLoCo while the lead ran ahead of slower workers (issue 18).
#include <gtest/gtest.h>
#include <unistd.h>

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "tributary/core/fs.h"
#include "tributary/runtime/run_report.h"

using namespace tributary;

namespace {

// Per worker: 100 tokens a step, a peak of 150 tokens/s (1 FLOP per token); 4 workers.
constexpr int64_t kTokens = 100;
constexpr int kWorkers = 4;

struct Lines {
  std::vector<nlohmann::json> main, worker;
};

Lines read_lines(const fs::path& dir) {
  Lines out;
  auto read = [](const fs::path& path, std::vector<nlohmann::json>& into) {
    std::istringstream in(read_file(path));
    for (std::string line; std::getline(in, line);)
      if (auto j = nlohmann::json::parse(line); j.contains("mfu")) into.push_back(j);
  };
  read(dir / "metrics.jsonl", out.main);
  read(dir / "workers" / "rank0.jsonl", out.worker);
  return out;
}

// One DiLoCo round of H = 5 on the lead: four steps of 0.5 s (its own pace: 200 tokens/s, 133% of its peak), then
// the outer step, where it waits 2.5 s for the slowest worker; the members' count after the round is `members`.
void round_of_five(RunReport& report, int64_t& step, int members) {
  for (int i = 0; i < 5; ++i) {
    step += 1;
    report.step_done(i < 4 ? 0.5 : 3.0, kTokens * members, 2.0);
    if (i == 4) report.exchange_done(step, step / 5, 5, {}, 0.0, members, 0);
    report.log_step(step, 0, StepResult{.loss = 2.0}, 1e-3, 0.0);
  }
}

// An empty run directory of the test's own, and the lead's report into it (a peak of 150 FLOP/s per worker).
fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("trib_{}_{}", name, ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

ReportSetup lead_of(const fs::path& dir, int64_t total_steps, int world_size) {
  return {.run_dir = dir,
          .lead = true,
          .total_steps = total_steps,
          .log_every = 1,
          .world_size = world_size,
          .distributed = true,
          .rank = 0,
          .flops_per_token = 1.0,
          .peak_flops = 150.0};
}

}  // namespace

TEST(RunReportMfu, ALeadRunningAheadReadsTheWorldsRoundRateNotItsOwn) {
  const fs::path dir = fresh_dir("mfu");
  {
    RunReport report(lead_of(dir, 20, kWorkers));
    int64_t step = 0;
    round_of_five(report, step, kWorkers);
    round_of_five(report, step, kWorkers);
    round_of_five(report, step, 3);  // a worker died in this round: three members from here on
    round_of_five(report, step, 3);
  }
  const Lines lines = read_lines(dir);
  ASSERT_EQ(lines.main.size(), 20u);
  // Before the first round ends, the interval's rate (all the lead knows): 4 x 200 tokens/s over 4 x 150 would be
  // 133%; MFU is never shown above 100% (issue 66, item 7).
  EXPECT_NEAR(lines.main[0]["mfu"].get<double>(), 1.0, 1e-9);
  // From the first outer step on: 5 steps x 400 tokens in 5 s = 400 tokens/s, 66.7% — on every line of the round,
  // not 133% on four lines and 22% on the fifth.
  for (size_t i = 4; i < 14; ++i) {
    EXPECT_NEAR(lines.main[i]["tokens_per_s"].get<double>(), 400.0, 1e-9) << "line " << i;
    EXPECT_NEAR(lines.main[i]["mfu"].get<double>(), 400.0 / 600.0, 1e-9) << "line " << i;
  }
  // Three members from the third round on: 5 x 300 tokens in 5 s against the four launched workers' peak (they share
  // the same machines).
  for (size_t i = 14; i < 20; ++i) EXPECT_NEAR(lines.main[i]["mfu"].get<double>(), 300.0 / 600.0, 1e-9);
  // The worker's own line: its steps' pace against its share of the launched peak (150, then 4 x 150 / 3 = 200).
  ASSERT_EQ(lines.worker.size(), 20u);
  EXPECT_NEAR(lines.worker[0]["mfu"].get<double>(), 1.0, 1e-9);  // 200 / 150, capped
  EXPECT_NEAR(lines.worker[19]["mfu"].get<double>(), (100.0 / 3.0) / 200.0, 1e-9);
  fs::remove_all(dir);
}

TEST(RunReportMfu, ARoundsComputeIsNeverBelowZero) {
  // Issue 66, item 9: the blocked time since the last exchange may include waits outside the steps (the start's
  // identity check, a checkpoint's collectives); compute_s = steps' time - blocked read -2 s here, and the report's
  // blocked share of the round 116%.
  const fs::path dir = fresh_dir("compute");
  {
    RunReport report(lead_of(dir, 5, 2));
    for (int i = 0; i < 3; ++i) report.step_done(1.0, kTokens, 2.0);
    report.exchange_done(3, 1, 3, {.comm_s = 5.0}, 5.0, 2, 0);
  }
  for (const char* file : {"metrics.jsonl", "workers/rank0.jsonl"}) {
    std::istringstream in(read_file(dir / file));
    int exchanges = 0;
    for (std::string line; std::getline(in, line);)
      if (auto j = nlohmann::json::parse(line); j.contains("outer_step")) {
        ++exchanges;
        EXPECT_EQ(j["compute_s"].get<double>(), 0.0) << file << ": " << line;
      }
    EXPECT_EQ(exchanges, 1) << file;
  }
  fs::remove_all(dir);
}
