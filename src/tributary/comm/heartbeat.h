// Liveness on the run's store, the way DiPaCo's task queue and the fault-tolerant replicas both need it.
//
// Heartbeat: a thread that bumps the counter `hb/<id>` every `interval` on a store connection of its own (a long
// blocking get on the main connection must not delay it). A process that is killed, frozen (SIGSTOP) or cut off
// stops bumping. If the store itself goes away the thread ends quietly: the main thread finds out on its next call.
//
// Liveness: an observer's view. A member is dead once its counter has not moved for `dead_after` seconds of this
// observer's clock (counters, not timestamps: the machines' clocks need not agree). Observers may disagree for a
// moment near the limit, so decisions built on it are agreed through the store (comm/membership.h).
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "tributary/comm/store.h"

namespace tributary::comm {

class Heartbeat {
 public:
  // `store`: a connection used only by this thread. The first beat is sent before the constructor returns.
  Heartbeat(Store store, const std::string& key_prefix, int id,
            std::chrono::milliseconds interval = std::chrono::milliseconds(250));
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

 private:
  Store store_;
  std::string key_;
  std::chrono::milliseconds interval_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

class Liveness {
 public:
  Liveness(Store store, std::string key_prefix, int self, double dead_after_s)
      : store_(std::move(store)), prefix_(std::move(key_prefix)), self_(self), dead_after_s_(dead_after_s) {}
  // Reads every member's counter now; true for members (never this process) whose counter is stale.
  bool dead(int id) { return silence_s(id) > dead_after_s_; }
  // Reads the member's counter now: seconds of this observer's clock since it last moved (0 for this process).
  double silence_s(int id);
  std::vector<int> dead_among(const std::vector<int>& ids);
  double dead_after_s() const { return dead_after_s_; }

 private:
  struct Beat {
    int64_t value = -1;
    std::chrono::steady_clock::time_point changed;
  };
  Store store_;
  std::string prefix_;
  int self_;
  double dead_after_s_;
  std::map<int, Beat> beats_;
};

}  // namespace tributary::comm
