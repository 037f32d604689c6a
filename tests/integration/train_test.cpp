// End-to-end: real data (a small slice of the built-in corpus), real training, checkpoints and the CLI.
#include <gtest/gtest.h>

#include "support/error_of.h"
#include "support/hf_python.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "shell.h"
#include "test_corpus.h"
#include "test_paths.h"  // generated: TRIBUTARY_CLI, TRIBUTARY_SOURCE_DIR, ...
#include "tributary/artifacts/checkpoint.h"
#include "tributary/artifacts/inference.h"
#include "tributary/core/error.h"
#include "tributary/core/hash.h"
#include "tributary/core/tb_events.h"
#include "tributary/data/corpus.h"
#include "tributary/data/dataset.h"
#include "tributary/data/hf_tokenizer.h"
#include "tributary/data/tokenizer.h"
#include "tributary/model/tensor_io.h"
#include "tributary/runtime/trainer.h"

using namespace tributary;

namespace {

fs::path work_dir() { return fs::temp_directory_path() / "trib_integration"; }
fs::path data_dir() { return test_support::test_data_dir((work_dir() / "data").string()); }

// The CLI: exit codes and messages users see.
// transformers' AutoTokenizer, reading `dir` alone (tokenizer.json, tokenizer_config.json), gives `ours`'s ids for a
// text of accents, characters no training text had, tabs, newlines and double spaces, and decodes them back.
void expect_transformers_round_trip(const fs::path& dir, const Tokenizer& ours) {
  const std::string text =
      "And God said, \u00abLet there be light\u00bb: h\u00e9llo \u2713 \U0001D11E\n\ttabs  and  spaces\n";
  const fs::path text_file = dir / "tokenizer_text.txt";
  write_file(text_file, text);
  const auto [py_rc, printed] =
      test_support::run_shell(fmt::format("{} {}/tests/reference/hf_tokenizer_roundtrip.py {} {}", TRIBUTARY_PYTHON,
                                          TRIBUTARY_SOURCE_DIR, dir.string(), text_file.string()));
  fs::remove(text_file);
  ASSERT_EQ(py_rc, 0) << printed;
  const auto theirs = nlohmann::json::parse(printed.substr(printed.rfind("{\"ids\"")));
  EXPECT_EQ(theirs["ids"].get<std::vector<int32_t>>(), ours.encode(text)) << dir << ": " << printed;
  EXPECT_EQ(theirs["decoded"].get<std::string>(), text) << dir << ": " << printed;
  EXPECT_EQ(theirs["eos_id"].get<int32_t>(), ours.eot_id()) << dir << ": " << printed;
}

std::pair<int, std::string> run_cli(const std::string& args) {
  return test_support::run_shell(std::string(TRIBUTARY_CLI) + " " + args);
}

class Training : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    fs::create_directories(work_dir());
    test_support::ensure_test_corpus(data_dir());
  }

  static RunConfig tiny(const std::string& run, std::vector<std::string> extra = {}) {
    std::vector<std::string> o = {"model.num_layers=2",
                                  "model.width=64",
                                  "model.num_heads=4",
                                  "model.context=64",
                                  "train.batch_size=8",
                                  "train.steps=20",
                                  "optim.warmup_steps=5",
                                  "optim.lr=3e-3",
                                  "train.threads=1",
                                  "train.eval_every=0",
                                  "train.eval_batches=4",
                                  "train.log_every=5",
                                  "train.checkpoint_every=0",
                                  "data.dir=" + data_dir().string(),
                                  "train.run_dir=" + (work_dir() / run).string()};
    o.insert(o.end(), extra.begin(), extra.end());
    fs::remove_all(work_dir() / run);
    return RunConfig::load("", o);
  }
};

using test_support::error_of;

