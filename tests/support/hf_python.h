// The Python proof of the Hugging Face export (tests/reference/hf_llama_logits.py): the logits that plain PyTorch,
// following modeling_llama's formulas, computes from an exported directory alone.
#pragma once

#include <fmt/format.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "integration/shell.h"
#include "tributary/core/fs.h"
#include "test_paths.h"  // generated: TRIBUTARY_CLI, TRIBUTARY_SOURCE_DIR, ...

namespace tributary::test_support {

// tokens: (B, T) int64. Returns (B, T, vocab) float32; a Python failure is a test failure with its output.
inline torch::Tensor hf_python_logits(const std::filesystem::path& dir, const torch::Tensor& tokens, int64_t vocab) {
  std::string rows;
  for (int64_t b = 0; b < tokens.size(0); ++b) {
    if (b) rows += ";";
    for (int64_t t = 0; t < tokens.size(1); ++t) rows += (t ? "," : "") + std::to_string(tokens[b][t].item<int64_t>());
  }
  const auto out = std::filesystem::temp_directory_path() / fmt::format("hf_logits_{}.f32", ::getpid());
  const auto [rc, printed] =
      run_shell(fmt::format("{} {}/tests/reference/hf_llama_logits.py {} --tokens '{}' --out {}", TRIBUTARY_PYTHON,
                            TRIBUTARY_SOURCE_DIR, dir.string(), rows, out.string()));
  if (rc != 0) throw std::runtime_error("hf_llama_logits.py failed (" + std::to_string(rc) + "): " + printed);
  const std::string bytes = read_file(out);
  std::filesystem::remove(out);
  auto logits = torch::empty({tokens.size(0), tokens.size(1), vocab}, torch::kFloat32);
  if (bytes.size() != size_t(logits.numel()) * 4)
    throw std::runtime_error(fmt::format("hf_llama_logits.py wrote {} bytes, expected {}: {}", bytes.size(),
                                         logits.numel() * 4, printed));
  std::memcpy(logits.data_ptr<float>(), bytes.data(), bytes.size());
  return logits;
}

}  // namespace tributary::test_support
