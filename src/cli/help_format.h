// The help of every command as words: "--threads INT (0 to 1024; default 0)", where CLI11 prints
// "--threads INT:INT in [0 - 1024]=0" and "INT in [0 - 9223372036854775807]" for a bound that only says "not negative".
#pragma once

#include <CLI/CLI.hpp>

namespace tributary::cli {

class HelpFormatter : public CLI::Formatter {
 public:
  std::string make_option_opts(const CLI::Option* opt) const override;
};

// A validator's description in words: "INT in [1 - 999]" -> "1 to 999", "INT in [0 - 9223372036854775807]" ->
// "at least 0"; anything else as it is.
std::string readable_bounds(const std::string& description);

}  // namespace tributary::cli
