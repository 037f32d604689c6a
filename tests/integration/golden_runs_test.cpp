// Golden runs: fixed-seed runs of every algorithm (single, DP, DiLoCo, Streaming, a 1F1B pipeline, local parallelism,
// fault-tolerant DiLoCo through one death, DiPaCo; islands of one rank, compared with DiLoCo) on the tiny model,
// compared bit for bit with losses and checkpoint hashes recorded before a refactor (torchtitan's rule: a refactor
// reproduces the losses exactly).
//
// What is compared: every logged training loss (log_every = 1) and validation loss, in order; DiPaCo's per-task
// losses keyed by (round, path); the xxh64 of every .safetensors file the run leaves (final checkpoint, DiPaCo's
// modules and best paths, the router).
//
// DiPaCo on two workers is not bit-deterministic by design: tasks are claimed from a queue as workers become free,
// and a module's sum of path contributions is grouped by the worker that ran them (fp32 addition is not
// associative: the stem, shared by all four paths, differs in its last bits between assignments). So that run
// compares its first round exactly (every task starts from the same global modules) and the rest to 1e-6; the same
// grid on one worker (a fixed task order) is compared bit for bit, hashes included.
//
// Bit-exactness holds for one corpus and one floating-point platform (BLAS kernels, vector width). ATen picks its
// vectorised kernels by the CPU (an AVX-512 machine reduces in other lanes than an AVX2 one, and the losses differ in
// their last bits), so the goldens also record the kernels' capability they ran with, and the runs here are pinned to
// it (ATEN_CPU_CAPABILITY) where this CPU has it; recording pins AVX2 where the CPU has it, the widest set of machines
// that can compare exactly. The goldens carry a fingerprint of all three: with another corpus the test skips (nothing
// comparable; under CI=true it fails instead); with another platform it compares the losses to 1e-3 relative and skips
// the hashes, and says so. Record again (only when a change is *meant* to change the numbers, and say why in the
// commit) with:
//   TRIBUTARY_GOLDEN_RECORD=1 ./build/tributary_tests --gtest_filter='GoldenRuns.*'
#include <gtest/gtest.h>

#include <unistd.h>

#include <fmt/format.h>
#include <algorithm>
#include <cctype>
#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

#include <ATen/Version.h>

#include "shell.h"
#include "test_paths.h"  // generated: TRIBUTARY_CLI, TRIBUTARY_SOURCE_DIR, ...
#include "tributary/core/fs.h"
#include "tributary/core/hash.h"
#include "tributary/data/corpus.h"
#include "tributary/data/dataset.h"

using namespace tributary;
using nlohmann::json;

namespace {

fs::path work() { return fs::temp_directory_path() / ("trib_golden_" + std::to_string(::getpid())); }
// The corpus is tests/golden/corpus (committed text, tests/golden/CORPUS.md), not the integration tests' corpus: that
// one is built from Debian's text packages and changes with their versions, which would make the goldens incomparable.
fs::path data() { return work() / "corpus"; }
fs::path golden_file() { return fs::path(TRIBUTARY_SOURCE_DIR) / "tests" / "golden" / "runs.json"; }
const std::string cli = TRIBUTARY_CLI;

std::string file_hash(const fs::path& p) {
  const std::string bytes = read_file(p);
  return hex64(hash64(bytes));
}

// The corpus: every file of the dataset directory, in name order.
std::string data_fingerprint() {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(data()))
    if (e.is_regular_file()) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  Hasher h;
  for (const auto& f : files) {
    const std::string name = f.filename().string(), bytes = read_file(f);
    h.update(name.data(), name.size());
    h.update(bytes.data(), bytes.size());
  }
  return hex64(h.digest());
}