TEST_F(Training, LearnsWellBelowUnigramEntropy) {
  auto s = train(
      tiny("learn", {"train.steps=400", "train.batch_size=16", "optim.warmup_steps=20", "train.eval_batches=16"}), {});
  ASSERT_GT(s.unigram_bpb, 4.0);
  EXPECT_LT(s.val_bpb, 0.8 * s.unigram_bpb) << "val " << s.val_bpb << " bits/byte vs unigram " << s.unigram_bpb;
  EXPECT_LT(s.losses.back(), s.losses.front() - 1.0);
  EXPECT_TRUE(fs::exists(s.run_dir / "metrics.jsonl"));
  // TensorBoard: RUN/tb holds one event file whose scalars are every number of every metrics line, at its step.
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(s.run_dir / "tb")) files.push_back(e.path());
  ASSERT_EQ(files.size(), 1u);
  const auto events = read_events(files[0]);
  std::map<std::pair<std::string, int64_t>, float> scalars;
  for (const auto& e : events) scalars[{e.tag, e.step}] = e.value;
  std::istringstream metrics(read_file(s.run_dir / "metrics.jsonl"));
  int64_t checked = 0;
  for (std::string line; std::getline(metrics, line);) {
    const auto j = nlohmann::json::parse(line);
    for (const auto& [key, value] : j.items()) {
      if (key == "step" || !value.is_number()) continue;
      const auto it = scalars.find({key, j.at("step").get<int64_t>()});
      ASSERT_NE(it, scalars.end()) << key << " at step " << j.at("step");
      EXPECT_FLOAT_EQ(it->second, value.get<float>()) << key;
      checked += 1;
    }
  }
  EXPECT_EQ(checked, static_cast<int64_t>(events.size()));
  EXPECT_TRUE(scalars.count({"val_loss", 400})) << "the evaluation too";
  // Issue 45, item 5: `eval` of the whole split says why its loss is not the run's, and how to get the run's.
  auto [rc, out] = run_cli("eval " + s.run_dir.string() + " --threads 1");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("the run's own evaluation scored the first 16 batches of 16, and --batches 16 --batch-size 16 "
                     "gives its number"),
            std::string::npos)
      << out;
  std::tie(rc, out) = run_cli("eval " + s.run_dir.string() + " --threads 1 --batches 16 --batch-size 16");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find(fmt::format("val loss {:.4f}", s.val_loss)), std::string::npos) << out;
  EXPECT_EQ(out.find("own evaluation"), std::string::npos) << out;
  // --all-heads on a run without chunks is refused before the evaluation, not after it
  std::tie(rc, out) = run_cli("eval " + s.run_dir.string() + " --all-heads");
  EXPECT_EQ(rc, 2) << out;
  EXPECT_EQ(out.find("val loss"), std::string::npos) << out;
}

TEST_F(Training, ResumeIsBitForBit) {
  auto full = train(tiny("full"), {});
  RunConfig split_config = tiny("split");
  auto first = train(split_config, {.stop_after_step = 10});
  ASSERT_TRUE(first.stopped_early);
  ASSERT_EQ(first.losses.size(), 10u);
  auto second = train(split_config, {.resume = true});
  ASSERT_EQ(second.losses.size(), 10u);
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_EQ(first.losses[i], full.losses[i]) << "step " << i + 1;
    EXPECT_EQ(second.losses[i], full.losses[10 + i]) << "step " << 11 + i;
  }
  for (const char* file : {"model.safetensors", "optim.safetensors"})
    EXPECT_EQ(hash64(read_file(full.checkpoint / file)), hash64(read_file(second.checkpoint / file)))
        << file << " differs between the uninterrupted and the resumed run";
  // metrics.jsonl of the resumed run has each step once.
  std::string metrics = read_file(second.run_dir / "metrics.jsonl");
  EXPECT_EQ(metrics.find("\"step\":10,"), metrics.rfind("\"step\":10,"));
}

