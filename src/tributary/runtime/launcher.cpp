#include "tributary/runtime/launcher.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <optional>
#include <cstring>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <map>
#include <thread>

#include "tributary/core/error.h"
#include "tributary/core/log.h"

namespace tributary {
namespace {

volatile sig_atomic_t g_signal = 0;
volatile sig_atomic_t g_signals = 0;  // a second one kills the workers without waiting for their checkpoint
void on_signal(int s) {
  g_signal = s;
  g_signals = g_signals + 1;
}

struct Worker {
  int rank;
  pid_t pid;
  int fd;  // read end of the worker's stdout+stderr
  std::string partial;
  bool running = true;
  bool stopped = false;  // by SIGSTOP/SIGTSTP: alive, but its peers wait for it
  int status = 0;
};

bool is_loopback_or_private(const std::string& addr) {
  in_addr a{};
  if (::inet_pton(AF_INET, addr.c_str(), &a) != 1) return addr == "localhost" || addr == "::1";
  const uint32_t ip = ntohl(a.s_addr);
  return (ip >> 24) == 127 || (ip >> 24) == 10 || (ip >> 20) == 0xAC1 /* 172.16/12 */ || (ip >> 16) == 0xC0A8;
}

void flush_lines(Worker& w, bool final) {
  size_t pos;
  while ((pos = w.partial.find('\n')) != std::string::npos) {
    std::fprintf(stdout, "[rank %d] %s\n", w.rank, w.partial.substr(0, pos).c_str());
    w.partial.erase(0, pos + 1);
  }
  if (final && !w.partial.empty()) {
    std::fprintf(stdout, "[rank %d] %s\n", w.rank, w.partial.c_str());
    w.partial.clear();
  }
  std::fflush(stdout);
}

const char* stop_signal_name(int sig) {
  switch (sig) {
    case SIGSTOP: return "SIGSTOP";
    case SIGTSTP: return "SIGTSTP";
    case SIGTTIN: return "SIGTTIN";
    case SIGTTOU: return "SIGTTOU";
    default: return "a stop signal";
  }
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
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
  if (o.max_failures < 0 || o.max_failures >= o.nproc * o.nnodes)
    fail("launch: --max-failures must be from 0 to the number of workers - 1 (got {})", o.max_failures);
  int port = o.master_port;
  if (port <= 0) {
    if (o.nnodes > 1)
      fail("launch: with --nnodes > 1 every machine must name the same --master-port (free ports are picked only on a "
           "single node)");
    port = free_tcp_port();
  }
  addrinfo hints{}, *found = nullptr;
  hints.ai_family = AF_INET;
  if (int rc = ::getaddrinfo(o.master_addr.c_str(), nullptr, &hints, &found); rc != 0 || !found)
    fail("launch: cannot resolve --master-addr '{}' ({}); give rank 0's machine's address or host name",
         o.master_addr, ::gai_strerror(rc));
  char resolved[INET_ADDRSTRLEN] = "";
  ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr, resolved, sizeof(resolved));
  ::freeaddrinfo(found);
  if (!is_loopback_or_private(resolved))
    log::warn("master address {} looks public: c10d's TCPStore and Gloo are unauthenticated and unencrypted; anyone "
              "who reaches port {} can join or disrupt the run. Use a private network, VPN or tunnel.",
              o.master_addr, port);
  return port;
}

// Forks the local workers with the torchrun variables; their stdout and stderr go to one pipe each.
std::vector<Worker> spawn_workers(const LaunchOptions& o, int port) {
  char exe[4096];
  ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) fail("launch: cannot find its own executable");
  exe[n] = '\0';
  const int world = o.nproc * o.nnodes;
  std::vector<Worker> workers;
  for (int local = 0; local < o.nproc; ++local) {
    int pipefd[2];
    if (::pipe2(pipefd, O_CLOEXEC) != 0) fail("launch: pipe: {}", std::strerror(errno));
    const int rank = o.node_rank * o.nproc + local;
    pid_t pid = ::fork();
    if (pid < 0) fail("launch: fork: {}", std::strerror(errno));
    if (pid == 0) {
      ::dup2(pipefd[1], STDOUT_FILENO);
      ::dup2(pipefd[1], STDERR_FILENO);
      ::setenv("RANK", std::to_string(rank).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(local).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(o.nproc).c_str(), 1);
      ::setenv("GROUP_RANK", std::to_string(o.node_rank).c_str(), 1);
      ::setenv("MASTER_ADDR", o.master_addr.c_str(), 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      ::setenv("TRIBUTARY_LAUNCHED", "1", 1);
      if (o.host_store) ::setenv("TRIBUTARY_AGENT_STORE", "1", 1);  // launch on node 0 hosts it: no worker does
      std::vector<char*> argv;
      argv.push_back(exe);
      for (const auto& a : o.command) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(exe, argv.data());
      std::fprintf(stderr, "exec %s failed: %s\n", exe, std::strerror(errno));
      ::_exit(127);
    }
    ::close(pipefd[1]);
    workers.push_back({rank, pid, pipefd[0]});
  }
  return workers;
}

// Forwards what the workers printed, line by line with their rank prefix.
void pump_output(std::vector<Worker>& workers) {
  std::vector<pollfd> fds;
  for (auto& w : workers)
    if (w.fd >= 0) fds.push_back({w.fd, POLLIN, 0});
  if (!fds.empty()) ::poll(fds.data(), fds.size(), 100);
  else std::this_thread::sleep_for(std::chrono::milliseconds(50));
  for (auto& w : workers) {
    if (w.fd < 0) continue;
    char buf[8192];
    for (;;) {
      pollfd p{w.fd, POLLIN, 0};
      if (::poll(&p, 1, 0) <= 0) break;
      ssize_t got = ::read(w.fd, buf, sizeof(buf));
      if (got <= 0) {
        ::close(w.fd);
        w.fd = -1;
        flush_lines(w, true);
        break;
      }
      w.partial.append(buf, static_cast<size_t>(got));
      flush_lines(w, false);
    }
  }
}

// The supervision of running workers: the first failure (beyond --max-failures) or a signal stops the rest with
// SIGTERM, then SIGKILL after --grace; a second signal kills at once. A worker that exits with a NetworkError
// (status 4) is usually the echo of a peer's failure (the peer's exit closed the connection), so launch waits up to
// kBlameWindow for a rank that failed for a reason of its own and blames that one; a stopped (SIGSTOP) worker is
// named at once and again when the others fail waiting for it.
class Supervisor {
 public:
  Supervisor(const LaunchOptions& o, std::vector<Worker>& workers) : o_(o), workers_(workers) {}
  int run();

