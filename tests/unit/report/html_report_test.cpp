// `tributary report`'s reading and rendering (report/): what a run directory holds becomes the page's
// sections; what is not a run is refused naming the directory, file and line. The browser test of a real
// multi-worker run is in integration/fault_tolerance_test.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cmath>
#include <regex>

#include "support/error_of.h"
#include "tributary/core/fs.h"
#include "tributary/report/html_report.h"
#include "tributary/report/svg_chart.h"

using namespace tributary;

namespace {

struct RunDir {
  fs::path dir =
      fs::temp_directory_path() /
      fmt::format("trib_report_{}_{}", ::getpid(), ::testing::UnitTest::GetInstance()->current_test_info()->name());
  RunDir() {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~RunDir() { fs::remove_all(dir); }
  void put(const std::string& name, const std::string& text) const {
    fs::create_directories((dir / name).parent_path());
    write_file_atomic(dir / name, text);
  }
};

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST(RunReportHtml, WhatIsNotARunIsRefusedNamingTheDirectoryFileAndLine) {
  RunDir run;
  EXPECT_NE(test_support::error_of([&] { report::read_run_files(run.dir / "nope"); }).find("is not a directory"),
            std::string::npos);
  EXPECT_NE(test_support::error_of([&] {
              report::read_run_files(run.dir);
            }).find(run.dir.string() + "' is not a run directory: it has no metrics.jsonl"),
            std::string::npos);
  run.put("metrics.jsonl", "{\"step\":1,\"loss\":5}\nnot json\n{\"step\":2,\"loss\":4}\n");
  EXPECT_NE(test_support::error_of([&] {
              report::read_run_files(run.dir);
            }).find("metrics.jsonl line 2 is not a JSON object"),
            std::string::npos);
  run.put("metrics.jsonl", "{\"step\":1,\"loss\":5}\n");
  run.put("summary.json", "[1,2]");
  EXPECT_NE(test_support::error_of([&] { report::read_run_files(run.dir); }).find("summary.json is not a JSON object"),
            std::string::npos);
  run.put("summary.json", "{}");
  EXPECT_NE(test_support::error_of([&] {
              report::write_report(run.dir, run.dir / "no" / "such" / "r.html");
            }).find("does not exist"),
            std::string::npos);
}

TEST(RunReportHtml, AnUnfinishedSingleProcessRunFillsEverySectionAndSaysWhatItLacks) {
  // A crash mid-write leaves a torn last line: skipped and mentioned, the rest drawn.
  RunDir run;
  run.put(
      "metrics.jsonl",
      "{\"step\":10,\"tokens\":1000,\"loss\":4.0,\"loss_avg\":4.5,\"tokens_per_s\":900,\"mfu\":0.4,\"elapsed_s\":1}\n"
      "{\"step\":20,\"tokens\":2000,\"val_loss\":3.5,\"elapsed_s\":2.5}\n"
      "{\"step\":20,\"tokens\":2000,\"loss\":3.0,\"loss_avg\":3.2,\"tokens_per_s\":950,\"mfu\":0.42,\"elapsed_s\":2}\n"
      "{\"step\":30,\"tok");
  run.put("config.toml", "[model]\nwidth = 64\n");
  const std::string page = report::render_html(report::read_run_files(run.dir));
  for (const char* id : {"overview", "loss", "workers", "communication", "timeline", "faults", "config"})
    EXPECT_EQ(count(page, fmt::format("<section id=\"{}\">", id)), 1u) << id;
  // Issue 45, item 4: the parts this kind of run does not have are left out, not shown empty.
  for (const char* id : {"dipaco", "pipeline"}) EXPECT_EQ(count(page, fmt::format("id=\"{}\"", id)), 0u) << id;
  EXPECT_NE(page.find("the last line is torn"), std::string::npos);
  EXPECT_NE(page.find("unfinished: no summary.json"), std::string::npos);
  EXPECT_NE(page.find("single-process run"), std::string::npos);
  EXPECT_NE(page.find("width = 64"), std::string::npos);
  EXPECT_EQ(count(page, "<svg class=\"chart\""), 3u) << "loss vs tokens, vs time, tokens/s";
  EXPECT_EQ(page.find("no data"), std::string::npos) << "every chart has points";
  EXPECT_EQ(page.find("http"), page.find("http://www.w3.org/2000/svg")) << "no address but the SVG namespace";
}

TEST(RunReportHtml, WorkersStagesAndMembershipComeFromTheirFiles) {
  RunDir run;
  run.put("metrics.jsonl",
          "{\"step\":4,\"tokens\":400,\"loss\":4.0,\"tokens_per_s\":900,\"mfu\":0.4,\"elapsed_s\":1,"
          "\"stage_step_s\":[0.1,0.2]}\n"
          "{\"step\":4,\"outer_step\":1,\"bytes_sent\":1e6,\"bytes_recv\":1e6,\"comm_s\":0.5,\"compute_s\":2,"
          "\"elapsed_s\":2.5,\"world_size\":2}\n"
          "{\"step\":4,\"event\":\"membership\",\"members\":1,\"members_before\":2}\n");
  run.put("workers/rank0.jsonl", "{\"step\":4,\"outer_step\":1,\"comm_s\":0.5,\"compute_s\":2,\"elapsed_s\":2.5}\n");
  run.put("workers/rank1.jsonl", "{\"step\":4,\"outer_step\":1,\"comm_s\":0.1,\"compute_s\":2.4,\"elapsed_s\":2.5}\n");
  run.put("summary.json", R"({"algorithm":"diloco","world_size":1,"stages":[{"compute_s":3,"blocked_s":1,"bubble":0.25},
                              {"compute_s":2,"blocked_s":2,"bubble":0.5}],"rejected":2,"reformations":1})");
  const std::string page = report::render_html(report::read_run_files(run.dir));
  EXPECT_NE(page.find("<td>worker 1</td>"), std::string::npos);
  EXPECT_NE(page.find("2 -&gt; 1 workers"), std::string::npos);
  EXPECT_NE(page.find("<td>stage 1</td><td>2.00</td><td>2.00</td><td>50.0</td>"), std::string::npos);
  EXPECT_NE(page.find("step seconds per stage"), std::string::npos);
  EXPECT_EQ(count(page, "<title>worker 1 blocked in communication: 2.40-2.50 s</title>"), 1u);
}