TEST_F(Training, Bf16TrainsLikeFp32WithinItsPrecisionAndResumesBitForBit) {
  // train.precision = bf16 (model/autocast.h): the step under autocast, fp32 master weights and AdamW state. Over 20
  // steps the losses follow fp32's within bf16's rounding, but not bit for bit (the forward really ran in bf16).
  auto fp32 = train(tiny("prec_fp32"), {});
  auto full = train(tiny("prec_bf16", {"train.precision=bf16"}), {});
  ASSERT_EQ(full.losses.size(), fp32.losses.size());
  bool differs = false;
  for (size_t i = 0; i < fp32.losses.size(); ++i) {
    EXPECT_NEAR(full.losses[i], fp32.losses[i], 0.02 * fp32.losses[i]) << "step " << i + 1;
    differs |= full.losses[i] != fp32.losses[i];
  }
  EXPECT_TRUE(differs) << "bf16 gave fp32's losses to the bit: autocast did not run";
  RunConfig split = tiny("prec_bf16_split", {"train.precision=bf16"});
  ASSERT_TRUE(train(split, {.stop_after_step = 10}).stopped_early);
  auto second = train(split, {.resume = true});
  for (size_t i = 0; i < second.losses.size(); ++i) EXPECT_EQ(second.losses[i], full.losses[10 + i]) << 11 + i;
  // Pipelines and local parallelism keep fp32: refused, naming the key.
  EXPECT_NE(error_of([&] { tiny("prec_local", {"train.precision=bf16", "local.chunks=2"}); }).find("train.precision"),
            std::string::npos);
}

TEST_F(Training, GradientAccumulationEqualsTheLargerBatch) {
  // The loader hands out windows in the same order whatever the micro-batch size, so 2 x 4 sequences accumulate
  // exactly the batch of 8 (up to float summation order).
  auto big = train(tiny("accum1", {"train.steps=6", "optim.warmup_steps=2"}), {});
  auto accum =
      train(tiny("accum2", {"train.steps=6", "optim.warmup_steps=2", "train.batch_size=4", "train.grad_accum=2"}), {});
  ASSERT_EQ(big.losses.size(), accum.losses.size());
  for (size_t i = 0; i < big.losses.size(); ++i) EXPECT_NEAR(big.losses[i], accum.losses[i], 1e-4) << "step " << i + 1;
}

TEST_F(Training, SentencePieceDatasetTrainsAndGenerates) {
  fs::path spm_data = work_dir() / "spm_data";
  if (!fs::exists(spm_data / "dataset.json"))
    build_dataset(build_default_corpus({.max_bytes_per_domain = 100 << 10}), spm_data,
                  {.tokenizer = "sentencepiece", .sentencepiece = {.vocab_size = 512}, .val_permille = 100});
  Dataset ds = Dataset::open(spm_data);
  EXPECT_EQ(ds.tokenizer_kind(), "sentencepiece");
  EXPECT_GT(ds.bytes_per_token("val"), 1.3) << "subwords should cover several bytes each";
  auto s = train(
      tiny("spm", {"train.steps=10", "optim.warmup_steps=2", "model.context=32", "data.dir=" + spm_data.string()}), {});
  EXPECT_TRUE(std::isfinite(s.val_bpb));
  EXPECT_TRUE(fs::exists(s.checkpoint / "tokenizer.model")) << "checkpoints carry the tokenizer";
  auto [rc, out] = run_cli("generate " + s.run_dir.string() + " --prompt 'The Lord' --tokens 8 --threads 1");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out.rfind("The Lord", 0), 0u) << out;
  // export writes the SentencePiece model as a tokenizer.json too (BPE, byte fallback), which transformers reads
  const auto hf = work_dir() / "spm_hf";
  fs::remove_all(hf);
  std::tie(rc, out) = run_cli("export " + s.run_dir.string() + " --format hf --out " + hf.string());
  ASSERT_EQ(rc, 0) << out;
  expect_transformers_round_trip(hf, SentencePieceTokenizer(hf / "tokenizer.model"));
  // ... and a unigram model (data build --sp-model-type unigram) the same way
  const auto unigram = work_dir() / "spm_unigram";
  fs::remove_all(unigram);
  fs::create_directories(unigram);
  const Corpus corpus = build_default_corpus({.max_bytes_per_domain = 50 << 10});
  std::vector<std::string_view> texts;
  for (const Document& d : corpus.docs) texts.push_back(d.text);
  train_sentencepiece(texts, unigram / "tokenizer", {.vocab_size = 512, .model_type = "unigram"});
  const SentencePieceTokenizer unigram_tokenizer(unigram / "tokenizer.model");
  const auto model = SentencePieceModel::parse(read_file(unigram / "tokenizer.model"), "unigram tokenizer.model");
  ASSERT_EQ(model.kind, SentencePieceModel::Kind::kUnigram);
  const HfTokenizer files = hf_sentencepiece_tokenizer(model, unigram_tokenizer.eot_id(), 64);
  write_file(unigram / "tokenizer.json", files.tokenizer.dump());
  write_file(unigram / "tokenizer_config.json", files.config.dump());
  expect_transformers_round_trip(unigram, unigram_tokenizer);
}

