#include "tributary/config/run_config.h"

#include <fmt/ranges.h>

#include <algorithm>

#include "tributary/config/outer_auto.h"
#include "tributary/config/slow_workers.h"
#include "tributary/core/error.h"
#include "tributary/core/number_list.h"
#include "tributary/core/update_codecs.h"
#include "tributary/sched/sites.h"

namespace tributary {

RunConfig::RunConfig() { bind(); }
RunConfig::RunConfig(const RunConfig& other)
    : model(other.model),
      data(other.data),
      optim(other.optim),
      train(other.train),
      dist(other.dist),
      parallel(other.parallel),
      dipaco(other.dipaco),
      local(other.local) {
  bind();
}
RunConfig& RunConfig::operator=(const RunConfig& other) {
  model = other.model;
  data = other.data;
  optim = other.optim;
  train = other.train;
  dist = other.dist;
  parallel = other.parallel;
  dipaco = other.dipaco;
  local = other.local;
  bind();
  return *this;
}

namespace {

// [dist]: how the replicas of a run keep together, and what the links and deadlines are.
void bind_dist(ConfigSchema& s, DistConfig& dist) {
  s.add("dist.algorithm", dist.algorithm, "replica synchronisation in multi-process runs",
        {"diloco", "ddp", "async_diloco"});
  s.add("dist.inner_steps", dist.inner_steps, "DiLoCo: inner steps H between outer steps", 1);
  s.add("dist.warmup_ddp_steps", dist.warmup_ddp_steps,
        "DiLoCo: data-parallel steps before the first inner step; -1: a third of the steps when the run has fewer "
        "than 20 outer steps, else 0",
        -1);
  s.add("dist.outer_lr", dist.outer_lr, "DiLoCo: outer Nesterov learning rate; -1: from the run", -1.0, 10.0);
  s.add("dist.outer_momentum", dist.outer_momentum, "DiLoCo: outer Nesterov momentum; -1: from the run", -1.0,
        0.999999);
  s.add("dist.ramp_steps", dist.ramp_steps,
        "DiLoCo: the first rounds are short, lengthening from 1 inner step to H over this many steps; 0: none", 0);
  s.add("dist.qsr_alpha", dist.qsr_alpha, "QSR: H = max(inner_steps, (alpha/lr)^2); 0 disables", 0.0, 1.0);
  s.add("dist.fragments", dist.fragments, "Streaming DiLoCo: fragments synced at staggered times", 1, 1024);
  s.add("dist.overlap_steps", dist.overlap_steps, "inner steps an outer exchange overlaps with (tau)", 0);
  s.add("dist.merge_alpha", dist.merge_alpha, "overlap merge: local = a*local + (1-a)*global", 0.0, 1.0);
  s.add("dist.compute_nice", dist.compute_nice,
        "lower the training thread's priority by this much so communication threads run first (more workers than "
        "cores)",
        0, 19);
  s.add("dist.slow_workers", dist.slow_workers,
        "emulated slow machines: 'R:F,...' makes worker R F times slower (a sleep after each step); '' = none");
  s.add("dist.compression", dist.compression, "what goes on the wire", update_codec_names());
  s.add("dist.topk_ratio", dist.topk_ratio, "top-k: fraction of values sent", 1e-6, 1.0);
  s.add("dist.powersgd_rank", dist.powersgd_rank, "PowerSGD: rank of the factors", 1, 1024);
  s.add("dist.sparse_chunk", dist.sparse_chunk, "sparseloco: values per chunk", 1, int64_t{1} << 24);
  s.add("dist.sparse_topk", dist.sparse_topk, "sparseloco: values kept per chunk (<= sparse_chunk)", 1,
        int64_t{1} << 24);
  s.add("dist.sparse_bits", dist.sparse_bits, "sparseloco: bits per kept value (sign + magnitude)", 2, 8);
  s.add("dist.error_feedback_decay", dist.error_feedback_decay,
        "sparseloco: share of the unsent error kept for the next round", 0.0, 1.0);
  s.add("dist.bucket_mb", dist.bucket_mb, "MB per collective", 0.001, 4096.0);
  s.add("dist.wan", dist.wan, "emulated links: '' | '10Mbit,100ms' | cluster JSON or preset");
  s.add("dist.store_timeout_s", dist.store_timeout_s, "rendezvous deadline (s)", 1.0, 86400.0);
  s.add("dist.collective_timeout_s", dist.collective_timeout_s, "deadline of one collective (s)", 1.0, 86400.0);
  s.add("dist.fault_tolerant", dist.fault_tolerant,
        "DiLoCo and data parallel: survive dead or frozen workers (rounds are committed or redone by the survivors)");
  s.add("dist.heartbeat_timeout_s", dist.heartbeat_timeout_s,
        "silence after which a worker is dead (s): fault tolerance and DiPaCo", 0.5, 3600.0);
  s.add("dist.min_quorum", dist.min_quorum,
        "async_diloco: a merge closes once updates of this many replicas arrived (and dist.grace_s passed); 0: half "
        "the replicas, rounded up",
        0);
  s.add("dist.grace_s", dist.grace_s, "async_diloco: how long a merge that has its quorum waits for stragglers (s)",
        0.0, 3600.0);
  s.add("dist.round_seconds", dist.round_seconds,
        "async_diloco: > 0 paces rounds by time: each replica posts after this many seconds of training (at least one "
        "step), so a fast replica's round holds more steps and a slow one's fewer; -1: the same, a round lasting "
        "dist.inner_steps steps of the median replica (timed at start-up); 0: every dist.inner_steps steps",
        -1.0, 86400.0);
  s.add("dist.max_staleness", dist.max_staleness,
        "async_diloco: an update trained from a version more than this many merges old is refused", 0);
  s.add("dist.reject_norm_factor", dist.reject_norm_factor,
        "drop non-finite updates (pseudo-gradients, gradients) and those with a norm above this x the round's median "
        "or below the median / this, each judged as received (the updates are all-gathered); 0 = off",
        0.0, 1e6);
  s.add("dist.aggregate", dist.aggregate,
        "how the replicas' updates combine: mean (on the ring) or a robust rule over the all-gathered updates",
        {"mean", "trimmed_mean", "median", "centered_clip"});
  s.add("dist.trim_fraction", dist.trim_fraction,
        "trimmed_mean: fraction of the values dropped at each end of every coordinate", 0.0, 0.49);
  s.add("dist.clip_radius", dist.clip_radius,
        "centered_clip: the clipping radius tau; 0 = the median distance of the updates to their median", 0.0, 1e12);
  s.add("dist.evict_after", dist.evict_after,
        "robust aggregation: evict a participant refused or scoring below dist.min_score in this many exchanges in a "
        "row (its updates refused from then on); 0 = never",
        0, 1000000);
  s.add("dist.admission", dist.admission,
        "a file of the participants' public keys (one per line, `tributary identity` prints one): only they may join; "
        "\"\" = anyone holding the run's secret");
  s.add("dist.min_score", dist.min_score,
        "robust aggregation: the lowest score that counts: an update's cosine with the round's aggregate, or with "
        "dist.score = 'loss' its participant's rating (1 = as good as the round's median update)",
        -1.0, 1.0);
  s.add("dist.score", dist.score,
        "robust aggregation: what an update scores: agreement (its cosine with the round's aggregate) or loss (the "
        "loss it alone brings on a probe batch its sender could not choose, rated over rounds)",
        {"agreement", "loss"});
  s.add("dist.probe_windows", dist.probe_windows,
        "dist.score = 'loss': windows of model.context in each round's probe batch", 1, 4096);
  s.add("dist.probe_evaluators", dist.probe_evaluators,
        "dist.score = 'loss': how many other replicas evaluate each update (the median of their measurements counts)",
        1, 1024);
}

// [parallel]: how the ranks divide the model and the machines (pipelines, islands).
void bind_parallel(ConfigSchema& s, ParallelConfig& parallel) {
  s.add("parallel.pipeline_stages", parallel.pipeline_stages, "pipeline stages D_PP (world = D_DP x D_PP); 1 = none", 1,
        1024);
  s.add("parallel.micro_batches", parallel.micro_batches, "pipeline: micro-batches per step (divides batch_size)", 1,
        65535);
  s.add("parallel.schedule", parallel.schedule, "pipeline schedule", {"gpipe", "1f1b"});
  s.add("parallel.warmup_margin", parallel.warmup_margin, "1F1B: extra warm-up forwards per stage (link latency)", 0,
        1024);
  s.add("parallel.stage_layers", parallel.stage_layers, "pipeline: blocks per stage, e.g. '3,5'; '' = balanced");
  s.add("parallel.placement", parallel.placement,
        "placement.json from `tributary plan --out` (a pipeline's: which rank runs which stage) or from `tributary "
        "plan --sites --out` (the islands of a replica run); '' = rank order");
  s.add("parallel.activation_compression", parallel.activation_compression,
        "pipeline: activations and their gradients on the wire (int8: one scale per token; hadamard4 / hadamard2: 4 or "
        "2 bits per value after a tile-wise Hadamard rotation, one scale per 64 values; aq4 / aq2: AQ-SGD, an example "
        "seen before sends its activation's change at 4 or 2 bits, gradients as hadamard4)",
        {"fp32", "fp16", "bf16", "int8", "hadamard4", "hadamard2", "aq4", "aq2"});
  s.add("parallel.activation_cache_mb", parallel.activation_cache_mb,
        "aq4 / aq2: the most each stage boundary's cache of activations may hold (MB, in memory; examples beyond it "
        "travel as int8)",
        1.0, 1048576.0);
  s.add("parallel.islands", parallel.islands,
        "islands of ranks on a fast link (data parallel inside, DiLoCo across): '' = none, '2' equal islands, sizes "
        "'4,4,2', or 'machines' (one per launch machine)");
  s.add("parallel.shard_optimizer", parallel.shard_optimizer,
        "islands: ZeRO-1, each rank keeps and steps 1/N of its island's AdamW moments");
  s.add("parallel.island_steps", parallel.island_steps,
        "islands of unlike speed: optimizer steps per train step, per island, e.g. '2,1'; 'auto' = measured at "
        "start-up, in proportion to each island's speed; '' = one each (lockstep)");
}

// [dipaco]: the paths, their modules and how workers share them.
void bind_dipaco(ConfigSchema& s, DipacoConfig& dipaco) {
  s.add("dipaco.modules", dipaco.modules, "DiPaCo: modules per level, e.g. '2x2'; '' = not DiPaCo");
  s.add("dipaco.private_stem", dipaco.private_stem, "DiPaCo: embeddings/head private to each path");
  s.add("dipaco.routes", dipaco.routes, "DiPaCo: directory written by `tributary route`");
  s.add("dipaco.init_from", dipaco.init_from, "DiPaCo: dense checkpoint every module starts from");
  s.add("dipaco.norm_rescale", dipaco.norm_rescale, "DiPaCo: outer gradient x or / sqrt(paths through the module)",
        {"multiply", "divide", "none"});
  s.add("dipaco.on_failure", dipaco.on_failure, "DiPaCo: a dead worker's tasks are re-run or skipped",
        {"requeue", "skip"});
  s.rename("dipaco.heartbeat_timeout_s", "dist.heartbeat_timeout_s", "one heartbeat deadline for every kind of run");
  s.add("dipaco.holdout_permille", dipaco.holdout_permille, "DiPaCo: held-out slice of each shard (early stopping)", 0,
        500);
  s.add("dipaco.eval_units", dipaco.eval_units, "DiPaCo: routed validation units evaluated at the end; 0 = all", 0);
  s.add("dipaco.path_local", dipaco.path_local,
        "DiPaCo: workers hold and ship only their paths' modules (through owners and the store)");
  s.add("dipaco.fetch_codec", dipaco.fetch_codec, "DiPaCo path_local: module values fetched as",
        {"fp32", "fp16", "bf16"});
  s.add("dipaco.inner_state", dipaco.inner_state,
        "DiPaCo: a path's AdamW state follows it between tasks, or every task starts afresh", {"travel", "reset"});
  s.add("dipaco.path_state", dipaco.path_state,
        "DiPaCo path_local: a path's state stays with the worker that trained it (served on request) or goes into the "
        "run's store (outlives a dead worker)",
        {"holder", "store"});
  s.add("dipaco.eval_every_rounds", dipaco.eval_every_rounds,
        "DiPaCo: routed validation every this many rounds (into the metrics); 0 = only at the end", 0);
}

void bind_local(ConfigSchema& s, LocalConfig& local) {
  s.add("local.chunks", local.chunks,
        "local parallelism: chunks K with their own auxiliary loss and no backward messages; 0 = off", 0, 1024);
  s.add("local.mode", local.mode, "local parallelism: how blocks form chunks", {"chunked", "greedy", "overlapping"});
  s.add("local.overlap_blocks", local.overlap_blocks,
        "overlapping: last blocks of a chunk that the next chunk's loss also trains", 1, 1024);
  s.add("local.aux_head", local.aux_head,
        "auxiliary head: RMSNorm + vocabulary projection, after private blocks or not", {"linear", "blocks"});
  s.add("local.aux_head_blocks", local.aux_head_blocks, "aux_head = blocks: private transformer blocks per head", 1, 2);
  s.add("local.aux_weight", local.aux_weight, "scale of each auxiliary head's loss", 0.0, 100.0);
  s.add("local.queue_steps", local.queue_steps,
        "across processes: steps a stage may run ahead of the next (in-flight micro-batches; losses reported as late)",
        0, 64);
  s.add("local.lr_scale", local.lr_scale,
        "per-chunk learning rates: multipliers of optim.lr, one per chunk, e.g. '1,0.5' (a tied embedding steps with "
        "the first chunk's); '' = all 1");
}

// Cross-key rules of [local].
void validate_local(const RunConfig& c) {
  const LocalConfig& l = c.local;
  if (l.chunks == 0) return;
  const int64_t blocks = c.model.num_layers;
  if (blocks % l.chunks != 0)
    fail("local.chunks = {} must divide model.num_layers = {} (chunks have equal numbers of blocks)", l.chunks, blocks);
  if (l.mode == "greedy" && l.chunks != blocks)
    fail("local.mode = greedy is one block per chunk: set local.chunks = model.num_layers ({}), not {}", blocks,
         l.chunks);
  if (l.mode == "overlapping" && l.chunks > 1 && l.overlap_blocks >= blocks / l.chunks)
    fail("local.overlap_blocks = {} must be smaller than the {} blocks of a chunk (model.num_layers / local.chunks)",
         l.overlap_blocks, blocks / l.chunks);
  if (!c.dipaco.modules.empty())
    fail(
        "local.chunks = {} with dipaco.modules: local parallelism inside DiPaCo paths is not supported yet; set "
        "local.chunks = 0",
        l.chunks);
  if (c.parallel.pipeline_stages > 1 && l.chunks != c.parallel.pipeline_stages)
    fail(
        "local.chunks = {} with parallel.pipeline_stages = {}: across processes each stage is one chunk; set them "
        "equal",
        l.chunks, c.parallel.pipeline_stages);
  lr_scales(l);
}

// DiPaCo's own constraints (dipaco.modules set): routes, which codecs its exchanges can carry, whole rounds.
void validate_dipaco(const RunConfig& c) {
  if (c.dipaco.modules.empty()) return;
  if (c.dipaco.routes.empty())
    fail("dipaco.modules = '{}' needs dipaco.routes: the directory written by `tributary route`", c.dipaco.modules);
  if (c.dist.judges_updates())
    fail(
        "dist.aggregate = '{}', dist.reject_norm_factor = {}: DiPaCo's module owners sum their contributors' updates "
        "on a ring and do not judge them one by one yet; leave dist.aggregate = 'mean' and reject_norm_factor = 0",
        c.dist.aggregate, c.dist.reject_norm_factor);
  // SparseLoCo's payloads go point to point to each module's owner with per-module error feedback
  // (optim/module_feedback.h); the ring re-encodes at every hop, and top-k / PowerSGD need every contributor's
  // factors or indices in one collective (docs/dipaco.md, "Compression").
  if (c.dist.compression == "sparseloco" && !c.dipaco.path_local)
    fail(
        "dist.compression = 'sparseloco' with DiPaCo needs dipaco.path_local = true (each worker's sparse payload "
        "goes to the module's owner; the owners' ring carries fp32, fp16, bf16, int8, fp4 or terngrad)");
  if (c.dist.compression == "topk" || c.dist.compression == "powersgd")
    fail(
        "dist.compression = '{}' does not work with DiPaCo: use 'sparseloco' with dipaco.path_local = true "
        "(per-chunk top-k with error feedback per module, packed indices), or fp32, fp16, bf16, int8, fp4 or "
        "terngrad",
        c.dist.compression);
  if (c.train.steps % c.dist.inner_steps != 0)
    fail("DiPaCo: train.steps ({}) must be a multiple of dist.inner_steps ({}), the inner steps of one round",
         c.train.steps, c.dist.inner_steps);
  if (c.dist.ramp_steps > 0)
    fail("dist.ramp_steps = {}: DiPaCo's rounds are all dist.inner_steps long (tasks of whole rounds); set it to 0",
         c.dist.ramp_steps);
}

}  // namespace

bool DistConfig::diloco() const { return algorithm == "diloco"; }
bool DistConfig::async_diloco() const { return algorithm == "async_diloco"; }

std::vector<double> lr_scales(const LocalConfig& local) {
  const auto K = static_cast<size_t>(std::max<int64_t>(local.chunks, 1));
  if (local.lr_scale.empty()) return std::vector<double>(K, 1.0);
  const auto out =
      parse_number_list(local.lr_scale, "local.lr_scale", "write one multiplier per chunk, e.g. \"1,0.5\"");
  for (double v : out)
    if (!(v > 0 && v <= 100))
      fail("local.lr_scale = '{}': {} is outside (0, 100] (a multiplier of optim.lr)", local.lr_scale, v);
  if (out.size() != K)
    fail("local.lr_scale = '{}' names {} chunks but local.chunks = {}: give one multiplier per chunk", local.lr_scale,
         out.size(), K);
  return out;
}

void RunConfig::bind() {
  schema_ = std::make_unique<ConfigSchema>();
  auto& s = *schema_;
  s.add("model.vocab_size", model.vocab_size, "vocabulary size; 0 takes the dataset tokenizer's", 0, 1 << 24);
  s.add("model.num_layers", model.num_layers, "transformer blocks", 1, 1024);
  s.add("model.num_levels", model.num_levels, "levels of consecutive blocks (must divide num_layers)", 1, 1024);
  s.add("model.width", model.width, "residual width", 8, 1 << 16);
  s.add("model.num_heads", model.num_heads, "attention heads (must divide width)", 1, 1024);
  s.add("model.num_kv_heads", model.num_kv_heads,
        "key/value heads; 0 = num_heads, fewer = grouped-query attention (must divide num_heads)", 0, 1024);
  s.add("model.context", model.context, "sequence length T", 2, 1 << 20);
  s.add("model.mlp", model.mlp, "MLP type", {"swiglu", "gelu"});
  s.add("model.mlp_hidden", model.mlp_hidden, "MLP hidden width; 0 = 4*width (gelu) or 8/3*width (swiglu)", 0, 1 << 20);
  s.add("model.positions", model.positions, "position encoding", {"rope", "learned"});
  s.add("model.tie_embeddings", model.tie_embeddings, "share the token embedding with the output head");
  s.add("model.rope_theta", model.rope_theta, "RoPE base", 1.0, 1e9);
  s.add("model.rope_scaling", model.rope_scaling,
        "RoPE frequencies rescaled for a longer context (transformers' rope_type)", {"none", "linear", "llama3"});
  s.add("model.rope_factor", model.rope_factor, "rope_scaling's factor (linear, llama3)", 1.0, 1e6);
  s.add("model.rope_low_freq_factor", model.rope_low_freq_factor, "llama3 scaling: the low band's factor", 1e-6, 1e6);
  s.add("model.rope_high_freq_factor", model.rope_high_freq_factor, "llama3 scaling: the high band's factor", 1e-6,
        1e6);
  s.add("model.rope_original_context", model.rope_original_context, "llama3 scaling: the context trained before it", 1,
        1 << 24);
  s.add("model.head_dim", model.fixed_head_dim, "attention head width; 0 = width / num_heads", 0, 1 << 12);
  s.add("model.qkv_bias", model.qkv_bias, "biases on the query, key and value projections (Qwen 2)");
  s.add("model.norm_eps", model.norm_eps, "RMSNorm epsilon", 0.0, 1.0);
  s.add("model.init_std", model.init_std, "std of the normal initialisation", 0.0, 10.0);
  s.add("data.dir", data.dir, "token dataset directory (tributary data build / build-default)");
  s.add("data.shards", data.shards,
        "how the replicas divide the training split: windows (each its share of every window) or domains (replica r "
        "reads only the documents of domain r mod D: unlike shards)",
        {"windows", "domains"});
  s.add("optim.lr", optim.lr, "peak AdamW learning rate", 0.0, 10.0);
  s.add("optim.min_lr_ratio", optim.min_lr_ratio, "final lr as a fraction of the peak (cosine)", 0.0, 1.0);
  s.add("optim.warmup_steps", optim.warmup_steps, "linear warm-up steps", 0);
  s.add("optim.weight_decay", optim.weight_decay, "decoupled weight decay (matrices only)", 0.0, 10.0);
  s.add("optim.beta1", optim.beta1, "AdamW beta1", 0.0, 0.999999);
  s.add("optim.beta2", optim.beta2, "AdamW beta2", 0.0, 0.999999);
  s.add("optim.eps", optim.eps, "AdamW epsilon", 0.0, 1.0);
  s.add("optim.grad_clip", optim.grad_clip, "max global gradient norm; 0 disables", 0.0);
  s.add("train.steps", train.steps, "optimizer steps", 1, int64_t{1} << 40);
  s.add("train.batch_size", train.batch_size, "sequences per micro-batch", 1, 1 << 20);
  s.add("train.grad_accum", train.grad_accum, "micro-batches per optimizer step", 1, 1 << 20);
  s.add("train.seed", train.seed, "seed for initialisation and data order", 0);
  s.add("train.threads", train.threads, "intra-op threads; 0 = all cores", 0, 1024);
  s.add("train.device", train.device, "torch device (cpu, cuda, cuda:1, ...)");
  s.add("train.precision", train.precision,
        "compute precision: fp32, or bf16 (autocast: bf16 matmuls; fp32 master weights, AdamW state, loss and "
        "pseudo-gradients)",
        {"fp32", "bf16"});
  s.add("train.cuda_graph", train.cuda_graph,
        "on a GPU, capture the training step once as a CUDA graph and replay it (one launch per step instead of "
        "hundreds: small models); one process or DiLoCo replicas");
  s.add("train.run_dir", train.run_dir, "where metrics.jsonl, checkpoints and plots go");
  s.add("train.log_every", train.log_every, "steps between console/metrics lines", 1);
  s.add("train.eval_every", train.eval_every, "steps between validations; 0 = only at the end", 0);
  s.add("train.eval_batches", train.eval_batches, "validation micro-batches per evaluation", 1, 1 << 30);
  s.add("train.checkpoint_every", train.checkpoint_every, "steps between checkpoints; 0 = only at the end", 0);
  s.add("train.keep_checkpoints", train.keep_checkpoints, "how many recent checkpoints to keep", 1);
  s.add("train.init_from", train.init_from, "checkpoint whose weights the model starts from ('' = initialise)");
  bind_dist(s, dist);
  bind_parallel(s, parallel);
  bind_dipaco(s, dipaco);
  bind_local(s, local);
}

namespace {

// An islands placement (`plan --sites --out`) names the run's islands: parallel.islands takes them, so that everything
// after (validation, DiLoCo's settings from the run, the layout) sees one value. It may repeat them, not contradict
// them.
void take_placement_islands(ParallelConfig& parallel) {
  if (parallel.placement.empty() || parallel.pipeline_stages > 1) return;
  const auto islands = sched::read_island_placement(parallel.placement);
  if (!islands)  // a pipeline placement (or none of ours) would be read by nothing: the run would go on without it
    fail(
        "parallel.placement = '{}' is not an islands placement (`tributary plan --sites --out`), and a pipeline "
        "placement places pipeline stages while parallel.pipeline_stages = {}: set parallel.pipeline_stages to the "
        "placement's stages, or drop parallel.placement",
        parallel.placement, parallel.pipeline_stages);
  if (!parallel.islands.empty() && parallel.islands != *islands)
    fail(
        "parallel.islands = '{}' and the islands of parallel.placement '{}' ({}) differ: drop parallel.islands (the "
        "placement's are taken), or write the placement again with `tributary plan --sites --out`",
        parallel.islands, parallel.placement, *islands);
  parallel.islands = *islands;
}

// Each section's impossible values and combinations, as an Error naming the key(s) and what to set instead.
void validate_model(const RunConfig& c) {
  if (c.model.fixed_head_dim == 0 && c.model.width % c.model.num_heads != 0)
    fail("model.width ({}) must be divisible by model.num_heads ({}), or set model.head_dim", c.model.width,
         c.model.num_heads);
  if (c.model.num_heads % c.model.kv_heads() != 0)
    fail(
        "model.num_kv_heads ({}) must divide model.num_heads ({}): each key/value head serves the same number of "
        "query heads",
        c.model.num_kv_heads, c.model.num_heads);
  if (c.model.positions == "rope" && c.model.head_dim() % 2 != 0)
    fail(
        "RoPE needs an even head dimension: model.width / model.num_heads = {}; change model.num_heads or "
        "model.width",
        c.model.head_dim());
  // The RoPE tables (cos and sin, context x head dim, built in double precision) must fit: Llama 3.1's are 2^24.
  if (c.model.positions == "rope" && double(c.model.context) * double(c.model.head_dim()) > 0x1p27)
    fail(
        "model.context x head dimension (model.width / model.num_heads) = {} x {} is more than 2^27: the RoPE tables "
        "alone would take {:.1f} GB; shorten model.context or use more heads",
        c.model.context, c.model.head_dim(), double(c.model.context) * double(c.model.head_dim()) * 16 / 1e9);
  if (c.model.num_layers % c.model.num_levels != 0)
    fail("model.num_levels ({}) must divide model.num_layers ({}) so every level has the same number of blocks",
         c.model.num_levels, c.model.num_layers);
  if (c.model.rope_scaling != "none" && c.model.positions != "rope")
    fail("model.rope_scaling = {} rescales RoPE: it needs model.positions = rope", c.model.rope_scaling);
  if (c.model.rope_scaling == "llama3" && !(c.model.rope_high_freq_factor > c.model.rope_low_freq_factor))
    fail(
        "model.rope_high_freq_factor ({}) must be larger than model.rope_low_freq_factor ({}): they bound the band "
        "that llama3 scaling blends",
        c.model.rope_high_freq_factor, c.model.rope_low_freq_factor);
}

// Asynchronous DiLoCo runs replicas of the whole model that never meet in a collective: what needs one is refused.
void validate_async(const RunConfig& c) {
  const std::string why =
      "dist.algorithm = async_diloco: replicas of the whole model (or islands of them) post their updates alone";
  if (c.parallel.pipeline_stages > 1 || !c.dipaco.modules.empty() || c.local.chunks > 0)
    fail(
        "{}; pipeline stages, local parallelism and DiPaCo are not asynchronous yet: use dist.algorithm = diloco with "
        "them",
        why);
  if (!c.parallel.island_steps.empty())
    fail(
        "dist.algorithm = async_diloco with parallel.island_steps = '{}': asynchronous islands need no pace (a faster "
        "island posts more rounds); drop parallel.island_steps",
        c.parallel.island_steps);
  if (c.dist.fault_tolerant)
    fail(
        "{}, so a death needs no agreement: drop dist.fault_tolerant (launch --max-restarts still restarts a dead "
        "replica, which then starts from the newest version)",
        why);
  if (c.dist.warmup_ddp_steps > 0 || c.dist.overlap_steps > 0 || c.dist.fragments > 1 || c.dist.ramp_steps > 0 ||
      c.dist.qsr_alpha > 0)
    fail(
        "{}: dist.warmup_ddp_steps, overlap_steps, fragments, ramp_steps and qsr_alpha are synchronous DiLoCo's; "
        "leave them at 0 (fragments 1)",
        why);
  if (!travels_alone(c.dist.compression))
    fail("{}: dist.compression = '{}' needs every replica in one collective; use {}", why, c.dist.compression,
         travels_alone_list());
}

void validate_dist(const RunConfig& c) {
  if (c.dist.round_seconds < 0 && c.dist.round_seconds != -1)
    fail(
        "dist.round_seconds = {}: give a round's seconds, 0 (rounds of dist.inner_steps steps) or -1 (the length "
        "measured at start-up)",
        c.dist.round_seconds);
  if (c.dist.round_seconds != 0 && !c.dist.async_diloco())
    fail(
        "dist.round_seconds = {} paces asynchronous rounds by time; with dist.algorithm = '{}' every replica's round "
        "is dist.inner_steps steps: set dist.algorithm = async_diloco, or drop dist.round_seconds",
        c.dist.round_seconds, c.dist.algorithm);
  // -1 is "from the run"; any other negative value is a mistake, not a request for auto.
  for (const auto& [key, v] : {std::pair<const char*, double>{"dist.outer_lr", c.dist.outer_lr},
                               {"dist.outer_momentum", c.dist.outer_momentum}})
    if (v < 0 && v != -1) fail("{} = {}: give a value >= 0, or -1 to choose it from the run", key, v);
  if (c.dist.collective_timeout_s < c.dist.store_timeout_s)
    fail(
        "dist.collective_timeout_s ({}) must be at least dist.store_timeout_s ({}): each layer of timeouts waits "
        "longer than the one below it",
        c.dist.collective_timeout_s, c.dist.store_timeout_s);
  if (c.dist.overlap_steps >= c.dist.inner_steps && c.dist.diloco())
    fail(
        "dist.overlap_steps ({}) must be smaller than dist.inner_steps ({}): a fragment's update has to land before "
        "its next exchange",
        c.dist.overlap_steps, c.dist.inner_steps);
  if (c.dist.fragments > c.dist.inner_steps)
    fail("dist.fragments ({}) cannot exceed dist.inner_steps ({}): fragments are staggered within one period",
         c.dist.fragments, c.dist.inner_steps);
  if (c.dist.fault_tolerant) {
    if (c.dist.overlap_steps > 0 && c.dist.overlap_steps >= c.dist.inner_steps / c.dist.fragments)
      fail(
          "dist.fault_tolerant = true needs dist.overlap_steps ({}) < dist.inner_steps / dist.fragments ({}): a "
          "fault-tolerant round may change the members, so one must land before the next starts",
          c.dist.overlap_steps, c.dist.inner_steps / c.dist.fragments);
    if (!c.dipaco.modules.empty())
      fail(
          "dist.fault_tolerant = true covers replicas of the whole model (DiLoCo, data parallel) and pipelines; "
          "DiPaCo has its own (dipaco.on_failure)");
    if (c.parallel.pipeline_stages > 1 && c.parallel.islands.empty())
      fail(
          "dist.fault_tolerant = true with parallel.pipeline_stages = {}: a pipeline is the fault domain (a stage "
          "lost takes its pipeline out, which starts again as a whole and rejoins), so each machine runs one whole "
          "pipeline: set parallel.islands = 'machines', launch --nproc {} per machine with --restart-island "
          "--max-restarts N, and dist.algorithm = diloco",
          c.parallel.pipeline_stages, c.parallel.pipeline_stages);
    if (c.dist.heartbeat_timeout_s >= c.dist.collective_timeout_s)
      fail(
          "dist.heartbeat_timeout_s ({}) must be shorter than dist.collective_timeout_s ({}): a dead worker is found "
          "by its silence before a collective gives up on it",
          c.dist.heartbeat_timeout_s, c.dist.collective_timeout_s);
  }
  if (c.dist.async_diloco()) validate_async(c);
  parse_slow_workers(c.dist.slow_workers);  // an Error naming the key and the bad entry
  if (c.dist.reject_norm_factor > 0 && c.dist.reject_norm_factor < 1)
    fail("dist.reject_norm_factor = {} would reject the median update itself: use 0 (off) or a factor >= 1 (e.g. 10)",
         c.dist.reject_norm_factor);
  if (c.data.shards == "domains" && c.dist.fault_tolerant)
    fail(
        "data.shards = 'domains' with dist.fault_tolerant = true: a re-formed run would deal the domains out anew; "
        "use data.shards = 'windows' with fault tolerance");
  if (c.dist.score == "loss") {
    if ((!c.dist.diloco() && !c.dist.async_diloco()) || !c.dist.judges_updates())
      fail(
          "dist.score = 'loss' judges DiLoCo's updates in a robust exchange or merge: set dist.algorithm = 'diloco' "
          "or 'async_diloco' and "
          "dist.aggregate (trimmed_mean, median, centered_clip) or dist.reject_norm_factor (it is '{}', '{}', {})",
          c.dist.algorithm, c.dist.aggregate, c.dist.reject_norm_factor);
    // Islands and pipelines exchange the whole model only through their leads, which fault tolerance makes them do
    // (asynchronous islands post it whole).
    if (c.dist.fragments != 1 || c.dist.overlap_steps != 0 ||
        ((c.parallel.pipeline_stages != 1 || !c.parallel.islands.empty()) && !c.dist.fault_tolerant &&
         !c.dist.async_diloco()))
      fail(
          "dist.score = 'loss' probes the whole model's update while training waits for the round: it needs "
          "dist.fragments = 1, dist.overlap_steps = 0, and one pipeline stage and no islands unless "
          "dist.fault_tolerant = true, whose island and pipeline leads exchange the whole model (they are {}, {}, {}, "
          "'{}', {})",
          c.dist.fragments, c.dist.overlap_steps, c.parallel.pipeline_stages, c.parallel.islands,
          c.dist.fault_tolerant);
  }
  if (c.dist.evict_after > 0 && !c.dist.judges_updates())
    fail(
        "dist.evict_after = {} scores each update as received, which the mean on the ring never sees: set "
        "dist.aggregate (trimmed_mean, median, centered_clip) or dist.reject_norm_factor",
        c.dist.evict_after);
  if (c.dist.judges_updates() && keeps_error_feedback(c.dist.compression))
    fail(
        "dist.aggregate = '{}' with dist.reject_norm_factor = {} judges every replica's update whole, which "
        "dist.compression = '{}' never sends (it keeps error feedback or factors on each worker); use a stateless "
        "codec (fp32, fp16, bf16, int8, fp4, terngrad), or dist.aggregate = 'mean' and reject_norm_factor = 0",
        c.dist.aggregate, c.dist.reject_norm_factor, c.dist.compression);
  if (c.dist.fault_tolerant && keeps_error_feedback(c.dist.compression))
    fail(
        "dist.compression = '{}' keeps error feedback on each worker, which a discarded and redone round would "
        "count twice; with dist.fault_tolerant = true use a stateless codec (fp32, fp16, bf16, int8, fp4, terngrad)",
        c.dist.compression);
  if (c.dist.sparse_topk > c.dist.sparse_chunk)
    fail("dist.sparse_topk = {} is more than dist.sparse_chunk = {}: a chunk cannot keep more values than it has",
         c.dist.sparse_topk, c.dist.sparse_chunk);
}

void validate_train(const RunConfig& c) {
  // Token counts are 64-bit integers: a run counts at most 2^62 tokens whatever its workers (up to 2^16 of them).
  if (double(c.train.steps) * double(c.train.batch_size) * double(c.train.grad_accum) * double(c.model.context) >
      0x1p46)
    fail(
        "train.steps x train.batch_size x train.grad_accum x model.context = {:.3g} tokens per worker, more than a "
        "run can count (2^46); lower train.grad_accum or train.batch_size",
        double(c.train.steps) * double(c.train.batch_size) * double(c.train.grad_accum) * double(c.model.context));
  if (c.optim.warmup_steps > c.train.steps)
    fail(
        "optim.warmup_steps ({}) is longer than train.steps ({}): shorten the warm-up with the run, e.g. --set "
        "optim.warmup_steps={} (a tenth of the steps)",
        c.optim.warmup_steps, c.train.steps, std::max<int64_t>(c.train.steps / 10, 0));
  if (c.train.precision == "bf16" && (c.parallel.pipeline_stages > 1 || c.local.chunks > 0))
    fail(
        "train.precision = bf16 runs the whole model's step (one process, replicas, islands, DiPaCo's paths); "
        "pipeline stages and local parallelism train in fp32: set train.precision = fp32");
  if (c.train.cuda_graph) {
    if (c.train.device.rfind("cuda", 0) != 0)
      fail("train.cuda_graph = true needs a GPU (train.device = cuda), not '{}': CUDA graphs are CUDA's",
           c.train.device);
    if (c.parallel.pipeline_stages > 1 || c.local.chunks > 0 || !c.parallel.islands.empty() ||
        !c.dipaco.modules.empty() || c.dist.algorithm == "ddp")
      fail(
          "train.cuda_graph = true replays the whole model's step with no exchange inside it: one process or DiLoCo "
          "replicas; pipeline stages, local parallelism, islands, DiPaCo and dist.algorithm = ddp exchange inside "
          "the step: set train.cuda_graph = false");
  }
}

void validate_pipelines(const RunConfig& c) {
  if (c.parallel.pipeline_stages > 1) {
    if (c.parallel.pipeline_stages > c.model.num_layers)
      fail("parallel.pipeline_stages ({}) exceeds model.num_layers ({}): every stage owns at least one block",
           c.parallel.pipeline_stages, c.model.num_layers);
    if (c.train.batch_size % c.parallel.micro_batches != 0)
      fail("parallel.micro_batches ({}) must divide train.batch_size ({})", c.parallel.micro_batches,
           c.train.batch_size);
    if (c.train.grad_accum != 1)
      fail("train.grad_accum = {} with parallel.pipeline_stages > 1: use parallel.micro_batches instead",
           c.train.grad_accum);
    if (!c.dipaco.modules.empty()) fail("DiPaCo with parallel.pipeline_stages > 1 is not supported yet");
    if (!c.dist.diloco() && c.dist.compression != "fp32")
      fail(
          "parallel.pipeline_stages > 1 with dist.algorithm = ddp averages fp32 gradients (dist.compression = '{}' "
          "applies to DiLoCo's pseudo-gradients): leave it at fp32, or set dist.algorithm = diloco",
          c.dist.compression);
  }
}

}  // namespace

RunConfig RunConfig::load(const std::string& file, const std::vector<std::string>& overrides) {
  RunConfig config;
  if (!file.empty()) config.schema().merge_toml_file(file);
  for (const auto& o : overrides) config.schema().apply_override(o);
  take_placement_islands(config.parallel);
  config.validate();
  config.dist.auto_note = resolve_outer_auto(config.dist, config.train.steps,
                                             !config.parallel.islands.empty() || config.dist.async_diloco());
  return config;
}

RunConfig RunConfig::from_toml(const std::string& text, const std::string& origin) {
  RunConfig config;
  config.schema().merge_toml(text, origin);
  try {
    config.validate();
  } catch (const Error& e) {  // a configuration a run left behind (a checkpoint's, the store's): say whose
    fail("{}: {}", origin, e.what());
  }
  config.dist.auto_note = resolve_outer_auto(config.dist, config.train.steps,
                                             !config.parallel.islands.empty() || config.dist.async_diloco());
  return config;
}

void RunConfig::validate() const {
  validate_model(*this);
  validate_dist(*this);
  validate_dipaco(*this);
  validate_local(*this);
  validate_train(*this);
  validate_pipelines(*this);
}

void RunConfig::check_resumable_from(RunConfig saved, const std::string& what, const std::string& saved_file) const {
  if (saved.model.vocab_size == 0) saved.model.vocab_size = model.vocab_size;
  const auto diffs = config_differences(saved.schema().flatten(), schema().flatten(), resumable_keys());
  if (!diffs.empty())
    fail(
        "cannot resume from '{}': the configuration differs in {} (saved vs now). Resume with its config ({}), or "
        "start a new run with another train.run_dir",
        what, fmt::join(diffs, ", "), saved_file);
}

const std::vector<std::string>& RunConfig::resumable_keys() {
  static const std::vector<std::string> keys = {"train.log_every", "train.eval_every", "train.eval_batches",
                                                "train.checkpoint_every", "train.keep_checkpoints", "train.run_dir",
                                                "train.device", "data.dir", "dist.compute_nice", "dist.slow_workers",
                                                // the state is saved whole (islands hold identical replicas, ZeRO-1
                                                // shards are gathered): any island shape resumes
                                                "parallel.islands", "parallel.shard_optimizer"};
  return keys;
}

}  // namespace tributary
