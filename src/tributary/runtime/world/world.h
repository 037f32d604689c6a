// This rank's world: whom it trains with and how they keep together. One process (world.cpp), the whole model's
// replicas (replica_world.h), pipelines (pipeline_world.h) or islands (island_world.h): the run's layout picks one
// (make_world) and the trainer (training_run.h) asks it what it needs to know, never which kind it is.
// Internal to runtime/.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "tributary/config/run_config.h"
#include "tributary/data/loader.h"
#include "tributary/optim/adamw.h"
#include "tributary/parallel/layout.h"
#include "tributary/runtime/checkpoint.h"
#include "tributary/runtime/replica_checkpoint.h"
#include "tributary/runtime/run_state.h"
#include "tributary/runtime/session.h"
#include "tributary/runtime/stop.h"
#include "tributary/runtime/sync/replica_sync.h"
#include "tributary/runtime/train_summary.h"

namespace tributary {
class Pipelines;
class Replicas;
}  // namespace tributary

namespace tributary::detail {

// Which of the training windows this rank reads: its share `rank` of `world` (a pipeline's stages read alike).
struct DataShard {
  int rank = 0, world = 1;
};

// This rank's share of the run: the windows it reads, the batches one step of the run takes (all replicas together),
// the optimizer steps it takes per step of the run (time-paced islands: a faster island more), the ranks one member
// of a fault-tolerant run stands for (an island's; 1: a rank is a member), and what the replicas are replicas of (the
// start-up line).
struct Share {
  DataShard data;
  int64_t batches_per_step = 1;
  int64_t steps_per_tick = 1;
  int64_t ranks_per_member = 1;
  std::string replicas_of;
};

// Whom the step itself exchanges with: the replicas that average gradients inside it (data parallel: the run's
// replicas, an island's ranks) and the pipeline step's groups; null where none.
struct StepPeers {
  ReplicaSync* sync = nullptr;
  Pipelines* pipelines = nullptr;
};

// What the world's start takes over: the state a resume restored (ckpt) or that a joiner heals into.
struct StartState {
  NamedTensors& trained;
  AdamW& optimizer;
  BatchLoader& loader;
  RunProgress& progress;
  int64_t total_steps = 0;
  const LoadedCheckpoint* ckpt = nullptr;  // a resume
  bool joining = false;                    // a restarted fault-tolerant member (DistEnv::joining)
  bool lead = false;                       // this rank leads (it logs what the start decided)
  std::function<double()> step_seconds;    // one training step's time here, measured now (time-paced islands)
};

// Size: one question per place where the kinds of run differ (built, started, after each step, at a checkpoint, in
// the summary); each is a line or two in each kind.
class World {
 public:
  virtual ~World() = default;

  // The replicas whose outer loop runs after each step (with their quorum when fault tolerant): the whole model's,
  // a pipeline stage's across the pipelines, this rank's outer shard's across the islands; null when none (one
  // process, one pipeline, data-parallel stages, an island's rank without a shard).
  virtual Replicas* synced() { return nullptr; }
  virtual StepPeers step_peers() { return {}; }

  // Every rank of the run, for the multi-process checkpoint; none for one process.
  virtual std::optional<CheckpointPeers> peers() { return std::nullopt; }
  // The sgemm peak one rank can count on (the replicas measure together: the contention of training).
  virtual double matmul_peak(const torch::Device& device);
  virtual Share share() const { return {}; }  // its batches and steps per tick as the start left them

  // Starts keeping the replicas together (a resume's outer state and codec progress; islands paced by measurement
  // first agree on the pace: parallel.island_steps = "auto") or, for a joiner, heals it from the run: its pending
  // heal, if any (it trains on and becomes a member at the next round). Collective over the run.
  virtual std::optional<PendingHeal> start(const StartState& state) { return std::nullopt; }
  // The run's stop agreement across the world (empty for one process).
  virtual StopAgreement::Vote stop_vote() { return {}; }

  // After each step: the outer steps due (`last`: and those pending).
  virtual AfterStep after_step(int64_t step, double lr, NamedTensors& trained, bool last) { return {}; }
  virtual double blocked_total_s() const { return 0; }  // the training thread's time blocked on communication
  // Fault tolerant, every unit: the rank's data shard and tokens per step as its member's lead has them (an island's
  // other ranks follow their rank 0); `tokens_per_step` elsewhere. Collective inside the member.
  virtual int64_t follow_lead(BatchLoader& loader, int64_t tokens_per_step) { return tokens_per_step; }
  // Whether every rank of this rank's member takes part in reading the state a heal sends (ZeRO-1 islands: the
  // AdamW state is sharded over them); `heals` is the member's lead's answer. Collective inside the member.
  virtual bool heal_reads_together(bool heals) { return false; }

  // Before the whole model is read (evaluation, checkpoint): every rank's copy made current (pipeline stages).
  virtual void whole_model(NamedTensors& params, NamedTensors* aux_params) {}
  // The checkpoint's part beyond this rank's own files (runtime/run_state.h, SaveRequest::stage_state).
  virtual bool stage_state(const fs::path& run_dir, int64_t step, const RankState& mine, CheckpointContents& contents) {
    return true;
  }
  virtual void describe() {}                        // the start-up lines that describe the world (the lead logs them)
  virtual void summarize(TrainSummary& summary) {}  // the world's figures in the run's summary
};

// `session`: the run's (runtime/session.h), which outlives the world; null for one process.
std::unique_ptr<World> make_world(const Session* session, const Layout& layout);

}  // namespace tributary::detail