TEST_F(Training, ResumeRefusesAnotherConfiguration) {
  auto first = train(tiny("cfg"), {.stop_after_step = 5});
  RunConfig changed =
      RunConfig::load("", {"model.num_layers=2", "model.width=32", "model.num_heads=4", "model.context=64",
                           "train.batch_size=8", "train.steps=20", "optim.warmup_steps=5",
                           "data.dir=" + data_dir().string(), "train.run_dir=" + first.run_dir.string()});
  auto msg = error_of([&] { train(changed, {.resume = true}); });
  EXPECT_NE(msg.find("model.width"), std::string::npos) << msg;
  msg = error_of([&] {
    train(tiny("cfg2"), {});
    train(RunConfig::from_toml(read_file(first.run_dir / "config.toml"), "c"), {});
  });
  EXPECT_NE(msg.find("--resume"), std::string::npos) << "a run dir with checkpoints needs --resume: " << msg;
}

TEST_F(Training, CorruptOrIncompleteCheckpointsAreRefused) {
  auto s = train(tiny("corrupt", {"train.steps=6", "optim.warmup_steps=1"}), {});
  fs::path model = s.checkpoint / "model.safetensors";
  std::string bytes = read_file(model);
  bytes[bytes.size() / 2] ^= 0x10;
  write_file(model, bytes);
  auto msg = error_of([&] { load_checkpoint(s.run_dir); });
  EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("corrupted"), std::string::npos) << msg;
  fs::remove(s.checkpoint / "manifest.json");
  msg = error_of([&] { load_checkpoint(s.checkpoint); });
  EXPECT_NE(msg.find("incomplete"), std::string::npos) << msg;
  // and a run dir whose only checkpoint is incomplete has none to resume from
  msg = error_of([&] { load_checkpoint(s.run_dir); });
  EXPECT_NE(msg.find("no complete checkpoint"), std::string::npos) << msg;
}

TEST_F(Training, AForeignStateOrConfigInACheckpointIsNamed) {
  // Issue 12, item 7: a checkpoint whose (checksummed, intact) state.json lacks its step, or whose config.toml
  // is empty, was a crash (exit 3); it is an Error naming the file.
  auto s = train(tiny("foreign", {"train.steps=4", "optim.warmup_steps=1"}), {});
  auto loaded = load_checkpoint(s.checkpoint);
  auto named = [](const safetensors::File& f) {
    NamedTensors out;
    for (const auto& [name, view] : f.tensors()) out.emplace_back(name, to_torch(view));
    return out;
  };
  CheckpointContents contents{named(loaded.model), named(loaded.optim), loaded.state, loaded.config_toml};
  contents.state.erase("step");
  auto dir = save_checkpoint(s.run_dir, 100, contents, 10);
  auto msg = error_of([&] { load_checkpoint(dir); });
  EXPECT_NE(msg.find("state.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'step'"), std::string::npos) << msg;
  contents.state = loaded.state;
  contents.config_toml = "";
  dir = save_checkpoint(s.run_dir, 101, contents, 10);
  msg = error_of([&] { load_checkpoint(dir); });
  EXPECT_NE(msg.find("config.toml"), std::string::npos) << msg;
}

TEST_F(Training, KeepsTheLastNCheckpoints) {
  auto s = train(tiny("keep", {"train.checkpoint_every=4", "train.keep_checkpoints=2"}), {});
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(s.run_dir / "checkpoints")) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"step-00000016", "step-00000020"}));
}

