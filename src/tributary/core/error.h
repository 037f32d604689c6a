// Error policy (docs/errors.md):
//  - Error: a user mistake (config, data, files, flags). The message names the key, file or rank and says what to do.
//  - NetworkError: a peer or the network failed; the runtime may recover from it.
//  - Broken internal invariants use TRIB_CHECK(cond, "format", args...) / TRIB_CHECK_EQ(a, b): a bug report (a
//    std::logic_error, exit status 3), not a user message. TRIB_CHECK_EQ prints both sides' values; TRIB_CHECK
//    prints the condition and the formatted message. Anything a user can cause (a flag, a file, a foreign
//    checkpoint) is an Error instead.
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

// The run's store refused this process's proof of the run's secret: the machine was started with another secret (or
// none). Nothing this process does can help; its one line says what to change.
class SecretRefused : public Error {
 public:
  explicit SecretRefused(const std::string& message) : Error(message) {}
};

// A fault-tolerant run has no member left: every process that held its state is gone, so a restarted worker has
// nobody to heal from. Restarting cannot help (launch stops instead); the run continues only from a checkpoint.
class RunLost : public Error {
 public:
  explicit RunLost(const std::string& message) : Error(message) {}
};

// Exit statuses of the CLI: 2 a user Error, 3 a bug (internal check or library exception), 4 a NetworkError (a peer
// or the network failed: look at the other ranks for the cause; `launch` does), 5 RunLost (`launch` restarts nothing
// after it).
inline constexpr int kUserErrorStatus = 2;
inline constexpr int kBugStatus = 3;
inline constexpr int kNetworkErrorStatus = 4;
inline constexpr int kRunLostStatus = 5;

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

[[noreturn]] void internal_failure(const char* file, int line, const std::string& what);

namespace detail {
inline std::string check_message() { return {}; }
template <typename... Args>
std::string check_message(fmt::format_string<Args...> format, Args&&... args) {
  return fmt::format(format, std::forward<Args>(args)...);
}
}  // namespace detail

}  // namespace tributary

#define TRIB_CHECK(cond, ...)                                                                                      \
  do {                                                                                                             \
    if (!(cond))                                                                                                   \
      ::tributary::internal_failure(__FILE__, __LINE__,                                                            \
                                    "check failed: " #cond " " + ::tributary::detail::check_message(__VA_ARGS__)); \
  } while (0)

// Both sides are evaluated once and printed when they differ (they must be fmt-formattable).
#define TRIB_CHECK_EQ(a, b, ...)                                                                                  \
  do {                                                                                                            \
    const auto& trib_a_ = (a);                                                                                    \
    const auto& trib_b_ = (b);                                                                                    \
    if (!(trib_a_ == trib_b_))                                                                                    \
      ::tributary::internal_failure(__FILE__, __LINE__,                                                           \
                                    fmt::format("check failed: " #a " == " #b " ({} vs {}) {}", trib_a_, trib_b_, \
                                                ::tributary::detail::check_message(__VA_ARGS__)));                \
  } while (0)
