#include "tributary/runtime/dipaco/state_server.h"

#include "tributary/core/clock.h"
#include "tributary/core/error.h"
#include "tributary/core/log.h"

namespace tributary {
namespace {

// Both sides poll (check + a short sleep) rather than block in the store's wait: a c10d wait that times out leaves its
// connection expecting a reply that comes later, and the next request on it would read that instead.
constexpr auto kServePoll = std::chrono::milliseconds(10);
constexpr double kGapS = 2.0;

std::string base(int holder) { return fmt::format("dipaco/serve/w{}/", holder); }

}  // namespace

StateServer::StateServer(comm::Store connection, int rank, Lookup lookup)
    : store_(std::move(connection)), rank_(rank), lookup_(std::move(lookup)), thread_([this] { serve(); }) {}

StateServer::~StateServer() {
  stop_ = true;
  thread_.join();
}

void StateServer::serve() {
  try {
    Clock::time_point gap_since{};  // since when ask{n} is missing while ask{n + 1} is there; {}: no gap
    int64_t idle_polls = 0;
    for (int64_t n = 0; !stop_;) {
      const std::string ask = base(rank_) + fmt::format("ask{}", n);
      if (!store_.check({ask})) {
        // An asker that died between taking its number and writing its request would hold up every later one:
        // a gap that lasts is skipped (a live asker writes its request right after taking the number). Looked at
        // every 25th poll: one store request per poll while idle.
        if (++idle_polls % 25 == 0 && store_.check({base(rank_) + fmt::format("ask{}", n + 1)})) {
          if (gap_since == Clock::time_point{}) gap_since = Clock::now();
          if (seconds_since(gap_since) > kGapS) {
            gap_since = {};
            ++n;
            continue;
          }
        }
        std::this_thread::sleep_for(kServePoll);
        continue;
      }
      gap_since = {};
      const std::string what = store_.get(ask);
      store_.remove(ask);
      std::optional<std::string> bytes;
      try {
        bytes = lookup_(what);
      } catch (const std::exception& e) {  // a file removed or unreadable: the asker goes on without it
        log::warn("DiPaCo: worker {} cannot serve {}: {}", rank_, what, e.what());
      }
      store_.set(base(rank_) + fmt::format("reply{}", n), bytes ? "1" + *bytes : std::string("0"));
      if (bytes) served_bytes_ += int64_t(bytes->size());
      ++n;
    }
  } catch (const std::exception& e) {
    // The store is gone (the run ended, or its host died: the worker's own next store call reports that).
    if (!stop_) log::warn("DiPaCo: worker {} stops serving path state: {}", rank_, comm::error_text(e));
  }
}

std::optional<std::string> ask_holder(comm::Store& store, int holder, const std::string& what,
                                      std::chrono::milliseconds timeout) {
  const int64_t n = store.add(base(holder) + "next", 1) - 1;
  const std::string reply = base(holder) + fmt::format("reply{}", n);
  store.set(base(holder) + fmt::format("ask{}", n), what);
  const auto start = Clock::now();
  while (!store.check({reply})) {
    if (seconds_since(start) * 1000 > double(timeout.count())) {
      log::warn("DiPaCo: worker {} did not answer for {} within {} s (dead?): going on without it", holder, what,
                double(timeout.count()) / 1000);
      return std::nullopt;
    }
    std::this_thread::sleep_for(kServePoll);
  }
  std::string bytes = store.get(reply);
  store.remove(reply);
  if (bytes.empty() || bytes[0] != '1') return std::nullopt;
  bytes.erase(0, 1);
  return bytes;
}

}  // namespace tributary