TEST_F(Training, StartingOverForgetsTheEarlierRunsResultsAndNothingElse) {
  // An earlier run's summary.json read as the new run's when the new one failed (a chaos run that stalled at step 400
  // "finished 600 steps"): a fresh start removes the results it will write itself, and only those.
  RunConfig config = tiny("over", {"train.steps=2", "optim.warmup_steps=1"});
  const fs::path dir = config.train.run_dir;
  fs::create_directories(dir / "tb");
  write_file(dir / "summary.json", R"({"steps": 600, "val_loss": 1.851})");
  write_file(dir / "report.html", "<html>the earlier run</html>");
  write_file(dir / "tb" / "events.out.tfevents.1.earlier.1", "old events");
  write_file(dir / "tb" / "notes.txt", "the user's");
  write_file(dir / "notes.txt", "the user's");
  train(config, {});
  EXPECT_EQ(nlohmann::json::parse(read_file(dir / "summary.json"))["steps"].get<int>(), 2);
  EXPECT_FALSE(fs::exists(dir / "report.html"));
  EXPECT_FALSE(fs::exists(dir / "tb" / "events.out.tfevents.1.earlier.1"));
  EXPECT_TRUE(fs::exists(dir / "tb" / "notes.txt"));
  EXPECT_TRUE(fs::exists(dir / "notes.txt"));
}

TEST_F(Training, OneLocalChunkIsBitIdenticalToThePlainTrainer) {
  // local.chunks = 1 runs the local-parallel step (one chunk, no auxiliary head): the same losses and checkpoint bytes
  // as the plain trainer, with gradient accumulation on so the loss scaling is covered too.
  std::vector<std::string> o = {"train.steps=8", "optim.warmup_steps=2", "train.batch_size=4", "train.grad_accum=2"};
  auto plain = train(tiny("local_plain", o), {});
  o.push_back("local.chunks=1");
  auto local = train(tiny("local_one", o), {});
  ASSERT_EQ(plain.losses.size(), local.losses.size());
  for (size_t i = 0; i < plain.losses.size(); ++i) EXPECT_EQ(plain.losses[i], local.losses[i]) << "step " << i + 1;
  for (const char* file : {"model.safetensors", "optim.safetensors"})
    EXPECT_EQ(hash64(read_file(plain.checkpoint / file)), hash64(read_file(local.checkpoint / file))) << file;
  EXPECT_FALSE(fs::exists(local.checkpoint / "aux_heads.safetensors"));
}

