// The resolved configuration of a training run: plain structs (no LibTorch) bound to a ConfigSchema so that every
// key is documented, typed and range-checked in one place. Cross-key rules live in validate().
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tributary/core/config.h"
#include "tributary/model/config.h"

namespace tributary {

struct DataConfig {
  std::string dir = "data/default";  // a directory written by `tributary data build*`
  // How the replicas divide the training split: "windows" (each reads its share of the windows of the whole split)
  // or "domains" (replica r reads only the documents of domain r mod D: unlike shards, non-IID data).
  std::string shards = "windows";
};

struct OptimConfig {
  double lr = 2e-3;
  double min_lr_ratio = 0.1;  // cosine decays to lr * min_lr_ratio
  int64_t warmup_steps = 50;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;  // 0 disables clipping
};

struct TrainConfig {
  int64_t steps = 600;
  int64_t batch_size = 16;  // sequences per micro-batch
  int64_t grad_accum = 1;   // micro-batches per optimizer step
  int64_t seed = 1234;
  int64_t threads = 0;  // intra-op threads; 0: all cores / local workers
  std::string device = "cpu";
  std::string precision = "fp32";  // fp32 | bf16 (model/autocast.h)
  bool cuda_graph = false;         // the step captured once and replayed (runtime/step_graph.h)
  std::string run_dir = "runs/default";
  int64_t log_every = 10;
  int64_t eval_every = 100;  // 0: only at the end
  int64_t eval_batches = 16;
  int64_t checkpoint_every = 200;  // 0: only at the end
  int64_t keep_checkpoints = 2;
  std::string
      init_from;  // start from this checkpoint's weights (fresh optimizer and schedule), e.g. a pre-trained model
};

// How replicas synchronise when the run has more than one process (tributary launch, torchrun, Slurm).
// Data parallel: gradients averaged every step. DiLoCo: inner_steps local AdamW steps, then the pseudo-gradients are
// averaged and applied by the outer Nesterov optimizer.
// Size: one member per dist.* key.
struct DistConfig {
  std::string algorithm = "diloco";  // diloco | ddp | async_diloco
  int64_t inner_steps = 50;          // H
  int64_t warmup_ddp_steps = 0;      // DiLoCo: train this many steps as data parallel first (the paper starts
                                     // DiLoCo from a pre-trained model); -1: from the run (config/outer_auto.h)
  double outer_lr = 0.7;             // -1: from the run (config/outer_auto.h)
  double outer_momentum = 0.9;       // -1: from the run (config/outer_auto.h)
  int64_t ramp_steps = 0;            // > 0: rounds lengthen from 1 step to H over these first DiLoCo steps
                                     // (optim/round_length.h)
  double qsr_alpha = 0;              // > 0: H = max(inner_steps, floor((alpha / lr)^2)) as the inner lr decays
  int64_t fragments = 1;             // Streaming DiLoCo: fragments synced at staggered times (blocks strided)
  int64_t overlap_steps = 0;         // tau: apply a fragment's outer update tau inner steps after sending it
  double merge_alpha = 0.5;          // with overlap: local = alpha * local + (1 - alpha) * global
  int64_t compute_nice = 0;          // > 0: the training thread runs this much nicer than the communication threads
  std::string slow_workers;          // "R:F,...": worker R runs F x slower (runtime/slowdown.h); "" = none
  std::string auto_note;             // not a key: what resolve_outer_auto chose, printed by the lead at start-up
  std::string compression = "fp32";  // fp32 | fp16 | bf16 | int8 | fp4 | terngrad | topk | powersgd | sparseloco
  double topk_ratio = 0.01;
  int64_t powersgd_rank = 4;
  int64_t sparse_chunk = 4096;  // SparseLoCo's defaults: top-64 of every 4,096 values, 2 bits, error feedback x 0.95
  int64_t sparse_topk = 64;
  int64_t sparse_bits = 2;
  double error_feedback_decay = 0.95;
  double bucket_mb = 25;
  std::string wan;  // "" | "10Mbit,100ms" | cluster JSON / preset: emulated links between ranks
  double store_timeout_s = 600;
  double collective_timeout_s = 1800;
  // Fault tolerance (DiLoCo; optim/resilient_average.h): workers may die; survivors redo the round without them.
  bool fault_tolerant = false;
  double heartbeat_timeout_s = 10;  // a worker whose heartbeat stalls this long is dead (fault tolerance, DiPaCo)
  double reject_norm_factor = 0;    // > 0: drop a pseudo-gradient that is non-finite or has a norm above this
                                    // factor x the round's median norm (or below the median / factor); 0 = off
  // Robust aggregation (optim/robust_aggregate.h): mean | trimmed_mean | median | centered_clip. Anything but the mean
  // without a norm test all-gathers the updates and judges each as received.
  std::string aggregate = "mean";
  double trim_fraction = 0.2;  // trimmed_mean: the fraction of values dropped at each end, per coordinate
  double clip_radius = 0;      // centered_clip's tau; 0: the median distance of the updates to their median
  int64_t evict_after = 0;     // a participant refused or scoring below min_score this many exchanges in a row is
                               // evicted (its updates refused from then on); 0: never
  double min_score = 0;        // the lowest score that counts (a cosine with the aggregate, or a loss rating)
  // What an update scores (optim/robust_aggregate.h): "agreement" (its cosine with the round's aggregate) or "loss"
  // (Covenant's Gauntlet: the loss it alone brings on a probe batch its sender could not choose, rated over rounds;
  // runtime/sync/loss_probe.h).
  std::string score = "agreement";
  int64_t probe_windows = 2;     // loss scores: windows of the model's context in each round's probe batch
  int64_t probe_evaluators = 3;  // loss scores: other replicas that evaluate each update (their median counts)
  std::string admission;  // a file of the public keys admitted (comm/identity.h); "" = open to the secret's holders
  // Asynchronous DiLoCo (runtime/sync/async_sync.h, optim/async_merger.h).
  int64_t min_quorum = 0;     // a merge closes once this many replicas' updates arrived; 0: half, rounded up
  double grace_s = 0.25;      // then waits this long for stragglers (every second of it is drift: §40)
  int64_t max_staleness = 4;  // updates trained from a version more than this many merges old are refused
  double round_seconds = 0;   // > 0: a round ends after this much time (time-paced), not after inner_steps steps;
                              // -1: time-paced, inner_steps steps of the median replica timed at start-up

