#include "tributary/comm/store_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "tributary/comm/sealed_store.h"
#include "tributary/core/error.h"
#include "tributary/core/log.h"

namespace tributary::comm {
// Named, not anonymous: StoreServer::Loop (external linkage) holds these types.
namespace store_server_detail {

using Clock = std::chrono::steady_clock;

// c10d's TCPStore protocol (torch/csrc/distributed/c10d/TCPStoreBackend.hpp): a request is one byte naming the query,
// then its arguments; a key or value is a uint64 length and its bytes; numbers are binary in host order. A client's
// first request is VALIDATE with the magic number; CHECK and WAIT answer one byte.
enum class Query : uint8_t {
  kValidate = 0,
  kSet,
  kCompareSet,
  kGet,
  kAdd,
  kCheck,
  kWait,
  kGetNumKeys,
  kDeleteKey,
  kAppend,
  kMultiGet,
  kMultiSet,
  kCancelWait,
  kPing,
};
constexpr uint32_t kValidationMagic = 0x3C85F7CE;
// c10d's client puts "/" before every key (TCPStore's key prefix): the entry's keys as they arrive.
const std::string kChallengeOnTheWire = std::string("/") + kStoreChallengeKey;
const std::string kProofOnTheWire = std::string("/") + kStoreProofKey;
constexpr uint8_t kReady = 0, kNotReady = 1;            // CheckResponseType
constexpr uint8_t kStopWaiting = 0, kWaitCanceled = 1;  // WaitResponseType
constexpr size_t kReadChunk = 256 * 1024;
constexpr size_t kAnswersHighWater = 8 << 20;  // a client with more unread answers is not read from

struct Request {
  Query query = Query::kValidate;
  uint32_t nonce = 0;
  int64_t delta = 0;
  std::vector<std::string> keys, values;
};

// One request out of a client's bytes, if they hold it whole; nothing is copied or allocated before its bytes are
// there. `bad()` after a false return: the bytes break the protocol or a limit (the connection is closed).
class Reader {
 public:
  Reader(const std::string& bytes, size_t start, const StoreServerLimits& limits)
      : bytes_(bytes), limits_(limits), pos_(start) {}

  bool parse(Request& q) {
    uint8_t type = 0;
    if (!raw(&type, 1)) return false;
    q.query = Query(type);
    switch (q.query) {
      case Query::kValidate:
      case Query::kPing:
        return raw(&q.nonce, sizeof(q.nonce));
      case Query::kSet:
      case Query::kAppend:
        return text(q.keys, limits_.max_key_bytes) && text(q.values, limits_.max_value_bytes);
      case Query::kCompareSet:
        return text(q.keys, limits_.max_key_bytes) && text(q.values, limits_.max_value_bytes) &&
               text(q.values, limits_.max_value_bytes);
      case Query::kGet:
      case Query::kDeleteKey:
        return text(q.keys, limits_.max_key_bytes);
      case Query::kAdd:
        return text(q.keys, limits_.max_key_bytes) && raw(&q.delta, sizeof(q.delta));
      case Query::kCheck:
      case Query::kWait:
      case Query::kMultiGet:
      case Query::kMultiSet: {
        uint64_t n = 0;
        if (!raw(&n, sizeof(n))) return false;
        if (n > limits_.max_keys_per_request) return fail();
        for (uint64_t i = 0; i < n; ++i) {
          if (!text(q.keys, limits_.max_key_bytes)) return false;
          if (q.query == Query::kMultiSet && !text(q.values, limits_.max_value_bytes)) return false;
        }
        return true;
      }
      case Query::kGetNumKeys:
      case Query::kCancelWait:
        return true;
    }
    return fail();  // a query this server does not serve (c10d's queues, key listing, barrier: unused by the run)
  }
  bool bad() const { return bad_; }
  size_t end() const { return pos_; }  // where the request parsed last ended

