// Minimal leveled logging to stderr with a per-process prefix (the rank, once distributed runs exist).
#pragma once

#include <fmt/format.h>

#include <string>

namespace tributary::log {

enum class Level { debug = 0, info = 1, warn = 2, error = 3 };

void set_level(Level level);
void set_prefix(std::string prefix);
void write(Level level, const std::string& message);

template <typename... Args>
void info(fmt::format_string<Args...> f, Args&&... args) {
  write(Level::info, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) {
  write(Level::warn, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void error(fmt::format_string<Args...> f, Args&&... args) {
  write(Level::error, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void debug(fmt::format_string<Args...> f, Args&&... args) {
  write(Level::debug, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace tributary::log
