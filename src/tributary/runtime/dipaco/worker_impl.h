// The worker process of a DiPaCo run as a source of work for the one run loop (runtime/run_loop.h; made by
// worker.h's make_path_rounds). Internal to dipaco/.
#pragma once

#include "tributary/runtime/dipaco/worker.h"

#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>

#include "tributary/artifacts/inference.h"
#include "tributary/artifacts/json_file.h"
#include "tributary/artifacts/modules.h"
#include "tributary/artifacts/routed_eval.h"
#include "tributary/artifacts/routes.h"
#include "tributary/comm/exchange.h"
#include "tributary/comm/group.h"
#include "tributary/comm/membership.h"
#include "tributary/core/clock.h"
#include "tributary/core/error.h"
#include "tributary/core/hash.h"
#include "tributary/core/log.h"
#include "tributary/data/dataset.h"
#include "tributary/data/loader.h"
#include "tributary/launch/launcher.h"
#include "tributary/optim/adamw.h"
#include "tributary/optim/outer.h"
#include "tributary/optim/schedule.h"
#include "tributary/perf/flops.h"
#include "tributary/routing/router.h"
#include "tributary/routing/units.h"
#include "tributary/runtime/dipaco/crew.h"
#include "tributary/runtime/dipaco/held_modules.h"
#include "tributary/runtime/dipaco/path_data.h"
#include "tributary/runtime/dipaco/path_state.h"
#include "tributary/runtime/dipaco/resume.h"
#include "tributary/runtime/dipaco/task_queue.h"
#include "tributary/runtime/ft/lead.h"
#include "tributary/runtime/metrics.h"
#include "tributary/runtime/rendezvous.h"
#include "tributary/runtime/replica_checkpoint.h"
#include "tributary/runtime/run_loop.h"
#include "tributary/runtime/run_report.h"
#include "tributary/runtime/session.h"
#include "tributary/runtime/slowdown.h"
#include "tributary/runtime/step_runner.h"
#include "tributary/runtime/stop.h"
#include "tributary/runtime/wan.h"

namespace tributary::dipaco {

// What this worker counted over the run, for summary.json and the run's TrainSummary.
struct RunTally {
  int64_t first_round = 0;    // the round this invocation began with (> 0 when resumed)
  int64_t rounds = 0;         // the run's, resumed ones included
  int64_t tasks_run = 0;      // by this process
  int64_t tasks_dropped = 0;  // over the run (skip policy or nobody left)
  double bytes_sent = 0, bytes_recv = 0, comm_s = 0;
};

// One process of a DiPaCo run: its connection to the others (crew.h: store, group, exchange, task queue, quorum), the
// global modules it holds, and the outer optimizers of the modules it owns. Its unit of work is a round: claimed path
// tasks -> settle -> one ring (or the owners' upload) -> the round's files; the loop drives it like the trainer's
// steps. Size: the run's settings and place, the modules and per-path state, the round's accumulators, and the run's
// accounting.
class Worker : public WorkSource {
 public:
  Worker(const RunConfig& config, const DistEnv& env, const TrainOptions& options);

  StopAgreement::Vote stop_vote() override;  // every live worker's vote after a round
  bool lead() const override { return lead_.is(); }
  bool done() const override { return round_ >= rounds_; }
  UnitDone next() override;  // one round
  Due due_after(const UnitDone& unit, bool stop) override;
  void when_due(const UnitDone& unit, const Due& due) override;  // the leader's routed validation
  void between_units(const UnitDone&) override;                  // admits the restarted workers that asked to rejoin
  TrainSummary finish(bool stopped_early) override;

 private:
  // What a round's tasks and exchange left: for its metrics line.
  struct RoundWork {
    int64_t tasks = 0;             // tasks this worker ran
    std::vector<int64_t> dropped;  // paths the round went on without (on_failure = skip)
    double sent = 0, recv = 0;     // the exchange's bytes (the ring, or the upload to the owners)
    double comm_s = 0;             // in the exchange, every attempt
  };
  bool start(const TrainOptions& options);  // a fresh or resumed run, every worker together; true: resumed
  bool rejoin();                            // a restarted worker, taken in at a round boundary
  void follow_members(int64_t round);       // after a departure or an admission
  RoundWork tasks_and_exchange(int64_t round);
  void save_round_as_leader(int64_t round);
  bool run_dirs_apart();  // collective: whether some worker does not see the lead's run directory
  void train_task(int64_t path, int64_t round);
  // The quorum's decision on the round's tasks of generation `gen` (all of `round_tasks` so far).
  Verdict settle(int64_t round, int64_t gen, const std::vector<int64_t>& round_tasks);

  RunConfig config_;
  DistEnv env_;
  torch::Device device_;
  Lead lead_;  // the lowest live worker: writes the module files, metrics.jsonl and the summary
  PathGrid grid_;
  std::vector<std::string> module_ids_;
  int64_t rounds_;
  int64_t round_ = 0;  // the next round to train (> 0 when resumed)
  fs::path run_dir_;
  Slowdown slowdown_;  // dist.slow_workers
  Faults faults_;      // injected on purpose (TrainOptions::faults)
  std::vector<PathData> data_;
  CosineSchedule schedule_;
  std::unique_ptr<Session> session_;   // this process's connection to the run (the crew's groups form over it)
  std::unique_ptr<Crew> crew_;         // the connection to the others, and who they are round by round
  std::unique_ptr<RunReport> report_;  // metrics.jsonl and tb/ (the lead; the others their own tasks' lines), summary
  std::unique_ptr<HeldModules> held_;  // the global modules this worker holds, the outer state of those it owns
  std::unique_ptr<PathState> state_;   // inner AdamW state and early-stopping copies, per path
  std::map<std::string, ModuleAccumulator> accs_;  // this round's contributions, by module
  std::vector<int64_t> trained_;  // the paths this worker trained last round (path-local: claimed first, see claim())
  int64_t inner_steps_done_ = 0;
  double compute_s_ = 0;
  double eval_s_ = 0;  // the leader's routed validations during the run (dipaco.eval_every_rounds)
  Clock::time_point start_ = Clock::now();
  RunTally tally_;
  bool outside_ = false;  // a restarted worker whose run finished before it could rejoin
};

// Whether the run's workers went path-local (written by worker 0 at start): a restarted worker cannot rejoin those.
inline constexpr const char* kPathLocalKey = "dipaco/path_local";

}  // namespace tributary::dipaco
