// The run's store server (comm/store_server.h) under c10d's own client and under a stranger: every operation the run
// uses, idle floods, length fields that claim more than was sent, requests that break the protocol.
#include "tributary/comm/store_server.h"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tributary/comm/sealed_store.h"
#include "tributary/comm/store.h"
#include "tributary/core/error.h"

using namespace tributary;
using namespace std::chrono_literals;

namespace {

comm::Store client_of(const comm::StoreServer& server) {
  return comm::Store::connect("127.0.0.1", server.port(), 0, 1, /*server_exists=*/true, "t", 5s);
}

int raw_connection(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{.sin_family = AF_INET,
                      .sin_port = htons(static_cast<uint16_t>(port)),
                      .sin_addr = {htonl(INADDR_LOOPBACK)},
                      .sin_zero = {}};
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// A connection from `source` (another loopback address, 127.0.0.2 ...: a stranger on several machines).
int raw_connection_from(int port, const std::string& source) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in local{.sin_family = AF_INET, .sin_port = 0, .sin_addr = {}, .sin_zero = {}};
  ::inet_pton(AF_INET, source.c_str(), &local.sin_addr);
  sockaddr_in address{.sin_family = AF_INET,
                      .sin_port = htons(static_cast<uint16_t>(port)),
                      .sin_addr = {htonl(INADDR_LOOPBACK)},
                      .sin_zero = {}};
  if (::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof(local)) != 0 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

template <typename T>
void put(std::string& bytes, T value) {
  bytes.append(reinterpret_cast<const char*>(&value), sizeof(value));
}

std::string validate() {
  std::string b(1, '\0');  // VALIDATE
  put<uint32_t>(b, 0x3C85F7CE);
  return b;
}

// True once the server closed `fd` (a read sees the end, or a reset: a socket closed with bytes unread), within
// `within`.
bool closed_by_server(int fd, std::chrono::milliseconds within) {
  timeval tv{.tv_sec = within.count() / 1000, .tv_usec = (within.count() % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char byte = 0;
  const ssize_t n = ::recv(fd, &byte, 1, 0);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

int64_t rss_mb() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) / 1024;
  return -1;
}

}  // namespace

TEST(StoreServer, ServesC10dsClientEveryOperationTheRunUses) {
  comm::StoreServer server(0);
  auto store = client_of(server);
  store.set("a", "1");
  EXPECT_EQ(store.get("a"), "1");
  store.set("a", std::string(3 << 20, 'x'));  // a module's worth, overwritten
  EXPECT_EQ(store.get("a").size(), size_t(3) << 20);
  EXPECT_EQ(store.add("n", 5), 5);
  EXPECT_EQ(store.add("n", -2), 3);
  EXPECT_EQ(store.set_once("once", "first"), "first");
  EXPECT_EQ(store.set_once("once", "second"), "first");
  EXPECT_TRUE(store.check({"a", "n"}));
  EXPECT_FALSE(store.check({"a", "missing"}));
  EXPECT_TRUE(store.remove("a"));
  EXPECT_FALSE(store.remove("a"));
  // A wait ends when another client sets the key, not before.
  auto other = client_of(server);
  std::thread later([&] {
    std::this_thread::sleep_for(200ms);
    other.set("late", "here");
  });
  const auto start = std::chrono::steady_clock::now();
  store.wait({"late"}, 5s, "the late key");
  EXPECT_GE(std::chrono::steady_clock::now() - start, 150ms);
  later.join();
  EXPECT_EQ(store.get("late"), "here");
  // A wait that times out leaves the client usable (c10d cancels it with CANCEL_WAIT).
  EXPECT_THROW(store.wait({"never"}, 300ms, "a key nobody sets"), NetworkError);
  store.set("after", "ok");
  EXPECT_EQ(store.get("after"), "ok");
  EXPECT_EQ(server.counts().closed_bad, 0);
}

TEST(StoreServer, AnIdleFloodIsRefusedPastItsCapAndClosedAtTheDeadlineWhileTheRunsClientGoesOn) {
  comm::StoreServer server(0, std::nullopt, {.max_per_address = 8, .introduce_within = 300ms});
  auto store = client_of(server);  // the run's client, connected before the flood
  std::vector<int> flood;
  for (int i = 0; i < 50; ++i)
    if (const int fd = raw_connection(server.port()); fd >= 0) flood.push_back(fd);
  store.set("during", "flood");
  EXPECT_EQ(store.get("during"), "flood");
  std::this_thread::sleep_for(1s);
  const auto counts = server.counts();
  EXPECT_GE(counts.refused_connections, 50 - 8);
  EXPECT_GE(counts.closed_silent, 7) << "the silent connections under the cap are closed at the deadline";
  for (const int fd : flood) ::close(fd);
  auto late = client_of(server);  // room again
  EXPECT_EQ(late.get("during"), "flood");
}

TEST(StoreServer, ALengthFieldThatClaimsMoreThanWasSentAllocatesNothing) {
  comm::StoreServer server(0, std::nullopt, {.max_value_bytes = uint64_t(4) << 30});
  const int64_t before = rss_mb();
  std::vector<int> liars;
  for (int i = 0; i < 4; ++i) {  // 4 x 2 GiB claimed, 10 bytes sent
    std::string b = validate();
    b.push_back('\1');  // SET
    put<uint64_t>(b, 1);
    b.push_back('k');
    put<uint64_t>(b, uint64_t(2) << 30);
    b.append("0123456789");
    const int fd = raw_connection(server.port());
    ASSERT_EQ(::send(fd, b.data(), b.size(), 0), ssize_t(b.size()));
    liars.push_back(fd);
  }
  std::this_thread::sleep_for(300ms);
  EXPECT_LT(rss_mb() - before, 64) << "the server allocated for the claimed length";
  auto store = client_of(server);
  store.set("k2", "v");
  EXPECT_EQ(store.get("k2"), "v");
  for (const int fd : liars) ::close(fd);
}

TEST(StoreServer, ARequestThatBreaksALimitOrTheProtocolClosesOnlyItsConnection) {
  comm::StoreServer server(0, std::nullopt, {.max_value_bytes = 1 << 20});
  auto store = client_of(server);
  std::string oversized = validate();
  oversized.push_back('\1');  // SET of a value over the limit: refused as soon as its length arrives
  put<uint64_t>(oversized, 1);
  oversized.push_back('k');
  put<uint64_t>(oversized, uint64_t(1) << 40);
  std::string unknown = validate();
  unknown.push_back('\x63');                 // no such query
  std::string unintroduced = "\x03garbage";  // a GET before VALIDATE
  int bad = 0;
  for (const std::string& bytes : {oversized, unknown, unintroduced}) {
    const int fd = raw_connection(server.port());
    ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), 0), ssize_t(bytes.size()));
    EXPECT_TRUE(closed_by_server(fd, 2000ms)) << "request " << bad;
    ::close(fd);
    ++bad;
  }
  EXPECT_EQ(server.counts().closed_bad, bad);
  store.set("still", "served");
  EXPECT_EQ(store.get("still"), "served");
}

