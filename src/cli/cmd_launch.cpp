#include <cstdlib>
#include <functional>
#include <optional>

#include "cli/commands.h"
#include "tributary/comm/exit_reports.h"
#include "tributary/comm/membership.h"
#include "tributary/comm/sealed_store.h"
#include "tributary/comm/store.h"
#include "tributary/core/log.h"
#include "tributary/launch/launcher.h"
#include "tributary/runtime/rendezvous.h"

namespace tributary::cli {
namespace {

// The workers' identities of a single machine's run without a secret file (comm/identity.h): in a folder only this
// user reads, for as long as this launch lives, so that a restarted worker signs as the same participant.
void keep_identities() {
  if (std::getenv("TRIBUTARY_IDENTITY_DIR") || std::getenv("TRIBUTARY_IDENTITY_FILE")) return;
  static std::string dir = (fs::temp_directory_path() / "tributary-identities-XXXXXX").string();
  if (!::mkdtemp(dir.data())) {
    log::warn("launch: cannot make a folder for the workers' identities in {}: a restarted worker signs as a new one",
              fs::temp_directory_path().string());
    return;
  }
  ::setenv("TRIBUTARY_IDENTITY_DIR", dir.c_str(), 1);
  std::atexit([] {
    std::error_code ec;
    fs::remove_all(dir, ec);
  });
}

// The key this launch and the workers it starts seal the store's values with (TRIBUTARY_RUN_SECRET, which they
// inherit; never a command line): --secret-file's, the environment's, or on a single machine a fresh one.
void choose_run_secret(const std::string& file, int nnodes) {
  std::optional<comm::RunKey> key;
  if (!file.empty()) {
    key = comm::run_key_of_file(file, fmt::format("--secret-file '{}'", file));
    // Beside it, each worker's identity (comm/identity.h): FILE.identity-<rank>, made on first start.
    ::setenv("TRIBUTARY_SECRET_FILE", fs::absolute(file).c_str(), 1);
  } else if (auto from_environment = comm::run_key_from_environment()) {
    key = from_environment;
  } else if (nnodes == 1) {
    key = comm::random_run_key();
    keep_identities();
  }
  if (key) {
    ::setenv("TRIBUTARY_RUN_SECRET", comm::run_key_hex(*key).c_str(), 1);
    return;
  }
  log::warn(
      "launch: no run secret (--secret-file): whoever reaches the store's port can read this run's configuration "
      "and write values its workers trust (docs/distributed.md, \"Threat model\"); give every machine the same "
      "--secret-file");
}

// launch's own connection to the run's store, under an attempt's keys (launcher.h): made at the first use, again for
// another attempt, and once more when a call on it failed (the connection may have been cut).
class StoreReporter {
 public:
  explicit StoreReporter(std::string scope = "") : scope_(std::move(scope)) {}
  void use(const std::string& addr, int port, int attempt, const std::function<void(comm::Store&)>& call) {
    if (attempt != attempt_) store_.reset();
    attempt_ = attempt;
    try {
      call(connected(addr, port));
    } catch (const std::exception&) {
      store_.reset();
      call(connected(addr, port));
    }
  }