// The platform: the bits of a matmul, an exp and a reduction on one thread (BLAS kernel, SLEEF vector width).
std::string numerics_fingerprint() {
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  torch::manual_seed(7);
  auto a = torch::randn({96, 80}), b = torch::randn({80, 72});
  auto c = torch::matmul(a, b);
  auto d = torch::softmax(c, 1).exp().sum(0).contiguous();
  at::set_num_threads(threads);
  Hasher h;
  h.update(c.data_ptr<float>(), size_t(c.numel()) * 4);
  h.update(d.data_ptr<float>(), size_t(d.numel()) * 4);
  return hex64(h.digest());
}

// The capability ATen's CPU kernels run with in this process ("AVX2", "AVX512", "DEFAULT", ...).
std::string cpu_capability() { return at::get_cpu_capability(); }

// Pins the runs this test starts to `wanted` when this CPU can run it (AVX2 code runs on an AVX-512 machine).
bool pin_cpu_capability(const std::string& wanted) {
  const std::string here = cpu_capability();
  const bool can = wanted == here || (wanted == "AVX2" && here == "AVX512");
  if (!can) return false;
  std::string lower = wanted;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  ::setenv("ATEN_CPU_CAPABILITY", lower.c_str(), 1);
  return true;
}

std::string tiny_model() {
  return " --set model.num_layers=2 --set model.num_levels=2 --set model.width=64 --set model.context=64"
         " --set optim.warmup_steps=2 --set train.threads=1 --set train.log_every=1 --set train.eval_batches=2"
         " --set data.dir=" +
         data().string();
}

std::string train(const std::string& run, const std::string& extra) {
  return " train --overwrite" + tiny_model() +
         " --set train.eval_every=12 --set train.run_dir=" + (work() / run).string() + " " + extra;
}

std::string launch2() { return cli + " launch --nproc 2 --master-port 0 --"; }

void run_ok(const std::string& cmd) {
  auto [rc, out] = test_support::run_shell(cmd);
  ASSERT_EQ(rc, 0) << cmd << "\n" << out;
}

std::vector<json> jsonl(const fs::path& p) {
  std::vector<json> lines;
  std::istringstream in(read_file(p));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(json::parse(line));
  return lines;
}

// Losses in log order and the hashes of the last checkpoint's tensors.
json trainer_record(const std::string& run) {
  json rec = {{"losses", json::array()}, {"val_losses", json::array()}, {"files", json::object()}};
  for (const auto& m : jsonl(work() / run / "metrics.jsonl")) {
    if (m.contains("loss")) rec["losses"].push_back(m["loss"]);
    if (m.contains("val_loss")) rec["val_losses"].push_back(m["val_loss"]);
  }
  const auto summary = json::parse(read_file(work() / run / "summary.json"));
  const fs::path ckpt = summary.at("checkpoint").get<std::string>();
  for (const auto& e : fs::directory_iterator(ckpt))
    if (e.path().extension() == ".safetensors") rec["files"][e.path().filename().string()] = file_hash(e.path());
  return rec;
}

json dipaco_record(const std::string& run) {
  json rec = {{"losses", json::object()}, {"files", json::object()}};
  for (const auto& name : {"metrics.jsonl", "metrics-rank1.jsonl"})
    if (fs::exists(work() / run / name))
      for (const auto& m : jsonl(work() / run / name))
        if (m.contains("path"))
          rec["losses"][fmt::format("round{}.path{}", m["round"].get<int>(), m["path"].get<int>())] = m["loss"];
  for (const char* dir : {"modules", "best"})
    for (const auto& e : fs::directory_iterator(work() / run / dir))
      if (e.path().extension() == ".safetensors")
        rec["files"][std::string(dir) + "/" + e.path().filename().string()] = file_hash(e.path());
  const auto summary = json::parse(read_file(work() / run / "summary.json"));
  rec["val_losses"] = json::array({summary["val_loss"], summary["val_loss_early_stopped"]});
  return rec;
}