TEST(RunReportHtml, TheWarmUpsGradientAveragesAreNotCountedAsOuterExchanges) {
  // Issue 45, item 4: DiLoCo's data-parallel warm-up logs each interval's gradient averages as outer step 0; their
  // bytes (many steps' all-reduces) made the demo's "per exchange (median)" read 177 MB for 19.7 MB exchanges.
  RunDir run;
  std::string lines = "{\"step\":1,\"tokens\":100,\"loss\":4.0,\"tokens_per_s\":900,\"mfu\":0.4,\"elapsed_s\":1}\n";
  for (int step : {25, 50, 75})  // the warm-up: 177 MB per logged interval
    lines += fmt::format(
        "{{\"step\":{},\"outer_step\":0,\"bytes_sent\":1.77e8,\"bytes_recv\":1.77e8,\"comm_s\":1,"
        "\"compute_s\":2,\"elapsed_s\":{}}}\n",
        step, step);
  for (int outer : {1, 2})  // DiLoCo: 19.7 MB per outer step
    lines += fmt::format(
        "{{\"step\":{},\"outer_step\":{},\"bytes_sent\":1.97e7,\"bytes_recv\":1.97e7,\"comm_s\":1,"
        "\"compute_s\":2,\"elapsed_s\":{}}}\n",
        75 + 50 * outer, outer, 75 + 50 * outer);
  run.put("metrics.jsonl", lines);
  run.put("summary.json", R"({"algorithm":"diloco","world_size":2,"compression":"fp32"})");
  const std::string page = report::render_html(report::read_run_files(run.dir));
  EXPECT_NE(page.find("<td>data-parallel warm-up (logged intervals)</td><td>3</td><td>531 MB</td>"), std::string::npos)
      << page;
  EXPECT_NE(page.find("<td>exchanges</td><td>2</td><td>39.4 MB</td><td>39.4 MB</td><td>19.7 MB</td>"),
            std::string::npos)
      << page;
}

