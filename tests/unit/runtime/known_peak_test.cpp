// The matmul peak MFU divides by is the best this machine gave (perf/flops.h best_known_peak): a measurement taken
// under load (issue 66, item 7: 10-27 GFLOP/s where an idle core gives 176, MFU printed at 106-206%) yields to the
// kept one; a better one replaces it; a file that cannot be read or written never fails the run.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdlib>

#include "integration/shell.h"
#include "integration/test_corpus.h"
#include "test_paths.h"
#include "tributary/core/fs.h"
#include "tributary/perf/flops.h"

using namespace tributary;

namespace {

struct CacheFile {
  fs::path file = fs::temp_directory_path() / fmt::format("trib_peak_{}.json", ::getpid());
  CacheFile() {
    fs::remove(file);
    ::setenv("TRIBUTARY_PEAK_CACHE", file.c_str(), 1);
  }
  ~CacheFile() {
    ::unsetenv("TRIBUTARY_PEAK_CACHE");
    fs::remove(file);
  }
};

}  // namespace

TEST(KnownPeak, ALowMeasurementYieldsToTheBestKeptAndABetterOneReplacesIt) {
  CacheFile cache;
  const auto first = best_known_peak(100e9, "cpu|float|2 threads|1 workers");
  EXPECT_DOUBLE_EQ(first.flops, 100e9);
  EXPECT_FALSE(first.from_file());
  EXPECT_TRUE(fs::exists(cache.file));
  const auto loaded = best_known_peak(10e9, "cpu|float|2 threads|1 workers");  // measured while the machine was busy
  EXPECT_DOUBLE_EQ(loaded.flops, 100e9);
  EXPECT_DOUBLE_EQ(loaded.measured, 10e9);
  EXPECT_TRUE(loaded.from_file());
  EXPECT_NE(describe_peak(loaded).find(cache.file.string()), std::string::npos) << describe_peak(loaded);
  EXPECT_DOUBLE_EQ(best_known_peak(150e9, "cpu|float|2 threads|1 workers").flops, 150e9);
  EXPECT_DOUBLE_EQ(best_known_peak(1e9, "cpu|float|2 threads|1 workers").flops, 150e9);
  EXPECT_DOUBLE_EQ(best_known_peak(20e9, "cpu|float|1 threads|4 workers").flops, 20e9) << "another key, its own";
  // A file that is no JSON object is replaced; one that cannot be written is skipped.
  write_file(cache.file, "not json");
  EXPECT_DOUBLE_EQ(best_known_peak(7e9, "k").flops, 7e9);
  EXPECT_DOUBLE_EQ(best_known_peak(1e9, "k").flops, 7e9);
  ::setenv("TRIBUTARY_PEAK_CACHE", "/proc/no/such/peak.json", 1);
  const auto unwritable = best_known_peak(5e9, "k");
  EXPECT_DOUBLE_EQ(unwritable.flops, 5e9);
  EXPECT_TRUE(unwritable.file.empty());
}

TEST(KnownPeak, ARunDividesByTheKeptPeakAndSaysSo) {
  // A kept peak far above anything this machine measures: the run's MFU is against it, the start-up line and
  // summary.json say where it came from, and MFU stays within 0-100%.
  CacheFile cache;
  const std::string key = peak_key(torch::kCPU, torch::kFloat32, 1, 1);
  write_file(cache.file, nlohmann::json({{key, 1e15}}).dump());
  const fs::path run = fs::temp_directory_path() / fmt::format("trib_peak_run_{}", ::getpid());
  const std::string data =
      test_support::test_data_dir((fs::temp_directory_path() / "trib_integration" / "data").string());
  test_support::ensure_test_corpus(data);
  const auto [rc, out] = test_support::run_shell(fmt::format(
      "TRIBUTARY_PEAK_CACHE={} {} train --overwrite --set model.num_layers=1 --set model.width=32 --set "
      "model.context=32 --set train.steps=4 --set optim.warmup_steps=0 --set train.threads=1 --set train.eval_every=0 "
      "--set data.dir={} --set train.run_dir={}",
      cache.file.string(), TRIBUTARY_CLI, data, run.string()));
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("MFU is against a matmul peak of 1000000.0 GFLOP/s (1000000.0 GFLOP/s, the best this machine"),
            std::string::npos)
      << out;
  const auto summary = nlohmann::json::parse(read_file(run / "summary.json"));
  EXPECT_DOUBLE_EQ(summary["peak_flops"].get<double>(), 1e15);
  EXPECT_LT(summary["mfu"].get<double>(), 0.01);
  EXPECT_NE(summary["peak_source"].get<std::string>().find(cache.file.string()), std::string::npos);
  fs::remove_all(run);
}
