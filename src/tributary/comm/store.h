// The narrow key-value store every process of a run shares (rendezvous, the DiPaCo task queue, heartbeats, the
// process groups' own bootstrap). comm/ is the only layer that touches c10d: this wraps a c10d::Store (c10d's
// TCPStore client in real runs, against the server of comm/store_server.h that launch, `tributary store` or rank 0
// hosts, or an agent's such as torchrun's; HashStore in one process).
// Contracts: every blocking call has a deadline; failures are NetworkError naming the key and this rank.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

namespace c10d {
class Store;
}

namespace tributary::comm {

class StoreServer;

class Store {
 public:
  explicit Store(c10::intrusive_ptr<c10d::Store> impl, int rank = 0);
  Store(const Store&);
  Store& operator=(const Store&);
  ~Store();

  // One process: an in-memory store (a group of one needs no network).
  static Store in_memory();
  // Real runs: connects (rank 0 also hosts it unless `server_exists`) and scopes every key under `prefix`.
  static Store connect(const std::string& master_addr, int master_port, int rank, int world_size, bool server_exists,
                       const std::string& prefix, std::chrono::milliseconds timeout);

  // The run's store server itself, for a process that is not a worker (tributary launch, tributary store): it lives
  // as long as the returned Store (and its copies), so workers may come and go, rank 0 included. It is ours
  // (comm/store_server.h: c10d's protocol, limits a stranger cannot exhaust); this Store is a client of it.
  static Store host(int port, std::chrono::milliseconds timeout);

  void set(const std::string& key, const std::string& value);
  std::string get(const std::string& key);  // waits for the key up to the store's timeout
  int64_t add(const std::string& key, int64_t delta);
  // Sets `key` to `desired` only if it does not exist yet; returns the value it holds afterwards (the first writer's:
  // how processes agree on one decision).
  std::string set_once(const std::string& key, const std::string& desired);
  bool check(const std::vector<std::string>& keys);
  bool remove(const std::string& key);  // true if it existed (the store keeps values in memory: drop what is done)
  // Waits until every key exists; NetworkError naming `what` and this rank after `timeout`.
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout, const std::string& what);

  const c10::intrusive_ptr<c10d::Store>& handle() const { return impl_; }  // for Group and LaggedVote (comm/)
  // The address of this machine on the route to the store's host (connect()): where this process's process groups
  // listen, so that workers on other machines reach them. 127.0.0.1 for a store on this machine's loopback.
  const std::string& local_address() const { return local_address_; }

 private:
  c10::intrusive_ptr<c10d::Store> impl_;
  int rank_;
  std::string local_address_ = "127.0.0.1";
  std::shared_ptr<StoreServer> server_;  // host(): the server this Store is the host's client of
};

// Rank 0 of a run without an agent's store hosts the run's store (comm/store_server.h) on `port` until the process
// ends; its own client connects like everyone's (connect_store).
void host_for_this_process(int port);

// The store's host serves one connection per client (and per stranger): the soft limit on open files (often 1,024,
// of which ~1,100 idle connections ran it out and the host aborted) is raised to the hard one (often 2^19). The
// hosts call it (Store::host, host_for_this_process).
void raise_open_file_limit();

// An exception's message for a NetworkError: LibTorch's (c10::Error) without the C++ backtrace its what() carries.
std::string error_text(const std::exception& e);

// c10d logs each failed store read as a warning with C++ stack frames (a store that refused this process's secret,
// a peer that is gone), often dozens of times for one cause, burying the one line our own error gives. Turns its
// warnings off for this process unless TORCH_CPP_LOG_LEVEL asks for them (its errors still print). Called once, at
// the start of the command line tool.
void quiet_c10d_warnings();

// While one lives, c10d logs nothing below FATAL (unless TORCH_CPP_LOG_LEVEL asks): a store client's connect logs its
// failure as an ERROR with C++ stack frames before it throws, and every caller turns that exception into one line of
// its own (a store whose host has gone, a secret refused). Nests and may be held by several threads at once.
class QuietC10dErrors {
 public:
  QuietC10dErrors();
  ~QuietC10dErrors();
  QuietC10dErrors(const QuietC10dErrors&) = delete;
  QuietC10dErrors& operator=(const QuietC10dErrors&) = delete;
};

// Rendezvous: a worker on another continent may start minutes later than rank 0.
constexpr std::chrono::seconds kDefaultStoreTimeout{600};

// The store of a real run: rank 0 hosts a TCPStore server on master_addr:master_port (unless an agent such as
// torchrun already does), everyone connects as a client.
c10::intrusive_ptr<c10d::Store> connect_store(const std::string& master_addr, int master_port, int rank, int world_size,
                                              bool server_exists, const std::string& prefix,
                                              std::chrono::milliseconds timeout = kDefaultStoreTimeout);

}  // namespace tributary::comm
