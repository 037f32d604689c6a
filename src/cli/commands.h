// Each subcommand registers itself on the CLI11 app; the callbacks are thin: parse, build objects, call the library.
#pragma once

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

#include "tributary/core/error.h"
#include "tributary/core/fs.h"

namespace tributary::cli {

void add_train(CLI::App& app);
void add_eval(CLI::App& app);
void add_generate(CLI::App& app);
void add_data(CLI::App& app);
void add_plot(CLI::App& app);
void add_plan(CLI::App& app);
void add_launch(CLI::App& app);
void add_store(CLI::App& app);
void add_identity(CLI::App& app);
void add_route(CLI::App& app);
void add_export_path(CLI::App& app);
void add_export(CLI::App& app);
void add_import(CLI::App& app);
void add_report(CLI::App& app);

// Validators for numeric flags: out-of-range, NaN and infinite values are parse errors (exit 2, one [ERROR] line).
// CLI::Range alone lets NaN through (every comparison with NaN is false).
inline CLI::Validator finite_range(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        double v = 0;
        try {
          size_t used = 0;
          v = std::stod(s, &used);
          if (used != s.size()) return "'" + s + "' is not a number";
        } catch (const std::exception&) {
          return "'" + s + "' is not a number";
        }
        if (!(v >= lo && v <= hi)) return fmt::format("'{}' is outside {:g} to {:g}", s, lo, hi);
        return {};
      },
      fmt::format("{:g} to {:g}", lo, hi));
}
// An output file the user named with --out that already exists is replaced only with --overwrite (a command's own
// default file in the run directory, report.html or loss.png, is rewritten: it is that command's output). A directory
// is left to the write, which names it.
inline void refuse_existing_out(const std::string& out, bool overwrite) {
  std::error_code ec;
  if (!out.empty() && !overwrite && fs::exists(fs::symlink_status(out, ec)) && !fs::is_directory(out, ec))
    fail("--out '{}' already exists; pass --overwrite to replace it, or choose another path", out);
}

constexpr int64_t kMaxThreads = 1024;  // intra-op threads a flag may ask for

}  // namespace tributary::cli
