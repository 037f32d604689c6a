// Issue 46, "status 3 only for our bugs": a seeded fuzz test per kind of file a user hands us or a run leaves behind
// for the next command — the run configuration (TOML file and --set overrides), a checkpoint (manifest.json,
// state.json, config.toml, as load_checkpoint and --resume read them), a run directory as `tributary report` reads it,
// a Hugging Face directory's config.json (import) and a placement file. Every mutation either loads or is refused with
// a tributary::Error naming the file (exit 2) — never another exception type (exit 3), a crash or a hang. Each test
// is bounded in time; dataset.json, plan's cluster/workload files, shards, safetensors and DiPaCo's files have theirs
// beside their readers (file_fuzz_test, shard_test, safetensors_test, dipaco_test).
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>

#include "support/json_fuzz.h"
#include "test_paths.h"  // generated: TRIBUTARY_CLI, TRIBUTARY_SOURCE_DIR, ...
#include "tributary/artifacts/checkpoint.h"
#include "tributary/config/run_config.h"
#include "tributary/config/run_layout.h"
#include "tributary/core/error.h"
#include "tributary/core/fs.h"
#include "tributary/core/hash.h"
#include "tributary/interop/hf_import.h"
#include "tributary/model/hf_llama.h"
#include "tributary/model/tensor_io.h"
#include "tributary/model/transformer.h"
#include "tributary/optim/adamw.h"
#include "tributary/report/html_report.h"
#include "tributary/report/run_files.h"
#include "tributary/runtime/run_state.h"
#include "tributary/sched/placement.h"

using namespace tributary;
using test_support::fuzz_outcome;
using test_support::mutate_json;

namespace {

constexpr auto kBudget = std::chrono::seconds(3);  // per test: thousands of mutations where the reader is quick

bool within_budget(std::chrono::steady_clock::time_point start) {
  return std::chrono::steady_clock::now() - start < kBudget;
}

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("trib_input_fuzz_{}_{}", ::getpid(), name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// Values a hostile or careless hand puts into a TOML file or a --set.
const std::vector<std::string> kTomlValues = {"-1",
                                              "0",
                                              "1",
                                              "1e308",
                                              "-1e308",
                                              "nan",
                                              "inf",
                                              "-inf",
                                              "0.5",
                                              "2147483648",
                                              "9223372036854775807",
                                              "-9223372036854775808",
                                              "\"text\"",
                                              "\"\"",
                                              "\"../../etc/passwd\"",
                                              "true",
                                              "[1, \"x\"]",
                                              "{}",
                                              "\"4,4,2\"",
                                              "\"0:3\"",
                                              "1.7e19"};

std::string mutate_toml(const std::string& text, SplitMix64& rng) {
  std::vector<std::string> lines;
  for (size_t at = 0; at <= text.size();) {
    const size_t end = text.find('\n', at);
    lines.push_back(text.substr(at, end == std::string::npos ? std::string::npos : end - at));
    if (end == std::string::npos) break;
    at = end + 1;
  }
  const int mutations = 1 + static_cast<int>(rng.below(3));
  for (int m = 0; m < mutations && !lines.empty(); ++m) {
    const size_t i = rng.below(lines.size());
    const size_t eq = lines[i].find('=');
    switch (rng.below(4)) {
      case 0:  // another value
        if (eq != std::string::npos)
          lines[i] = lines[i].substr(0, eq + 1) + " " + kTomlValues[rng.below(kTomlValues.size())];
        break;
      case 1:  // the line twice (a duplicate key)
        lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(i), lines[i]);
        break;
      case 2:  // the line gone
        lines.erase(lines.begin() + static_cast<std::ptrdiff_t>(i));
        break;
      default:  // a key of another table, or no table
        lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(i), rng.below(2) ? "[model]" : "bogus = 1");
    }
  }
  std::string out;
  for (const auto& line : lines) out += line + "\n";
  if (rng.below(8) == 0) out = out.substr(0, rng.below(out.size() + 1));  // a torn write
  if (rng.below(8) == 0 && !out.empty()) out[rng.below(out.size())] = static_cast<char>(rng.below(256));
  return out;
}

// A model small enough to build thousands of times.
ModelConfig small_model() {
  ModelConfig c;
  c.vocab_size = 61;
  c.num_layers = 2;
  c.width = 16;
  c.num_heads = 2;
  c.context = 8;
  return c;
}

