#include "tributary/launch/launch_supervisor.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <chrono>
#include <csignal>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>

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
    case SIGSTOP:
      return "SIGSTOP";
    case SIGTSTP:
      return "SIGTSTP";
    case SIGTTIN:
      return "SIGTTIN";
    case SIGTTOU:
      return "SIGTTOU";
    default:
      return "a stop signal";
  }
}

// For the peers' error messages; the statuses of docs/errors.md.
std::string how_it_ended(int status) {
  if (WIFSIGNALED(status))
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  if (!WIFEXITED(status)) return "ended";
  const int code = WEXITSTATUS(status);
  const char* meaning = code == 2   ? " (an error in its input or config)"
                        : code == 3 ? " (a bug)"
                        : code == 4 ? " (a network error)"
                        : code == 5 ? " (no member of the run left to heal from)"
                                    : "";
  return fmt::format("exited with status {}{}", code, meaning);
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// Forwards what the workers printed, line by line with their rank prefix.
void pump_output(std::vector<Worker>& workers) {
  std::vector<pollfd> fds;
  for (auto& w : workers)
    if (w.fd >= 0) fds.push_back({w.fd, POLLIN, 0});
  if (!fds.empty())
    ::poll(fds.data(), fds.size(), 100);
  else
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
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
  Supervisor(const LaunchOptions& o, std::vector<Worker>& workers, Respawn respawn, int restarts)
      : o_(o),
        workers_(workers),
        respawn_(std::move(respawn)),
        restarts_(restarts),
        island_life_(o.first_island_life) {}
  int run();
  bool start_again() const { return start_again_; }
  int restarts() const { return restarts_; }

 private:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::seconds kBlameWindow{3};
  static constexpr std::chrono::milliseconds kAgainPoll{250};

  void reap();
  void on_failure(const Worker& w, int code);
  // --max-restarts: true if `w` is restarted (`started`: the run got through start-up, so a replacement can heal)
  bool restart(const Worker& w, int code, bool started);
  // --restart-island: the others are killed and all of them start again together once every one exited.
  bool restart_island(const Worker& w, int code);
  void respawn_island();
  // A worker killed before start-up: true when the whole run starts again instead (Supervised::start_again).
  bool start_run_again(const Worker& w, int code);
  void follow_start_again();
  void blame(int rank, int code, const std::string& how = "");  // how: how_it_ended's words
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
    stop_deadline_ =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o_.grace_s));
  }
  void enforce_deadline();
  // Stopped (SIGSTOP) workers left alone after every other worker exited: nobody will continue them (the others
  // went on without them, dist.fault_tolerant): killed, counted as failures.
  void kill_forgotten_stopped();
  std::string stopped_ranks() const;

  const LaunchOptions& o_;
  std::vector<Worker>& workers_;
  Respawn respawn_;
  std::vector<int> pending_restarts_;  // local ranks to fork again after this reap
  int restarts_ = 0;
  int island_life_;                 // --restart-island: this launch's island's life (first_island_life first)
  bool island_restarting_ = false;  // its workers are being killed to start again together
  bool start_again_ = false;
  Clock::time_point next_again_poll_{};
  bool run_started_ = false;  // several machines: learnt by the polls for a start again, which then end
  int result_ = 0, failed_rank_ = -1, tolerated_ = 0;
  int stop_signal_ = 0;  // the user's SIGINT/SIGTERM, forwarded as a stop
  bool killed_ = false;
  std::optional<Clock::time_point> stop_deadline_;
  struct NetworkFailure {
    int rank, code;
    Clock::time_point until;
  };
  std::optional<NetworkFailure> network_failure_;  // waiting for the cause
  std::string cause_;                              // what the final line says when it is not the failed rank itself
};

std::string Supervisor::stopped_ranks() const {
  std::vector<std::string> out;
  for (const auto& w : workers_)
    if (w.running && w.stopped) out.push_back(fmt::format("rank {} (pid {})", w.rank, w.pid));
  return fmt::format("{}", fmt::join(out, ", "));
}

void Supervisor::blame(int rank, int code, const std::string& how) {
  failed_rank_ = rank;
  result_ = code;
  log::error("launch: rank {} {}; stopping the other workers", rank,
             how.empty() ? fmt::format("exited with status {}", code) : how);
  begin_stop();
}

// A dead worker comes back while the others still run (after the run, nothing is left to join).
bool Supervisor::restart(const Worker& w, int code, bool started) {
  if (restarts_ >= o_.max_restarts) return false;
  // One machine: with none of its workers left running, nobody holds the run's state to heal from. Several: the
  // other machines' workers may (a machine whose workers all died with its link heals from them); a replacement that
  // finds no live member exits with status 5 within the heartbeat deadline, and nothing is restarted after that.
  bool others = o_.nnodes > 1;
  for (const auto& o : workers_) others |= o.running && !o.stopped && o.pid != w.pid;
  if (!others && !o_.restart_island) return false;
  if (!started) {
    log::warn(
        "launch: rank {} (pid {}) {} before the run got through start-up; a restart would fail the same way, so it "
        "is not restarted",
        w.rank, w.pid, how_it_ended(w.status));
    return false;
  }
  if (o_.restart_island) return restart_island(w, code);
  restarts_ += 1;
  log::warn("launch: rank {} (pid {}) {}; restarting it to rejoin the run ({} of --max-restarts {})", w.rank, w.pid,
            how_it_ended(w.status), restarts_, o_.max_restarts);
  pending_restarts_.push_back(w.rank - o_.node_rank * o_.nproc);
  return true;
}

