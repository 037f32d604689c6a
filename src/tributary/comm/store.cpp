#include "tributary/comm/store.h"

#include <c10/util/Logging.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <filesystem>
#include <mutex>

#include <fmt/format.h>

#include "tributary/comm/sealed_store.h"
#include "tributary/comm/store_deadline.h"
#include "tributary/comm/store_server.h"
#include "tributary/core/error.h"

namespace tributary::comm {

namespace fs = std::filesystem;

Store::Store(c10::intrusive_ptr<c10d::Store> impl, int rank) : impl_(std::move(impl)), rank_(rank) {}
Store::Store(const Store&) = default;
Store& Store::operator=(const Store&) = default;
Store::~Store() = default;

Store Store::in_memory() { return Store(c10::make_intrusive<c10d::HashStore>()); }

namespace {

// The local address the kernel picks to reach `host` (a UDP socket's connect sends nothing): the interface on the
// route to the master, as a multi-machine run needs; 127.0.0.1 when the host is this machine's loopback.
std::string local_address_towards(const std::string& host, int port, int rank) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || !found)
    throw NetworkError(
        fmt::format("rank {}: cannot resolve the master address '{}'; give an IPv4 address or a host "
                    "name this machine resolves (MASTER_ADDR, launch --master-addr)",
                    rank, host));
  std::string address;
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in local{};
  socklen_t len = sizeof(local);
  if (fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
    char text[INET_ADDRSTRLEN] = {};
    if (::inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text))) address = text;
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(found);
  if (address.empty())
    throw NetworkError(
        fmt::format("rank {}: no route from this machine to the master address '{}'; check the "
                    "address, or name the interface to use with GLOO_SOCKET_IFNAME",
                    rank, host));
  return address;
}

}  // namespace

Store Store::connect(const std::string& master_addr, int master_port, int rank, int world_size, bool server_exists,
                     const std::string& prefix, std::chrono::milliseconds timeout) {
  Store store(connect_store(master_addr, master_port, rank, world_size, server_exists, prefix, timeout), rank);
  store.local_address_ = local_address_towards(master_addr, master_port, rank);
  return store;
}

void quiet_c10d_warnings() {
  if (std::getenv("TORCH_CPP_LOG_LEVEL") == nullptr) FLAGS_caffe2_log_level = c10::GLOG_ERROR;
}

namespace {
std::mutex quiet_mutex;
int quiet_holders = 0;
int32_t level_before_quiet = 0;
}  // namespace

QuietC10dErrors::QuietC10dErrors() {
  if (std::getenv("TORCH_CPP_LOG_LEVEL") != nullptr) return;
  std::lock_guard<std::mutex> lock(quiet_mutex);
  if (quiet_holders++ == 0) {
    level_before_quiet = FLAGS_caffe2_log_level;
    FLAGS_caffe2_log_level = c10::GLOG_FATAL;
  }
}

QuietC10dErrors::~QuietC10dErrors() {
  if (std::getenv("TORCH_CPP_LOG_LEVEL") != nullptr) return;
  std::lock_guard<std::mutex> lock(quiet_mutex);
  if (--quiet_holders == 0) FLAGS_caffe2_log_level = level_before_quiet;
}

void raise_open_file_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
  limit.rlim_cur = limit.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &limit);  // best effort: the soft limit is only what the shell happened to leave
}

Store Store::host(int port, std::chrono::milliseconds timeout) {
  raise_open_file_limit();
  const auto key = run_key_from_environment();
  auto server = std::make_shared<StoreServer>(port, key);
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(server->port());
  opts.isServer = false;
  opts.waitWorkers = false;
  opts.timeout = timeout;
  try {
    const QuietC10dErrors quiet;  // a failed connect is said once, below
    c10::intrusive_ptr<c10d::Store> client = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", opts);
    if (key) {  // launch's own values, sealed as the workers' are
      prove_run_key(*client, *key);
      client = sealed_store(client, *key);
    }
    Store store(client, -1);
    store.server_ = std::move(server);
    return store;
  } catch (const std::exception& e) {
    throw NetworkError(fmt::format("cannot reach the run's store just started on port {}: {}", port, error_text(e)));
  }
}

void host_for_this_process(int port) {
  raise_open_file_limit();
  // Rank 0 hosts for as long as the process lives: its process groups and threads hold the store's client to the
  // end, in an order no owner could follow. Never destroyed, like the process's other serving threads.
  static auto* hosted = new std::vector<std::unique_ptr<StoreServer>>();
  static std::mutex mutex;
  auto server = std::make_unique<StoreServer>(port, run_key_from_environment());
  std::lock_guard<std::mutex> lock(mutex);
  hosted->push_back(std::move(server));
}

