// How this rank keeps its model together with the others': the one object the run loop's trainer
// (runtime/training_run.h) talks to between steps, never asking which kind it is. The layout picks it (make_sync):
//   this class itself   one process: nothing to keep together
//   ReplicaSync         the whole model's replicas: data parallel or DiLoCo (streaming fragments, overlap, codecs,
//                       the warm-up), fault tolerant or not (replica_sync.h)
//   PipelineSync        a pipeline stage: its pipeline's groups, and its replicas across the pipelines averaging
//                       every step or taking DiLoCo's rounds (a ReplicaSync of their own; pipeline_sync.h)
//   IslandSync          islands as a composition: a data-parallel ReplicaSync inside the island on the fast link and
//                       a DiLoCo ReplicaSync across the islands, sharded or led (island_sync.h)
// DiPaCo's workers keep their owned modules with the modules' owners instead (runtime/dipaco/).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "tributary/artifacts/checkpoint.h"
#include "tributary/data/loader.h"
#include "tributary/optim/adamw.h"
#include "tributary/optim/update_probe.h"
#include "tributary/parallel/layout.h"
#include "tributary/runtime/replica_checkpoint.h"
#include "tributary/runtime/run_state.h"
#include "tributary/runtime/session.h"
#include "tributary/runtime/stop.h"
#include "tributary/runtime/sync/replica_rounds.h"
#include "tributary/runtime/train_summary.h"

namespace tributary {

class PipelineSync;
class ReplicaSync;

// Which of the training windows this rank reads: its share `rank` of `world` (a pipeline's stages read alike).
struct DataShard {
  int rank = 0, world = 1;
};

// This rank's share of the run: the windows it reads, the batches one step of the run takes (all replicas together),
// the optimizer steps it takes per step of the run (time-paced islands: a faster island more), the ranks one member
// of a fault-tolerant run stands for (an island's; 1: a rank is a member), what the replicas are replicas of, and the
// start-up line that describes the sync (the lead logs it; empty: none), and the steps this rank may take when the
// run ends by the sync's word rather than at train.steps (asynchronous rounds: a fast replica takes more).
struct Share {
  DataShard data;
  int64_t batches_per_step = 1;
  int64_t steps_per_tick = 1;
  int64_t ranks_per_member = 1;
  std::string replicas_of;
  std::string line;
  int64_t max_steps = 0;  // > 0: this rank may take up to so many steps, the sync ending the run (AfterStep::over)
};

// Whom the step itself exchanges with: the rounds that average gradients inside it (data parallel: the run's replicas,
// an island's ranks) and the pipeline step's groups, null where none; and the training thread's time blocked on
// communication since the start (dist.slow_workers slows compute only).
struct StepPeers {
  ReplicaRounds* rounds = nullptr;
  PipelineSync* pipelines = nullptr;
  std::function<double()> blocked_s = [] { return 0.0; };
};

// Every rank of the run: the collectives of the multi-process checkpoint, and the run's stop agreement. Both empty for
// one process.
struct RunPeers {
  std::optional<CheckpointPeers> checkpoint;
  StopAgreement::Vote stop;
};

// What the start takes over: the state a resume restored (ckpt) or that a joiner heals into.
// A probe of updates (optim/update_probe.h) over the model `globals` returns.
using ProbeMaker = std::function<std::unique_ptr<UpdateProbe>(std::function<NamedTensors()> globals)>;

struct StartState {
  NamedTensors& trained;
  NamedTensors* params = nullptr;  // every parameter of the model (a pipeline stage trains its own part: trained)
  AdamW& optimizer;
  BatchLoader& loader;
  RunProgress& progress;
  int64_t total_steps = 0;
  const LoadedCheckpoint* ckpt = nullptr;  // a resume
  bool joining = false;                    // a restarted fault-tolerant member (DistEnv::joining)
  bool lead = false;                       // this rank leads (it logs what the start decided)
  torch::Device device = torch::kCPU;      // where the matmul peak is measured
  std::function<double()> step_seconds;    // one training step's time here, measured now (time-paced islands)
  // dist.score = "loss": makes the probe whoever judges whole updates (a robust exchange's ranks, an asynchronous
  // merger) rates each with, reading the judged round's start model through its argument; empty otherwise.
  ProbeMaker loss_probe;
};

// What the start decided: the sgemm peak one rank can count on, and a joiner's pending heal (it trains on and becomes
// a member at the next round), if any.
struct Started {
  double peak_flops = 0;   // per worker: what MFU divides by
  std::string peak_words;  // which measurement it is, for the start-up line (perf/flops.h describe_peak)
  std::optional<PendingHeal> pending;
};

// Size: one question per point of the loop (start, the step's and the run's peers, the round, between rounds, the
// checkpoint, the summary); each is a line or two in each kind, and every kind answers each.
class Sync {
 public:
  virtual ~Sync() = default;

  // This rank's share: before start() what the layout gives, after it as the start left it (a measured pace).
  virtual Share share() const { return {}; }
  // Measures the matmul peak, then starts keeping the replicas together (a resume's outer state and codec progress;
  // islands paced by measurement first agree on the pace) or, for a joiner, heals it from the run. Collective.
  virtual Started start(const StartState& state);
  // The replicas whose rounds this rank reports (their traffic, outer steps, rejected updates) and whose membership
  // decides a fault-tolerant run's members: the whole model's, a pipeline stage's across the pipelines, this rank's
  // outer shard's across the islands; null when none.
  virtual ReplicaSync* replicas() { return nullptr; }
  virtual StepPeers step_peers() { return {}; }
  virtual RunPeers peers() { return {}; }

  // The round after each step: the outer steps due (`last`: and those pending). True on every rank alike.
  virtual AfterStep after_step(int64_t step, double lr, NamedTensors& trained, bool last) { return {}; }
  // Between rounds, fault tolerant: a member of several ranks makes the state a heal sends together when its lead
  // heals (`heals`: the lead's answer; an island with ZeRO-1 gathers its AdamW shards, a pipeline every stage's
  // parameters and moments), and its ranks read the data shard and tokens per step their lead has (returned;
  // `tokens_per_step` where a member is one rank). Collective inside the member. heal_made_together returns the state
  // on the lead when made together (`own`: this rank's heal_state(), which it may use), nullopt otherwise (the lead
  // makes its own).
  virtual std::optional<HealState> heal_made_together(bool heals, const std::function<HealState()>& own) {
    return std::nullopt;
  }
  virtual int64_t follow_lead(BatchLoader& loader, int64_t tokens_per_step) { return tokens_per_step; }

  // Before the whole model is read (evaluation, checkpoint): this rank's copy made whole and current.
  virtual void before_read(NamedTensors& params, NamedTensors* aux_params) {}
  // The checkpoint's part beyond this rank's own files (runtime/run_state.h, SaveRequest::stage_state).
  virtual bool checkpoint_part(const fs::path& run_dir, int64_t step, const RankState& mine,
                               CheckpointContents& contents) {
    return true;
  }
  virtual void summarize(TrainSummary& summary) {}  // the sync's figures in the run's summary
};

// `session`: the run's (runtime/session.h), which outlives the sync; null for one process.
std::unique_ptr<Sync> make_sync(const Session* session, const Layout& layout);

}  // namespace tributary
