#include "tributary/core/fs.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "tributary/core/error.h"

namespace tributary {

std::string read_file(const fs::path& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) fail("'{}' is a directory; a file was expected here", path.string());
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read file '{}': {}", path.string(), std::strerror(errno));
  std::string data;
  std::vector<char> buf(1 << 16);
  while (in.read(buf.data(), static_cast<std::streamsize>(buf.size())) || in.gcount() > 0) {
    data.append(buf.data(), static_cast<size_t>(in.gcount()));
    if (!in) break;
  }
  if (in.bad()) fail("read error in '{}': {}", path.string(), std::strerror(errno));  // not a silent truncation
  return data;
}

void write_file(const fs::path& path, std::string_view data, bool sync) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot write file '{}': {}", path.string(), std::strerror(errno));
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      fail("cannot write file '{}': {}", path.string(), std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  if (sync && ::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    fail("cannot fsync file '{}': {}", path.string(), std::strerror(err));
  }
  ::close(fd);
}

void fsync_path(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open '{}' to fsync: {}", path.string(), std::strerror(errno));
  ::fsync(fd);  // directories on some filesystems refuse fsync; the rename is still ordered after the data.
  ::close(fd);
}

void rename_durable(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::rename(from, to, ec);
  if (ec) fail("cannot rename '{}' to '{}': {}", from.string(), to.string(), ec.message());
  fs::path parent = to.parent_path().empty() ? fs::path(".") : to.parent_path();
  fsync_path(parent);
}

void require_empty_output(const fs::path& dir, std::string_view option) {
  std::error_code ec;
  const auto status = fs::symlink_status(dir, ec);
  if (fs::exists(status) && !fs::is_directory(fs::status(dir, ec)))  // a link to a directory is that directory
    fail("{} '{}' is not a directory (a file, a device or a link): name a new or empty directory", option,
         dir.string());
  if (fs::exists(status) && !fs::is_empty(dir))
    fail("{} '{}' already holds files: write into a new or empty directory (nothing there is overwritten)", option,
         dir.string());
}

void write_file_atomic(const fs::path& path, std::string_view data) {
  fs::path tmp = path;
  tmp += fmt::format(".tmp-{}", ::getpid());
  std::error_code ec;
  if (fs::is_directory(path, ec))
    fail("'{}' is a directory; name a file to write (nothing was written)", path.string());
  try {
    write_file(tmp, data, /*sync=*/true);
    rename_durable(tmp, path);
  } catch (...) {
    fs::remove(tmp, ec);  // a failed write leaves no temporary file behind
    throw;
  }
}

}  // namespace tributary
