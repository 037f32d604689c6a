#include "tributary/runtime/rendezvous.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <random>
#include <thread>

#include "tributary/comm/sealed_store.h"
#include "tributary/core/clock.h"
#include "tributary/core/error.h"
#include "tributary/core/hash.h"
#include "tributary/core/log.h"
#include "tributary/data/dataset.h"

namespace tributary {
namespace {

using std::chrono::milliseconds;
const std::string kAbortKey = "rendezvous/refused";
const std::string kKeyPrefix = "/tributary";  // every run key, under the agent's prefix if any

[[noreturn]] void refuse(comm::Store& store, const std::string& why) {
  store.set(kAbortKey, why);
  throw Error(why);
}

// Waits for every rank's key, saying which ranks are missing every 30 s and at the deadline; stops at once when
// another rank refused the rendezvous.
void wait_for_ranks(comm::Store& store, const std::string& prefix, int world_size, milliseconds timeout, int rank) {
  std::vector<std::string> keys;
  for (int r = 0; r < world_size; ++r) keys.push_back(prefix + std::to_string(r));
  const auto start = std::chrono::steady_clock::now();
  double next_report = 30;
  for (;;) {
    if (store.check({kAbortKey})) fail("rank {}: another rank refused the rendezvous: {}", rank, store.get(kAbortKey));
    if (store.check(keys)) return;
    const double waited = seconds_since(start);
    if (waited >= next_report || waited * 1000 >= double(timeout.count())) {
      std::vector<int> missing;
      for (int r = 0; r < world_size; ++r)
        if (!store.check({keys[size_t(r)]})) missing.push_back(r);
      if (waited * 1000 >= double(timeout.count()))
        throw NetworkError(
            fmt::format("rank {}: rank(s) {} of {} did not reach the rendezvous within {} s "
                        "(dist.store_timeout_s): start them, or check WORLD_SIZE and MASTER_ADDR:PORT{}",
                        rank, fmt::join(missing, ", "), world_size, timeout.count() / 1000.0,
                        comm::run_key_from_environment()
                            ? "; a rank with another run secret (or none) is not seen either: give every machine "
                              "the same --secret-file"
                            : ""));
      log::info("rank {}: waiting for rank(s) {} of {} at the rendezvous ({:.0f} s of {:.0f} s){}", rank,
                fmt::join(missing, ", "), world_size, waited, timeout.count() / 1000.0,
                comm::run_key_from_environment()
                    ? "; a machine started with another --secret-file is refused by the run's store, whose host "
                      "logs 'the run's store refused a client at ADDRESS: a wrong proof of the run's secret'"
                    : "");
      next_report += 30;
    }
    std::this_thread::sleep_for(milliseconds(50));
  }
}

// Whether anything accepts a TCP connection at addr:port within `timeout`. c10d's client retries a refused
// connection until its own deadline; launch asks first, so that a store whose host has gone costs no wait.
bool accepts_connections(const std::string& addr, int port, milliseconds timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(addr.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return true;  // c10d says why
  bool open = false;
  for (addrinfo* a = found; a && !open; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      open = true;
    } else if (errno == EINPROGRESS) {
      pollfd p{.fd = fd, .events = POLLOUT, .revents = 0};
      int error = 0;
      socklen_t len = sizeof(error);
      open = ::poll(&p, 1, static_cast<int>(timeout.count())) == 1 &&
             ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) == 0 && error == 0;
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return open;
}

}  // namespace

comm::GroupOptions group_options(const RunConfig& config) {
  return {.collective_timeout = milliseconds(static_cast<int64_t>(config.dist.collective_timeout_s * 1000))};
}

comm::Store reconnect_store(const RunConfig& config, const DistEnv& env) { return connect_scope(config, env, ""); }

comm::Store connect_scope(const RunConfig& config, const DistEnv& env, const std::string& scope) {
  const auto store_timeout = milliseconds(static_cast<int64_t>(config.dist.store_timeout_s * 1000));
  return comm::Store::connect(env.master_addr, env.master_port, env.rank, env.world_size, /*server_exists=*/true,
                              env.store_prefix + kKeyPrefix + scope, store_timeout);
}

comm::Store connect_supervisor(const std::string& addr, int port, milliseconds timeout, int attempt, bool first,
                               const std::string& scope) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!accepts_connections(addr, port, timeout)) {
    if (!first || std::chrono::steady_clock::now() >= deadline)
      throw NetworkError(fmt::format("nothing accepts connections at the run's store {}:{} ({})", addr, port,
                                     first ? "not up yet" : "its host has gone"));
    std::this_thread::sleep_for(milliseconds(100));
  }
  return comm::Store::connect(addr, port, /*rank=*/-1, 1, /*server_exists=*/true,
                              attempt_prefix(attempt) + kKeyPrefix + scope, timeout);
}

void claim_seat(comm::Store& store, const DistEnv& env) {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  uint64_t nonce = 0;
  {
    std::random_device device;
    nonce = (uint64_t(device()) << 32) ^ device();
  }
  const std::string me = fmt::format("pid {} on {} ({:016x})", ::getpid(), host, nonce);
  const std::string seat = "seat/" + std::to_string(env.rank);
  if (env.joining) {
    store.set(seat, me);
    return;
  }
  const std::string holder = store.set_once(seat, me);
  if (holder != me)
    fail(
        "rank {} of this run is already held by {}: every rank is started once (check RANK, --node-rank and "
        "--nproc on every machine); a worker that died rejoins through launch --max-restarts",
        env.rank, holder.substr(0, holder.rfind(" (")));
}