TEST_F(Training, LocalChunksResumeBitForBitAndKeepTheirHeadsBesideTheModel) {
  const std::vector<std::string> o = {"model.num_layers=4", "local.chunks=2", "local.mode=overlapping",
                                      "local.aux_head=blocks"};
  auto full = train(tiny("local_full", o), {});
  EXPECT_LT(full.losses.back(), full.losses.front() - 0.5);
  RunConfig split_config = tiny("local_split", o);
  auto first = train(split_config, {.stop_after_step = 10});
  auto second = train(split_config, {.resume = true});
  ASSERT_EQ(first.losses.size() + second.losses.size(), full.losses.size());
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_EQ(first.losses[i], full.losses[i]) << "step " << i + 1;
    EXPECT_EQ(second.losses[i], full.losses[10 + i]) << "step " << 11 + i;
  }
  for (const char* file : {"model.safetensors", "optim.safetensors", "aux_heads.safetensors"})
    EXPECT_EQ(hash64(read_file(full.checkpoint / file)), hash64(read_file(second.checkpoint / file))) << file;
  const std::string metrics = read_file(full.run_dir / "metrics.jsonl");
  EXPECT_NE(metrics.find("\"chunk_losses\":["), std::string::npos) << metrics.substr(0, 400);
  // model.safetensors is the plain dense model: eval reads it like any other checkpoint; --all-heads adds every
  // chunk's head on the same batches, the last being the model's own loss again.
  auto [rc, out] = run_cli("eval " + full.run_dir.string() + " --batches 2 --threads 1 --all-heads");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("chunk 0 (blocks 0-1) aux head: loss "), std::string::npos) << out;
  const auto model_loss = out.substr(out.find("val loss ") + 9, 6);
  EXPECT_NE(out.find("chunk 1 (blocks 2-3) model head: loss " + model_loss), std::string::npos) << out;
  std::tie(rc, out) = run_cli("eval " + first.run_dir.string() + " --batches 1 --threads 1 --all-heads");
  EXPECT_EQ(rc, 0) << out;
  // export writes the dense model in the Hugging Face Llama layout (model/hf_llama.h): the heads stay behind, and an
  // --out that already holds files is refused, not overwritten.
  const auto hf = full.run_dir.parent_path() / "local_hf";
  fs::remove_all(hf);
  const std::string do_export = "export " + full.run_dir.string() + " --format hf --out " + hf.string();
  std::tie(rc, out) = run_cli(do_export);
  EXPECT_EQ(rc, 0) << out;
  const auto exported = safetensors::File::load(hf / "model.safetensors");
  EXPECT_EQ(exported.tensors().count("model.layers.3.mlp.gate_proj.weight"), 1u);
  for (const auto& [name, view] : exported.tensors()) EXPECT_EQ(name.find("aux"), std::string::npos) << name;
  EXPECT_NE(read_file(hf / "config.json").find("\"LlamaForCausalLM\""), std::string::npos);
  EXPECT_NE(read_file(hf / "tributary_tokenizer.json").find("\"byte\""), std::string::npos);
  expect_transformers_round_trip(hf, ByteTokenizer());  // AutoTokenizer reads the exported tokenizer.json
  {  // transformers' LlamaForCausalLM, from the exported files alone, gives our logits
    const LoadedModel trained = load_model(full.run_dir.string(), torch::kCPU);
    auto tokens = torch::randint(257, {2, 24}, torch::kInt64);
    torch::NoGradGuard no_grad;
    const auto ours = trained.model->forward(tokens);
    const auto theirs = test_support::transformers_logits(hf, tokens, 257);
    EXPECT_TRUE(torch::allclose(ours, theirs, 1e-4, 1e-4)) << (ours - theirs).abs().max().item<double>();
  }
  // import reads the export back as a checkpoint of ours: its export is the same bytes, its eval the same loss
  const auto imported = full.run_dir.parent_path() / "local_imported", again = full.run_dir.parent_path() / "local_hf2";
  fs::remove_all(imported);
  fs::remove_all(again);
  std::tie(rc, out) =
      run_cli("import " + hf.string() + " --out " + imported.string() + " --data " + data_dir().string());
  ASSERT_EQ(rc, 0) << out;
  std::tie(rc, out) = run_cli("export " + imported.string() + " --format hf --out " + again.string());
  ASSERT_EQ(rc, 0) << out;
  for (const char* file :
       {"config.json", "model.safetensors", "tributary_tokenizer.json", "tokenizer.json", "tokenizer_config.json"})
    EXPECT_EQ(read_file(hf / file), read_file(again / file)) << file;
  std::tie(rc, out) = run_cli("eval " + imported.string() + " --batches 2 --threads 1");
  EXPECT_NE(out.find("val loss " + model_loss), std::string::npos) << out;
  // ... and starts training: the import has one level of 4 blocks, this model two of 2 (blocks match in model order)
  auto from_hf = train(tiny("local_from_hf", {"model.num_layers=4", "model.num_levels=2", "train.steps=1",
                                              "optim.warmup_steps=0", "train.init_from=" + imported.string()}),
                       {});
  EXPECT_TRUE(std::isfinite(from_hf.losses.at(0)));
  std::tie(rc, out) = run_cli("import " + full.run_dir.string() + " --out " + (imported / "x").string());
  EXPECT_NE(out.find("config.json' is missing"), std::string::npos) << out;
  std::tie(rc, out) = run_cli(do_export);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("already holds files"), std::string::npos) << out;
  auto plain = train(tiny("local_none", {"train.steps=2", "optim.warmup_steps=1"}), {});
  std::tie(rc, out) = run_cli("eval " + plain.run_dir.string() + " --batches 1 --threads 1 --all-heads");
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("was not trained with local parallelism (local.chunks = 0)"), std::string::npos) << out;
}

