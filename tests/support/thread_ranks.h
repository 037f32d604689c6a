// Ranks as threads: runs body(r) for r in 0..n-1 concurrently, joins them all, then rethrows the first rank's error
// (an assertion inside a thread is reported by gtest; an exception would otherwise terminate the process).
#pragma once

#include <exception>
#include <functional>
#include <thread>
#include <vector>

namespace test_support {

inline void run_threads(int n, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace test_support