// Every key of a resolved configuration ("train.steps", ...), from its TOML.
std::vector<std::string> keys_of(const std::string& toml) {
  std::vector<std::string> keys;
  std::string table;
  size_t at = 0;
  while (at < toml.size()) {
    const size_t end = std::min(toml.find('\n', at), toml.size());
    const std::string line = toml.substr(at, end - at);
    at = end + 1;
    if (line.size() > 2 && line.front() == '[') table = line.substr(1, line.find(']') - 1);
    const size_t eq = line.find(" = ");
    if (eq != std::string::npos && line.front() != '#') keys.push_back(table + "." + line.substr(0, eq));
  }
  return keys;
}

}  // namespace

TEST(InputFuzz, RunConfigurationFileAndOverrides) {
  const fs::path dir = scratch("config");
  const std::string base = read_file(fs::path(TRIBUTARY_SOURCE_DIR) / "configs" / "diloco.toml");
  const fs::path file = dir / "run.toml";
  const std::vector<std::string> keys =
      keys_of(RunConfig::load((fs::path(TRIBUTARY_SOURCE_DIR) / "configs" / "diloco.toml").string(), {}).to_toml());
  ASSERT_GT(keys.size(), 40u);
  SplitMix64 rng(46);
  int ok = 0, refused = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 20000 && within_budget(start); ++i) {
    std::vector<std::string> overrides;
    std::string origin = file.string();
    if (i % 2 == 0) {
      write_file(file, mutate_toml(base, rng), false);
    } else {  // the shipped file with hostile --set values (the error names the key)
      write_file(file, base, false);
      const std::string key = keys[rng.below(keys.size())];
      overrides.push_back(key + "=" + kTomlValues[rng.below(kTomlValues.size())]);
      origin = key;
    }
    // An Error names the file (syntax) or the key(s) it refuses (values, combinations): either is the user's to fix.
    std::string got = fuzz_outcome(origin, [&] {
      const RunConfig config = RunConfig::load(file.string(), overrides);
      // What train builds from it next: the layout of a 4-worker run (counts and groups from the keys).
      run_layout(config, DistEnv{.rank = 1, .world_size = 4, .local_rank = 1, .local_world_size = 4});
    });
    if (got.rfind("unnamed: ", 0) == 0) got = "error";
    ASSERT_TRUE(got == "ok" || got == "error") << "mutation " << i << ": " << got << "\n"
                                               << (overrides.empty() ? read_file(file) : overrides.front());
    (got == "ok" ? ok : refused) += 1;
  }
  EXPECT_GT(refused, 100) << "the mutations must reach the checks";
  EXPECT_GT(ok, 20) << "and some must load";
  std::printf("run configuration: %d loaded, %d refused\n", ok, refused);
  fs::remove_all(dir);
}

