// Continue an open model (issue 65), end to end through the CLI: a random model made by transformers with its own
// tokenizer — Llama 3 shaped with a Llama-3-style byte-level BPE tokenizer.json, Qwen 2 shaped with a Qwen-2-style
// one, Llama shaped with a SentencePiece tokenizer.model — goes import -> data build with the model's tokenizer ->
// two-worker DiLoCo from its weights (train --init-from: the shape from the checkpoint, the rest from the flags) ->
// export -> transformers, which loads the exported directory and computes our loss on the dataset's tokens, and whose
// tokenizer gives our ids.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <fstream>

#include "integration/launch_support.h"
#include "support/hf_python.h"
#include "tributary/artifacts/inference.h"
#include "tributary/data/corpus.h"
#include "tributary/data/dataset.h"

using namespace tributary;
using test_support::sh;

namespace {

fs::path scratch() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / fmt::format("trib_open_models_{}", ::getpid());
    fs::remove_all(d);
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

std::string python(const std::string& args) {
  const auto [rc, out] = sh(fmt::format("{} {}", TRIBUTARY_PYTHON, args));
  if (rc != 0) throw std::runtime_error(args + " failed: " + out);
  return out;
}

// The first windows of `dataset`'s validation split: (rows, length) ids.
torch::Tensor windows(const fs::path& dataset, int64_t rows, int64_t length) {
  const auto shards = Dataset::open(dataset).load_shards("val");
  std::vector<int64_t> ids;
  for (const auto& s : shards)
    for (const auto t : s.tokens) ids.push_back(int64_t(t));
  EXPECT_GE(int64_t(ids.size()), rows * length);
  return torch::tensor(std::vector<int64_t>(ids.begin(), ids.begin() + rows * length)).view({rows, length});
}

}  // namespace

