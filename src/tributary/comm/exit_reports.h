// Which worker exited, and how, as its `tributary launch` saw it: the cause a peer's failed collective names. Gloo's
// own error says "Connection closed by peer [address]:port" — the connection's remote end, often an ephemeral port
// and the kernel's choice of source address, so no rank can be read from it reliably. Launch knows which rank exited
// and how, and writes it to the run's store at once (before it stops or restarts anything); a group whose collective
// failed early reads what was reported since the group formed and names the rank.
// Keys (under the run's prefix): ft/exits (how many so far), ft/exit/{n} = "rank {r} {how}".
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace c10d {
class Store;
}

namespace tributary::comm {

class Store;

// Launch: rank `rank` exited `how` ("was killed by signal 9 (SIGKILL)", "exited with status 2").
void report_exit(Store& store, int rank, const std::string& how);

// What a group reads of the reports. Never throws: the store may be gone with the failure being described.
class ExitWatch {
 public:
  ExitWatch();                                                // reads nothing (a group of one)
  explicit ExitWatch(c10::intrusive_ptr<c10d::Store> store);  // from the reports made so far on
  explicit ExitWatch(const Store& store);
  ExitWatch(const ExitWatch&);
  ExitWatch& operator=(const ExitWatch&);
  ExitWatch(ExitWatch&&) noexcept;
  ExitWatch& operator=(ExitWatch&&) noexcept;
  ~ExitWatch();  // out of line: c10d::Store is complete only in comm/'s sources
  // "rank 1 was killed by signal 9 (SIGKILL), as its launch reported" for the reports made since, waiting up to
  // `wait` for the first one (launch reports within its 0.1 s poll of its workers); "" if none came.
  std::string reported(std::chrono::milliseconds wait) const;

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  int64_t seen_ = 0;
};

}  // namespace tributary::comm
