// Issue 12, item 6 and the fuzz test it asks for: seeded, time-bounded mutations of dataset.json and of plan's
// cluster/workload files. Every mutation either loads as a valid file or is refused with a tributary::Error naming the
// file — never another exception type (exit 3, "a bug in Tributary"), a crash or a hang.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>

#include "support/json_fuzz.h"
#include "tributary/core/error.h"
#include "tributary/core/fs.h"
#include "tributary/data/dataset.h"
#include "tributary/sched/cluster.h"
#include "tributary/sched/workload.h"

using namespace tributary;

namespace {

constexpr auto kBudget = std::chrono::seconds(4);  // per fuzz test: bounded, like the shard and safetensors ones

fs::path fresh_dataset() {
  auto dir = fs::temp_directory_path() / "trib_fuzz_ds";
  fs::remove_all(dir);
  Corpus c;
  for (int i = 0; i < 80; ++i) c.docs.push_back({"fuzz document " + std::to_string(i), 0});
  c.domain_id("default");
  build_dataset(c, dir, {.val_permille = 200});
  return dir;
}

using test_support::fuzz_outcome;

}  // namespace

TEST(FileFuzz, DatasetJson) {
  const fs::path dir = fresh_dataset(), meta = dir / "dataset.json";
  const auto valid = nlohmann::json::parse(read_file(meta));
  SplitMix64 rng(12);
  int ok = 0, refused = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 3000 && std::chrono::steady_clock::now() - start < kBudget; ++i) {
    const std::string text = test_support::mutate_json(valid, rng);
    write_file(meta, text, false);
    const std::string got = fuzz_outcome(dir.string(), [&] {  // dataset.json or the shard it names
      Dataset ds = Dataset::open(dir);
      ds.load_tokens("train");
      ds.load_tokens("val");
    });
    ASSERT_TRUE(got == "ok" || got == "error") << "mutation " << i << ": " << got << "\n" << text;
    (got == "ok" ? ok : refused) += 1;
  }
  EXPECT_GT(refused, 100) << "the mutations must reach the checks";
  std::printf("dataset.json: %d loaded, %d refused\n", ok, refused);
  // the issue's cases, each refused naming the file
  for (const auto& [pointer, value] :
       std::vector<std::pair<std::string, nlohmann::json>>{{"/tokenizer/vocab_size", 0},
                                                           {"/tokenizer/kind", "bogus"},
                                                           {"/splits/val/num_bytes", -5},
                                                           {"/splits/train/shards/0", "../other/train-00000.bin"},
                                                           {"/splits/train/num_tokens", 7}}) {
    auto j = valid;
    j[nlohmann::json::json_pointer(pointer)] = value;
    write_file(meta, j.dump(), false);
    EXPECT_EQ(fuzz_outcome(meta.string(), [&] { Dataset::open(dir).load_tokens("train"); }), "error") << pointer;
  }
  fs::remove_all(dir);
}

TEST(FileFuzz, PlanClusterAndWorkloadFiles) {
  const auto cluster = nlohmann::json::parse(R"({"name": "c", "regions": [
      {"name": "a", "devices": 4, "tflops": 100, "memory_gb": 16}, {"name": "b", "devices": 4}],
      "latency_ms": [[0.1, 50], [50, 0.1]], "bandwidth_gbps": [[100, 1], [1, 100]]})");
  const auto matrix = nlohmann::json::parse(R"({"latency_ms": [[0, 1, 2], [1, 0, 3], [2, 3, 0]],
      "bandwidth_gbps": [[9, 1, 1], [1, 9, 1], [1, 1, 9]], "device_regions": ["x", "y", "z"],
      "devices": [{"tflops": 1}, {"tflops": 2}, {"memory_gb": 3}]})");
  const auto workload = nlohmann::json::parse(R"({"name": "w", "num_layers": 24, "width": 2048, "seq_len": 2048,
      "global_batch": 512, "num_parameters": 1.3e9, "d_dp": 2, "d_pp": 4})");
  SplitMix64 rng(7);
  int refused = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 20000 && std::chrono::steady_clock::now() - start < kBudget; ++i) {
    const auto& base = i % 3 == 0 ? cluster : i % 3 == 1 ? matrix : workload;
    const std::string text = test_support::mutate_json(base, rng);
    const std::string got = i % 3 == 2 ? fuzz_outcome("fuzz.json", [&] { sched::parse_workload(text, "fuzz.json"); })
                                       : fuzz_outcome("fuzz.json", [&] { sched::parse_cluster(text, "fuzz.json"); });
    ASSERT_TRUE(got == "ok" || got == "error") << "mutation " << i << ": " << got << "\n" << text;
    refused += got == "error";
  }
  EXPECT_GT(refused, 100);
}