 private:
  bool raw(void* out, size_t n) {
    if (bytes_.size() - pos_ < n) return false;
    std::memcpy(out, bytes_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool text(std::vector<std::string>& out, uint64_t max) {
    uint64_t n = 0;
    if (!raw(&n, sizeof(n))) return false;
    if (n > max) return fail();
    if (bytes_.size() - pos_ < n) return false;
    out.emplace_back(bytes_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool fail() {
    bad_ = true;
    return false;
  }

  const std::string& bytes_;
  const StoreServerLimits& limits_;
  size_t pos_;
  bool bad_ = false;
};

struct Client {
  std::string address;
  Clock::time_point since;
  bool introduced = false;  // sent VALIDATE
  bool proved = false;      // proved the run's key (from VALIDATE on where the server has none)
  bool counted = true;      // in per_address_: until it proved the key
  std::string nonce;        // its challenge (comm/sealed_store.h), drawn when first asked for
  std::string in;           // bytes of requests not handled yet
  std::string out;          // answers not sent yet, from out_sent on
  size_t out_sent = 0;
  int awaited = 0;                 // keys of its WAIT not set yet
  std::vector<std::string> waits;  // the keys it waits for
  size_t unsent() const { return out.size() - out_sent; }
};

std::string peer_address(const sockaddr_storage& a) {
  char text[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(a);
    ::inet_ntop(AF_INET6, &in6.sin6_addr, text, sizeof(text));
    const std::string s = text;
    return s.rfind("::ffff:", 0) == 0 ? s.substr(7) : s;  // an IPv4 client of the dual-stack socket
  }
  ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(a).sin_addr, text, sizeof(text));
  return text;
}

[[noreturn]] void cannot_listen(int port, int err) {
  if (err == EADDRINUSE)
    throw NetworkError(fmt::format(
        "cannot host the run's store on port {}: another program (another run?) listens there; choose another "
        "port (launch --master-port, store --port; launch on one machine picks a free one without it) or stop it",
        port));
  throw NetworkError(fmt::format("cannot host the run's store on port {}: {}", port, std::strerror(err)));
}

// A bound socket of `family` on every interface at `port`, or -1 with errno set.
int bound_socket(int family, int port) {
  const int fd = ::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  const int one = 1, zero = 0;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_storage a{};
  socklen_t len = 0;
  if (family == AF_INET6) {  // dual stack: IPv4 clients arrive on the same socket
    ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    auto& in6 = reinterpret_cast<sockaddr_in6&>(a);
    in6 = {.sin6_family = AF_INET6,
           .sin6_port = htons(uint16_t(port)),
           .sin6_flowinfo = 0,
           .sin6_addr = in6addr_any,
           .sin6_scope_id = 0};
    len = sizeof(in6);
  } else {
    auto& in4 = reinterpret_cast<sockaddr_in&>(a);
    in4 = {.sin_family = AF_INET, .sin_port = htons(uint16_t(port)), .sin_addr = {htonl(INADDR_ANY)}, .sin_zero = {}};
    len = sizeof(in4);
  }
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), len) == 0) return fd;
  const int err = errno;
  ::close(fd);
  errno = err;
  return -1;
}

int listen_on(int port) {
  int fd = bound_socket(AF_INET6, port);
  if (fd < 0 && errno == EADDRINUSE) cannot_listen(port, errno);
  if (fd < 0) fd = bound_socket(AF_INET, port);  // no IPv6 on this machine
  if (fd < 0) cannot_listen(port, errno);
  if (::listen(fd, 4096) != 0) {
    const int err = errno;
    ::close(fd);
    cannot_listen(port, err);
  }
  return fd;
}

}  // namespace store_server_detail

using namespace store_server_detail;

// The serving thread and everything it owns; only counts_ is read from other threads.
class StoreServer::Loop {
 public:
  Loop(int port, std::optional<RunKey> run_key, StoreServerLimits limits)
      : limits_(limits), unproven_limits_(limits), run_key_(run_key), listen_fd_(listen_on(port)) {
    // Before its proof a connection's every key and value is small (the entry's), and so is its request count.
    unproven_limits_.max_key_bytes = std::min(limits.max_key_bytes, limits.max_unproven_bytes);
    unproven_limits_.max_value_bytes = std::min(limits.max_value_bytes, limits.max_unproven_bytes);
    unproven_limits_.max_keys_per_request = std::min<uint64_t>(limits.max_keys_per_request, 4);
    sockaddr_storage a{};
    socklen_t len = sizeof(a);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6&>(a).sin6_port
                                          : reinterpret_cast<sockaddr_in&>(a).sin_port);
    if (::pipe2(stop_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) {
      ::close(listen_fd_);
      throw NetworkError(fmt::format("cannot host the run's store: pipe: {}", std::strerror(errno)));
    }
    thread_ = std::thread([this] { serve(); });
  }

