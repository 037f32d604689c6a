// Our tokenizer.json reader against Hugging Face's `tokenizers` (tests/reference/hf_bpe_peer.py): three families'
// tokenizers, trained by the peer on real text (the built-in corpus: the King James Bible, fortunes, manual pages) and
// hard cases, must give the same ids document by document.
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <fstream>

#include "integration/shell.h"
#include "support/error_of.h"
#include "test_paths.h"
#include "tributary/core/error.h"
#include "tributary/data/bpe_tokenizer.h"
#include "tributary/data/corpus.h"
#include "tributary/data/dataset.h"

using namespace tributary;
using tributary::test_support::run_shell;

namespace {

fs::path work() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / fmt::format("trib_bpe_{}", ::getpid());
    fs::remove_all(d);
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

// What no ordinary paragraph of English holds: accents in two Unicode forms (NFC makes them one), scripts without
// spaces, emoji, whitespace runs and line ends of both kinds, digits in long runs, contractions in capitals, special
// tokens inside the text, control characters.
std::vector<std::string> hard_cases() {
  return {
      "Cafe\xcc\x81 vs Caf\xc3\xa9: d\xc3\xa9j\xc3\xa0 vu, na\xc3\xafve \xe2\x80\x94 \xc3\x85ngstr\xc3\xb6m",
      "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe6\x96\x87\xe7\xab\xa0\xe3\x80\x82 \xec\x95\x88\xeb\x85\x95"
      "\xed\x95\x98\xec\x84\xb8\xec\x9a\x94 \xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82 \xf0\x9f\x98\x80\xf0\x9f"
      "\x91\x8d\xf0\x9f\x8f\xbd",
      "tabs\t\tand   spaces    \n\n\n  then\r\nwindows\r\n\r\nlines   ",
      "1234567890 3.14159 0x7fff 2026-11-28 1,000,000 \xd9\xa1\xd9\xa2\xd9\xa3",
      "I'M SURE YOU'LL SEE WE'D DONE IT, don't you? 'S 'T",
      "before<|endoftext|>after <|end_of_text|> <|im_start|>user\nhi<|im_end|> <|begin_of_text|>x",
      "   leading spaces and trailing   ",
      "\x01\x02 bell\x07 esc\x1b[0m nbsp\xc2\xa0here zero\xe2\x80\x8bwidth",
      "=============================================================== ...... !!!!!! ??",
      ""};
}

void write_corpus(const fs::path& file, const std::vector<std::string>& docs) {
  std::ofstream out(file);
  for (const auto& d : docs) out << nlohmann::json({{"text", d}}).dump() << "\n";
}

std::vector<int32_t> read_i32(const fs::path& file) {
  const std::string bytes = read_file(file);
  std::vector<int32_t> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

std::string peer(const std::string& args) {
  const auto [rc, out] =
      run_shell(fmt::format("{} {}/tests/reference/hf_bpe_peer.py {}", TRIBUTARY_PYTHON, TRIBUTARY_SOURCE_DIR, args));
  if (rc != 0) throw std::runtime_error("hf_bpe_peer.py " + args + " failed: " + out);
  return out;
}

}  // namespace

TEST(BpeTokenizer, EqualsTheTokenizersLibraryOnRealTextForThreeFamilies) {
  const Corpus corpus = build_default_corpus({.max_bytes_per_domain = 96 << 10});
  std::vector<std::string> docs;
  for (const auto& d : corpus.docs) docs.push_back(d.text);
  ASSERT_GT(docs.size(), 50u);
  for (auto& h : hard_cases()) docs.push_back(h);
  const fs::path jsonl = work() / "docs.jsonl";
  write_corpus(jsonl, docs);
  peer(fmt::format("train --corpus {} --out {} --vocab 1500", jsonl.string(), work().string()));
  for (const std::string family : {"gpt2", "llama3", "qwen2"}) {
    SCOPED_TRACE(family);
    const fs::path file = work() / family / "tokenizer.json";
    peer(fmt::format("encode --tokenizer {} --corpus {} --out {}", file.string(), jsonl.string(),
                     (work() / (family + ".ids")).string()));
    const auto ids = read_i32(work() / (family + ".ids")), lens = read_i32(work() / (family + ".ids.lens"));
    ASSERT_EQ(lens.size(), docs.size());
    const BpeTokenizer ours(file);
    size_t at = 0, differing = 0;
    for (size_t d = 0; d < docs.size(); ++d) {
      const std::vector<int32_t> theirs(ids.begin() + long(at), ids.begin() + long(at + size_t(lens[d])));
      at += size_t(lens[d]);
      const auto mine = ours.encode(docs[d]);
      if (mine != theirs && differing++ < 3)
        ADD_FAILURE() << "document " << d << " (" << docs[d].substr(0, 80) << "): " << mine.size() << " ids against "
                      << theirs.size();
    }
    EXPECT_EQ(differing, 0u) << "of " << docs.size() << " documents";
    // The end of a document is the eos token tokenizer_config.json names; special tokens decode to nothing.
    const std::string eos = family == "llama3" ? "<|end_of_text|>" : "<|endoftext|>";
    EXPECT_EQ(ours.eot_id(), *ours.id_of(eos));
    EXPECT_EQ(ours.decode(ours.encode("one two" + eos + " three")), "one two three");
    // Llama 3's template begins with <|begin_of_text|>: a dataset puts it before every document.
    if (family == "llama3") {
      EXPECT_EQ(ours.bos_id(), ours.id_of("<|begin_of_text|>"));
    } else {
      EXPECT_FALSE(ours.bos_id().has_value());
    }
    if (family != "qwen2") {  // NFC changes the text it normalizes
      for (const auto& h : hard_cases()) {
        if (h.find("<|") == std::string::npos) {
          EXPECT_EQ(ours.decode(ours.encode(h)), h);
        }
      }
    }
  }
}

// Llama 3's vocabulary holds whole words that its merges do not reach (it was converted from tiktoken's ranks):
// with ignore_merges such a word is taken whole. A word added to a trained vocabulary, merges unchanged, shows it.
TEST(BpeTokenizer, IgnoreMergesTakesAWholeVocabularyEntryAsTheLibraryDoes) {
  const fs::path jsonl = work() / "fox.jsonl";
  write_corpus(jsonl, {"the quick brown fox jumps over the lazy dog", "the fox", "a quick fox"});
  peer(fmt::format("train --corpus {} --out {} --vocab 272 --families llama3", jsonl.string(),
                   (work() / "fox").string()));
  const fs::path file = work() / "fox" / "llama3" / "tokenizer.json";
  auto j = nlohmann::json::parse(read_file(file));
  const std::string word = "\xc4\xa0jumps";  // " jumps" in the byte-level alphabet (a space is U+0120)
  ASSERT_FALSE(j["model"]["vocab"].contains(word)) << "the trainer already made it: nothing would be tested";
  j["model"]["vocab"][word] = int(j["model"]["vocab"].size() + j["added_tokens"].size());
  write_file(file, j.dump());
  const fs::path text = work() / "fox_text.jsonl";
  write_corpus(text, {"the quick brown fox jumps over", "jumps jumps"});
  peer(fmt::format("encode --tokenizer {} --corpus {} --out {}", file.string(), text.string(),
                   (work() / "fox.ids").string()));
  const auto theirs = read_i32(work() / "fox.ids");
  const BpeTokenizer ours(file);
  auto mine = ours.encode("the quick brown fox jumps over");
  const auto second = ours.encode("jumps jumps");
  mine.insert(mine.end(), second.begin(), second.end());
  EXPECT_EQ(mine, theirs);
  EXPECT_EQ(std::count(mine.begin(), mine.end(), *ours.id_of("\xc4\xa0jumps")), 2);
}

TEST(BpeTokenizer, RefusesWhatItCannotReadNamingTheFileAndKey) {
  // A small tokenizer of the peer's to mutate.
  const fs::path jsonl = work() / "small.jsonl";
  write_corpus(jsonl, {"the quick brown fox jumps over the lazy dog", "hello world 123"});
  peer(fmt::format("train --corpus {} --out {} --vocab 300 --families llama3", jsonl.string(),
                   (work() / "small").string()));
  const fs::path good = work() / "small" / "llama3" / "tokenizer.json";
  const auto original = nlohmann::json::parse(read_file(good));
  const auto refused = [&](const std::function<void(nlohmann::json&)>& change) {
    auto j = original;
    change(j);
    const fs::path file = work() / "small" / "llama3" / "mutated.json";
    write_file(file, j.dump());
    return test_support::error_of([&] { BpeTokenizer{file}; });
  };
  EXPECT_NE(refused([](auto& j) { j["model"]["type"] = "WordPiece"; }).find("model.type"), std::string::npos);
  EXPECT_NE(refused([](auto& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}}; }).find("tokenizer.model"),
            std::string::npos);
  EXPECT_NE(refused([](auto& j) { j["model"]["merges"][0] = {"zz", "qq"}; }).find("model.merges[0]"),
            std::string::npos);
  EXPECT_NE(refused([](auto& j) { j["added_tokens"][0]["lstrip"] = true; }).find("added_tokens[0].lstrip"),
            std::string::npos);
  EXPECT_NE(refused([](auto& j) { j["normalizer"] = {{"type", "Lowercase"}}; }).find("normalizer"), std::string::npos);
  EXPECT_NE(refused([](auto& j) {
              j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
            }).find("pre_tokenizer.pretokenizers[0].pattern"),
            std::string::npos);
  EXPECT_NE(refused([](auto& j) { j["model"]["vocab"] = 7; }).find("mutated.json"), std::string::npos);
  const std::string no_eos = refused([](auto& j) { j["added_tokens"] = nlohmann::json::array(); });
  EXPECT_NE(no_eos.find("eos_token"), std::string::npos) << no_eos;
  const fs::path not_json = work() / "small" / "llama3" / "broken.json";
  write_file(not_json, "{\"model\": ");
  EXPECT_NE(test_support::error_of([&] { BpeTokenizer{not_json}; }).find("broken.json"), std::string::npos);
}