 private:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::seconds kBlameWindow{3};

  void reap();
  void on_failure(const Worker& w, int code);
  void blame(int rank, int code);
  void settle_network_failure();
  void stop_all(int sig) {
    for (auto& w : workers_) {
      if (!w.running) continue;
      ::kill(w.pid, sig);
      if (w.stopped) ::kill(w.pid, SIGCONT);  // a stopped process handles SIGTERM only once continued
    }
  }
  void begin_stop() {
    stop_all(SIGTERM);
    stop_deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o_.grace_s));
  }
  void enforce_deadline();
  // Stopped (SIGSTOP) workers left alone after every other worker exited: nobody will continue them (the others
  // went on without them, dist.fault_tolerant): killed, counted as failures.
  void kill_forgotten_stopped();
  std::string stopped_ranks() const;

  const LaunchOptions& o_;
  std::vector<Worker>& workers_;
  int result_ = 0, failed_rank_ = -1, tolerated_ = 0;
  bool killed_ = false;
  std::optional<Clock::time_point> stop_deadline_;
  struct NetworkFailure {
    int rank, code;
    Clock::time_point until;
  };
  std::optional<NetworkFailure> network_failure_;  // waiting for the cause
  std::string cause_;                               // what the final line says when it is not the failed rank itself
};

std::string Supervisor::stopped_ranks() const {
  std::vector<std::string> out;
  for (const auto& w : workers_)
    if (w.running && w.stopped) out.push_back(fmt::format("rank {} (pid {})", w.rank, w.pid));
  return fmt::format("{}", fmt::join(out, ", "));
}

void Supervisor::blame(int rank, int code) {
  failed_rank_ = rank;
  result_ = code;
  log::error("launch: rank {} exited with status {}; stopping the other workers", rank, code);
  begin_stop();
}

void Supervisor::on_failure(const Worker& w, int code) {
  if (failed_rank_ >= 0 || stop_deadline_) return;
  if (tolerated_ < o_.max_failures) {
    tolerated_ += 1;
    log::warn("launch: rank {} (pid {}) exited with status {}; tolerated ({} of --max-failures {}), the others "
              "carry on", w.rank, w.pid, code, tolerated_, o_.max_failures);
  } else if (code == kNetworkErrorStatus) {
    if (!network_failure_) network_failure_ = NetworkFailure{w.rank, code, Clock::now() + kBlameWindow};
  } else {
    if (network_failure_)
      log::warn("launch: rank {}'s network error followed from rank {}'s failure", network_failure_->rank, w.rank);
    network_failure_.reset();
    blame(w.rank, code);
  }
}