std::shared_ptr<const comm::Identity> publish_identity(comm::Store& store, const RunConfig& config,
                                                       const DistEnv& env) {
  const std::string& admission = config.dist.admission;
  if (admission.empty() && !comm::run_key_from_environment()) return nullptr;
  const auto path = comm::Identity::path_from_environment(env.rank);
  if (!admission.empty() && !path)
    fail(
        "dist.admission = '{}' admits participants by their identity files, and rank {} has none: start it with "
        "`tributary launch --secret-file F` (each rank's identity is F.identity-<rank>) or set "
        "TRIBUTARY_IDENTITY_FILE",
        admission, env.rank);
  auto identity =
      std::make_shared<const comm::Identity>(path ? comm::Identity::load_or_create(*path) : comm::Identity::generate());
  const std::string& mine = identity->public_hex();
  if (!admission.empty()) {
    const auto admitted = comm::read_admission_list(admission);
    if (std::find(admitted.begin(), admitted.end(), mine) == admitted.end())
      fail(
          "rank {}: this participant's identity {} ('{}') is not on the run's admission list '{}': ask the run's "
          "owner to add this public key (`tributary identity --file {}` prints it)",
          env.rank, mine, path->string(), admission, path->string());
  }
  const std::string key = "identity/" + std::to_string(env.rank);
  if (env.joining) {
    store.set(key, mine);
  } else if (const std::string held = store.set_once(key, mine); held != mine) {
    fail("rank {}'s identity is already published as {}: another process holds this rank", env.rank, held);
  }
  return identity;
}

std::string published_key(comm::Store& store, const std::vector<std::string>& admitted, int rank,
                          std::map<int, std::string>& pins) {
  if (const auto pin = pins.find(rank); pin != pins.end()) return pin->second;
  const std::string key = "identity/" + std::to_string(rank);
  std::string value = store.check({key}) ? store.get(key) : "";
  if (!value.empty() && !admitted.empty() && std::find(admitted.begin(), admitted.end(), value) == admitted.end()) {
    log::warn("rank {} published the identity {}, which dist.admission does not list: its updates are refused", rank,
              value);
    value.clear();
  }
  pins[rank] = value;
  return value;
}

comm::Store rendezvous(const RunConfig& config, const DistEnv& env, std::shared_ptr<const comm::Identity>* identity) {
  const auto store_timeout = milliseconds(static_cast<int64_t>(config.dist.store_timeout_s * 1000));
  auto store = comm::Store::connect(env.master_addr, env.master_port, env.rank, env.world_size, env.use_agent_store,
                                    env.store_prefix + kKeyPrefix, store_timeout);
  claim_seat(store, env);
  try {
    auto published = publish_identity(store, config, env);
    if (identity) *identity = std::move(published);
  } catch (const Error& e) {
    refuse(store, e.what());  // every waiting rank stops with the reason
  }
  // The world size first: rank 0's is the run's.
  store.set("world_size/" + std::to_string(env.rank), std::to_string(env.world_size));
  if (env.rank != 0) {
    store.wait({"world_size/0"}, store_timeout, "rank 0 did not reach the rendezvous");
    const std::string theirs = store.get("world_size/0");
    if (theirs != std::to_string(env.world_size))
      refuse(store, fmt::format("rank {} was started with WORLD_SIZE={} but rank 0 with WORLD_SIZE={}: start every "
                                "worker with the same world size (launch --nproc/--nnodes)",
                                env.rank, env.world_size, theirs));
  }
  // Every rank publishes its resolved config; every rank compares all of them with rank 0's.
  store.set("config/" + std::to_string(env.rank), config.to_toml());
  wait_for_ranks(store, "config/", env.world_size, store_timeout, env.rank);
  const auto reference = RunConfig::from_toml(store.get("config/0"), "rank 0's config").schema().flatten();
  std::vector<std::string> problems;
  // Each machine names its own run directory: whether it is rank 0's is found by looking (a probe file, after the
  // groups form: runtime/replica_checkpoint.h), not by comparing names — one filesystem may be mounted at two paths.
  const std::vector<std::string> local_keys = {"train.threads", "train.device", "dist.compute_nice", "train.run_dir"};
  for (int r = 1; r < env.world_size; ++r) {
    auto other = RunConfig::from_toml(store.get("config/" + std::to_string(r)), "rank config").schema().flatten();
    auto diffs = config_differences(reference, other, local_keys);
    if (!diffs.empty()) problems.push_back(fmt::format("rank {} differs from rank 0 in {}", r, fmt::join(diffs, ", ")));
  }
  if (!problems.empty())
    fail("workers disagree on the run configuration: {}. Start every worker with the same config and overrides",
         fmt::join(problems, "; "));
  // The same data.dir on every machine must hold the same data (a joiner too: it compares with rank 0's). DiPaCo's
  // path-local workers may hold only their own paths' shards.
  if (config.dipaco.modules.empty()) {
    store.set("dataset/" + std::to_string(env.rank), hex64(dataset_fingerprint(config.data.dir)));
    wait_for_ranks(store, "dataset/", env.world_size, store_timeout, env.rank);
    const std::string lead = store.get("dataset/0");
    std::vector<int> other;
    for (int r = 1; r < env.world_size; ++r)
      if (store.get("dataset/" + std::to_string(r)) != lead) other.push_back(r);
    if (!other.empty())
      fail(
          "rank(s) {} hold other data than rank 0 at data.dir = '{}' (dataset.json or a shard's checksums differ): "
          "every machine must have the same dataset; build it with the same `tributary data build` command or copy "
          "rank 0's",
          fmt::join(other, ", "), config.data.dir);
  }
  return store;
}

}  // namespace tributary
