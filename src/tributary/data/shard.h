// Token shard file: the unit of tokenized data on disk.
//
//   offset  size  field
//   0       8     magic "TRIBTOK\0"
//   8       4     version (1)
//   12      4     bytes per token (2: uint16, 4: uint32)
//   16      8     num_tokens
//   24      8     num_docs
//   32      8     xxh64 of the document table
//   40      8     xxh64 of the token data
//   48      16    reserved (zero)
//   64            document table: num_docs x {u64 first_token, u32 num_tokens, u32 domain}
//   ...           tokens, little-endian
//
// Every document ends with the tokenizer's end-of-text id. Shards are written atomically (temp + fsync + rename);
// a truncated or corrupted shard is refused with an Error naming the file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tributary/core/fs.h"

namespace tributary {

struct ShardDoc {
  uint64_t first_token;
  uint32_t num_tokens;
  uint32_t domain;
};

struct Shard {
  std::vector<uint32_t> tokens;
  std::vector<ShardDoc> docs;

  static Shard read(const fs::path& path);
  // Writes atomically with the smallest token width that holds max_token_id.
  void write(const fs::path& path, int64_t max_token_id) const;
};

}  // namespace tributary
