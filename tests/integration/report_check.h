// `tributary report` of a real run, opened in a real headless browser (support/browser.h): every section present and
// filled (the page's own check, read from <body data-check>), no script error, and the given texts on the page.
#pragma once

#include <gtest/gtest.h>

#include <iostream>
#include <string>
#include <vector>

#include "shell.h"
#include "support/browser.h"
#include "test_paths.h"  // generated: TRIBUTARY_CLI, TRIBUTARY_SOURCE_DIR, ...
#include "tributary/core/fs.h"

namespace tributary::test_support {

// `sections`: the ids of the sections this kind of run has, in order (a DiLoCo run has no DiPaCo paths).
inline void expect_report_opens(const fs::path& run_dir, const std::vector<std::string>& texts,
                                const std::string& sections) {
  const fs::path html = run_dir / "report.html";
  const auto [rc, out] = run_shell(std::string(TRIBUTARY_CLI) + " report " + run_dir.string());
  ASSERT_EQ(rc, 0) << out;
  const std::string page = read_file(html);
  for (const auto& t : texts) EXPECT_NE(page.find(t), std::string::npos) << "the report lacks: " << t;
  const auto browser = headless_dom(html);
  if (!browser) {  // a machine set up without ./run setup (a GPU image): the page was checked as text only
    std::cerr << "chromium is not installed (./run setup installs it): the report was not opened in a browser\n";
    return;
  }
  const std::string& dom = browser->dom;
  EXPECT_NE(dom.find("data-sections=\"" + sections + "\""), std::string::npos) << dom.substr(0, 2000);
  EXPECT_NE(dom.find("data-errors=\"0\""), std::string::npos) << browser->log;
  EXPECT_NE(dom.find("data-check=\"ok\""), std::string::npos)
      << "empty sections: " << dom.substr(dom.find("data-empty"), 80);
  EXPECT_EQ(browser->log.find("Uncaught"), std::string::npos) << browser->log;
}

}  // namespace tributary::test_support