json record_all() {
  json runs;
  run_ok(cli + train("single", "--set train.steps=24 --set train.batch_size=8"));
  runs["single"] = trainer_record("single");
  run_ok(launch2() + train("ddp", "--set train.steps=24 --set train.batch_size=4 --set dist.algorithm=ddp"));
  runs["ddp"] = trainer_record("ddp");
  // QSR (alpha 0.004, H = 4): H grows from 4 as the inner lr decays.
  run_ok(launch2() + train("diloco",
                           "--set train.steps=24 --set train.batch_size=4 --set dist.inner_steps=4 "
                           "--set dist.qsr_alpha=0.004"));
  runs["diloco"] = trainer_record("diloco");
  // The same as islands of one rank each (parallel.islands = 2 on two ranks): the islands' runtime must be flat
  // DiLoCo bit for bit (compared with "diloco", not recorded on its own).
  run_ok(launch2() + train("islands_of_one",
                           "--set train.steps=24 --set train.batch_size=4 --set dist.inner_steps=4 "
                           "--set dist.qsr_alpha=0.004 --set parallel.islands=2"));
  runs["islands_of_one"] = trainer_record("islands_of_one");
  // Streaming: data-parallel warm-up, two staggered fragments, overlapped by one step, int8 on the wire.
  run_ok(launch2() + train("streaming",
                           "--set train.steps=24 --set train.batch_size=4 --set dist.inner_steps=6 "
                           "--set dist.fragments=2 --set dist.overlap_steps=1 "
                           "--set dist.warmup_ddp_steps=4 --set dist.compression=int8"));
  runs["streaming"] = trainer_record("streaming");
  // One pipeline of two stages (1F1B, two micro-batches): the loss is the last stage's, the checkpoint consolidated.
  run_ok(launch2() + train("pipeline",
                           "--set train.steps=24 --set train.batch_size=8 "
                           "--set parallel.pipeline_stages=2 --set parallel.schedule=1f1b "
                           "--set parallel.micro_batches=2"));
  runs["pipeline"] = trainer_record("pipeline");
  // Two pipelines of two stages, DiLoCo per stage (H = 4): four ranks, stage groups across the pipelines.
  run_ok(cli + " launch --nproc 4 --master-port 0 --" +
         train("pipeline_diloco",
               "--set train.steps=16 --set train.batch_size=4 --set parallel.pipeline_stages=2 "
               "--set parallel.micro_batches=2 --set dist.algorithm=diloco --set dist.inner_steps=4"));
  runs["pipeline_diloco"] = trainer_record("pipeline_diloco");
  // The same as two islands holding one pipeline each (island-major ranks: the stages of a pipeline on one island's
  // ranks, DiLoCo per stage across the islands): the same computation placed otherwise, bit for bit (compared with
  // "pipeline_diloco", not recorded on its own).
  run_ok(cli + " launch --nproc 4 --master-port 0 --" +
         train("pipeline_islands",
               "--set train.steps=16 --set train.batch_size=4 --set parallel.pipeline_stages=2 "
               "--set parallel.micro_batches=2 --set dist.algorithm=diloco --set dist.inner_steps=4 "
               "--set parallel.islands=2"));
  runs["pipeline_islands"] = trainer_record("pipeline_islands");
  // Local parallelism in one process: two chunks of one block, each with its auxiliary head.
  run_ok(cli + train("local", "--set train.steps=24 --set train.batch_size=8 --set local.chunks=2"));
  runs["local"] = trainer_record("local");
  // Fault-tolerant DiLoCo on three workers; worker 2 is killed at step 6 (in the second round, H = 4): that round is
  // redone by the two survivors, who finish the run.
  run_ok("TRIBUTARY_FAIL_RANK=2 TRIBUTARY_FAIL_STEP=6 " + cli +
         " launch --nproc 3 --master-port 0 --max-failures 1 --grace 2 --" +
         train("ft_diloco",
               "--set train.steps=16 --set train.batch_size=4 --set dist.inner_steps=4 "
               "--set dist.fault_tolerant=true --set dist.heartbeat_timeout_s=5 "
               "--set dist.collective_timeout_s=30 --set dist.store_timeout_s=30"));
  runs["ft_diloco"] = trainer_record("ft_diloco");
  const auto ft = json::parse(read_file(work() / "ft_diloco" / "summary.json"));
  runs["ft_diloco"]["members"] = {ft["world_size"], ft["reformations"]};  // [2, 1]: the death happened
  // DiPaCo 2x2 on two workers: a dense start, product k-means routes, two rounds of tau = 8.
  run_ok(cli + train("dense", "--set train.steps=12 --set train.batch_size=8"));
  run_ok(cli + " route --model " + (work() / "dense").string() + " --data " + data().string() +
         " --modules 2x2 --method product --overwrite --out " + (work() / "routes").string());
  json route_files;
  for (const auto& e : fs::directory_iterator(work() / "routes"))
    if (e.path().extension() == ".safetensors") route_files[e.path().filename().string()] = file_hash(e.path());
  route_files["path-0/train-00000.bin"] = file_hash(work() / "routes" / "path-0" / "train-00000.bin");
  runs["routes"] = {{"files", route_files}};
  run_ok(launch2() + " train --overwrite" + tiny_model() + " --set train.batch_size=8 --set train.steps=16" +
         " --set dist.inner_steps=8 --set dipaco.modules=2x2 --set dipaco.routes=" + (work() / "routes").string() +
         " --set dipaco.init_from=" + (work() / "dense").string() + " --set dipaco.eval_units=64" +
         " --set train.run_dir=" + (work() / "dipaco").string());
  runs["dipaco"] = dipaco_record("dipaco");
  runs["dipaco"]["order_dependent"] = true;
  run_ok(cli + " train --overwrite" + tiny_model() + " --set train.batch_size=8 --set train.steps=16" +
         " --set dist.inner_steps=8 --set dipaco.modules=2x2 --set dipaco.routes=" + (work() / "routes").string() +
         " --set dipaco.init_from=" + (work() / "dense").string() + " --set dipaco.eval_units=64" +
         " --set train.run_dir=" + (work() / "dipaco1").string());
  runs["dipaco_one_worker"] = dipaco_record("dipaco1");
  return runs;
}

