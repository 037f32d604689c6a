// Path state on request (dipaco.path_state = holder): the worker that trained a path keeps the path's AdamW state and
// early-stopping copy in its own run directory and hands them out when another worker asks, instead of putting every
// task's state into the run's store. A worker usually trains its last round's paths again (task_queue.h: it claims
// them first), so most state never moves: at 6x6 a worker put 181-209 MB of state per round into the store and fetched
// 0-7 MB of it (docs/benchmarks.md §14.4).
//
// Protocol, over the run's store (keys under dipaco/serve/w{holder}/):
//   asker    n = add(next, 1) - 1; set(ask{n}, what); wait for reply{n} up to its deadline; get it; remove it
//   holder   a thread with its own store connection polls ask{0}, ask{1}, ... in order; replies '1' + bytes, or '0'
//            when it does not have `what` (the asker then goes on without it); skips a number whose request is
//            still missing 2 s after the next one's arrived (its asker died in between)
// The holder's thread answers while its worker trains or waits in a collective. A holder that died answers nothing:
// the asker gives up at its deadline and the state is lost (the path goes on with fresh AdamW state; its early-stopping
// copy is the one the leader holds, if any). dipaco.path_state = store keeps every state in the store instead.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "tributary/comm/store.h"

namespace tributary {

class StateServer {
 public:
  // `what` -> the bytes this worker holds under that name, or nothing. Called on the server's thread.
  using Lookup = std::function<std::optional<std::string>(const std::string& what)>;

  // Serves the requests addressed to `rank` through `connection` (a store connection of its own: c10d's store clients
  // are not shared between threads).
  StateServer(comm::Store connection, int rank, Lookup lookup);
  ~StateServer();  // stops the thread (a request it has not read stays unanswered: the asker's deadline ends it)
  StateServer(const StateServer&) = delete;
  StateServer& operator=(const StateServer&) = delete;

  double take_served_bytes() { return double(served_bytes_.exchange(0)); }  // since the last call

 private:
  void serve();

  comm::Store store_;
  int rank_;
  Lookup lookup_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> served_bytes_{0};
  std::thread thread_;
};

// Asks worker `holder` for `what` through `store`; nothing when the holder does not have it or did not answer within
// `timeout` (it died). Never throws for a silent holder.
std::optional<std::string> ask_holder(comm::Store& store, int holder, const std::string& what,
                                      std::chrono::milliseconds timeout);

}  // namespace tributary
