#include "tributary/data/sentencepiece_model.h"

#include <gtest/gtest.h>

#include <limits>

#include "support/error_of.h"
#include "tributary/core/fs.h"
#include "tributary/data/hf_tokenizer.h"
#include "tributary/data/tokenizer.h"

using namespace tributary;
using tributary::test_support::error_of;

namespace {

// A BPE model as data build trains one (identity normalizer, byte fallback, spaces kept), on a small text.
fs::path trained_bpe() {
  const fs::path dir = fs::temp_directory_path() / "trib_spm_model_test";
  if (fs::exists(dir / "tok.model")) return dir / "tok.model";
  fs::create_directories(dir);
  std::vector<std::string> docs;
  for (int i = 0; i < 300; ++i)
    docs.push_back("In the beginning God created the heaven and the earth, verse " + std::to_string(i) + ".");
  std::vector<std::string_view> views(docs.begin(), docs.end());
  train_sentencepiece(views, dir / "tok", {.vocab_size = 300, .model_type = "bpe"});
  return dir / "tok.model";
}

}  // namespace

TEST(SentencePieceModel, ReadsThePiecesAndSettingsLibsentencepieceWrote) {
  const fs::path file = trained_bpe();
  const auto model = SentencePieceModel::parse(read_file(file), file.string());
  const SentencePieceTokenizer tokenizer(file);
  ASSERT_EQ(int64_t(model.pieces.size()), tokenizer.vocab_size());
  EXPECT_EQ(model.kind, SentencePieceModel::Kind::kBpe);
  EXPECT_TRUE(model.byte_fallback);
  EXPECT_EQ(model.normalizer, "identity");
  EXPECT_TRUE(model.add_dummy_prefix);
  EXPECT_FALSE(model.remove_extra_whitespaces);
  EXPECT_EQ(model.pieces[0].type, SentencePieceModel::PieceType::kUnknown);
  EXPECT_EQ(model.pieces[size_t(tokenizer.eot_id())].type, SentencePieceModel::PieceType::kControl);
  EXPECT_EQ(model.pieces[2 + 'A'].text, "<0x41>");  // the 256 byte pieces follow <unk> and </s>
  EXPECT_EQ(model.pieces[2 + 'A'].type, SentencePieceModel::PieceType::kByte);
  // A piece of the model decodes to its text: the ids are the pieces' order.
  const int32_t id = 2 + 256;
  std::string text = model.pieces[id].text;
  if (text.rfind("\u2581", 0) == 0) text = text.substr(3);
  EXPECT_EQ(tokenizer.decode({id}), text);
  EXPECT_EQ(hf_unsupported(model), "");
}

TEST(SentencePieceModel, TheBpeMergesAreTheVocabularysSplitsInScoreOrder) {
  const fs::path file = trained_bpe();
  const auto model = SentencePieceModel::parse(read_file(file), file.string());
  const HfTokenizer hf = hf_sentencepiece_tokenizer(model, 1, 64);
  const auto& merges = hf.tokenizer["model"]["merges"];
  ASSERT_GT(merges.size(), 10u);
  // Every merge makes a piece of the vocabulary, and the pieces they make come in the order of their scores.
  float last = std::numeric_limits<float>::infinity();
  for (const auto& m : merges) {
    const std::string made = m[0].get<std::string>() + m[1].get<std::string>();
    ASSERT_TRUE(hf.tokenizer["model"]["vocab"].contains(made)) << made;
    const float score = model.pieces[hf.tokenizer["model"]["vocab"][made].get<size_t>()].score;
    EXPECT_LE(score, last) << made;
    last = score;
  }
  EXPECT_EQ(hf.config["eos_token"], "</s>");
  EXPECT_EQ(hf.config["unk_token"], "<unk>");
}

TEST(SentencePieceModel, NotAModelIsRefusedNamingTheFile) {
  std::string msg = error_of([] { SentencePieceModel::parse("\x0a\xff\xff\xff", "x/tokenizer.model"); });
  EXPECT_NE(msg.find("x/tokenizer.model"), std::string::npos) << msg;
  msg = error_of([] { SentencePieceModel::parse("", "y/tokenizer.model"); });
  EXPECT_NE(msg.find("no pieces"), std::string::npos) << msg;
  // a truncated real model
  const std::string bytes = read_file(trained_bpe());
  msg = error_of([&] { SentencePieceModel::parse(bytes.substr(0, bytes.size() / 2), "z.model"); });
  EXPECT_NE(msg.find("z.model"), std::string::npos) << msg;
  SentencePieceModel other = SentencePieceModel::parse(bytes, "t");
  other.normalizer = "nmt_nfkc";
  EXPECT_NE(hf_unsupported(other).find("nmt_nfkc"), std::string::npos);
  EXPECT_THROW(hf_sentencepiece_tokenizer(other, 1, 64), Error);
}
