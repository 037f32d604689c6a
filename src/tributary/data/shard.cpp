#include "tributary/data/shard.h"

#include <cstring>

#include "tributary/core/error.h"
#include "tributary/core/hash.h"

namespace tributary {
namespace {

constexpr char kMagic[8] = {'T', 'R', 'I', 'B', 'T', 'O', 'K', '\0'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 64;

template <typename T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}
template <typename T>
T get(const std::string& in, size_t offset) {
  T value;
  std::memcpy(&value, in.data() + offset, sizeof(T));
  return value;
}

}  // namespace

void Shard::write(const fs::path& path, int64_t max_token_id) const {
  const uint32_t width = max_token_id < 65536 ? 2 : 4;
  std::string table;
  table.reserve(docs.size() * 16);
  for (const auto& d : docs) {
    put<uint64_t>(table, d.first_token);
    put<uint32_t>(table, d.num_tokens);
    put<uint32_t>(table, d.domain);
  }
  std::string data;
  data.reserve(tokens.size() * width);
  for (uint32_t t : tokens) {
    TRIB_CHECK(static_cast<int64_t>(t) <= max_token_id);
    if (width == 2) {
      put<uint16_t>(data, static_cast<uint16_t>(t));
    } else {
      put<uint32_t>(data, t);
    }
  }
  std::string out(kMagic, 8);
  put<uint32_t>(out, kVersion);
  put<uint32_t>(out, width);
  put<uint64_t>(out, tokens.size());
  put<uint64_t>(out, docs.size());
  put<uint64_t>(out, hash64(table.data(), table.size()));
  put<uint64_t>(out, hash64(data.data(), data.size()));
  out.resize(kHeaderBytes, '\0');
  out += table;
  out += data;
  write_file_atomic(path, out);
}

Shard Shard::read(const fs::path& path) {
  const std::string bytes = read_file(path);
  const std::string name = path.string();
  if (bytes.size() < kHeaderBytes || std::memcmp(bytes.data(), kMagic, 8) != 0)
    fail("'{}' is not a Tributary token shard (bad magic or shorter than the 64-byte header); rebuild the dataset",
         name);
  uint32_t version = get<uint32_t>(bytes, 8);
  if (version != kVersion)
    fail("'{}' has shard format version {}, this build reads version {}; rebuild the dataset", name, version, kVersion);
  uint32_t width = get<uint32_t>(bytes, 12);
  if (width != 2 && width != 4) fail("'{}': invalid token width {} (expected 2 or 4)", name, width);
  uint64_t num_tokens = get<uint64_t>(bytes, 16);
  uint64_t num_docs = get<uint64_t>(bytes, 24);
  uint64_t table_bytes = num_docs * 16;
  uint64_t data_bytes = num_tokens * width;
  if (num_docs > bytes.size() || num_tokens > bytes.size() || kHeaderBytes + table_bytes + data_bytes != bytes.size())
    fail("'{}' is truncated or corrupted: header says {} documents and {} tokens ({} bytes) but the file has {} bytes",
         name, num_docs, num_tokens, kHeaderBytes + table_bytes + data_bytes, bytes.size());
  const char* table = bytes.data() + kHeaderBytes;
  const char* data = table + table_bytes;
  if (hash64(table, table_bytes) != get<uint64_t>(bytes, 32))
    fail("'{}' is corrupted: document table checksum mismatch; rebuild the dataset", name);
  if (hash64(data, data_bytes) != get<uint64_t>(bytes, 40))
    fail("'{}' is corrupted: token data checksum mismatch; rebuild the dataset", name);
  Shard shard;
  shard.docs.resize(num_docs);
  for (uint64_t i = 0; i < num_docs; ++i) {
    std::memcpy(&shard.docs[i].first_token, table + 16 * i, 8);
    std::memcpy(&shard.docs[i].num_tokens, table + 16 * i + 8, 4);
    std::memcpy(&shard.docs[i].domain, table + 16 * i + 12, 4);
    if (shard.docs[i].first_token + shard.docs[i].num_tokens > num_tokens)
      fail("'{}' is corrupted: document {} extends past the token data", name, i);
  }
  shard.tokens.resize(num_tokens);
  if (width == 2) {
    for (uint64_t i = 0; i < num_tokens; ++i) {
      uint16_t v;
      std::memcpy(&v, data + 2 * i, 2);
      shard.tokens[i] = v;
    }
  } else {
    std::memcpy(shard.tokens.data(), data, data_bytes);
  }
  return shard;
}

}  // namespace tributary