// `data build --tokenizer PATH`: a model's tokenizer.json (its end of document from tokenizer_config.json, its
// template's first token before every document) or a SentencePiece .model is copied into the dataset, which
// load_tokenizer then reads; what is not a tokenizer is refused naming the path.
TEST(BpeTokenizer, ADatasetIsBuiltWithAModelsOwnTokenizerFile) {
  const fs::path jsonl = work() / "ds.jsonl";
  std::vector<std::string> docs;
  for (int i = 0; i < 60; ++i)
    docs.push_back(fmt::format("document {} says: the quick brown fox, again and again.", i));
  write_corpus(jsonl, docs);
  peer(fmt::format("train --corpus {} --out {} --vocab 300 --families llama3", jsonl.string(),
                   (work() / "ds").string()));
  Corpus corpus;
  for (const auto& d : docs) corpus.docs.push_back({d, corpus.domain_id("fox")});
  const fs::path out = work() / "ds_built";
  build_dataset(corpus, out,
                {.tokenizer = (work() / "ds" / "llama3" / "tokenizer.json").string(), .val_permille = 200});
  EXPECT_TRUE(fs::exists(out / "tokenizer.json"));
  EXPECT_TRUE(fs::exists(out / "tokenizer_config.json"));
  const Dataset ds = Dataset::open(out);
  EXPECT_EQ(ds.tokenizer_kind(), "bpe");
  const auto tok = load_tokenizer(out);
  const BpeTokenizer reference(work() / "ds" / "llama3" / "tokenizer.json");
  EXPECT_EQ(tok->eot_id(), *reference.id_of("<|end_of_text|>"));
  const auto shards = ds.load_shards("train");
  ASSERT_FALSE(shards.empty());
  const auto& first = shards.front().docs.front();
  EXPECT_EQ(shards.front().tokens[first.first_token], uint32_t(*reference.id_of("<|begin_of_text|>")));
  EXPECT_EQ(shards.front().tokens[first.first_token + first.num_tokens - 1], uint32_t(tok->eot_id()));
  // Another dataset's directory: the same tokenizer, taken from it.
  build_dataset(corpus, work() / "ds_again", {.tokenizer = out.string(), .val_permille = 200});
  EXPECT_EQ(load_tokenizer(work() / "ds_again")->encode("the quick brown fox"), tok->encode("the quick brown fox"));
  // A SentencePiece .model file.
  build_dataset(corpus, work() / "ds_sp",
                {.tokenizer = "sentencepiece", .sentencepiece = {.vocab_size = 320}, .val_permille = 200});
  build_dataset(corpus, work() / "ds_sp_model",
                {.tokenizer = (work() / "ds_sp" / "tokenizer.model").string(), .val_permille = 200});
  EXPECT_EQ(Dataset::open(work() / "ds_sp_model").tokenizer_kind(), "sentencepiece");
  EXPECT_EQ(load_tokenizer(work() / "ds_sp_model")->encode("the quick brown fox"),
            load_tokenizer(work() / "ds_sp")->encode("the quick brown fox"));
  const auto refused = [&](const std::string& tokenizer) {
    return test_support::error_of([&] { build_dataset(corpus, work() / "ds_refused", {.tokenizer = tokenizer}); });
  };
  EXPECT_NE(refused((work() / "missing.json").string()).find("neither byte, sentencepiece nor an existing"),
            std::string::npos);
  EXPECT_NE(refused(jsonl.string()).find("a Hugging Face tokenizer.json (.json) or a SentencePiece .model"),
            std::string::npos);
  EXPECT_NE(refused(work().string()).find("holds no tokenizer.model, tokenizer.json"), std::string::npos);
}
