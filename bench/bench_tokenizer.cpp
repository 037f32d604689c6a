// Our tokenizer.json reader on a corpus, for bench/tokenizers_peer.py: encodes every document of a JSONL file
// ({"text": ...} per line) with a Hugging Face tokenizer.json and writes the ids as tests/reference/hf_bpe_peer.py's
// `encode` does (little-endian int32 ids to OUT, each document's count to OUT.lens), then prints the time encoding took
// (one thread, reading and writing excluded) as JSON.
//
//   bench_tokenizer TOKENIZER_JSON DOCS.jsonl OUT
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "tributary/core/error.h"
#include "tributary/data/bpe_tokenizer.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s TOKENIZER_JSON DOCS.jsonl OUT\n", argv[0]);
    return 2;
  }
  try {
    const tributary::BpeTokenizer tokenizer(argv[1]);
    std::vector<std::string> docs;
    std::ifstream in(argv[2]);
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) docs.push_back(nlohmann::json::parse(line).at("text").get<std::string>());
    std::vector<std::vector<int32_t>> ids(docs.size());
    const auto start = std::chrono::steady_clock::now();
    for (size_t i = 0; i < docs.size(); ++i) ids[i] = tokenizer.encode(docs[i]);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::ofstream out(argv[3], std::ios::binary), lens(std::string(argv[3]) + ".lens", std::ios::binary);
    size_t bytes = 0, tokens = 0;
    for (size_t i = 0; i < docs.size(); ++i) {
      out.write(reinterpret_cast<const char*>(ids[i].data()), std::streamsize(ids[i].size() * 4));
      const int32_t n = int32_t(ids[i].size());
      lens.write(reinterpret_cast<const char*>(&n), 4);
      bytes += docs[i].size();
      tokens += ids[i].size();
    }
    std::printf("{\"seconds\": %.4f, \"documents\": %zu, \"bytes\": %zu, \"tokens\": %zu}\n", seconds, docs.size(),
                bytes, tokens);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_tokenizer: %s\n", e.what());
    return 2;
  }
  return 0;
}