  bool diloco() const;  // algorithm read: DiLoCo (true) or data parallel; the one place that compares the string
  bool async_diloco() const;
  // Each replica's update judged whole as received (dist.aggregate other than mean, or a norm test): the exchange
  // all-gathers instead of summing on the ring (optim/robust_aggregate.h).
  bool judges_updates() const { return aggregate != "mean" || reject_norm_factor > 0; }
};

// Pipeline parallelism (parallel/pipeline/): the model's blocks split over pipeline_stages ranks (D_PP), the step's
// batch over micro_batches; world size = D_DP x D_PP, rank = stage * D_DP + pipeline (Megatron's order), each stage's
// replicas across pipelines averaging gradients every step.
struct ParallelConfig {
  int64_t pipeline_stages = 1;     // D_PP; 1 = no pipeline
  int64_t micro_batches = 1;       // m; must divide train.batch_size
  std::string schedule = "gpipe";  // gpipe | 1f1b
  int64_t warmup_margin = 0;       // 1F1B: extra warm-up forwards per stage distance (tolerates link latency)
  std::string stage_layers;        // "" (balanced) | blocks per stage, e.g. "3,5"
  std::string placement;           // "" (Megatron's order) | placement.json from `tributary plan --out`
  // fp32 | fp16 | bf16 | int8 | hadamard4 | hadamard2 | aq4 | aq2 (parallel/pipeline/wire.h)
  std::string activation_compression = "fp32";
  double activation_cache_mb = 1024;  // aq4 / aq2: per stage boundary (parallel/pipeline/activation_deltas.h)
  // Islands (runtime/sync/island_sync.h): ranks joined by a fast link, data parallel inside, DiLoCo across. "" (every
  // rank an island of one) | "N" equal islands | sizes "4,4,2" | "machines" (one per launch machine).
  std::string islands;
  bool shard_optimizer = true;  // islands: ZeRO-1, each rank of an island keeps and steps 1/N of the AdamW moments
  // Islands of unlike speed: optimizer steps per train step ("tick"), per island, e.g. "2,1" (a twice faster island
  // takes two); "" = one each (lockstep). Rounds stay H ticks, so all islands meet at the same outer step.
  std::string island_steps;
};

// DiPaCo (arXiv 2403.10616): a grid of modules, one path per routed shard. Each path trains dist.inner_steps (tau)
// inner steps per round from the current global modules; train.steps is each path's total, so there are
// train.steps / tau rounds. Compression, WAN emulation and the outer lr/momentum come from [dist].
struct DipacoConfig {
  std::string modules;                 // "" (not DiPaCo) | modules per level, e.g. "2x2" (one factor per model level)
  bool private_stem = false;           // embeddings, final norm and head private to each path instead of shared
  std::string routes;                  // directory written by `tributary route` (one shard per path + the router)
  std::string init_from;               // dense checkpoint every module starts from ("" = the seed's initialisation)
  std::string norm_rescale = "none";   // none | multiply | divide: outer gradient x1, x or / sqrt(paths through it)
  std::string on_failure = "requeue";  // requeue | skip: a dead worker's tasks are re-run, or the round goes on
  int64_t holdout_permille = 20;       // per-path early stopping: this slice of the path's shard is held out
  int64_t eval_units = 0;              // routed validation units to evaluate at the end; 0 = all
  // Path-local workers (runtime/dipaco/module_depot.h, optim/module_owners.h): a worker holds only its owned modules
  // and the path it trains, sends only its paths' pseudo-gradients to their owners and fetches modules through the
  // run's store; path state travels through the store (no shared run directory). false: the owners' ring.
  bool path_local = false;
  std::string fetch_codec = "fp32";  // path_local: module values fetched as fp32 | fp16 | bf16
  // A path's inner AdamW state between its tasks: travel (kept per path; it moves with the path: 2x the path's
  // parameters each way per task) | reset (every task starts AdamW afresh: no state moves).
  std::string inner_state = "travel";
  // path_local: where a path's state waits for its next task: holder (the worker that trained it keeps it and serves
  // it on request; lost if that worker dies) | store (put into the run's store every task; outlives its worker).
  std::string path_state = "holder";
  int64_t eval_every_rounds = 0;  // the leader's routed validation every this many rounds (metrics); 0 = at the end
};

// Local parallelism (Laskin, Metz et al., arXiv 2012.03837; parallel/local/): the blocks cut into `chunks` chunks of
// consecutive blocks, each ending in an auxiliary head with its own next-token loss and starting from a detached input,
// so no gradient crosses a chunk boundary. The last chunk's head is the model's head. chunks = 0: global backprop.
// With parallel.pipeline_stages > 1 each stage is one chunk.
struct LocalConfig {
  int64_t chunks = 0;               // K (must divide model.num_layers); 0 = off; 1 = one chunk (global backprop)
  std::string mode = "chunked";     // chunked | greedy (one block per chunk) | overlapping
  int64_t overlap_blocks = 1;       // overlapping: the last blocks of a chunk that the next chunk's loss also trains
  std::string aux_head = "linear";  // linear (RMSNorm + projection to the vocabulary) | blocks (private blocks first)
  int64_t aux_head_blocks = 1;      // aux_head = blocks: private transformer blocks before the projection
  double aux_weight = 1.0;          // scale of an auxiliary head's loss (the model's head: 1)
  int64_t queue_steps = 2;          // across processes: steps a stage may run ahead of the stages after it
  std::string lr_scale;             // per-chunk multipliers of optim.lr, e.g. "1,0.5"; '' = all 1
};

// local.lr_scale read: one multiplier of the learning rate per chunk (all 1 where the key is empty). Error naming the
// key on a malformed list, a count other than local.chunks or a multiplier outside (0, 100].
std::vector<double> lr_scales(const LocalConfig& local);

struct RunConfig {
  ModelConfig model;
  DataConfig data;
  OptimConfig optim;
  TrainConfig train;
  DistConfig dist;
  ParallelConfig parallel;
  DipacoConfig dipaco;
  LocalConfig local;

  RunConfig();
  RunConfig(const RunConfig& other);
  RunConfig& operator=(const RunConfig& other);

  ConfigSchema& schema() { return *schema_; }
  const ConfigSchema& schema() const { return *schema_; }

  // Defaults <- file (if not empty) <- overrides, then validate().
  static RunConfig load(const std::string& file, const std::vector<std::string>& overrides);
  static RunConfig from_toml(const std::string& text, const std::string& origin);
  void validate() const;  // Error naming the key(s) on an impossible combination

  std::string to_toml() const { return schema_->to_toml(); }

  // Keys that may change between a checkpoint and its resume without changing the computation.
  static const std::vector<std::string>& resumable_keys();
  // Resuming `what` (a checkpoint or run directory) saved with `saved` under this config: Error naming every key
  // that differs (keys of resumable_keys() may) and the saved config file to resume with. A saved vocab_size of 0
  // (take the tokenizer's) counts as this run's.
  void check_resumable_from(RunConfig saved, const std::string& what, const std::string& saved_file) const;

 private:
  void bind();
  std::unique_ptr<ConfigSchema> schema_;
};

}  // namespace tributary