TEST(InputFuzz, CheckpointAsLoadAndResumeReadIt) {
  const fs::path dir = scratch("checkpoint");
  const ModelConfig mc = small_model();
  Transformer model(mc);
  AdamW optimizer(named_parameters_of(model), {});
  auto tokens = std::make_shared<std::vector<uint32_t>>(4096, 7);
  BatchLoader loader(tokens, {.batch_size = 2, .context = 8}, "fuzz train");
  NamedTensors optim_state = optimizer.state();
  optim_state.emplace_back("rng.cpu", at::detail::getDefaultCPUGenerator().get_state());
  RunConfig config;
  config.model = mc;
  const nlohmann::json state = {{"step", 10},
                                {"tokens", 640},
                                {"elapsed_s", 1.5},
                                {"optimizer_steps", 10},
                                {"loader", {{"epoch", 0}, {"cursor", 20}}},
                                {"loaders", {{{"epoch", 0}, {"cursor", 20}}, {{"epoch", 0}, {"cursor", 20}}}},
                                {"world_size", 2},
                                {"replicas", nlohmann::json::array({{{"last_sync", 10}, {"outer_steps", 2}}})},
                                {"tokenizer", "byte"}};
  const fs::path ckpt =
      save_checkpoint(dir, 10, {named_parameters_of(model), optim_state, state, config.to_toml(), {}, {}, {}}, 1);
  const fs::path manifest_file = ckpt / "manifest.json";
  const auto manifest = nlohmann::json::parse(read_file(manifest_file));
  const std::string config_text = read_file(ckpt / "config.toml");
  // A file rewritten with its manifest entry kept true, so that the mutation reaches the reader behind the checksum.
  auto rewrite = [&](const std::string& name, const std::string& text) {
    write_file(ckpt / name, text, false);
    auto m = manifest;
    m["files"][name] = {{"bytes", text.size()}, {"xxh64", hex64(hash64(text))}};
    write_file(manifest_file, m.dump(2), false);
  };
  SplitMix64 rng(4646);
  int ok = 0, refused = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 5000 && within_budget(start); ++i) {
    write_file(ckpt / "state.json", state.dump(2) + "\n", false);
    write_file(ckpt / "config.toml", config_text, false);
    write_file(manifest_file, manifest.dump(2), false);
    const uint64_t kind = rng.below(3);
    if (kind == 0) rewrite("state.json", mutate_json(state, rng));
    if (kind == 1) write_file(manifest_file, mutate_json(manifest, rng), false);
    if (kind == 2) rewrite("config.toml", mutate_toml(config_text, rng));
    const int rank = static_cast<int>(rng.below(3)), world = rank == 2 ? 3 : 2;
    const std::string got = fuzz_outcome(ckpt.string(), [&] {
      LoadedCheckpoint loaded = load_checkpoint(dir);
      RunConfig::from_toml(loaded.config_toml, (loaded.dir / "config.toml").string());
      restore(loaded, model, optimizer, loader, rank, world);
    });
    ASSERT_TRUE(got == "ok" || got == "error")
        << "mutation " << i << " (kind " << kind << ", rank " << rank << "): " << got << "\n"
        << read_file(kind == 1   ? manifest_file
                     : kind == 0 ? ckpt / "state.json"
                                 : ckpt / "config.toml");
    (got == "ok" ? ok : refused) += 1;
  }
  EXPECT_GT(refused, 100);
  std::printf("checkpoint: %d resumed, %d refused\n", ok, refused);
  fs::remove_all(dir);
}

TEST(InputFuzz, RunDirectoryAsTheReportReadsIt) {
  const fs::path dir = scratch("report");
  const std::vector<nlohmann::json> metrics = {
      nlohmann::json::parse(R"({"elapsed_s":0.12,"grad_norm":1.5,"loss":4.8,"loss_avg":5.1,"lr":0.0019,"mfu":0.42,
        "step":5,"tokens":10240,"tokens_per_s":80242.8})"),
      nlohmann::json::parse(R"({"bytes_recv":493056.0,"bytes_sent":493056.0,"comm_s":0.049,"compute_s":0.21,
        "elapsed_s":0.26,"inner_steps":10,"modelled_link_s":0.0,"outer_step":1,"step":10,"world_size":2})"),
      nlohmann::json::parse(R"({"elapsed_s":0.26,"grad_norm":1.18,"loss":4.29,"loss_avg":4.4,"lr":0.0018,"mfu":0.41,
        "step":10,"tokens":20480,"tokens_per_s":77845.6})"),
      nlohmann::json::parse(
          R"({"step":10,"tokens":20480,"val_loss":3.2,"val_ppl":24.9,"val_bpb":4.6,"elapsed_s":0.3})")};
  const auto summary = nlohmann::json::parse(R"({"algorithm":"diloco","bytes_recv":1479168.0,"bytes_sent":1479168.0,
      "comm_s":0.05,"compression":"fp32","elapsed_s":1.12,"mfu":0.5,"num_parameters":123264,"outer_steps":4,
      "peak_flops":6.3e10,"reformations":0,"rejected":0,"steps":40,"stopped_early":false,"tokens":81920,
      "tokens_per_s":81008.2,"unigram_bpb":5.01,"val_bpb":4.64,"val_loss":3.21,"val_ppl":24.9,"world_size":2})");
  const std::vector<nlohmann::json> worker = {
      nlohmann::json::parse(R"({"elapsed_s":0.13,"loss_avg":5.09,"mfu":0.40,"step":5,"tokens_per_s":38238.2})"),
      nlohmann::json::parse(R"({"bytes_sent":493056.0,"comm_s":0.01,"compute_s":0.24,"elapsed_s":0.26,
        "outer_step":1,"step":10})")};
  auto lines = [](const std::vector<nlohmann::json>& js) {
    std::string text;
    for (const auto& j : js) text += j.dump() + "\n";
    return text;
  };
  fs::create_directories(dir / "workers");
  SplitMix64 rng(464646);
  int ok = 0, refused = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 5000 && within_budget(start); ++i) {
    auto m = metrics;
    auto s = summary;
    auto w = worker;
    std::string summary_text;
    const uint64_t kind = rng.below(3);
    if (kind == 0) {
      const size_t at = rng.below(m.size());
      m[at] = nlohmann::json::parse(mutate_json(m[at], rng), nullptr, false);
    }
    std::string metrics_text = lines(m);
    if (kind == 0 && m.back().is_discarded()) metrics_text += "{\"step\": \n";
    summary_text = kind == 1 ? mutate_json(s, rng) : s.dump();
    std::string worker_text = lines(w);
    if (kind == 2) worker_text = mutate_json(w[rng.below(w.size())], rng) + "\n" + worker_text;
    write_file(dir / "metrics.jsonl", metrics_text, false);
    write_file(dir / "summary.json", summary_text, false);
    write_file(dir / "workers" / "rank1.jsonl", worker_text, false);
    fs::remove(dir / "report.html");
    const std::string got = fuzz_outcome(dir.string(), [&] { report::write_report(dir, {}); });
    ASSERT_TRUE(got == "ok" || got == "error") << "mutation " << i << " (kind " << kind << "): " << got << "\n"
                                               << metrics_text << summary_text << "\n"
                                               << worker_text;
    (got == "ok" ? ok : refused) += 1;
  }
  EXPECT_GT(refused, 50);
  EXPECT_GT(ok, 50);
  std::printf("run directory: %d reported, %d refused\n", ok, refused);
  fs::remove_all(dir);
}

