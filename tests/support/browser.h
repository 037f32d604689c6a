// A real headless browser for the run report's test: Debian's chromium (installed by ./run setup) loads the page
// from disk, runs its script and prints the resulting DOM. The report's own script records its verdict on <body>.
#pragma once

#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include "integration/shell.h"
#include "tributary/core/fs.h"

namespace tributary::test_support {

struct BrowserResult {
  std::string dom;  // the DOM after load, serialised
  std::string log;  // chromium's log: script errors surface as "Uncaught ..."
};

// nullopt when chromium is not installed (the caller skips, naming ./run setup).
inline std::optional<BrowserResult> headless_dom(const std::filesystem::path& html) {
  if (std::system("command -v chromium >/dev/null 2>&1") != 0) return std::nullopt;
  const auto tmp = std::filesystem::temp_directory_path() / fmt::format("trib_chromium_{}", ::getpid());
  std::filesystem::create_directories(tmp);
  const auto [rc, dom] = run_shell(
      fmt::format("(timeout 60 chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run "
                  "--user-data-dir={0}/profile --enable-logging=stderr --dump-dom 'file://{1}' 2>{0}/stderr)",
                  tmp.string(), std::filesystem::absolute(html).string()));
  BrowserResult out{dom, std::filesystem::exists(tmp / "stderr") ? read_file(tmp / "stderr") : std::string()};
  std::filesystem::remove_all(tmp);
  if (rc != 0) out.log += fmt::format("\n(chromium exited with {})", rc);
  return out;
}

}  // namespace tributary::test_support
