// safetensors reader/writer without LibTorch (the interchange format for weights; see
// shared/reference/ecosystem.md). Layout: u64 little-endian header length N, N bytes of JSON
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {"k": "v"}}, then data.
// Files are treated as hostile: every length, offset and dtype x shape product is checked before use.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "tributary/core/fs.h"

namespace tributary::safetensors {

enum class DType { BOOL, U8, I8, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64 };

size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);
DType dtype_from_name(std::string_view name, std::string_view context);  // Error naming the context if unknown

struct TensorView {
  DType dtype;
  std::vector<int64_t> shape;
  const uint8_t* data;  // points into the owning File's buffer
  size_t num_bytes;
};

// A whole file held in memory (checkpoints of our models are small; shards use their own format).
class File {
 public:
  static File load(const fs::path& path);
  static File parse(std::string bytes, std::string origin);

  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  const TensorView& at(const std::string& name) const;  // Error naming the file and the tensor
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& origin() const { return origin_; }

 private:
  std::string bytes_;
  std::string origin_;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

struct Entry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;
  size_t num_bytes;
};

// Serialises entries (sorted by name, data 8-byte aligned) to bytes; write with write_file_atomic.
std::string serialize(const std::vector<Entry>& entries, const std::map<std::string, std::string>& metadata = {});

}  // namespace tributary::safetensors
