#include "tributary/core/log.h"

#include <cstdio>
#include <mutex>

namespace tributary::log {
namespace {
Level g_level = Level::info;
std::string g_prefix;
std::mutex g_mutex;
}  // namespace

void set_level(Level level) { g_level = level; }
void set_prefix(std::string prefix) { g_prefix = std::move(prefix); }

void write(Level level, const std::string& message) {
  if (level < g_level) return;
  static const char* names[] = {"debug", "info", "WARNING", "ERROR"};
  std::lock_guard<std::mutex> lock(g_mutex);
  if (level == Level::info) {
    std::fprintf(stderr, "%s%s\n", g_prefix.c_str(), message.c_str());
  } else {
    std::fprintf(stderr, "%s[%s] %s\n", g_prefix.c_str(), names[static_cast<int>(level)], message.c_str());
  }
  std::fflush(stderr);
}

}  // namespace tributary::log
