#include <gtest/gtest.h>

#include <fstream>

#include "tributary/core/error.h"
#include "tributary/data/dataset.h"

using namespace tributary;

namespace {
fs::path fresh(const std::string& name) {
  auto p = fs::temp_directory_path() / ("trib_ds_" + name);
  fs::remove_all(p);
  return p;
}
}  // namespace

TEST(Dataset, BuildsFromTextDirectoryWithDomains) {
  auto src = fresh("src"), out = fresh("out");
  for (const char* domain : {"poems", "code"}) {
    fs::create_directories(src / domain);
    for (int i = 0; i < 60; ++i)
      std::ofstream(src / domain / ("f" + std::to_string(i) + ".txt")) << domain << " document number " << i << "\n";
  }
  Corpus corpus = read_text_dir(src);
  EXPECT_EQ(corpus.docs.size(), 120u);
  EXPECT_EQ(corpus.domains.size(), 2u);
  build_dataset(corpus, out, {.val_permille = 200});
  Dataset ds = Dataset::open(out);
  EXPECT_EQ(ds.vocab_size(), 257);
  EXPECT_EQ(ds.split("train").num_docs + ds.split("val").num_docs, 120);
  EXPECT_GT(ds.split("val").num_docs, 5);
  auto train = ds.load_tokens("train");
  EXPECT_EQ(static_cast<int64_t>(train.size()), ds.split("train").num_tokens);
  EXPECT_EQ(train.back(), 256u) << "documents end with end-of-text";
  // Same corpus, same split: the split depends on content only.
  auto out2 = fresh("out2");
  std::reverse(corpus.docs.begin(), corpus.docs.end());
  build_dataset(corpus, out2, {.val_permille = 200});
  EXPECT_EQ(Dataset::open(out2).split("val").num_docs, ds.split("val").num_docs);
  // Every domain's documents (data.shards = "domains"): its text only, every document closed, all of them.
  const auto by_domain = ds.load_domains("train");
  ASSERT_EQ(by_domain.size(), 2u);
  for (uint32_t d = 0; d < 2; ++d) {
    const auto& tokens = by_domain[d];
    std::string text;
    for (uint32_t t : tokens)
      if (t < 256) text.push_back(char(t));
    const std::string other = ds.domains()[1 - d];
    EXPECT_EQ(text.find(other), std::string::npos) << ds.domains()[d] << " holds " << other;
    EXPECT_NE(text.find(ds.domains()[d] + " document number"), std::string::npos);
    EXPECT_EQ(tokens.back(), 256u);
  }
  EXPECT_EQ(by_domain[0].size() + by_domain[1].size(), train.size());
  fs::remove_all(src);
  fs::remove_all(out);
  fs::remove_all(out2);
}

TEST(Dataset, JsonlErrorsNameFileAndLine) {
  auto p = fresh("c4.jsonl");
  std::ofstream(p) << R"({"text": "ok", "source": "web"})" << "\n" << R"({"txt": "oops"})" << "\n";
  try {
    read_jsonl(p);
    FAIL();
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(p.string() + ":2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("\"text\""), std::string::npos) << msg;
  }
  std::ofstream(p) << R"({"text": "hello", "domain": "a"})" << "\n\n" << R"({"text": "world"})" << "\n";
  Corpus c = read_jsonl(p);
  ASSERT_EQ(c.docs.size(), 2u);
  EXPECT_EQ(c.domains[c.docs[0].domain], "a");
  fs::remove(p);
}

TEST(Dataset, MissingDirectoryIsAClearError) {
  try {
    Dataset::open("/nonexistent/ds");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("build-default"), std::string::npos);
  }
}