TEST(StoreServer, APortInUseIsNamed) {
  comm::StoreServer first(0);
  try {
    comm::StoreServer second(first.port());
    FAIL() << "two servers on one port";
  } catch (const NetworkError& e) {
    EXPECT_NE(std::string(e.what()).find("another program (another run?) listens there"), std::string::npos)
        << e.what();
  }
}

namespace {

// TRIBUTARY_RUN_SECRET for the scope of one client's connection (connect_store reads it).
class SecretInEnvironment {
 public:
  explicit SecretInEnvironment(const std::optional<comm::RunKey>& key) {
    if (key) {
      ::setenv("TRIBUTARY_RUN_SECRET", comm::run_key_hex(*key).c_str(), 1);
    } else {
      ::unsetenv("TRIBUTARY_RUN_SECRET");
    }
  }
  ~SecretInEnvironment() { ::unsetenv("TRIBUTARY_RUN_SECRET"); }
};

}  // namespace

// Entry (comm/sealed_store.h): a server with the run's key serves a connection only after it proved the key. A
// client without it, one with another run's key, and a raw stranger's delete are refused and counted; the run's own
// client, and what it stored, go on untouched. A server without a key serves everyone, provers included.
TEST(StoreServer, OnlyClientsThatProveTheRunsSecretAreServed) {
  const auto key = comm::random_run_key();
  comm::StoreServer server(0, key);
  auto member = [&] {
    const SecretInEnvironment secret(key);
    return client_of(server);
  }();
  member.set("a", "1");
  EXPECT_EQ(member.get("a"), "1");
  EXPECT_EQ(server.counts().strangers, 0);

  {  // c10d's client without the secret: its first request closes it
    const SecretInEnvironment none(std::nullopt);
    auto stranger = client_of(server);
    EXPECT_ANY_THROW({
      stranger.set("a", "forged");
      stranger.get("a");
    });
  }
  {  // another run's secret: refused at the proof, and the message says what to fix
    const SecretInEnvironment other(comm::random_run_key());
    try {
      client_of(server);
      ADD_FAILURE() << "a client with another run's secret was served";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("refused this process's run secret"), std::string::npos) << e.what();
    }
  }
  {  // a raw stranger: VALIDATE, then DELETE_KEY "a"
    const int fd = raw_connection(server.port());
    std::string bytes = validate();
    bytes += char(8);  // DELETE_KEY
    put<uint64_t>(bytes, 1);
    bytes += "a";
    ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), ssize_t(bytes.size()));
    EXPECT_TRUE(closed_by_server(fd, 2s));
    ::close(fd);
  }
  EXPECT_EQ(server.counts().strangers, 3);
  EXPECT_EQ(member.get("a"), "1") << "nothing a stranger sent reached the values";

  comm::StoreServer open(0);  // no key: everyone is served, and a prover's proof changes nothing
  auto prover = [&] {
    const SecretInEnvironment secret(key);
    return client_of(open);
  }();
  prover.set("b", "2");
  EXPECT_EQ(prover.get("b"), "2");
  const SecretInEnvironment none(std::nullopt);
  auto anyone = client_of(open);
  anyone.set("c", "3");
  EXPECT_EQ(anyone.get("c"), "3");
  EXPECT_EQ(open.counts().strangers, 0);
}

