// Issue 12, items 1 and 5: building a dataset never deletes what the user did not ask to delete, a failed build
// leaves nothing behind, and a read error is an error instead of a silently shorter corpus.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include "support/error_of.h"
#include "tributary/core/error.h"
#include "tributary/core/fs.h"
#include "tributary/data/corpus.h"
#include "tributary/data/dataset.h"

using namespace tributary;
using test_support::error_of;

namespace {

fs::path fresh(const std::string& name) {
  auto p = fs::temp_directory_path() / ("trib_dsout_" + name);
  fs::remove_all(p);
  return p;
}

Corpus small_corpus(int docs = 100) {
  Corpus c;
  for (int i = 0; i < docs; ++i) c.docs.push_back({"document number " + std::to_string(i) + " with some text", 0});
  c.domain_id("default");
  return c;
}

std::vector<std::string> temporaries_beside(const fs::path& out) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(out.parent_path()))
    if (e.path().filename().string().rfind(out.filename().string() + ".tmp-", 0) == 0)
      names.push_back(e.path().filename().string());
  return names;
}

}  // namespace

TEST(DatasetOutput, ANonEmptyDirectoryThatIsNotADatasetIsKept) {
  auto victim = fresh("victim");
  fs::create_directories(victim);
  std::ofstream(victim / "thesis.txt") << "thesis";
  auto msg = error_of([&] { build_dataset(small_corpus(), victim, {.val_permille = 200}); });
  EXPECT_NE(msg.find("not a Tributary dataset"), std::string::npos) << msg;
  EXPECT_NE(msg.find(victim.string()), std::string::npos) << msg;
  EXPECT_EQ(read_file(victim / "thesis.txt"), "thesis");
  // --overwrite replaces datasets only, never other directories
  msg = error_of([&] { build_dataset(small_corpus(), victim, {.val_permille = 200, .overwrite = true}); });
  EXPECT_NE(msg.find("not a Tributary dataset"), std::string::npos) << msg;
  EXPECT_EQ(read_file(victim / "thesis.txt"), "thesis");
  fs::remove_all(victim);
}

TEST(DatasetOutput, AFileAtTheOutputIsKept) {
  auto file = fresh("file");
  std::ofstream(file) << "precious";
  auto msg = error_of([&] { build_dataset(small_corpus(), file, {.val_permille = 200, .overwrite = true}); });
  EXPECT_NE(msg.find("not a directory"), std::string::npos) << msg;
  EXPECT_TRUE(fs::is_regular_file(file));
  EXPECT_EQ(read_file(file), "precious");
  fs::remove(file);
}

TEST(DatasetOutput, AnExistingDatasetIsReplacedOnlyWithOverwrite) {
  auto out = fresh("ds");
  build_dataset(small_corpus(100), out, {.val_permille = 200});
  const auto docs = Dataset::open(out).split("train").num_docs + Dataset::open(out).split("val").num_docs;
  auto msg = error_of([&] { build_dataset(small_corpus(150), out, {.val_permille = 200}); });
  EXPECT_NE(msg.find("--overwrite"), std::string::npos) << msg;
  EXPECT_EQ(Dataset::open(out).split("train").num_docs + Dataset::open(out).split("val").num_docs, docs);
  build_dataset(small_corpus(150), out, {.val_permille = 200, .overwrite = true});
  EXPECT_EQ(Dataset::open(out).split("train").num_docs + Dataset::open(out).split("val").num_docs, 150);
  // an empty directory is a fine place for a new dataset
  auto empty = fresh("empty");
  fs::create_directories(empty);
  build_dataset(small_corpus(), empty, {.val_permille = 200});
  EXPECT_TRUE(fs::exists(empty / "dataset.json"));
  fs::remove_all(out);
  fs::remove_all(empty);
}

