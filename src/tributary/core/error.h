// Error policy (docs/errors.md):
//  - Error: a user mistake (config, data, files, flags). The message names the key, file or rank and says what to do.
//  - NetworkError: a peer or the network failed; the runtime may recover from it.
//  - Broken internal invariants use TRIB_CHECK, which prints both sides and is a bug report, not a user message.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace tributary {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

class NetworkError : public Error {
 public:
  explicit NetworkError(const std::string& message) : Error(message) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

[[noreturn]] void internal_failure(const char* file, int line, const std::string& what);

}  // namespace tributary

#define TRIB_CHECK(cond, ...)                                                                      \
  do {                                                                                             \
    if (!(cond)) ::tributary::internal_failure(__FILE__, __LINE__, "check failed: " #cond " " __VA_ARGS__); \
  } while (0)