// No rank failed for a reason of its own within the window: the network failure is the cause as far as launch knows.
void Supervisor::settle_network_failure() {
  if (!network_failure_ || failed_rank_ >= 0 || stop_deadline_) return;
  bool others_running = false;
  for (const auto& w : workers_) others_running |= w.running;
  if (others_running && Clock::now() < network_failure_->until) return;
  const std::string stopped = stopped_ranks();
  if (!stopped.empty()) {
    log::error("launch: rank {} lost its peers while {} is stopped (SIGSTOP): the stopped rank is the likely cause",
               network_failure_->rank, stopped);
    cause_ = fmt::format("{} was stopped and rank {} gave up waiting for it", stopped, network_failure_->rank);
  } else {
    log::error("launch: rank {} reported a network failure and no local rank failed for a reason of its own; look at "
               "the other machines' ranks and the network", network_failure_->rank);
  }
  const auto failure = *network_failure_;
  network_failure_.reset();
  blame(failure.rank, failure.code);
}

void Supervisor::reap() {
  for (auto& w : workers_) {
    int status;
    if (!w.running || ::waitpid(w.pid, &status, WNOHANG | WUNTRACED | WCONTINUED) != w.pid) continue;
    if (WIFSTOPPED(status)) {
      w.stopped = true;
      log::warn("launch: rank {} (pid {}) was stopped by {}; the other ranks wait for it (up to "
                "dist.collective_timeout_s). `kill -CONT {}` resumes it",
                w.rank, w.pid, stop_signal_name(WSTOPSIG(status)), w.pid);
      continue;
    }
    if (WIFCONTINUED(status)) {
      w.stopped = false;
      log::info("launch: rank {} (pid {}) continues", w.rank, w.pid);
      continue;
    }
    w.running = false;
    w.stopped = false;
    w.status = status;
    if (const int code = exit_code_of(status); code != 0) on_failure(w, code);
  }
  settle_network_failure();
}

void Supervisor::enforce_deadline() {
  if (!stop_deadline_ || Clock::now() <= *stop_deadline_) return;
  bool any_running = false;
  for (auto& w : workers_) any_running |= w.running;
  if (any_running)
    log::error("launch: the workers did not stop within --grace {} s; killing them. Their progress since the run's "
               "last checkpoint is lost (resume continues from it, if any); a longer --grace lets them finish the "
               "stop checkpoint",
               o_.grace_s);
  stop_all(SIGKILL);
  stop_deadline_ = Clock::now() + std::chrono::hours(1);
}

void Supervisor::kill_forgotten_stopped() {
  bool stopped = false;
  for (const auto& w : workers_) {
    if (w.running && !w.stopped) return;
    stopped |= w.running && w.stopped;
  }
  if (!stopped) return;
  log::warn("launch: every other worker has exited; killing the stopped {}", stopped_ranks());
  for (auto& w : workers_)
    if (w.running && w.stopped) {
      ::kill(w.pid, SIGKILL);
      w.stopped = false;
    }
}

int Supervisor::run() {
  g_signal = 0;
  g_signals = 0;
  auto old_int = std::signal(SIGINT, on_signal);
  auto old_term = std::signal(SIGTERM, on_signal);
  for (;;) {
    pump_output(workers_);
    reap();
    if (g_signal && !stop_deadline_) {
      log::warn("launch: signal {} received; stopping the workers", int(g_signal));
      result_ = 128 + g_signal;
      begin_stop();
    }
    if (g_signals >= 2 && !killed_) {
      log::warn("launch: second signal; killing the workers now (no final checkpoint)");
      stop_all(SIGKILL);
      killed_ = true;
    }
    enforce_deadline();
    kill_forgotten_stopped();
    bool any = false;
    for (auto& w : workers_) any |= w.running || w.fd >= 0;
    if (!any) break;
  }
  std::signal(SIGINT, old_int);
  std::signal(SIGTERM, old_term);
  if (failed_rank_ >= 0 && !cause_.empty())
    log::error("launch: failed because {} (status {})", cause_, result_);
  else if (failed_rank_ >= 0)
    log::error("launch: failed because rank {} failed (status {})", failed_rank_, result_);
  return result_;
}

}  // namespace

int launch(const LaunchOptions& o) {
  const int port = check_launch(o);
  // The run's store lives here, not in rank 0, so that any worker may die (dist.fault_tolerant). Other machines'
  // launches connect their workers to this one.
  std::shared_ptr<void> store;
  if (o.node_rank == 0 && o.host_store) store = o.host_store(port);
  std::vector<Worker> workers = spawn_workers(o, port);
  return Supervisor(o, workers).run();
}

}  // namespace tributary