  ~Loop() {
    const char byte = 1;
    (void)!::write(stop_pipe_[1], &byte, 1);
    thread_.join();
    for (auto& [fd, client] : clients_) ::close(fd);
    ::close(listen_fd_);
    ::close(stop_pipe_[0]);
    ::close(stop_pipe_[1]);
  }

  int port() const { return port_; }
  StoreServerCounts counts() const { return {refused_.load(), silent_.load(), bad_.load(), strangers_.load()}; }

 private:
  void serve() {
    std::vector<pollfd> fds;
    std::vector<char> chunk(kReadChunk);
    for (;;) {
      fds.clear();
      const bool accepting = Clock::now() >= accept_paused_until_;
      fds.push_back({stop_pipe_[0], POLLIN, 0});
      fds.push_back({accepting ? listen_fd_ : -1, POLLIN, 0});
      for (const auto& [fd, c] : clients_)
        fds.push_back({fd, short((c.unsent() < kAnswersHighWater ? POLLIN : 0) | (c.unsent() ? POLLOUT : 0)), 0});
      if (::poll(fds.data(), fds.size(), 250) < 0 && errno != EINTR) return;
      if (fds[0].revents) return;
      if (fds[1].revents & POLLIN) accept_all();
      for (size_t i = 2; i < fds.size(); ++i) {
        if (!fds[i].revents) continue;
        const auto it = clients_.find(fds[i].fd);
        if (it == clients_.end()) continue;  // closed while handling another client's request (it cannot be yet)
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) read_from(it->first, chunk);
      }
      flush_all();
      close_silent();
      trim_unproved_order();
    }
  }

  // At most this many new connections per turn of the loop, so that a flood of connects cannot delay the answers to
  // the run's own clients (their heartbeats included) by more than one bounded turn.
  static constexpr int kAcceptsPerTurn = 256;

