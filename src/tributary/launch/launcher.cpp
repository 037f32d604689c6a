#include "tributary/launch/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>
#include <csignal>
#include <cstring>

#include "tributary/core/error.h"
#include "tributary/core/log.h"
#include "tributary/launch/launch_supervisor.h"

namespace tributary {
namespace {

bool is_loopback_or_private(const std::string& addr) {
  in_addr a{};
  if (::inet_pton(AF_INET, addr.c_str(), &a) != 1) return addr == "localhost" || addr == "::1";
  const uint32_t ip = ntohl(a.s_addr);
  return (ip >> 24) == 127 || (ip >> 24) == 10 || (ip >> 20) == 0xAC1 /* 172.16/12 */ || (ip >> 16) == 0xC0A8;
}

}  // namespace

int free_tcp_port() {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (s < 0 || ::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(s, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    fail("cannot find a free TCP port: {}", std::strerror(errno));
  ::close(s);
  return ntohs(addr.sin_port);
}

namespace {

// Flags that cannot work, the port (a free one on a single node), and the master address: resolved first (an
// unresolvable name is a typo to report, not an address to call public).
int check_launch(const LaunchOptions& o) {
  if (o.nproc < 1 || o.nnodes < 1 || o.node_rank < 0 || o.node_rank >= o.nnodes)
    fail("launch: need --nproc >= 1, --nnodes >= 1 and 0 <= --node-rank < --nnodes");
  if (o.command.empty()) fail("launch: give the worker command after --, e.g. launch --nproc 4 -- train cfg.toml");
  if (o.nproc > 4096) fail("launch: --nproc {} is more workers than one machine can hold (at most 4096)", o.nproc);
  if (o.master_port < -1 || o.master_port > 65535)
    fail("launch: --master-port {} is not a TCP port (0-65535; 0 picks a free one)", o.master_port);
  if (!(o.grace_s >= 0) || o.grace_s > 3600) fail("launch: --grace must be from 0 to 3600 seconds (got {})", o.grace_s);
  if (o.max_restarts < 0 || o.max_restarts > 1000000)
    fail("launch: --max-restarts must be from 0 to 1000000 (got {})", o.max_restarts);
  if (o.restart_island && (o.nnodes < 2 || o.max_restarts < 1))
    fail(
        "launch: --restart-island starts this machine's island again while the other machines' islands hold the "
        "run: it needs --nnodes 2 or more and --max-restarts 1 or more (got --nnodes {}, --max-restarts {})",
        o.nnodes, o.max_restarts);
  if (o.max_failures < 0 || o.max_failures >= o.nproc * o.nnodes)
    fail("launch: --max-failures must be from 0 to the number of workers - 1 (got {})", o.max_failures);
  int port = o.master_port;
  if (port <= 0) {
    if (o.nnodes > 1)
      fail(
          "launch: with --nnodes > 1 every machine must name the same --master-port (free ports are picked only on a "
          "single node)");
    port = free_tcp_port();
  }
  addrinfo hints{}, *found = nullptr;
  hints.ai_family = AF_INET;
  if (int rc = ::getaddrinfo(o.master_addr.c_str(), nullptr, &hints, &found); rc != 0 || !found)
    fail("launch: cannot resolve --master-addr '{}' ({}); give rank 0's machine's address or host name", o.master_addr,
         ::gai_strerror(rc));
  char resolved[INET_ADDRSTRLEN] = "";
  ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr, resolved, sizeof(resolved));
  ::freeaddrinfo(found);
  if (!is_loopback_or_private(resolved))
    log::warn(
        "master address {} looks public: c10d's TCPStore and Gloo are unauthenticated and unencrypted; anyone "
        "who reaches port {} can join or disrupt the run. Use a private network, VPN or tunnel.",
        o.master_addr, port);
  return port;
}

// Forks local worker `local` with the torchrun variables; its stdout and stderr go to one pipe. A joiner is a
// restart (--max-restarts): it joins the running run; with --restart-island it is of its island's life `life`. The
// faults injected for tests are the first attempt's only: not a joiner's, nor a run's started again.
Worker spawn_one(const LaunchOptions& o, int port, int local, bool joining, int life = 0) {
  char exe[4096];
  ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) fail("launch: cannot find its own executable");
  exe[n] = '\0';
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) fail("launch: pipe: {}", std::strerror(errno));
  const int rank = o.node_rank * o.nproc + local;
  const pid_t launch_pid = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) fail("launch: fork: {}", std::strerror(errno));
  if (pid == 0) {
    // The worker dies with its launch (even by SIGKILL): orphans would train on unseen and race a --resume for the
    // run directory. Checkpoints are written to a temporary name and renamed, so a kill never leaves a torn one.
    // The signal follows the forking thread: launch forks from its main thread, which lives as long as launch.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != launch_pid) ::_exit(1);  // launch died before the line above
    ::dup2(pipefd[1], STDOUT_FILENO);
    ::dup2(pipefd[1], STDERR_FILENO);
    ::setenv("RANK", std::to_string(rank).c_str(), 1);
    ::setenv("LOCAL_RANK", std::to_string(local).c_str(), 1);
    ::setenv("WORLD_SIZE", std::to_string(o.nproc * o.nnodes).c_str(), 1);
    ::setenv("LOCAL_WORLD_SIZE", std::to_string(o.nproc).c_str(), 1);
    ::setenv("GROUP_RANK", std::to_string(o.node_rank).c_str(), 1);
    ::setenv("MASTER_ADDR", o.master_addr.c_str(), 1);
    ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
    ::setenv("TRIBUTARY_LAUNCHED", "1", 1);
    if (o.host_store) ::setenv("TRIBUTARY_AGENT_STORE", "1", 1);  // node 0's launch or `tributary store` hosts it
    if (joining) ::setenv("TRIBUTARY_JOINING", "1", 1);
    if (o.restart_island) ::setenv("TRIBUTARY_ISLAND_LIFE", std::to_string(life).c_str(), 1);
    if (o.attempt > 0) ::setenv("TRIBUTARY_ATTEMPT", std::to_string(o.attempt).c_str(), 1);
    if (joining || o.attempt > 0) ::unsetenv("TRIBUTARY_FAIL_RANK");
    std::vector<char*> argv;
    argv.push_back(exe);
    for (const auto& a : o.command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(exe, argv.data());
    std::fprintf(stderr, "exec %s failed: %s\n", exe, std::strerror(errno));
    ::_exit(127);
  }
  ::close(pipefd[1]);
  return {rank, pid, pipefd[0]};
}

// --store ADDR:PORT: the master address and port are the store's, which must answer now (a typo or a store not
// started yet is reported here, not by every worker at its rendezvous deadline).
LaunchOptions with_store(LaunchOptions o) {
  if (o.store.empty()) return o;
  const size_t colon = o.store.rfind(':');
  char* end = nullptr;
  const long port = colon == std::string::npos ? -1 : std::strtol(o.store.c_str() + colon + 1, &end, 10);
  if (colon == 0 || port < 1 || port > 65535 || *end != '\0')
    fail("launch: --store '{}' is not ADDR:PORT (e.g. 10.0.0.9:29500)", o.store);
  if (o.master_port > 0 || o.master_addr != LaunchOptions{}.master_addr)
    fail("launch: --store names the master address and port; drop --master-addr/--master-port");
  o.master_addr = o.store.substr(0, colon);
  o.master_port = static_cast<int>(port);
  addrinfo hints{}, *found = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  bool answers = false;
  if (::getaddrinfo(o.master_addr.c_str(), std::to_string(port).c_str(), &hints, &found) == 0 && found) {
    const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    answers = s >= 0 && ::connect(s, found->ai_addr, found->ai_addrlen) == 0;
    if (s >= 0) ::close(s);
    ::freeaddrinfo(found);
  }
  if (!answers)
    fail("launch: nothing answers at {} (--store): start `tributary store --port {}` on that machine first", o.store,
         port);
  return o;
}

}  // namespace

