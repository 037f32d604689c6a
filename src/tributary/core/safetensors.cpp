#include "tributary/core/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "tributary/core/error.h"

namespace tributary::safetensors {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct DTypeInfo {
  DType dtype;
  const char* name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::BOOL, "BOOL", 1}, {DType::U8, "U8", 1},   {DType::I8, "I8", 1},     {DType::I16, "I16", 2},
    {DType::U16, "U16", 2},   {DType::F16, "F16", 2}, {DType::BF16, "BF16", 2}, {DType::I32, "I32", 4},
    {DType::U32, "U32", 4},   {DType::F32, "F32", 4}, {DType::F64, "F64", 8},   {DType::I64, "I64", 8},
    {DType::U64, "U64", 8},
};

}  // namespace

size_t dtype_size(DType dtype) { return kDTypes[static_cast<int>(dtype)].size; }
std::string_view dtype_name(DType dtype) { return kDTypes[static_cast<int>(dtype)].name; }

DType dtype_from_name(std::string_view name, std::string_view context) {
  for (const auto& info : kDTypes)
    if (name == info.name) return info.dtype;
  fail("{}: unknown safetensors dtype '{}'", context, name);
}

File File::load(const fs::path& path) { return parse(read_file(path), path.string()); }

File File::parse(std::string bytes, std::string origin) {
  File file;
  file.bytes_ = std::move(bytes);
  file.origin_ = std::move(origin);
  const std::string& b = file.bytes_;
  const std::string& o = file.origin_;
  if (b.size() < 8)
    fail("'{}' is not a safetensors file: {} bytes is shorter than the 8-byte header length", o, b.size());
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(b[i]);
  if (header_len > kMaxHeaderBytes || header_len > b.size() - 8)
    fail("'{}' is truncated or not a safetensors file: header length {} but the file has {} bytes", o, header_len,
         b.size());
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(b.begin() + 8, b.begin() + 8 + static_cast<std::ptrdiff_t>(header_len));
  } catch (const std::exception& e) {
    fail("'{}': safetensors header is not valid JSON ({})", o, e.what());
  }
  if (!header.is_object()) fail("'{}': safetensors header is not a JSON object", o);
  const size_t data_begin = 8 + header_len;
  const size_t data_size = b.size() - data_begin;
  std::vector<std::pair<size_t, size_t>> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") {
      if (!it->is_object()) fail("'{}': __metadata__ must be an object of strings", o);
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) fail("'{}': __metadata__['{}'] must be a string", o, m.key());
        file.metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    const auto& t = *it;
    std::string ctx = fmt::format("'{}' tensor '{}'", o, name);
    if (!t.is_object() || !t.contains("dtype") || !t.contains("shape") || !t.contains("data_offsets"))
      fail("{}: entry needs dtype, shape and data_offsets", ctx);
    if (!t["dtype"].is_string()) fail("{}: dtype must be a string", ctx);
    TensorView view{};
    view.dtype = dtype_from_name(t["dtype"].get<std::string>(), ctx);
    if (!t["shape"].is_array()) fail("{}: shape must be an array", ctx);
    uint64_t count = 1;
    for (const auto& d : t["shape"]) {
      if (!d.is_number_unsigned()) fail("{}: shape entries must be non-negative integers", ctx);
      uint64_t dim = d.get<uint64_t>();
      // Each dimension must fit a tensor's int64 size even when another is 0 (a [0, 2^64-1] tensor holds no bytes)
      if (dim > (uint64_t{1} << 62)) fail("{}: shape entry {} is larger than any tensor", ctx, dim);
      if (dim != 0 && count > std::numeric_limits<uint64_t>::max() / dim / 8) fail("{}: shape overflows", ctx);
      count *= dim;
      view.shape.push_back(static_cast<int64_t>(dim));
    }
    const auto& off = t["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      fail("{}: data_offsets must be [begin, end]", ctx);
    uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end || end > data_size)
      fail("{}: data_offsets [{}, {}] fall outside the {} data bytes (truncated file?)", ctx, begin, end, data_size);
    if (end - begin != count * dtype_size(view.dtype))
      fail("{}: {} bytes stored but dtype x shape needs {}", ctx, end - begin, count * dtype_size(view.dtype));
    view.data = reinterpret_cast<const uint8_t*>(b.data()) + data_begin + begin;
    view.num_bytes = end - begin;
    ranges.emplace_back(begin, end);
    file.tensors_.emplace(name, std::move(view));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second) fail("'{}': tensors have overlapping data ranges", o);
  return file;
}

const TensorView& File::at(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) fail("'{}' has no tensor named '{}'", origin_, name);
  return it->second;
}

std::string serialize(const std::vector<Entry>& entries, const std::map<std::string, std::string>& metadata) {
  std::vector<const Entry*> sorted;
  for (const auto& e : entries) sorted.push_back(&e);
  std::sort(sorted.begin(), sorted.end(), [](const Entry* a, const Entry* b) { return a->name < b->name; });
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (size_t i = 0; i < sorted.size(); ++i) {
    const Entry& e = *sorted[i];
    if (i > 0 && sorted[i - 1]->name == e.name) fail("safetensors: duplicate tensor name '{}'", e.name);
    header[e.name] = {
        {"dtype", dtype_name(e.dtype)}, {"shape", e.shape}, {"data_offsets", {offset, offset + e.num_bytes}}};
    offset += e.num_bytes;
  }
  std::string json = header.dump();
  // Pad the header with spaces so the data starts 8-byte aligned (allowed by the format).
  while ((8 + json.size()) % 8 != 0) json.push_back(' ');
  std::string out;
  out.reserve(8 + json.size() + offset);
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out += json;
  for (const Entry* e : sorted) out.append(static_cast<const char*>(e->data), e->num_bytes);
  return out;
}

}  // namespace tributary::safetensors