  void accept_all() {
    for (int accepted = 0; accepted < kAcceptsPerTurn; ++accepted) {
      sockaddr_storage a{};
      socklen_t len = sizeof(a);
      const int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE) {  // out of descriptors: let the caps and the deadline free some
          accept_paused_until_ = Clock::now() + std::chrono::milliseconds(100);
          warn_refusal("out of file descriptors");
        }
        return;
      }
      std::string address = peer_address(a);
      int& from = per_address_[address];
      // Full: a connection that has not proved the run's key yet makes room, oldest first, so that strangers from many
      // addresses cannot hold every connection while a worker of the run is turned away.
      const bool full = int(clients_.size()) >= limits_.max_connections && !close_oldest_unproved();
      if (full || from >= limits_.max_per_address) {
        ::close(fd);
        if (from == 0) per_address_.erase(address);
        refused_ += 1;
        warn_refusal(fmt::format("{} connections from {} ({} in all)", from, address, clients_.size()));
        continue;
      }
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      from += 1;
      const auto now = Clock::now();
      clients_.emplace(fd, Client{.address = std::move(address), .since = now});
      unproved_order_.emplace_back(fd, now);
    }
  }

  // The oldest connection that has not proved the run's key (introduced itself, without a key), closed. False: every
  // connection has.
  bool close_oldest_unproved() {
    while (!unproved_order_.empty()) {
      const auto [fd, since] = unproved_order_.front();
      unproved_order_.pop_front();
      const auto it = clients_.find(fd);
      if (it == clients_.end() || it->second.since != since || it->second.proved) continue;  // gone, or proved
      refused_ += 1;
      warn_refusal(
          fmt::format("the store is full ({} connections): the oldest unproved one, from {}, was closed to "
                      "make room",
                      clients_.size(), it->second.address));
      close_client(fd);
      return true;
    }
    return false;
  }

  // The order's front is kept to connections still unproved: an entry stays at most until its connection proved the
  // key or was closed at its deadline (introduce_within) and the entries before it went.
  void trim_unproved_order() {
    while (!unproved_order_.empty()) {
      const auto [fd, since] = unproved_order_.front();
      const auto it = clients_.find(fd);
      if (it != clients_.end() && it->second.since == since && !it->second.proved) return;
      unproved_order_.pop_front();
    }
  }

  void warn_refusal(const std::string& why) {
    const auto now = Clock::now();
    if (now - last_warning_ < std::chrono::seconds(10)) return;
    last_warning_ = now;
    log::warn("the run's store refuses new connections: {} (a flood? the run's own connections are kept)", why);
  }

  void read_from(int fd, std::vector<char>& chunk) {
    Client& c = clients_.at(fd);
    const ssize_t n = ::recv(fd, chunk.data(), chunk.size(), 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return close_client(fd);
    if (n < 0) return;
    if (held_ + uint64_t(n) > limits_.max_held_bytes) return close_bad(fd, "the store holds its limit of bytes");
    if (run_key_ && !c.proved && c.in.size() + size_t(n) > limits_.max_unproven_bytes)
      return close_bad(fd, "a connection sent more than the entry's requests before proving the run's key");
    c.in.append(chunk.data(), size_t(n));
    held_ += uint64_t(n);
    handle_requests(fd);
  }

  // Every whole request in the client's bytes, while it reads its answers.
  void handle_requests(int fd) {
    Client& c = clients_.at(fd);
    if (!c.introduced && !c.in.empty() && c.in[0] != char(Query::kValidate))
      return close_bad(fd, "the first request was not c10d's VALIDATE");
    size_t used = 0;
    while (c.unsent() < kAnswersHighWater) {
      Reader reader(c.in, used, run_key_ && !c.proved ? unproven_limits_ : limits_);
      Request q;
      if (!reader.parse(q)) {
        if (reader.bad()) return close_bad(fd, "a request broke the protocol or a limit");
        break;
      }
      used = reader.end();
      if (!handle(fd, c, q)) return;
    }
    if (used) {
      c.in.erase(0, used);
      held_ -= used;
    }
  }

  // false: the client was closed.
  bool handle(int fd, Client& c, Request& q) {
    if (!c.introduced) {
      if (q.query != Query::kValidate || q.nonce != kValidationMagic) {
        close_bad(fd, "the first request was not c10d's VALIDATE");
        return false;
      }
      c.introduced = true;
      c.proved = !run_key_;
      return true;
    }
    if (const auto entry = entry_request(fd, c, q)) return *entry;
    switch (q.query) {
      case Query::kValidate:
        close_bad(fd, "VALIDATE twice");
        return false;
      case Query::kPing:
        answer(c, &q.nonce, sizeof(q.nonce));
        return true;
      case Query::kSet:
        put(q.keys[0], std::move(q.values[0]));
        return true;
      case Query::kCompareSet: {
        const auto it = data_.find(q.keys[0]);
        if (it == data_.end() && !q.values[0].empty()) {
          answer_value(c, q.values[0]);  // c10d's answer when the key is missing: the expected value
        } else {
          if (it == data_.end() || it->second == q.values[0]) put(q.keys[0], std::move(q.values[1]));
          answer_value(c, data_.at(q.keys[0]));
        }
        return true;
      }
      case Query::kGet: {
        const auto it = data_.find(q.keys[0]);
        answer_value(c, it == data_.end() ? std::string() : it->second);
        return true;
      }
      case Query::kAdd: {
        int64_t value = q.delta;
        if (const auto it = data_.find(q.keys[0]); it != data_.end()) {
          int64_t before = 0;
          const char* end = it->second.data() + it->second.size();
          if (std::from_chars(it->second.data(), end, before).ptr != end) {
            close_bad(fd, fmt::format("ADD to key '{}', which does not hold a number", q.keys[0]));
            return false;
          }
          value += before;
        }
        put(q.keys[0], std::to_string(value));
        answer(c, &value, sizeof(value));
        return true;
      }
      case Query::kCheck: {
        const uint8_t ready = all_set(q.keys) ? kReady : kNotReady;
        answer(c, &ready, 1);
        return true;
      }
      case Query::kWait:
        wait_for(fd, c, q.keys);
        return true;
      case Query::kGetNumKeys: {
        const int64_t n = int64_t(data_.size());
        answer(c, &n, sizeof(n));
        return true;
      }
      case Query::kDeleteKey: {
        const auto it = data_.find(q.keys[0]);
        int64_t erased = 0;
        if (it != data_.end()) {
          held_ -= it->first.size() + it->second.size();
          data_.erase(it);
          erased = 1;
        }
        answer(c, &erased, sizeof(erased));
        return true;
      }
      case Query::kAppend: {
        const auto it = data_.find(q.keys[0]);
        put(q.keys[0], it == data_.end() ? std::move(q.values[0]) : it->second + q.values[0]);
        return true;
      }
      case Query::kMultiGet:
        for (const std::string& key : q.keys) {
          const auto it = data_.find(key);
          answer_value(c, it == data_.end() ? std::string() : it->second);
        }
        return true;
      case Query::kMultiSet:
        for (size_t i = 0; i < q.keys.size(); ++i) put(q.keys[i], std::move(q.values[i]));
        return true;
      case Query::kCancelWait: {
        stop_waiting(fd, c);
        answer(c, &kWaitCanceled, 1);
        return true;
      }
    }
    return true;
  }

  // The requests of entry (comm/sealed_store.h): the nonce (CHECK, WAIT and GET of the challenge key) and the proof
  // (SET of the proof key) are answered here, for every client; a client that has not proved the run's key may send
  // nothing else. nullopt: an ordinary request, served by handle(); else handle()'s result.
  std::optional<bool> entry_request(int fd, Client& c, const Request& q) {
    const bool challenge = !q.keys.empty() && q.keys[0] == kChallengeOnTheWire;
    const bool only_challenge = challenge && q.keys.size() == 1;
    if (c.nonce.empty() && challenge) c.nonce = store_nonce();
    if (only_challenge && (q.query == Query::kCheck || q.query == Query::kWait)) {
      answer(c, q.query == Query::kCheck ? &kReady : &kStopWaiting, 1);
      return true;
    }
    if (only_challenge && q.query == Query::kGet) {
      answer_value(c, c.nonce);
      return true;
    }
    if (q.query == Query::kSet && q.keys[0] == kProofOnTheWire) {
      if (!run_key_ || c.proved) return true;
      if (c.nonce.empty() || !store_proof_holds(*run_key_, c.nonce, q.values[0])) {
        refuse_stranger(fd, c, "a wrong proof of the run's secret");
        return false;
      }
      c.proved = true;
      // The run's own connections do not count against their address's cap: a machine of many workers is not a flood.
      uncount(c);
      return true;
    }
    if (challenge) {  // the challenge key is the server's: nobody writes or deletes it
      close_bad(fd, "a request that writes the store's challenge key");
      return false;
    }
    if (run_key_ && !c.proved && q.query != Query::kPing) {
      refuse_stranger(fd, c, fmt::format("request {} before proving the run's secret", int(q.query)));
      return false;
    }
    return std::nullopt;
  }

  void refuse_stranger(int fd, const Client& c, const std::string& what) {
    strangers_ += 1;
    const auto now = Clock::now();
    if (now - last_stranger_warning_ >= std::chrono::seconds(10)) {
      last_stranger_warning_ = now;
      log::warn("the run's store refused a client at {}: {} (a process without the run's secret; {} so far)", c.address,
                what, strangers_.load());
    }
    close_client(fd);
  }

  void put(const std::string& key, std::string value) {
    auto [it, fresh] = data_.try_emplace(key);
    held_ += value.size() + (fresh ? key.size() : 0);
    held_ -= it->second.size();
    it->second = std::move(value);
    wake(key);
  }

  bool all_set(const std::vector<std::string>& keys) const {
    for (const std::string& key : keys)
      if (!data_.count(key)) return false;
    return true;
  }

  void wait_for(int fd, Client& c, const std::vector<std::string>& keys) {
    stop_waiting(fd, c);  // a client waits for one request's keys at a time
    for (const std::string& key : keys) {
      if (data_.count(key)) continue;
      waiters_[key].push_back(fd);
      c.waits.push_back(key);
      held_ += key.size();
      c.awaited += 1;
    }
    if (c.awaited == 0) answer(c, &kStopWaiting, 1);
  }

  void wake(const std::string& key) {
    const auto it = waiters_.find(key);
    if (it == waiters_.end()) return;
    const std::vector<int> fds = std::move(it->second);
    waiters_.erase(it);
    for (const int fd : fds) {
      Client& c = clients_.at(fd);
      held_ -= key.size();
      if (--c.awaited == 0) {
        c.waits.clear();
        answer(c, &kStopWaiting, 1);
      }
    }
  }

  void stop_waiting(int fd, Client& c) {
    for (const std::string& key : c.waits) {
      const auto it = waiters_.find(key);
      if (it == waiters_.end()) continue;
      auto& fds = it->second;
      const auto before = fds.size();
      fds.erase(std::remove(fds.begin(), fds.end(), fd), fds.end());
      held_ -= key.size() * (before - fds.size());
      if (fds.empty()) waiters_.erase(it);
    }
    c.waits.clear();
    c.awaited = 0;
  }

  void answer(Client& c, const void* bytes, size_t n) { c.out.append(static_cast<const char*>(bytes), n); }
  void answer_value(Client& c, const std::string& value) {
    const uint64_t n = value.size();
    answer(c, &n, sizeof(n));
    c.out.append(value);
  }

  void flush_all() {
    std::vector<int> again;  // clients that were held back by their unread answers and may go on now
    for (auto it = clients_.begin(); it != clients_.end();) {
      const int fd = it->first;
      Client& c = it->second;
      ++it;
      if (!c.unsent()) continue;
      const bool held_back = c.unsent() >= kAnswersHighWater;
      const ssize_t n = ::send(fd, c.out.data() + c.out_sent, c.unsent(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        close_client(fd);
        continue;
      }
      if (n > 0) c.out_sent += size_t(n);
      if (!c.unsent()) {
        c.out.clear();
        c.out_sent = 0;
      } else if (c.out_sent > (1 << 20) && c.out_sent > c.out.size() / 2) {
        c.out.erase(0, c.out_sent);
        c.out_sent = 0;
      }
      if (held_back && c.unsent() < kAnswersHighWater) again.push_back(fd);
    }
    for (const int fd : again)
      if (clients_.count(fd)) handle_requests(fd);
  }

  void close_silent() {
    const auto now = Clock::now();
    std::vector<int> silent;
    for (const auto& [fd, c] : clients_)
      if (!c.proved && now - c.since > limits_.introduce_within) silent.push_back(fd);
    for (const int fd : silent) {
      silent_ += 1;
      close_client(fd);
    }
  }

  void close_bad(int fd, const std::string& why) {
    bad_ += 1;
    log::warn("the run's store closed a connection from {}: {}", clients_.at(fd).address, why);
    close_client(fd);
  }

  void uncount(Client& c) {
    if (!c.counted) return;
    c.counted = false;
    if (--per_address_[c.address] <= 0) per_address_.erase(c.address);
  }

  void close_client(int fd) {
    Client& c = clients_.at(fd);
    stop_waiting(fd, c);
    held_ -= c.in.size();
    uncount(c);
    ::close(fd);
    clients_.erase(fd);
  }

  StoreServerLimits limits_;
  StoreServerLimits unproven_limits_;  // what a connection may send before it proved the run's key
  std::optional<RunKey> run_key_;      // entry needs its proof (entry_request); none: everyone is served
  int listen_fd_;
  int port_ = 0;
  int stop_pipe_[2] = {-1, -1};
  std::map<int, Client> clients_;                                 // by socket
  std::deque<std::pair<int, Clock::time_point>> unproved_order_;  // accepted connections, oldest first (socket, since)
  std::unordered_map<std::string, int> per_address_;
  std::unordered_map<std::string, std::string> data_;
  std::unordered_map<std::string, std::vector<int>> waiters_;  // key -> sockets waiting for it
  uint64_t held_ = 0;  // bytes of values and keys held, unread requests, awaited keys
  Clock::time_point accept_paused_until_{};
  Clock::time_point last_warning_{}, last_stranger_warning_{};
  std::atomic<int64_t> refused_{0}, silent_{0}, bad_{0}, strangers_{0};
  std::thread thread_;  // last: it starts once everything above exists
};

StoreServer::StoreServer(int port, std::optional<RunKey> run_key, StoreServerLimits limits)
    : loop_(std::make_unique<Loop>(port, run_key, limits)) {}
StoreServer::~StoreServer() = default;
int StoreServer::port() const { return loop_->port(); }
StoreServerCounts StoreServer::counts() const { return loop_->counts(); }

}  // namespace tributary::comm