// With the run's key, the per-address cap and the deadline apply to connections that have not proved it: a machine
// of many workers (here 8 on a cap of 4) is served, while a stranger's introduced but unproved connections are capped
// and closed at the deadline.
TEST(StoreServer, WithTheRunsKeyOnlyUnprovedConnectionsCountAgainstTheCapAndTheyLastSeconds) {
  const auto key = comm::random_run_key();
  comm::StoreServer server(0, key, {.max_per_address = 4, .introduce_within = 300ms});
  std::vector<comm::Store> workers;
  {
    const SecretInEnvironment secret(key);
    for (int i = 0; i < 8; ++i) workers.push_back(client_of(server));
  }
  for (size_t i = 0; i < workers.size(); ++i) workers[i].set("w" + std::to_string(i), "here");
  std::vector<int> idle;
  for (int i = 0; i < 5; ++i) {
    const int fd = raw_connection(server.port());
    const std::string hello = validate();
    ::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL);
    idle.push_back(fd);
  }
  EXPECT_TRUE(closed_by_server(idle.back(), 1s)) << "a fifth unproved connection from the address is refused";
  for (size_t i = 0; i + 1 < idle.size(); ++i)
    EXPECT_TRUE(closed_by_server(idle[i], 3s)) << "an introduced but unproved connection outlived the deadline";
  for (const int fd : idle) ::close(fd);
  EXPECT_GE(server.counts().refused_connections, 1);
  EXPECT_GE(server.counts().closed_silent, 4);
  EXPECT_EQ(workers.back().get("w0"), "here") << "the run's own connections were kept";
}

// Issue 66, item 12: a connection that has not proved the run's key announced a 1.9 GiB value and streamed it, and the
// server held it until the deadline (RSS 169 -> 1,165 MB). Before its proof a connection may send only the entry's
// few hundred bytes: a value of more is refused at its length field, nothing of it held, and the run goes on.
TEST(StoreServer, AnUnprovedConnectionCannotMakeTheServerHoldALargeValue) {
  const auto key = comm::random_run_key();
  comm::StoreServer server(0, key);
  const int64_t before = rss_mb();
  std::string b = validate();
  b.push_back('\1');  // SET
  put<uint64_t>(b, 1);
  b.push_back('k');
  put<uint64_t>(b, uint64_t(1900) << 20);
  const int fd = raw_connection(server.port());
  const timeval send_deadline{.tv_sec = 2, .tv_usec = 0};  // a server that stops reading must not hang the test
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_deadline, sizeof(send_deadline));
  ASSERT_EQ(::send(fd, b.data(), b.size(), MSG_NOSIGNAL), ssize_t(b.size()));
  const std::string megabyte(1 << 20, 'x');
  for (int i = 0; i < 64; ++i)  // the value's first 64 MB, as fast as loopback takes them
    if (::send(fd, megabyte.data(), megabyte.size(), MSG_NOSIGNAL) < 0) break;
  EXPECT_TRUE(closed_by_server(fd, 1s)) << "the stranger's value was read instead of refused";
  ::close(fd);
  EXPECT_LT(rss_mb() - before, 32) << "the server held the stranger's bytes";
  EXPECT_GE(server.counts().closed_bad + server.counts().strangers, 1);
  const SecretInEnvironment secret(key);
  auto member = client_of(server);
  member.set("after", "fine");
  EXPECT_EQ(member.get("after"), "fine");
}

// Issue 66, item 11: from several source addresses a stranger held every connection of the store, and a worker holding
// the run's secret could not connect. Full, the store closes its oldest unproved connection to admit a new one: the
// worker connects, proves the key and is served, while the flood keeps only the newest of its connections.
TEST(StoreServer, AFloodFromManyAddressesCannotTurnAWorkerOfTheRunAway) {
  const auto key = comm::random_run_key();
  comm::StoreServer server(0, key, {.max_connections = 32, .max_per_address = 8, .introduce_within = 20s});
  std::vector<int> flood;
  for (int a = 2; a < 6; ++a)
    for (int i = 0; i < 8; ++i) {
      const int fd = raw_connection_from(server.port(), fmt::format("127.0.0.{}", a));
      ASSERT_GE(fd, 0) << "127.0.0." << a;
      const std::string hello = validate();
      ::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL);
      flood.push_back(fd);
    }
  std::this_thread::sleep_for(200ms);  // every flood connection accepted: the store is full
  {
    const SecretInEnvironment secret(key);
    comm::Store worker = client_of(server);  // before: refused ("the store is full"), its connect timed out
    worker.set("w", "here");
    EXPECT_EQ(worker.get("w"), "here");
  }
  EXPECT_TRUE(closed_by_server(flood.front(), 1s)) << "the oldest unproved connection made room";
  EXPECT_FALSE(closed_by_server(flood.back(), 200ms)) << "the newest stays (until its deadline)";
  for (const int fd : flood) ::close(fd);
  EXPECT_GE(server.counts().refused_connections, 1);
}