TEST(InputFuzz, HuggingFaceConfigJsonAsImportReadsIt) {
  const fs::path dir = scratch("hf");
  const ModelConfig c = small_model();
  Transformer model(c);
  fs::create_directories(dir / "hf");
  const auto config = nlohmann::json::parse(hf_llama_config_json(c));
  write_file(dir / "hf" / "model.safetensors", tensors_to_safetensors(to_hf_llama(model), {{"format", "pt"}}));
  write_file(dir / "hf" / "tributary_tokenizer.json", "{\"type\": \"byte\"}");
  SplitMix64 rng(46464646);
  int ok = 0, refused = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 3000 && within_budget(start); ++i) {
    const std::string text = mutate_json(config, rng);
    write_file(dir / "hf" / "config.json", text, false);
    fs::remove_all(dir / "out");
    const std::string got = fuzz_outcome((dir / "hf").string(), [&] { import_hf(dir / "hf", dir / "out", "data"); });
    ASSERT_TRUE(got == "ok" || got == "error") << "mutation " << i << ": " << got << "\n" << text;
    (got == "ok" ? ok : refused) += 1;
  }
  EXPECT_GT(refused, 100);
  std::printf("config.json: %d imported, %d refused\n", ok, refused);
  fs::remove_all(dir);
}

TEST(InputFuzz, PlacementFile) {
  const fs::path dir = scratch("placement");
  const auto placement = nlohmann::json::parse(R"({"d_dp": 2, "d_pp": 2, "stage_order": [0, 1],
      "ranks": [{"rank": 0, "stage": 0, "pipeline": 0, "cluster_device": 3, "region": "a"},
                {"rank": 1, "stage": 1, "pipeline": 0, "cluster_device": 1, "region": "a"},
                {"rank": 2, "stage": 0, "pipeline": 1, "cluster_device": 2, "region": "b"},
                {"rank": 3, "stage": 1, "pipeline": 1, "cluster_device": 0, "region": "b"}],
      "pipelines": [[0, 1], [2, 3]], "cost_s": {"dp": 1.0, "pp": 2.0, "total": 3.0}})");
  const fs::path file = dir / "placement.json";
  write_file(file, placement.dump(), false);
  ASSERT_EQ(sched::read_placement(file.string()).pipelines.size(), 2u);
  SplitMix64 rng(4600);
  int refused = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 20000 && within_budget(start); ++i) {
    const std::string text = mutate_json(placement, rng);
    write_file(file, text, false);
    const std::string got = fuzz_outcome(file.string(), [&] { sched::read_placement(file.string()); });
    ASSERT_TRUE(got == "ok" || got == "error") << "mutation " << i << ": " << got << "\n" << text;
    refused += got == "error";
  }
  EXPECT_GT(refused, 100);
  fs::remove_all(dir);
}