// rtol 0: bit for bit.
void compare_losses(const std::string& where, const json& want, const json& got, double rtol,
                    const std::string& exact_prefix = "") {
  ASSERT_EQ(want.size(), got.size()) << where << ": number of losses";
  if (want.is_object()) {
    for (const auto& [key, value] : want.items()) {
      ASSERT_TRUE(got.contains(key)) << where << " " << key;
      const double tol = !exact_prefix.empty() && key.rfind(exact_prefix, 0) == 0 ? 0.0 : rtol;
      compare_losses(where + " " + key, json::array({value}), json::array({got[key]}), tol);
    }
    return;
  }
  for (size_t i = 0; i < want.size(); ++i) {
    const double a = want[i].get<double>(), b = got[i].get<double>();
    if (rtol == 0) {
      EXPECT_EQ(a, b) << where << " [" << i << "]: " << fmt::format("{:.17g} vs {:.17g}", a, b);
    } else {
      EXPECT_NEAR(a, b, rtol * std::abs(a)) << where << " [" << i << "]";
    }
  }
}

class GoldenRuns : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::create_directories(work());
    run_ok(cli + " data build " + TRIBUTARY_SOURCE_DIR + "/tests/golden/corpus --val-permille 100 --out " +
           data().string());
  }
  void TearDown() override { fs::remove_all(work()); }
};

}  // namespace

