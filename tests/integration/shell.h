// Running the real CLI from integration tests: a shell command, its exit status and everything it printed.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>
#include <utility>

namespace tributary::test_support {

inline std::pair<int, std::string> run_shell(const std::string& command) {
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  int status = ::pclose(pipe);
  return {WEXITSTATUS(status), out};
}

// The integration tests' corpus: built by the CTest fixture testdata.build (TRIBUTARY_TEST_DATA), or by the first
// test that needs it when a test binary runs on its own.
inline std::string test_data_dir(const std::string& fallback) {
  const char* env = std::getenv("TRIBUTARY_TEST_DATA");
  return env ? std::string(env) : fallback;
}

}  // namespace tributary::test_support