TEST(OpenModels, ThreeFamiliesGoImportDataBuildDilocoExportAndBackToTransformers) {
  const std::string cli = TRIBUTARY_CLI;
  const fs::path w = scratch();
  // The user's own text (real text: the built-in corpus's sources) as a JSONL file.
  const Corpus corpus = build_default_corpus({.max_bytes_per_domain = 64 << 10});
  {
    std::ofstream out(w / "texts.jsonl");
    for (const auto& d : corpus.docs) out << nlohmann::json({{"text", d.text}}).dump() << "\n";
  }
  // The models' tokenizers: two of the byte-level BPE families trained by `tokenizers`; a SentencePiece model.
  python(fmt::format("{}/tests/reference/hf_bpe_peer.py train --corpus {} --out {} --vocab 400 --families llama3,qwen2",
                     TRIBUTARY_SOURCE_DIR, (w / "texts.jsonl").string(), (w / "tok").string()));
  auto [rc_sp, out_sp] = sh(fmt::format("{} data build {} --out {} --tokenizer sentencepiece --vocab-size 400", cli,
                                        (w / "texts.jsonl").string(), (w / "sp_data").string()));
  ASSERT_EQ(rc_sp, 0) << out_sp;
  fs::create_directories(w / "tok" / "sp");
  fs::copy_file(w / "sp_data" / "tokenizer.model", w / "tok" / "sp" / "tokenizer.model");

  struct Family {
    std::string variant, tokenizer, kind;
  };
  const std::vector<Family> families = {{"gqa-untied-llama3", "llama3", "bpe"},
                                        {"gqa-tied-qwen2", "qwen2", "bpe"},
                                        {"mha-untied", "sp", "sentencepiece"}};
  std::vector<std::string> variants, tokenizer_dirs;
  for (const auto& f : families) {
    variants.push_back(f.variant);
    tokenizer_dirs.push_back((w / "tok" / f.tokenizer).string());
  }
  python(fmt::format("{}/tests/reference/make_hf_llama.py --out {} --variants {} --vocab 400 --tokenizer {}",
                     TRIBUTARY_SOURCE_DIR, (w / "hf").string(), fmt::join(variants, ","),
                     fmt::join(tokenizer_dirs, ",")));
  const std::string text = "In the beginning was the Word, and 1,234 more words.\n  It's done!";
  std::vector<fs::path> exported;
  std::vector<torch::Tensor> tokens, ours;
  std::vector<std::string> our_ids;
  for (const auto& f : families) {
    SCOPED_TRACE(f.variant);
    const fs::path base = w / (f.tokenizer + "-base"), data = w / (f.tokenizer + "-data"),
                   run = w / (f.tokenizer + "-run");
    auto [rc_i, out_i] = sh(fmt::format("{} import {} --out {}", cli, (w / "hf" / f.variant).string(), base.string()));
    ASSERT_EQ(rc_i, 0) << out_i;
    // The model's tokenizer, taken from the imported checkpoint's run directory.
    auto [rc_d, out_d] = sh(fmt::format("{} data build {} --out {} --tokenizer {} --val-permille 100", cli,
                                        (w / "texts.jsonl").string(), data.string(), base.string()));
    ASSERT_EQ(rc_d, 0) << out_d;
    EXPECT_NE(out_d.find("tokenizer " + f.kind), std::string::npos) << out_d;
    // configs/diloco.toml's model is another shape: --init-from takes the checkpoint's.
    auto [rc_t, out_t] = sh(fmt::format(
        "{} launch --nproc 2 --master-port 0 -- train {}/configs/diloco.toml --init-from {} --set data.dir={} "
        "--set train.run_dir={} --set train.steps=8 --set dist.inner_steps=4 --set model.context=32 "
        "--set train.batch_size=4 --set train.eval_every=0 --set optim.warmup_steps=2 --set optim.lr=1e-3 "
        "--set train.threads=1 --set train.checkpoint_every=8",
        cli, TRIBUTARY_SOURCE_DIR, base.string(), data.string(), run.string()));
    ASSERT_EQ(rc_t, 0) << out_t;
    EXPECT_NE(out_t.find("--init-from"), std::string::npos) << out_t;
    EXPECT_NE(out_t.find("2 replicas, DiLoCo"), std::string::npos) << out_t;
    exported.push_back(w / (f.tokenizer + "-export"));
    auto [rc_e, out_e] =
        sh(fmt::format("{} export {} --out {} --format hf", cli, run.string(), exported.back().string()));
    ASSERT_EQ(rc_e, 0) << out_e;
    tokens.push_back(windows(data, 2, 32));
    const LoadedModel trained = load_model(run.string(), torch::kCPU);
    EXPECT_EQ(trained.tokenizer->kind(), f.kind);
    torch::NoGradGuard no_grad;
    ours.push_back(trained.model->forward(tokens.back()));
    std::string mine = "[";
    for (const auto id : trained.tokenizer->encode(text)) mine += (mine.size() > 1 ? ", " : "") + std::to_string(id);
    our_ids.push_back(mine + "]");
  }
  // transformers' tokenizer from each exported directory gives our ids for the same text (one Python process).
  std::string dirs;
  for (const auto& e : exported) dirs += (dirs.empty() ? "'" : ", '") + e.string() + "'";
  const std::string theirs = python(fmt::format(
      "-c \"import os; os.environ['HF_HUB_OFFLINE']='1'; from transformers import AutoTokenizer; "
      "[print(AutoTokenizer.from_pretrained(d).encode('''{}''', add_special_tokens=False)) for d in [{}]]\"",
      text, dirs));
  for (size_t i = 0; i < families.size(); ++i)
    EXPECT_NE(theirs.find(our_ids[i]), std::string::npos)
        << families[i].variant << ": ours " << our_ids[i] << "\ntransformers " << theirs;
  // transformers computes each exported model's logits from the exported directory alone.
  for (size_t i = 0; i < families.size(); ++i) {
    const auto theirs = test_support::transformers_logits(exported[i], tokens[i], 400);
    const double a = test_support::next_token_loss(ours[i], tokens[i]),
                 b = test_support::next_token_loss(theirs, tokens[i]);
    EXPECT_LE(std::abs(a - b), 1e-5) << families[i].variant << ": ours " << a << ", transformers' " << b;
    EXPECT_TRUE(torch::allclose(ours[i], theirs, 1e-4, 1e-4)) << families[i].variant;
  }
}
