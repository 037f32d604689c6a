// The DiPaCo integration tests' fixture: a dense feature model and 2x2 routes built once and copied into each test
// process's directory (CTest runs each test as its own process, possibly in parallel), and the command line of a small
// DiPaCo run.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <functional>
#include <string>
#include <system_error>

#include "shell.h"
#include "test_corpus.h"
#include "test_paths.h"  // generated: TRIBUTARY_CLI, TRIBUTARY_SOURCE_DIR, ...
#include "tributary/core/fs.h"
#include "tributary/data/dataset.h"
#include "tributary/routing/units.h"

namespace dipaco_test {

inline tributary::fs::path work() {
  return tributary::fs::temp_directory_path() / ("trib_dipaco_" + std::to_string(::getpid()));
}
inline tributary::fs::path data() {
  return tributary::test_support::test_data_dir(
      (tributary::fs::temp_directory_path() / "trib_integration" / "data").string());
}
inline std::pair<int, std::string> sh(const std::string& cmd) { return tributary::test_support::run_shell(cmd); }
inline const std::string cli = TRIBUTARY_CLI;

inline std::string model_flags() {
  return " --set model.num_layers=2 --set model.num_levels=2 --set model.width=64 --set model.context=64"
         " --set train.threads=1 --set optim.warmup_steps=2 --set train.batch_size=8 --set data.dir=" +
         data().string();
}

// `train` arguments of a 2x2 DiPaCo run of 2 rounds x 10 inner steps into work()/run.
inline std::string dipaco(const std::string& run, const std::string& routes, const std::string& extra) {
  return " train --overwrite" + model_flags() + " --set train.steps=20 --set dist.inner_steps=10" +
         " --set dipaco.modules=2x2 --set dipaco.routes=" + (work() / routes).string() +
         " --set dipaco.init_from=" + (work() / "dense").string() + " --set dipaco.eval_units=64" +
         " --set dist.heartbeat_timeout_s=5 --set train.run_dir=" + (work() / run).string() + " " + extra;
}

// The dense model and 2x2 routes every test of the suite starts from, built once per CLI binary and corpus and shared
// by the test processes (routing alone costs ~9 s of CPU, and CTest runs each test as its own process). A build in
// progress is never read: it appears under its name by one rename; two processes that build at once make the same
// bytes.
inline tributary::fs::path shared_base() {
  const auto stamp = tributary::fs::last_write_time(cli).time_since_epoch().count();
  return tributary::fs::temp_directory_path() / "trib_integration" /
         ("dipaco_base_" + std::to_string(stamp) + "_" + std::to_string(std::hash<std::string>{}(data().string())));
}

class Dipaco : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    namespace fs = tributary::fs;
    fs::create_directories(work());
    tributary::test_support::ensure_test_corpus(data());
    const fs::path base = shared_base();
    if (!fs::exists(base / "routes" / "route.json")) {
      const fs::path tmp = base.string() + ".tmp-" + std::to_string(::getpid());
      auto [rc, out] =
          sh(cli + " train --overwrite" + model_flags() + " --set train.steps=20 --set train.eval_every=0" +
             " --set train.run_dir=" + (tmp / "dense").string());
      ASSERT_EQ(rc, 0) << out;
      auto [rc2, out2] = sh(cli + " route --model " + (tmp / "dense").string() + " --data " + data().string() +
                            " --modules 2x2 --method product --overwrite --out " + (tmp / "routes").string());
      ASSERT_EQ(rc2, 0) << out2;
      std::error_code taken;  // another process was first
      fs::rename(tmp, base, taken);
      if (taken) fs::remove_all(tmp);
    }
    fs::copy(base / "dense", work() / "dense", fs::copy_options::recursive);
    fs::copy(base / "routes", work() / "routes", fs::copy_options::recursive);
  }
  static void TearDownTestSuite() { tributary::fs::remove_all(work()); }
};

}  // namespace dipaco_test