// An island's ranks train as one replica (data parallel inside): with one of them dead the others can neither go on
// nor be healed one by one, so the island starts again as a whole, under a fresh life (its groups' keys), and rejoins
// the run; the other machines' islands hold the run's state meanwhile. Its restart counts once.
bool Supervisor::restart_island(const Worker& w, int code) {  // check_launch: --nnodes >= 2, so others hold the run
  restarts_ += 1;
  island_life_ += 1;
  island_restarting_ = true;
  log::warn(
      "launch: rank {} (pid {}) {}; starting this machine's island again as its life {} ({} of --max-restarts {})",
      w.rank, w.pid, how_it_ended(w.status), island_life_, restarts_, o_.max_restarts);
  for (auto& other : workers_) {
    if (!other.running || other.pid == w.pid) continue;
    other.discarded = true;
    ::kill(other.pid, SIGKILL);
  }
  return true;
}

void Supervisor::respawn_island() {
  if (!island_restarting_) return;
  for (const auto& w : workers_)
    if (w.running) return;
  island_restarting_ = false;
  for (int local = 0; local < o_.nproc; ++local) workers_.push_back(respawn_(local, island_life_));
}

bool Supervisor::start_run_again(const Worker& w, int code) {
  if (restarts_ >= o_.max_restarts || (o_.nnodes > 1 && !o_.start_again)) return false;
  // A crash or a kill may not come back; a stop request (TERM, INT, HUP) is the user's, and an exit status of its
  // own (a bad config, a missing dataset) would.
  if (!WIFSIGNALED(w.status)) return false;
  const int sig = WTERMSIG(w.status);
  if (sig == SIGTERM || sig == SIGINT || sig == SIGHUP) return false;
  if (o_.nnodes > 1) o_.start_again(o_.master_addr, o_.master_port, o_.attempt, /*ask=*/true);  // every machine's
  restarts_ += 1;
  start_again_ = true;
  result_ = code;
  log::warn(
      "launch: rank {} (pid {}) {} before the run got through start-up (nothing was trained): stopping the others "
      "and starting the run again under fresh keys ({} of --max-restarts {})",
      w.rank, w.pid, how_it_ended(w.status), restarts_, o_.max_restarts);
  begin_stop();
  return true;
}

// Several machines: another machine's launch asked every launch to start the run again (its worker died before the
// run got through start-up); this one stops its workers and starts them again too, under the next attempt's keys.
void Supervisor::follow_start_again() {
  if (o_.nnodes == 1 || !o_.start_again || start_again_ || run_started_ || stop_deadline_ || failed_rank_ >= 0) return;
  if (Clock::now() < next_again_poll_) return;
  next_again_poll_ = Clock::now() + kAgainPoll;
  if (!o_.start_again(o_.master_addr, o_.master_port, o_.attempt, /*ask=*/false)) {
    // Nobody asks once the run got through start-up: the polls end there.
    run_started_ = o_.run_started && o_.run_started(o_.master_addr, o_.master_port, o_.attempt) == RunStart::heals;
    return;
  }
  if (restarts_ >= o_.max_restarts) {
    log::error(
        "launch: another machine's launch starts the run again, but this one's --max-restarts {} is spent: stopping "
        "this machine's workers",
        o_.max_restarts);
    result_ = 1;
    return begin_stop();
  }
  restarts_ += 1;
  start_again_ = true;
  log::warn(
      "launch: another machine's launch starts the run again (a worker died before the run got through start-up): "
      "stopping this machine's workers and starting them again ({} of --max-restarts {})",
      restarts_, o_.max_restarts);
  begin_stop();
}

