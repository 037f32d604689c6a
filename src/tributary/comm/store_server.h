// The run's store server: the host side of c10d's TCPStore protocol (the workers keep c10d's own client), written so
// that a stranger who reaches its port cannot take it down or starve the run's own clients (issue 46):
//   - one thread, non-blocking sockets: a client that stops in the middle of a request holds nobody else;
//   - nothing is allocated for what a length field claims, only for bytes that arrived; keys, values and the number
//     of keys in one request have limits, and so have the bytes held in all;
//   - connections are capped per address and in all; a connection that has not introduced itself with the
//     protocol's first message (VALIDATE) — and, with the run's key, proved it — within a few seconds is closed, so
//     idle floods cost nothing lasting; with a key, proved connections (the run's own) leave their address's count;
//   - a client that does not read its answers is not read from until it does (its answers are not piled up);
//   - with the run's key, a connection is served only once it has proved the key (comm/sealed_store.h: the HMAC of
//     a nonce the server draws for it); a stranger's first other request closes it, and the host logs it.
// A request that breaks a limit or the protocol closes that client's connection and nothing else. The values are the
// run's (sealed when the run has a secret: comm/sealed_store.h); the server itself does not look into them.
// c10d's server (libuv) refused a legitimate client once ~4,150 idle connections were open (docs/distributed.md).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>

namespace tributary::comm {

using RunKey = std::array<uint8_t, 32>;  // as comm/sealed_store.h: the server itself needs no LibTorch

struct StoreServerLimits {
  // All clients together. When full, the oldest connection that has not proved the run's key (without a key: not yet
  // introduced itself) is closed to make room, so strangers from many addresses cannot turn the run's workers away.
  int max_connections = 4096;
  int max_per_address = 512;  // from one peer address, not counting those that proved the run's key
  std::chrono::milliseconds introduce_within{5000};  // VALIDATE (and the proof, with a key) by then, or closed
  uint64_t max_key_bytes = 64 * 1024;
  uint64_t max_value_bytes = uint64_t(1) << 31;  // 2 GiB: path-local DiPaCo moves whole modules through the store
  uint64_t max_keys_per_request = 64 * 1024;
  uint64_t max_held_bytes = uint64_t(32) << 30;  // every value and every client's unread request together
  // With the run's key, what a connection may send before it has proved the key: the entry's requests (VALIDATE, the
  // challenge, the proof) are a few hundred bytes, so a stranger's value of gigabytes is refused at its length field,
  // before any of it is read or held.
  uint64_t max_unproven_bytes = 64 * 1024;
};

// What the server has refused so far (for tests and the host's log).
struct StoreServerCounts {
  int64_t refused_connections = 0;  // over a cap
  int64_t closed_silent = 0;        // never introduced themselves
  int64_t closed_bad = 0;           // broke the protocol or a limit
  int64_t strangers = 0;            // asked before proving the run's key, or proved it wrong
};

class StoreServer {
 public:
  // Listens on every interface (IPv6 and IPv4) at `port`; 0 picks a free one. NetworkError when it cannot. With
  // `run_key`, only clients that prove it are served (comm/sealed_store.h, prove_run_key).
  explicit StoreServer(int port, std::optional<RunKey> run_key = std::nullopt, StoreServerLimits limits = {});
  ~StoreServer();  // stops serving and closes every connection
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const;
  StoreServerCounts counts() const;

 private:
  class Loop;
  std::unique_ptr<Loop> loop_;
};

}  // namespace tributary::comm
