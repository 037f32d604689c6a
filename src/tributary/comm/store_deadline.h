// A deadline on every call to the run's store. c10d's TCPStore client waits for a reply without one in add,
// compareSet and set, and in the ping its constructor sends: a store host that is frozen (SIGSTOP, a hung machine) or
// cut off without a reset held its workers forever (seen in issue 46's fault matrix: launch stopped, its workers
// blocked in recv() for as long as we watched). Every comm::Store call holds a StoreDeadline for its duration; a thread
// checks them twice a second, and a call past its deadline ends the process with status 4 (a network failure, as launch
// and the peers read it), naming the call — nothing else can wake a thread blocked in recv().
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace tributary::comm {

class StoreDeadline {
 public:
  StoreDeadline(std::string what, std::chrono::milliseconds budget);
  ~StoreDeadline();
  StoreDeadline(const StoreDeadline&) = delete;
  StoreDeadline& operator=(const StoreDeadline&) = delete;

 private:
  uint64_t id_;
};

}  // namespace tributary::comm
