// Shared by the multi-process integration tests (tributary launch, real processes, real c10d on loopback): the
// scratch directory and test data, the tiny training command, reading a checkpoint's tensors, and the resume check.
#pragma once

#include <gtest/gtest.h>

#include <fmt/format.h>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "shell.h"
#include "test_corpus.h"
#include "tributary/core/fs.h"
#include "tributary/core/safetensors.h"
#include "tributary/data/dataset.h"
#include "tributary/model/tensor_io.h"

namespace tributary::test_support {

using tributary::fs::path;

inline path work() { return tributary::fs::temp_directory_path() / "trib_distributed"; }
inline path data() {
  return test_data_dir((tributary::fs::temp_directory_path() / "trib_integration" / "data").string());
}

inline std::pair<int, std::string> sh(const std::string& cmd) { return run_shell(cmd); }

// A fault-tolerant run's membership events in its metrics.jsonl, in order: (members before, members after).
inline std::vector<std::pair<int, int>> membership_events(const std::string& run) {
  std::vector<std::pair<int, int>> out;
  std::istringstream in(tributary::read_file(work() / run / "metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.value("event", "") == "membership")
      out.emplace_back(j.at("members_before").get<int>(), j.at("members").get<int>());
  }
  return out;
}

// ` train ...` of a 2-block width-64 model on the test data into work()/run, then `extra`.
inline std::string tiny(const std::string& run, const std::string& extra) {
  return std::string(" train --overwrite --set model.num_layers=2 --set model.width=64 --set model.context=64") +
         " --set optim.warmup_steps=2 --set train.eval_every=0 --set train.eval_batches=2 --set train.log_every=5" +
         " --set train.threads=1 --set data.dir=" + data().string() +
         " --set train.run_dir=" + (work() / run).string() + " " + extra;
}

class Distributed : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tributary::fs::create_directories(work());
    tributary::test_support::ensure_test_corpus(data());
  }
};

// Every tensor of one safetensors file of checkpoint step-N, flattened into one vector.
inline torch::Tensor flat_params(const path& run, int step = 6, const std::string& file = "model.safetensors") {
  auto f = tributary::safetensors::File::load(run / "checkpoints" / fmt::format("step-{:08d}", step) / file);
  std::vector<torch::Tensor> parts;
  for (const auto& [name, view] : f.tensors()) parts.push_back(tributary::to_torch(view).reshape({-1}));
  return torch::cat(parts);
}

inline bool any_process_mentions(const std::string& marker) {
  for (const auto& e : tributary::fs::directory_iterator("/proc")) {
    std::ifstream in(e.path() / "cmdline");
    std::string cmd((std::istreambuf_iterator<char>(in)), {});
    if (cmd.find(marker) != std::string::npos && cmd.find("gtest") == std::string::npos) return true;
  }
  return false;
}

// `launch + tiny(run, args)` uninterrupted into run_full and, into run_cut, stopped after `stop_step` then resumed:
// every named file of the final checkpoint (step `final_step`) must be bit-identical between the two.
inline void expect_resume_bit_exact(const std::string& launch, const std::string& run, const std::string& args,
                                    int stop_step, int final_step, const std::vector<std::string>& files) {
  auto [rc1, out1] = sh(launch + tiny(run + "_full", args));
  ASSERT_EQ(rc1, 0) << out1;
  auto [rc2, out2] = sh(launch + tiny(run + "_cut", args + fmt::format(" --stop-after-step {}", stop_step)));
  ASSERT_EQ(rc2, 0) << out2;
  auto [rc3, out3] = sh(launch + tiny(run + "_cut", args + " --resume"));
  ASSERT_EQ(rc3, 0) << out3;
  EXPECT_NE(out3.find("resumed from"), std::string::npos) << out3;
  for (const auto& file : files) {
    auto a = flat_params(work() / (run + "_full"), final_step, file);
    auto b = flat_params(work() / (run + "_cut"), final_step, file);
    EXPECT_TRUE(torch::equal(a, b)) << file << ": max diff " << (a - b).abs().max().item<double>();
  }
}

}  // namespace tributary::test_support
