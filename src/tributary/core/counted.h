// A count with its noun in the right number, for messages and log lines: counted(1, "level") is "1 level",
// counted(2, "level") "2 levels".
#pragma once

#include <cstdint>
#include <string>

namespace tributary {

inline std::string counted(int64_t n, const std::string& noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

}  // namespace tributary