TEST(DatasetOutput, TheInputIsNeverTheOutput) {
  auto texts = fresh("texts");
  fs::create_directories(texts / "poems");
  for (int i = 0; i < 50; ++i) std::ofstream(texts / "poems" / ("p" + std::to_string(i) + ".txt")) << "poem " << i;
  for (const fs::path& out : {texts, fs::path(texts.string() + "/"), texts / "poems", texts / "sub" / "ds"}) {
    auto msg = error_of([&] { check_dataset_output(out, true, texts); });
    EXPECT_NE(msg.find("overlaps the input"), std::string::npos) << out << ": " << msg;
  }
  auto jsonl = fresh("in.jsonl");
  std::ofstream(jsonl) << R"({"text": "a"})" << "\n";
  EXPECT_NE(error_of([&] { check_dataset_output(jsonl, true, jsonl); }).find("overlaps"), std::string::npos);
  EXPECT_EQ(read_text_dir(texts).docs.size(), 50u);
  fs::remove_all(texts);
  fs::remove(jsonl);
}

TEST(DatasetOutput, AFailedBuildLeavesNoTemporaryDirectory) {
  auto out = fresh("failed");
  // One document cannot give both a training and a validation split: the build fails after writing shards.
  auto msg = error_of([&] { build_dataset(small_corpus(1), out, {.val_permille = 200}); });
  EXPECT_NE(msg.find("too few"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_TRUE(temporaries_beside(out).empty());
  // a build killed earlier (its process gone) left one: the next build of that output removes it
  pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ASSERT_GT(dead, 0);
  int status = 0;
  ::waitpid(dead, &status, 0);
  fs::path stale = out;
  stale += ".tmp-" + std::to_string(dead);
  fs::create_directories(stale);
  std::ofstream(stale / "train-00000.bin") << "partial";
  build_dataset(small_corpus(), out, {.val_permille = 200});
  EXPECT_TRUE(temporaries_beside(out).empty());
  fs::remove_all(out);
}

TEST(DatasetOutput, AReadErrorIsAnErrorNotATruncatedCorpus) {
  // Reading /proc/self/mem from offset 0 fails with EIO: the stream's badbit, as a failing disk or a line too large
  // for memory would set it. Before the fix this read as an empty (or truncated) file.
  auto msg = error_of([] { read_jsonl("/proc/self/mem"); });
  EXPECT_NE(msg.find("read error"), std::string::npos) << msg;
  EXPECT_NE(msg.find("/proc/self/mem"), std::string::npos) << msg;
  msg = error_of([] { read_file("/proc/self/mem"); });
  EXPECT_NE(msg.find("read error"), std::string::npos) << msg;
  // a directory where a file belongs (e.g. `train <a directory>`) is named as such
  msg = error_of([] { read_file(fs::temp_directory_path()); });
  EXPECT_NE(msg.find("is a directory"), std::string::npos) << msg;
}

TEST(DatasetOutput, AMisspeltDatasetIsNamedWithTheOneBesideItNotBuiltThere) {
  // Issue 45, item 7: a misspelt data.dir suggested building the built-in corpus into the misspelt directory.
  const auto parent = fresh("beside");
  build_dataset(small_corpus(), parent / "default", {.val_permille = 200});
  auto msg = error_of([&] { Dataset::open(parent / "defualt"); });
  EXPECT_NE(msg.find("does not exist; did you mean '" + (parent / "default").string() + "'?"), std::string::npos)
      << msg;
  EXPECT_EQ(msg.find("build-default"), std::string::npos) << msg;
  // nothing close: the datasets beside it, and how to build one
  msg = error_of([&] { Dataset::open(parent / "something-else"); });
  EXPECT_NE(msg.find("datasets beside it: '" + (parent / "default").string() + "'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("data build-default --out"), std::string::npos) << msg;
  // a directory that exists but holds no dataset, and a relative path names the working directory
  fs::create_directories(parent / "empty");
  msg = error_of([&] { Dataset::open(parent / "empty"); });
  EXPECT_NE(msg.find("it has no dataset.json"), std::string::npos) << msg;
  // a directory of texts: the dataset goes into a new directory (data build refuses an --out holding its input)
  fs::create_directories(parent / "texts");
  write_file(parent / "texts" / "a.txt", "a text");
  msg = error_of([&] { Dataset::open(parent / "texts"); });
  EXPECT_NE(msg.find("--out " + (parent / "texts-data").string() +
                     "`, and train with --set data.dir=" + (parent / "texts-data").string()),
            std::string::npos)
      << msg;
  msg = error_of([&] { Dataset::open("no-such-relative-dataset"); });
  EXPECT_NE(msg.find("relative to the working directory '" + fs::current_path().string() + "'"), std::string::npos)
      << msg;
  fs::remove_all(parent);
}