void Supervisor::on_failure(const Worker& w, int code) {
  if (failed_rank_ >= 0 || stop_deadline_) return;
  if (code == kRunLostStatus) {  // nobody is left to heal from: a restart would find the same, again and again
    log::error(
        "launch: rank {} found no live member to heal from: every worker that held the run's state is gone, "
        "so restarting cannot help. Resume from the last checkpoint (train --resume)",
        w.rank);
    return blame(w.rank, code, how_it_ended(w.status));
  }
  // Restarts and tolerated deaths both need a run that got through start-up (a formed group, the task queue): a
  // death before it would leave the survivors waiting for it at the rendezvous until dist.store_timeout_s.
  const RunStart start =
      run_started_ || !o_.run_started ? RunStart::heals : o_.run_started(o_.master_addr, o_.master_port, o_.attempt);
  if (start == RunStart::fixed && (o_.max_restarts > 0 || o_.max_failures > 0)) {
    log::error(
        "launch: rank {} (pid {}) {} after the run got through start-up; the run is not fault tolerant, so the others "
        "cannot go on without it, and starting it again would lose what it trained: resume from its last checkpoint "
        "(train --resume), and set dist.fault_tolerant = true for --max-failures and --max-restarts to cover deaths",
        w.rank, w.pid, how_it_ended(w.status));
    return blame(w.rank, code, how_it_ended(w.status));
  }
  const bool started = start == RunStart::heals;
  if (!started && start_run_again(w, code)) return;
  if (restart(w, code, started)) return;
  if (tolerated_ < o_.max_failures && !started) {
    log::error(
        "launch: rank {} (pid {}) {} before the run got through start-up: --max-failures covers deaths after it, "
        "so the run stops now; {}{}",
        w.rank, w.pid, how_it_ended(w.status),
        // An error in the input or config (a finished run resumed, a bad key) is the worker's own line above.
        code == 2 ? "its error above says what to change" : "start it again (this start trained nothing)",
        o_.max_restarts == 0 ? "; with --max-restarts N a worker that dies after start-up is started again and rejoins"
                             : "");
    return blame(w.rank, code, how_it_ended(w.status));
  }
  if (tolerated_ < o_.max_failures) {
    tolerated_ += 1;
    log::warn("launch: rank {} (pid {}) {}; tolerated ({} of --max-failures {}), the others carry on{}", w.rank, w.pid,
              how_it_ended(w.status), tolerated_, o_.max_failures,
              o_.max_restarts == 0 ? " (without --max-restarts it is not started again)" : "");
  } else if (code == kNetworkErrorStatus) {
    if (!network_failure_) network_failure_ = NetworkFailure{w.rank, code, Clock::now() + kBlameWindow};
  } else {
    if (network_failure_)
      log::warn("launch: rank {}'s network error followed from rank {}'s failure", network_failure_->rank, w.rank);
    network_failure_.reset();
    blame(w.rank, code, how_it_ended(w.status));
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
    log::error(
        "launch: rank {} reported a network failure and no local rank failed for a reason of its own; look at "
        "the other machines' ranks and the network",
        network_failure_->rank);
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
      log::warn(
          "launch: rank {} (pid {}) was stopped by {}; the other ranks wait for it (up to "
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
    if (w.discarded) continue;  // killed to start its island again
    if (const int code = exit_code_of(status); code != 0) {
      // A worker that did not stop cleanly at the user's signal: ended by the SIGTERM launch forwarded (before it
      // could take it as a stop), the run ends as the user's signal would have ended it.
      if (stop_signal_ && result_ == 0)
        result_ = WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM ? 128 + stop_signal_ : code;
      // First, before the others are stopped or go on: their failed collectives name this rank.
      if (o_.report_exit)
        o_.report_exit(o_.master_addr, o_.master_port, o_.attempt, w.rank, how_it_ended(status),
                       /*go_on=*/o_.max_failures > 0 || o_.max_restarts > 0);
      on_failure(w, code);
    }
  }
  for (int local : std::exchange(pending_restarts_, {})) workers_.push_back(respawn_(local, island_life_));
  respawn_island();
  settle_network_failure();
}

void Supervisor::enforce_deadline() {
  if (!stop_deadline_ || Clock::now() <= *stop_deadline_) return;
  bool any_running = false;
  for (auto& w : workers_) any_running |= w.running;
  if (any_running)
    log::error(
        "launch: the workers did not stop within --grace {} s; killing them. Their progress since the run's "
        "last checkpoint is lost (resume continues from it, if any); a longer --grace lets them finish the "
        "stop checkpoint",
        o_.grace_s);
  stop_all(SIGKILL);
  stop_deadline_ = Clock::now() + std::chrono::hours(1);
}

void Supervisor::kill_forgotten_stopped() {
  if (network_failure_ || failed_rank_ >= 0 || stop_deadline_) return;  // a failure being handled stops them
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
    follow_start_again();
    if (g_signal) start_again_ = false;  // the user's stop wins over a run started again
    if (g_signal && !stop_deadline_) {
      log::warn("launch: signal {} received; stopping the workers", int(g_signal));
      stop_signal_ = g_signal;  // the status is the workers': 0 when each stopped with its checkpoint, as train's
      begin_stop();
    }
    if (g_signals >= 2 && !killed_) {
      log::warn("launch: second signal; killing the workers now (no final checkpoint)");
      result_ = 128 + g_signal;
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
  if (stop_signal_ && result_ == 0)
    log::info("launch: stopped at signal {}; every worker stopped cleanly (status 0): --resume continues",
              stop_signal_);
  if (failed_rank_ >= 0 && !cause_.empty())
    log::error("launch: failed because {} (status {})", cause_, result_);
  else if (failed_rank_ >= 0)
    log::error("launch: failed because rank {} failed (status {})", failed_rank_, result_);
  return result_;
}

}  // namespace

Supervised supervise(const LaunchOptions& options, std::vector<Worker>& workers, Respawn respawn, int restarts) {
  Supervisor supervisor(options, workers, std::move(respawn), restarts);
  const int status = supervisor.run();
  return {.status = status, .start_again = supervisor.start_again(), .restarts = supervisor.restarts()};
}

}  // namespace tributary
