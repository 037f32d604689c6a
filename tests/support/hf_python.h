// Hugging Face's own code as the peer of our Llama layout (tests/reference/hf_llama_logits.py, make_hf_llama.py):
// transformers' LlamaForCausalLM loads what `export --format hf` wrote, and makes the checkpoints `import` reads.
#pragma once

#include <fmt/format.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "integration/shell.h"
#include "test_paths.h"  // generated: TRIBUTARY_CLI, TRIBUTARY_SOURCE_DIR, ...
#include "tributary/core/fs.h"

namespace tributary::test_support {

// The next-token loss of `logits` (B, T, V) on `tokens` (B, T), as training and eval compute it: what ours and
// transformers' logits are compared by.
inline double next_token_loss(const torch::Tensor& logits, const torch::Tensor& tokens) {
  const int64_t V = logits.size(2), T = tokens.size(1);
  return torch::nn::functional::cross_entropy(logits.narrow(1, 0, T - 1).reshape({-1, V}),
                                              tokens.narrow(1, 1, T - 1).reshape({-1}))
      .item<double>();
}

// tokens (B, T) int64 as the scripts' --tokens: rows separated by ';', ids by ','.
inline std::string token_rows(const torch::Tensor& tokens) {
  std::string rows;
  for (int64_t b = 0; b < tokens.size(0); ++b) {
    if (b) rows += ";";
    for (int64_t t = 0; t < tokens.size(1); ++t) rows += (t ? "," : "") + std::to_string(tokens[b][t].item<int64_t>());
  }
  return rows;
}

// Raw little-endian float32 logits of shape (B, T, vocab), as the scripts write them.
inline torch::Tensor read_logits(const std::filesystem::path& file, const torch::Tensor& tokens, int64_t vocab) {
  const std::string bytes = read_file(file);
  auto logits = torch::empty({tokens.size(0), tokens.size(1), vocab}, torch::kFloat32);
  if (bytes.size() != size_t(logits.numel()) * 4)
    throw std::runtime_error(
        fmt::format("{} holds {} bytes, expected {}", file.string(), bytes.size(), logits.numel() * 4));
  std::memcpy(logits.data_ptr<float>(), bytes.data(), bytes.size());
  return logits;
}

// The logits transformers computes from each exported directory alone, in one Python process (importing transformers
// costs seconds). A Python failure is a test failure with its output.
inline std::vector<torch::Tensor> transformers_logits(const std::vector<std::filesystem::path>& dirs,
                                                      const torch::Tensor& tokens, int64_t vocab) {
  std::string pairs;
  std::vector<std::filesystem::path> outs;
  for (size_t i = 0; i < dirs.size(); ++i) {
    outs.push_back(std::filesystem::temp_directory_path() / fmt::format("hf_logits_{}_{}.f32", ::getpid(), i));
    pairs += fmt::format(" '{}={}'", dirs[i].string(), outs.back().string());
  }
  const auto [rc, printed] = run_shell(fmt::format("{} {}/tests/reference/hf_llama_logits.py --tokens '{}'{}",
                                                   TRIBUTARY_PYTHON, TRIBUTARY_SOURCE_DIR, token_rows(tokens), pairs));
  if (rc != 0) throw std::runtime_error("hf_llama_logits.py failed (" + std::to_string(rc) + "): " + printed);
  std::vector<torch::Tensor> logits;
  for (const auto& out : outs) {
    logits.push_back(read_logits(out, tokens, vocab));
    std::filesystem::remove(out);
  }
  return logits;
}

inline torch::Tensor transformers_logits(const std::filesystem::path& dir, const torch::Tensor& tokens, int64_t vocab) {
  return transformers_logits(std::vector<std::filesystem::path>{dir}, tokens, vocab).front();
}

// Random Llamas made by transformers (LlamaConfig + save_pretrained, sharded safetensors with an index) under `out`,
// one directory per variant (mha|gqa)-(tied|untied), each with its logits for `tokens` in VARIANT.f32 beside it.
inline void make_transformers_llamas(const std::filesystem::path& out, const torch::Tensor& tokens,
                                     const std::string& variants) {
  const auto [rc, printed] =
      run_shell(fmt::format("{} {}/tests/reference/make_hf_llama.py --out {} --tokens '{}' --variants {}",
                            TRIBUTARY_PYTHON, TRIBUTARY_SOURCE_DIR, out.string(), token_rows(tokens), variants));
  if (rc != 0) throw std::runtime_error("make_hf_llama.py failed (" + std::to_string(rc) + "): " + printed);
}

}  // namespace tributary::test_support
