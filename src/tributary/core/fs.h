// File helpers with the durability contract checkpoints and shards rely on: a file written with write_file_atomic is
// either absent or complete (temp file, fsync, rename, fsync of the directory); a crash never leaves half a file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace tributary {

namespace fs = std::filesystem;

std::string read_file(const fs::path& path);  // Error naming the file when it cannot be read.
void write_file(const fs::path& path, std::string_view data, bool sync = true);
void write_file_atomic(const fs::path& path, std::string_view data);
void fsync_path(const fs::path& path);  // file or directory
// rename(from, to) and fsync of the parent directory, so the rename itself survives a crash.
void rename_durable(const fs::path& from, const fs::path& to);
// An output directory that must be new or empty (export, import: nothing there is overwritten); Error naming `option`
// and the directory otherwise.
void require_empty_output(const fs::path& dir, std::string_view option);

}  // namespace tributary