// More island lives than one launch may use (one per --max-restarts, at most 1000000): a machine's n-th return to its
// running run starts at life n x this.
constexpr int kLivesPerLaunch = 1000001;

int launch(const LaunchOptions& options) {
  LaunchOptions o = with_store(options);
  const int port = check_launch(o);
  o.master_port = port;  // the supervisor reports deaths to the store there
  // The run's store lives here (or in `tributary store`), not in rank 0, so that any worker may die
  // (dist.fault_tolerant). Other machines' launches connect their workers to this one.
  // A run started again keeps the store (other machines' launches reach it) and uses fresh keys
  // (LaunchOptions::attempt).
  std::shared_ptr<void> store;
  if (o.node_rank == 0 && o.host_store && o.store.empty()) store = o.host_store(port);
  // A machine started again while its run goes on: its workers join it (each as a restarted worker does).
  const int returns = !store && o.rejoin ? o.rejoin(o.master_addr, port, o.attempt) : 0;
  if (returns > 0) {
    o.first_island_life = returns * kLivesPerLaunch;
    log::warn("launch: the run on the store at {}:{} is already going on: this machine's workers join it",
              o.master_addr, port);
  }
  for (int restarts = 0;; ++o.attempt) {
    std::vector<Worker> workers;
    for (int local = 0; local < o.nproc; ++local)
      workers.push_back(spawn_one(o, port, local, /*joining=*/returns > 0, o.first_island_life));
    const Supervised s = supervise(
        o, workers, [&o, port](int local, int life) { return spawn_one(o, port, local, /*joining=*/true, life); },
        restarts);
    if (!s.start_again) return s.status;
    restarts = s.restarts;
  }
}

}  // namespace tributary