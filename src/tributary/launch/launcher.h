// `tributary launch`: starts the local workers of a distributed run (like torchrun), prefixes their output with the
// rank, and supervises them: when a worker fails, the others are stopped (SIGTERM, then SIGKILL after a grace
// period) and launch exits with the failing worker's status, naming its rank. No orphans, no hang. With
// max_failures = K, up to K workers (rank 0 included) may die while the rest carry on; launch then exits 0 if every
// other worker succeeds. Launch on node 0 hosts the run's store (as torchrun's agent does), so the store outlives
// any worker.
// Multi-machine: the same command on every machine with --nnodes/--node-rank/--master-addr.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace tributary {

// Set on the run's store by a fault-tolerant run's rank 0 once every worker built its model and data.
inline constexpr const char* kRunStartedKey = "run/started";
// Set by the rank 0 of a run that cannot outlive a worker (no dist.fault_tolerant) once it got through start-up.
inline constexpr const char* kRunFixedKey = "run/started_fixed";
// How far a run got, as its store says: not through start-up yet; through it and fault tolerant (kRunStartedKey: a
// dead worker may be restarted to heal); through it without fault tolerance (kRunFixedKey).
enum class RunStart { not_yet, heals, fixed };

struct LaunchOptions {
  int nproc = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";  // loopback by default: c10d is unauthenticated
  int master_port = -1;  // -1 (default) or 0: a free port, single node only; a fixed default would let a second
                         // launch on the same machine join the first run's store
  double grace_s = 10;   // between SIGTERM and SIGKILL when stopping workers
  int max_failures = 0;  // workers that may die without stopping the others: for algorithms that
                         // survive it (DiPaCo, dist.fault_tolerant DiLoCo)
  int max_restarts = 0;  // dead workers restarted as joiners of the running run (dist.fault_tolerant
                         // DiLoCo heals them from a peer); a death beyond them counts as a failure
  // --restart-island: this launch's workers are one island (dist.fault_tolerant with parallel.islands): when one
  // dies, launch kills the others and starts all of them again together, as the island's next life (one of
  // --max-restarts); the island rejoins the run and heals from a peer island.
  bool restart_island = false;
  // "ADDR:PORT": the run's store is served there already (`tributary store`, on a machine that outlives the
  // workers'); no launch hosts it, and it replaces --master-addr/--master-port.
  std::string store;
  std::vector<std::string> command;  // tributary arguments for each worker, e.g. {"train", "cfg.toml"}
  // Node 0: hosts the run's store on the port (kept alive until launch returns). Given by the CLI, which links
  // comm/; this file stays free of LibTorch.
  std::function<std::shared_ptr<void>(int port)> host_store;
  // A worker exited with an error or a signal (`how`, e.g. "was killed by signal 9 (Killed)"): tell the run's store
  // (at addr:port), so that its peers' failed collectives name it (comm/exit_reports.h) and, when the run goes on
  // without it (`go_on`), fault-tolerant peers drop it at once instead of at its heartbeat deadline. Given by the CLI;
  // must not throw.
  // `attempt`: the run's (below), whose keys it is.
  std::function<void(const std::string& addr, int port, int attempt, int rank, const std::string& how, bool go_on)>
      report_exit;
  // How far the run on the store got (RunStart): a worker that dies before start-up (a bad config, a missing dataset)
  // would die again, so launch restarts nothing then; after it, a death in a run without fault tolerance stops the
  // run, where starting it again would throw away what it trained. Given by the CLI; must not throw.
  std::function<RunStart(const std::string& addr, int port, int attempt)> run_started;
  // A machine started again while its run goes on (its launch was killed, or the machine rebooted): 0 when the run on
  // the store has not got through start-up (or the store does not answer yet: a first start), otherwise this
  // machine's count of such returns (1, 2, ...), kept on the store. Its workers then join the running run as joiners
  // (a fresh rendezvous under the ranks of the dead would make them look alive to the members and hang the run).
  // Given by the CLI; must not throw.
  std::function<int(const std::string& addr, int port, int attempt)> rejoin;
  // Several machines: whether a launch asked every machine's launch to start the run again after attempt `attempt`
  // (a worker killed before the run got through start-up); `ask`: this launch asks. Given by the CLI; must not throw.
  std::function<bool(const std::string& addr, int port, int attempt, bool ask)> start_again;
  // Set by launch: the run's attempt, 0 and then one more each time it started the run again; attempt n's workers
  // and launch use the store's keys under attempt_prefix(n) (dist_env.h), so that nothing of a failed attempt is read.
  int attempt = 0;
  // Set by launch: its island's first life (--restart-island): 0, or above every life of the machine's earlier
  // launches when it returned to a running run, so that its groups' names are new.
  int first_island_life = 0;
};

// Runs to completion; returns the exit status launch should exit with.
int launch(const LaunchOptions& options);

int free_tcp_port();  // a port the OS just gave out on 127.0.0.1

}  // namespace tributary