 private:
  comm::Store& connected(const std::string& addr, int port) {
    if (!store_) store_ = connect_supervisor(addr, port, std::chrono::seconds(5), attempt_, !reached_, scope_);
    reached_ = true;
    return *store_;
  }
  std::string scope_;
  std::optional<comm::Store> store_;
  int attempt_ = 0;
  bool reached_ = false;  // a refused connection after this means the store's host has gone
};

// The key by which a launch asks every machine's launch to start the run again after `attempt` (outside every
// attempt's keys).
std::string start_again_key(int attempt) { return "launch/again/" + std::to_string(attempt); }

}  // namespace

void add_launch(CLI::App& app) {
  auto o = std::make_shared<LaunchOptions>();
  auto* cmd = app.add_subcommand("launch", "start N local workers of a distributed run: launch --nproc N -- train CFG");
  cmd->add_option("--nproc", o->nproc, "workers on this machine")->required();
  cmd->add_option("--nnodes", o->nnodes, "machines in the run");
  cmd->add_option("--node-rank", o->node_rank, "index of this machine");
  cmd->add_option("--master-addr", o->master_addr, "address of the machine with rank 0 (default loopback)");
  cmd->add_option("--master-port", o->master_port,
                  "rendezvous port (default: a free one, single machine only; required with --nnodes > 1)");
  cmd->add_option("--grace", o->grace_s, "seconds between SIGTERM and SIGKILL when stopping workers");
  cmd->add_option("--max-failures", o->max_failures,
                  "workers (rank 0 included) that may die while the others carry on (DiPaCo re-queues their tasks; "
                  "dist.fault_tolerant DiLoCo and data parallel re-form without them)");
  cmd->add_option("--max-restarts", o->max_restarts,
                  "dead workers restarted while the others run; they rejoin at the next round and heal from a peer "
                  "(dist.fault_tolerant DiLoCo or data parallel)");
  cmd->add_flag("--restart-island", o->restart_island,
                "this machine's workers are one island (dist.fault_tolerant with parallel.islands = 'machines'): when "
                "one dies, all of them start again together and the island rejoins from a peer island");
  cmd->add_option("--store", o->store,
                  "ADDR:PORT of a running `tributary store` (instead of node 0's launch hosting the store; replaces "
                  "--master-addr/--master-port)");
  auto secret_file = std::make_shared<std::string>();
  cmd->add_option("--secret-file", *secret_file,
                  "the run's secret (a file of 16+ bytes that every machine holds, e.g. head -c 32 /dev/urandom): "
                  "every store value is sealed with it (default: a fresh one on a single machine; none across "
                  "machines, with a warning)");
  cmd->add_option("command", o->command, "the worker's tributary command, after --")->required();
  cmd->callback([o, secret_file]() {
    choose_run_secret(*secret_file, o->nnodes);
    o->host_store = [](int port) -> std::shared_ptr<void> {
      return std::make_shared<comm::Store>(comm::Store::host(port, std::chrono::seconds(60)));
    };
    // Deaths go to the run's store under the attempt's keys, through a connection made at the first one.
    auto reporter = std::make_shared<StoreReporter>();
    // --restart-island: the members are the islands (the island leads' quorum, under its own keys), this machine's
    // is island node_rank.
    auto island_reporter = std::make_shared<StoreReporter>(kIslandsScope);
    o->report_exit = [o, reporter, island_reporter](const std::string& addr, int port, int attempt, int rank,
                                                    const std::string& how, bool go_on) {
      try {
        reporter->use(addr, port, attempt, [&](comm::Store& store) { comm::report_exit(store, rank, how); });
        if (go_on && o->restart_island)
          island_reporter->use(addr, port, attempt,
                               [&](comm::Store& store) { comm::Membership::report_lost(store, o->node_rank); });
        else if (go_on)
          reporter->use(addr, port, attempt, [&](comm::Store& store) { comm::Membership::report_lost(store, rank); });
      } catch (const SecretRefused&) {  // the worker's own line said it: this machine holds another secret
      } catch (const std::exception& e) {
        log::warn(
            "launch: could not report rank {}'s exit to the run's store ({}); its peers find out by their "
            "collectives failing (and by its heartbeat)",
            rank, e.what());
      }
    };
    o->run_started = [reporter](const std::string& addr, int port, int attempt) {
      try {
        RunStart start = RunStart::not_yet;
        reporter->use(addr, port, attempt, [&](comm::Store& store) {
          start = store.check({kRunStartedKey}) ? RunStart::heals
                  : store.check({kRunFixedKey}) ? RunStart::fixed
                                                : RunStart::not_yet;
        });
        return start;
      } catch (const SecretRefused&) {  // the worker's own line says it; nothing of the run is this machine's
        return RunStart::heals;
      } catch (const std::exception& e) {
        log::warn("launch: could not read the run's store ({}); taking the run as started", e.what());
        return RunStart::heals;
      }
    };
    o->rejoin = [o, reporter](const std::string& addr, int port, int attempt) {
      try {
        int returns = 0;
        reporter->use(addr, port, attempt, [&](comm::Store& store) {
          if (store.check({kRunStartedKey}))
            returns = int(store.add(fmt::format("launch/returns/{}", o->node_rank), 1));
        });
        return returns;
      } catch (const std::exception&) {
        return 0;  // no store yet: the run's first start
      }
    };
    auto coordinator = std::make_shared<StoreReporter>();  // the launches' own keys, beside the attempts'
    o->start_again = [coordinator](const std::string& addr, int port, int attempt, bool ask) {
      try {
        bool asked = false;
        coordinator->use(addr, port, 0, [&](comm::Store& store) {
          if (ask) store.set(start_again_key(attempt), "1");
          asked = store.check({start_again_key(attempt)});
        });
        return asked;
      } catch (const std::exception& e) {
        if (ask) log::warn("launch: could not ask the other machines' launches to start the run again ({})", e.what());
        return false;
      }
    };
    int code = launch(*o);
    if (code != 0) throw CLI::RuntimeError(code);
  });
}

}  // namespace tributary::cli