std::string error_text(const std::exception& e) {
  const auto* torch_error = dynamic_cast<const c10::Error*>(&e);
  return torch_error ? torch_error->what_without_backtrace() : e.what();
}

namespace {

// Every store operation's failure (connection reset, the host gone or unreachable, a get past its deadline) is a
// NetworkError naming the operation, the key and this process: LibTorch's own (c10::Error) would read as a bug (exit
// 3) and name nothing.
template <typename Op>
auto guarded(int rank, const char* op, const std::string& key, std::chrono::milliseconds timeout,
             Op&& run) -> decltype(run()) {
  const std::string who = rank >= 0 ? fmt::format("rank {}", rank) : std::string("launch");
  // c10d gives up on a get at `timeout`; the calls it does not bound end the process a little after that.
  const StoreDeadline deadline(fmt::format("{}: {} key '{}'", who, op, key), timeout + std::chrono::seconds(10));
  try {
    return run();
  } catch (const NetworkError&) {
    throw;
  } catch (const std::exception& e) {
    throw NetworkError(fmt::format("{}: the run's store failed to {} key '{}': {} (its host is gone or unreachable)",
                                   who, op, key, error_text(e)));
  }
}

}  // namespace

void Store::set(const std::string& key, const std::string& value) {
  guarded(rank_, "set", key, impl_->getTimeout(),
          [&] { impl_->set(key, std::vector<uint8_t>(value.begin(), value.end())); });
}

std::string Store::get(const std::string& key) {
  auto bytes = guarded(rank_, "get", key, impl_->getTimeout(), [&] { return impl_->get(key); });
  return {bytes.begin(), bytes.end()};
}

std::string Store::set_once(const std::string& key, const std::string& desired) {
  auto held = guarded(rank_, "set", key, impl_->getTimeout(),
                      [&] { return impl_->compareSet(key, {}, std::vector<uint8_t>(desired.begin(), desired.end())); });
  return {held.begin(), held.end()};
}

int64_t Store::add(const std::string& key, int64_t delta) {
  return guarded(rank_, "add to", key, impl_->getTimeout(), [&] { return impl_->add(key, delta); });
}

bool Store::check(const std::vector<std::string>& keys) {
  return guarded(rank_, "check", keys.empty() ? std::string() : keys.front(), impl_->getTimeout(),
                 [&] { return impl_->check(keys); });
}

bool Store::remove(const std::string& key) {
  return guarded(rank_, "remove", key, impl_->getTimeout(), [&] { return impl_->deleteKey(key); });
}

void Store::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout, const std::string& what) {
  const StoreDeadline deadline(
      fmt::format("rank {}: wait for key '{}'", rank_, keys.empty() ? std::string() : keys.front()),
      timeout + std::chrono::seconds(10));
  try {
    impl_->wait(keys, timeout);
  } catch (const std::exception& e) {
    throw NetworkError(
        fmt::format("rank {}: {} within {} s: {}", rank_, what, timeout.count() / 1000.0, error_text(e)));
  }
}

c10::intrusive_ptr<c10d::Store> connect_store(const std::string& master_addr, int master_port, int rank, int world_size,
                                              bool server_exists, const std::string& prefix,
                                              std::chrono::milliseconds timeout) {
  if (rank == 0 && !server_exists) host_for_this_process(master_port);
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(master_port);
  opts.isServer = false;
  opts.waitWorkers = false;
  opts.timeout = timeout;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    // The client's first ping waits for the host's answer without a deadline (a frozen host held it for good).
    const StoreDeadline deadline(fmt::format("rank {}: connect to the store at {}:{}", rank, master_addr, master_port),
                                 timeout + std::chrono::seconds(10));
    const QuietC10dErrors quiet;  // a failed connect is said once, below
    store = c10::make_intrusive<c10d::TCPStore>(master_addr, opts);
    if (const auto key = run_key_from_environment()) prove_run_key(*store, *key);  // before anything else is asked
  } catch (const Error&) {
    throw;  // the store refused this process's secret: prove_run_key says so
  } catch (const std::exception& e) {
    throw NetworkError(
        fmt::format("rank {}: cannot reach the rendezvous store at {}:{} within {} s ({}); check "
                    "MASTER_ADDR/MASTER_PORT and that rank 0 is running",
                    rank, master_addr, master_port, timeout.count() / 1000, error_text(e)));
  }
  // The run's secret, when it has one: every value this process and its process groups exchange is sealed.
  if (const auto key = run_key_from_environment()) store = sealed_store(store, *key);
  if (!prefix.empty()) store = c10::make_intrusive<c10d::PrefixStore>(prefix, store);
  return store;
}

}  // namespace tributary::comm
