#include <gtest/gtest.h>

#include "tributary/core/error.h"
#include "tributary/data/tokenizer.h"

using namespace tributary;

TEST(ByteTokenizer, RoundTripsEveryByte) {
  ByteTokenizer tok;
  std::string text;
  for (int i = 0; i < 256; ++i) text.push_back(static_cast<char>(i));
  text += "héllo wörld ✓ 日本";
  auto ids = tok.encode(text);
  EXPECT_EQ(ids.size(), text.size());
  EXPECT_EQ(tok.decode(ids), text);
  auto with_eot = ids;
  with_eot.push_back(tok.eot_id());
  EXPECT_EQ(tok.decode(with_eot), text) << "end-of-text decodes to nothing";
  EXPECT_EQ(tok.vocab_size(), 257);
}

TEST(SentencePieceTokenizer, TrainsAndRoundTrips) {
  fs::path dir = fs::temp_directory_path() / "trib_spm_test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<std::string> docs;
  for (int i = 0; i < 400; ++i)
    docs.push_back("In the beginning God created the heaven and the earth. int main(void) { return " +
                   std::to_string(i) + "; } The quick brown fox jumps over the lazy dog.");
  std::vector<std::string_view> views(docs.begin(), docs.end());
  train_sentencepiece(views, dir / "tok", {.vocab_size = 400, .model_type = "bpe"});
  SentencePieceTokenizer tok(dir / "tok.model");
  EXPECT_EQ(tok.vocab_size(), 400);
  for (const std::string& text : {std::string("The quick brown fox created 42 heavens."),
                                  std::string("unseen: ζ∑ bytes\tand  spaces\nnew line  ")}) {
    auto ids = tok.encode(text);
    EXPECT_LT(ids.size(), text.size()) << "subwords should compress";
    EXPECT_EQ(tok.decode(ids), text);
  }
  EXPECT_THROW(SentencePieceTokenizer(dir / "missing.model"), Error);
  fs::remove_all(dir);
}