TEST_F(Training, ARunWhoseOutputPipeClosesTrainsOnInsteadOfDyingOfSigpipe) {
  // SIGPIPE is ignored (main.cpp): a survivor's write to a killed peer's socket killed it with status 141; the same
  // disposition lets a run whose console reader went away (`| head`, a closed terminal pipe) finish.
  const fs::path dir = work_dir() / "sigpipe";
  fs::remove_all(dir);
  auto [rc, out] = test_support::run_shell(fmt::format(
      "bash -c '{} train --set model.num_layers=1 --set model.width=32 --set model.num_heads=2 --set model.context=32 "
      "--set train.steps=40 --set train.log_every=1 --set train.eval_every=0 --set train.threads=1 --set "
      "optim.warmup_steps=2 --set data.dir={} --set train.run_dir={} 2>&1 | head -c 1 > /dev/null; "
      "exit ${{PIPESTATUS[0]}}'",
      TRIBUTARY_CLI, data_dir().string(), dir.string()));
  EXPECT_EQ(rc, 0) << out;
  ASSERT_TRUE(fs::exists(dir / "summary.json"));
  EXPECT_EQ(nlohmann::json::parse(read_file(dir / "summary.json"))["steps"].get<int>(), 40);
}

TEST_F(Training, DataBatchesWritesTheWindowsEachReplicaReads) {
  // The windows a peer outside Tributary trains on (bench/torchft_peer.py): 2 replicas x batch 2 read the windows one
  // process with batch 4 reads, rank-strided; each window is context + 1 ids of the dataset's vocabulary.
  const fs::path dir = work_dir() / "batches";
  fs::create_directories(dir);
  const auto dump = [&](int rank, int world, int batch) {
    const fs::path out = dir / fmt::format("r{}-of-{}.bin", rank, world);
    auto [rc, text] =
        run_cli(fmt::format("data batches {} --batch-size {} --context 16 --seed 7 --rank {} --world {} "
                            "--count 3 --out {}",
                            data_dir().string(), batch, rank, world, out.string()));
    EXPECT_EQ(rc, 0) << text;
    const std::string bytes = read_file(out);
    std::vector<int32_t> ids(bytes.size() / sizeof(int32_t));
    std::memcpy(ids.data(), bytes.data(), ids.size() * sizeof(int32_t));
    EXPECT_EQ(ids.size(), size_t(3 * batch * 17));
    return ids;
  };
  const auto whole = dump(0, 1, 4), first = dump(0, 2, 2), second = dump(1, 2, 2);
  const int64_t vocab = Dataset::open(data_dir()).vocab_size();
  for (const int32_t id : whole) ASSERT_TRUE(id >= 0 && id < vocab) << id;
  for (int b = 0; b < 3; ++b)
    for (int w = 0; w < 4; ++w) {
      const auto& half = w % 2 == 0 ? first : second;
      const auto from = whole.begin() + (b * 4 + w) * 17, theirs = half.begin() + (b * 2 + w / 2) * 17;
      EXPECT_TRUE(std::equal(from, from + 17, theirs)) << "batch " << b << ", window " << w;
    }
  auto [rc, out] = run_cli(fmt::format("data batches {} --rank 2 --world 2 --count 1 --out {}", data_dir().string(),
                                       (dir / "x.bin").string()));
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("--rank 2 is not below --world 2"), std::string::npos) << out;
}

TEST_F(Training, CliRejectsBadConfigAndGenerates) {
  auto [rc, out] = run_cli("train --set model.widht=3");
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("model.widht"), std::string::npos) << out;
  std::tie(rc, out) = run_cli("train --set optim.lr=fast");
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("optim.lr"), std::string::npos) << out;

  auto s = train(tiny("cli", {"train.steps=10", "optim.warmup_steps=2"}), {});
  std::tie(rc, out) =
      run_cli("generate " + s.run_dir.string() + " --prompt 'In the beginning' --tokens 20 --threads 1");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out.rfind("In the beginning", 0), 0u) << out;
  std::tie(rc, out) = run_cli("eval " + s.run_dir.string() + " --batches 2 --threads 1");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("bits/byte"), std::string::npos) << out;
  std::tie(rc, out) = run_cli("plot " + s.run_dir.string());
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(fs::exists(s.run_dir / "loss.png"));
}

}  // namespace