TEST(RunReportHtml, ACountAxisHasOnlyWholeTicks) {
  // Issue 45, item 4: "Workers per round" had ticks at 3.2, 3.4, ... workers.
  auto labels = [](const std::string& svg) {
    std::vector<double> out;
    const std::regex number(R"(>(-?[0-9]+(\.[0-9]+)?)</text>)");
    for (std::sregex_iterator it(svg.begin(), svg.end(), number), end; it != end; ++it)
      out.push_back(std::stod((*it)[1]));
    return out;
  };
  const auto counts = labels(report::line_chart({{"workers", {{1, 4}, {2, 3}, {3, 3}, {4, 4}, {5, 4}}}},
                                                {"Workers per round", "round", "workers"}));
  ASSERT_GE(counts.size(), 4u);
  for (double v : counts) EXPECT_EQ(v, std::floor(v)) << "a tick between two whole counts";
  // a quantity that is not a count keeps its fine ticks
  const auto losses = labels(report::line_chart({{"loss", {{1, 3.1}, {2, 3.3}, {3, 3.4}}}}, {"Loss", "step", "loss"}));
  EXPECT_TRUE(std::any_of(losses.begin(), losses.end(), [](double v) { return v != std::floor(v); }));
}

TEST(RunReportHtml, ValuesNearTheLargestDoubleDrawAChartAndEnd) {
  // Issue 46, item 6: token counts 1 and 1.75e308 sent the tick loop to infinity, growing memory without end.
  const std::string svg = report::line_chart({{"loss", {{1, 3.0}, {1.75e308, 2.5}}}}, {"Loss", "tokens", "loss"});
  EXPECT_NE(svg.find("<svg class=\"chart\""), std::string::npos);
  EXPECT_LT(svg.size(), 100000u);
  const std::string huge_y = report::line_chart({{"x", {{1, -1.7e308}, {2, 1.7e308}}}}, {"X", "step", "x"});
  EXPECT_LT(huge_y.size(), 100000u);
}

TEST(RunReportHtml, FilesAUserHandsUsGetAClearErrorNotACrash) {
  // Issue 66, item 14: a worker file named past int's range (std::stoi), a DiPaCo grid that is not one (std::stoll)
  // ended `report` with status 3; a metrics.jsonl that is /dev/zero was read until memory ran out.
  RunDir run;
  run.put("metrics.jsonl", "{\"step\":1,\"tokens\":100,\"loss\":5}\n");
  run.put("workers/rank2147483648.jsonl", "{\"step\":1,\"outer_step\":1,\"comm_s\":0.1,\"compute_s\":1}\n");
  run.put("workers/rank1.jsonl", "{\"step\":1,\"outer_step\":1,\"comm_s\":0.1,\"compute_s\":1,\"elapsed_s\":1.1}\n");
  const report::RunFiles files = report::read_run_files(run.dir);
  EXPECT_EQ(files.workers.size(), 1u) << "the rank no run has is skipped";
  EXPECT_NE(fmt::format("{}", fmt::join(files.notes, "\n")).find("rank2147483648.jsonl: not a rank a run has"),
            std::string::npos);
  for (const char* grid : {R"("x")", R"("4x")", R"("0x4")", R"(16)", R"("99999999999x99999999999")"}) {
    run.put("dipaco.json", fmt::format(R"({{"modules":{},"round":1}})", grid));
    EXPECT_NE(test_support::error_of([&] {
                report::render_html(report::read_run_files(run.dir));
              }).find("dipaco.json: \"modules\" is"),
              std::string::npos)
        << grid;
  }
  fs::remove(run.dir / "dipaco.json");
  fs::remove(run.dir / "metrics.jsonl");
  fs::create_symlink("/dev/zero", run.dir / "metrics.jsonl");
  EXPECT_NE(test_support::error_of([&] { report::read_run_files(run.dir); }).find("is not a regular file"),
            std::string::npos);
}