TEST_F(GoldenRuns, EveryAlgorithmReproducesItsRecordedLossesAndCheckpoints) {
  json fingerprint = {{"data", data_fingerprint()}, {"numerics", numerics_fingerprint()}};
  if (std::getenv("TRIBUTARY_GOLDEN_RECORD")) {
    fingerprint["cpu_capability"] = pin_cpu_capability("AVX2") ? std::string("AVX2") : cpu_capability();
    json golden = {{"fingerprint", fingerprint}, {"runs", record_all()}};
    fs::create_directories(golden_file().parent_path());
    write_file_atomic(golden_file(), golden.dump(1) + "\n");
    GTEST_SKIP() << "recorded " << golden_file();
  }
  ASSERT_TRUE(fs::exists(golden_file())) << "no goldens: record them with TRIBUTARY_GOLDEN_RECORD=1";
  const json golden = json::parse(read_file(golden_file()));
  // CI must compare: a corpus that changed under it is a failure there, not a quiet skip.
  if (golden["fingerprint"]["data"] != fingerprint["data"] && std::getenv("CI"))
    FAIL() << "CI=true and the test corpus differs from the one the goldens were recorded on (" << fingerprint["data"]
           << " vs " << golden["fingerprint"]["data"] << "): nothing comparable; record them again on purpose "
           << "(TRIBUTARY_GOLDEN_RECORD=1) if the corpus was meant to change";
  if (golden["fingerprint"]["data"] != fingerprint["data"])
    GTEST_SKIP() << "the test corpus differs from the one the goldens were recorded on (" << fingerprint["data"]
                 << " vs " << golden["fingerprint"]["data"] << "): nothing comparable";
  const std::string recorded_capability = golden["fingerprint"].value("cpu_capability", std::string());
  const bool same_kernels = recorded_capability.empty() || pin_cpu_capability(recorded_capability);
  const bool exact = golden["fingerprint"]["numerics"] == fingerprint["numerics"] && same_kernels;
  if (!exact)
    std::cerr << "[golden] another floating-point platform than the goldens' (" << fingerprint["numerics"] << ", "
              << cpu_capability() << " kernels; recorded: " << golden["fingerprint"] << "): losses compared to 1e-3, "
              << "hashes not compared\n";
  const json runs = record_all();
  for (const auto& [name, want] : golden["runs"].items()) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(runs.contains(name));
    const json& got = runs[name];
    const bool order_dependent = want.value("order_dependent", false);
    const double rtol = !exact ? 1e-3 : order_dependent ? 1e-6 : 0.0;
    if (want.contains("losses")) compare_losses(name, want["losses"], got["losses"], rtol, exact ? "round0." : "");
    if (want.contains("val_losses")) compare_losses(name + " val", want["val_losses"], got["val_losses"], rtol);
    if (want.contains("members")) {
      EXPECT_EQ(want["members"], got["members"]) << name << ": [members, re-formations]";
    }
    if (exact && !order_dependent) {
      EXPECT_EQ(want["files"], got["files"]) << name << ": checkpoint tensors differ";
    }
  }
  // Islands of one rank are flat DiLoCo: the same losses, the same checkpoint files, bit for bit.
  const json& flat = golden["runs"]["diloco"];
  compare_losses("islands_of_one", flat["losses"], runs["islands_of_one"]["losses"], exact ? 0.0 : 1e-3);
  compare_losses("islands_of_one val", flat["val_losses"], runs["islands_of_one"]["val_losses"], exact ? 0.0 : 1e-3);
  if (exact) {
    EXPECT_EQ(flat["files"], runs["islands_of_one"]["files"]) << "islands of one rank: checkpoint tensors";
  }
  // A pipeline per island is DiLoCo per stage across the pipelines: the same losses and consolidated model (the
  // ranks' own files are named by rank, and the ranks are placed otherwise).
  const json& megatron = golden["runs"]["pipeline_diloco"];
  const json& islands = runs["pipeline_islands"];
  compare_losses("pipeline_islands", megatron["losses"], islands["losses"], exact ? 0.0 : 1e-3);
  compare_losses("pipeline_islands val", megatron["val_losses"], islands["val_losses"], exact ? 0.0 : 1e-3);
  if (exact) {
    EXPECT_EQ(megatron["files"]["model.safetensors"], islands["files"]["model.safetensors"])
        << "a pipeline per island: the consolidated model";
  }
}
