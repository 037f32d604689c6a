#include "tributary/comm/store_deadline.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

#include <fmt/format.h>

namespace tributary::comm {
namespace {

using Clock = std::chrono::steady_clock;

struct Call {
  std::string what;
  Clock::time_point deadline;
  std::chrono::milliseconds budget;
};

struct Registry {
  std::mutex mutex;
  std::map<uint64_t, Call> calls;
  uint64_t next = 0;
  std::once_flag watching;
};

Registry& registry() {
  static auto* r = new Registry();  // never destroyed: the watcher outlives static destruction
  return *r;
}

void watch() {
  Registry& r = registry();
  while (true) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    std::lock_guard<std::mutex> lock(r.mutex);
    const auto now = Clock::now();
    for (const auto& [id, call] : r.calls)
      if (now > call.deadline) {
        const std::string line = fmt::format(
            "[ERROR] {}: the run's store has not answered within {:.0f} s (its host is frozen, or the link to it is "
            "cut without a reset); stopping this process\n",
            call.what, call.budget.count() / 1000.0);
        // Not through stdio, and without blocking: stderr may be a pipe to the frozen launch, already full.
        ::fcntl(STDERR_FILENO, F_SETFL, ::fcntl(STDERR_FILENO, F_GETFL) | O_NONBLOCK);
        (void)!::write(STDERR_FILENO, line.data(), line.size());
        std::_Exit(4);
      }
  }
}

}  // namespace

StoreDeadline::StoreDeadline(std::string what, std::chrono::milliseconds budget) {
  Registry& r = registry();
  std::call_once(r.watching, [] { std::thread(watch).detach(); });
  std::lock_guard<std::mutex> lock(r.mutex);
  id_ = r.next++;
  r.calls.emplace(id_, Call{std::move(what), Clock::now() + budget, budget});
}

StoreDeadline::~StoreDeadline() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.calls.erase(id_);
}

}  // namespace tributary::comm
