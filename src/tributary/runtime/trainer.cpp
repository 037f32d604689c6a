#include "tributary/runtime/trainer.h"

#include <sys/resource.h>

#include <chrono>

#include "tributary/core/clock.h"
#include "tributary/core/error.h"
#include "tributary/core/log.h"
#include "tributary/data/dataset.h"
#include "tributary/data/loader.h"
#include "tributary/model/aux_head.h"
#include "tributary/model/eval.h"
#include "tributary/model/transformer.h"
#include "tributary/optim/adamw.h"
#include "tributary/optim/schedule.h"
#include "tributary/runtime/flops.h"
#include "tributary/runtime/inference.h"
#include "tributary/runtime/pipelines.h"
#include "tributary/runtime/replica_checkpoint.h"
#include "tributary/runtime/replicas.h"
#include "tributary/runtime/run_report.h"
#include "tributary/runtime/run_state.h"
#include "tributary/runtime/step_factory.h"
#include "tributary/runtime/stop.h"

namespace tributary {
namespace {

// One training run of one process: built in order (the seed fixes the initialisation, so nothing may draw random
// numbers before the model), then the loop.
class TrainingRun {
 public:
  TrainingRun(const RunConfig& config, const TrainOptions& options);
  TrainSummary run();

 private:
  void build_model_and_data();
  void start_replicas();
  void describe(int64_t threads) const;
  bool sync(int64_t step, double lr);  // the replicas' outer loop after a step; true if an outer step landed
  void report_exchange(int64_t step, bool synced, double elapsed);
  void follow_membership(int64_t step);
  void add_stage_stats(const pipeline::PipelineStats& s);
  void summarise_stages(double train_seconds);
  void record(const StepResult& result, int64_t step, double lr, double now);
  void save(int64_t step, double elapsed);
  void finish(int64_t step, double train_seconds);
  double elapsed() const { return progress_.elapsed_before + seconds_since(run_start_); }

  RunConfig config_;
  const TrainConfig& tc_ = config_.train;
  TrainOptions options_;
  torch::Device device_;
  bool lead_;
  std::unique_ptr<Replicas> replicas_;
  std::unique_ptr<Pipelines> pipelines_;  // parallel.pipeline_stages > 1 (then no replicas_)
  // The replicas whose outer loop runs after each step: the whole model's (replicas_), or this pipeline stage's
  // across the pipelines (DiLoCo per stage); null for one process, one pipeline or data-parallel stages.
  Replicas* synced_ = nullptr;
  NamedTensors trained_;                  // what this rank's optimizer updates: every parameter, or its stage's
  std::function<pipeline::PipelineStats()> take_stage_stats_;  // the step's, when it is a pipeline stage's
  pipeline::PipelineStats stage_stats_;              // summed over the run
  double sync_bytes_ = 0;  // sent to keep this stage's replicas together: gradient all-reduce or DiLoCo exchanges
  double peak_rss_mb_ = 0;  // a stage's process after its last step
  std::optional<Dataset> dataset_;
  std::optional<LoadedCheckpoint> ckpt_;
  std::shared_ptr<Transformer> model_;
  NamedTensors params_;
  std::shared_ptr<AuxHeads> aux_heads_;  // local parallelism: the chunks' auxiliary heads (kept out of model_)
  NamedTensors aux_params_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<BatchLoader> loader_;
  std::shared_ptr<const std::vector<uint32_t>> val_tokens_;
  RunProgress progress_;
  std::unique_ptr<RunReport> report_;
  TrainSummary summary_;
  int64_t tokens_per_step_ = 0;  // all replicas together
  size_t num_train_tokens_ = 0;
  double flops_per_token_ = 0;
  double eval_seconds_ = 0;  // in evaluations so far, this invocation (inside elapsed())
  Clock::time_point run_start_;
};

TrainingRun::TrainingRun(const RunConfig& config, const TrainOptions& options)
    : config_(config), options_(options), device_(parse_device(config.train.device)), lead_(options.dist.lead()) {
  const DistEnv& env = options_.dist;
  if (env.distributed()) log::set_prefix(getenv("TRIBUTARY_LAUNCHED") ? "" : fmt::format("[rank {}] ", env.rank));
  const int64_t threads = configure_threads(tc_.threads, env.local_world_size);
  if (lead_) check_blas();
  if (config_.parallel.pipeline_stages > 1) {
    if (!env.distributed())
      fail("parallel.pipeline_stages = {0} needs at least {0} worker processes: tributary launch --nproc {0} -- train ...",
           config_.parallel.pipeline_stages);
    pipelines_ = std::make_unique<Pipelines>(config_, env);
    synced_ = pipelines_->stage_replicas();
  } else if (env.distributed()) {
    if (config_.local.chunks > 0)
      fail("local.chunks = {} with {} processes: local parallelism runs in one process, or one chunk per pipeline "
           "stage (parallel.pipeline_stages = local.chunks)",
           config_.local.chunks, env.world_size);
    replicas_ = std::make_unique<Replicas>(config_, env);
    synced_ = replicas_.get();
  }
  dataset_.emplace(Dataset::open(config_.data.dir));
  ckpt_ = prepare_run(config_, options_, *dataset_);
  build_model_and_data();
  if (progress_.step >= tc_.steps)
    fail("the checkpoint is at step {} but train.steps = {}: nothing to do", progress_.step, tc_.steps);
  // Per-replica peak: rank 0 measures the machine alone, the local replicas share it (a joiner: in a group of one).
  summary_.peak_flops = replicas_ ? replicas_->shared_matmul_peak(device_, env.local_world_size)
                                  : measure_matmul_peak(device_);
  start_replicas();  // a joining worker may find the run over: then it trains nothing
  flops_per_token_ = training_flops_per_token(config_.model, model_->num_matmul_parameters());
  if (aux_heads_)  // the auxiliary heads are computed and trained too
    flops_per_token_ += 6.0 * double(aux_heads_->num_matmul_parameters()) +
                        6.0 * double(aux_heads_->num_blocks() * config_.model.width * config_.model.context);
  tokens_per_step_ = tc_.batch_size * tc_.grad_accum * config_.model.context *
                     (pipelines_ ? pipelines_->num_pipelines() : replicas_ ? replicas_->size() : env.world_size);
  summary_.run_dir = tc_.run_dir;
  summary_.num_parameters = model_->num_parameters();
  const double bytes_per_token = dataset_->bytes_per_token("val");
  summary_.unigram_bpb = dataset_->unigram_val_bits_per_token() / bytes_per_token;
  describe(threads);
  report_ = std::make_unique<RunReport>(ReportSetup{.run_dir = tc_.run_dir, .lead = lead_,
                                                    .resume_step = ckpt_ ? progress_.step : -1,
                                                    .total_steps = tc_.steps, .log_every = tc_.log_every,
                                                    .world_size = env.world_size, .distributed = synced_ != nullptr,
                                                    .flops_per_token = flops_per_token_,
                                                    .peak_flops = summary_.peak_flops,
                                                    .bytes_per_token = bytes_per_token});
}

void TrainingRun::build_model_and_data() {
  torch::manual_seed(static_cast<uint64_t>(tc_.seed));
  model_ = std::make_shared<Transformer>(config_.model);
  model_->to(device_);
  params_ = named_parameters_of(*model_);
  trained_ = pipelines_ ? pipeline::stage_params(params_, pipelines_->layout(), pipelines_->stage(),
                                                 config_.model.blocks_per_level(), config_.model.tie_embeddings)
                        : params_;
  const LocalConfig& local = config_.local;
  if (local.chunks > 0) {  // drawn after the model: its initialisation is the plain trainer's
    aux_heads_ = std::make_shared<AuxHeads>(config_.model, local.chunks,
                                            local.aux_head == "blocks" ? local.aux_head_blocks : 0);
    aux_heads_->to(device_);
    aux_params_ = named_parameters_of(*aux_heads_);
    const std::string mine = pipelines_ ? fmt::format("aux.{}.", pipelines_->stage()) : "aux.";  // a stage: its head
    for (const auto& [name, t] : aux_params_)
      if (name.rfind(mine, 0) == 0) trained_.emplace_back(name, t);
  }
  const auto& o = config_.optim;
  optimizer_ = std::make_unique<AdamW>(
      trained_, AdamWOptions{.beta1 = o.beta1, .beta2 = o.beta2, .eps = o.eps, .weight_decay = o.weight_decay});
  auto train_tokens = std::make_shared<const std::vector<uint32_t>>(dataset_->load_tokens("train"));
  num_train_tokens_ = train_tokens->size();
  val_tokens_ = std::make_shared<const std::vector<uint32_t>>(dataset_->load_tokens("val"));
  // Each replica reads its own share of the windows (rank-strided), so N replicas x batch b see the windows one
  // process with batch N*b would.
  loader_ = std::make_unique<BatchLoader>(
      train_tokens,
      LoaderOptions{.batch_size = tc_.batch_size, .context = config_.model.context,
                    .seed = static_cast<uint64_t>(tc_.seed),
                    .rank = pipelines_ ? pipelines_->pipeline() : options_.dist.rank,  // a pipeline's stages read alike
                    .world_size = pipelines_ ? pipelines_->num_pipelines() : options_.dist.world_size},
      fmt::format("'{}' train", config_.data.dir));
  // fail now, not at the first evaluation, if val is too small
  BatchLoader(val_tokens_, {.batch_size = tc_.batch_size, .context = config_.model.context, .shuffle = false},
              fmt::format("'{}' val", config_.data.dir));
  if (!ckpt_ && !tc_.init_from.empty()) init_from(*model_, tc_.init_from);
  if (ckpt_) progress_ = restore(*ckpt_, *model_, *optimizer_, *loader_, options_.dist.rank);
  if (ckpt_ && aux_heads_)  // a pipeline rank's own copy (DiLoCo replicas differ between outer steps)
    load_parameters(*aux_heads_, ckpt_->tensors(pipelines_ && options_.dist.rank != 0
                                                    ? replica_aux_file(options_.dist.rank)
                                                    : kAuxHeadsFile));
}

void TrainingRun::start_replicas() {
  if (!synced_) return;
  if (options_.dist.joining) return join_run(*replicas_, trained_, *optimizer_, *loader_, progress_, tc_.steps);
  if (!ckpt_) return synced_->start(trained_);
  std::optional<safetensors::File> outer;  // a pipeline stage's is its rank's; the whole model's is shared
  const std::string outer_file = pipelines_ ? replica_outer_file(options_.dist.rank) : "outer.safetensors";
  if (ckpt_->has(outer_file)) outer = ckpt_->tensors(outer_file);
  synced_->start(trained_, progress_.step, outer ? &*outer : nullptr, ckpt_->state.at("replicas"));
}

void TrainingRun::describe(int64_t threads) const {
  if (!lead_) return;
  const auto& m = config_.model;
  log::info("model: {} parameters ({} in matmuls), {} levels x {} blocks, width {}, context {}, vocab {}",
            thousands(double(summary_.num_parameters)), thousands(double(model_->num_matmul_parameters())),
            m.num_levels, m.blocks_per_level(), m.width, m.context, m.vocab_size);
  const int64_t replicas = pipelines_ ? pipelines_->num_pipelines() : options_.dist.world_size;  // of the model
  log::info("data: '{}' ({} train tokens, {} val tokens, tokenizer {}); {} tokens per step; {} threads; matmul peak "
            "{:.1f} GFLOP/s",
            config_.data.dir, thousands(double(num_train_tokens_)), thousands(double(val_tokens_->size())),
            dataset_->tokenizer_kind(), thousands(double(tokens_per_step_ / replicas)), threads,
            summary_.peak_flops / 1e9);
  if (pipelines_) {
    const auto& par = config_.parallel;
    log::info("{} pipeline(s) of {} stages (blocks per stage from {}), schedule {}{}, {} micro-batches of {}, "
              "activations on the wire as {}",
              pipelines_->num_pipelines(), pipelines_->stages(),
              par.stage_layers.empty() ? std::string("a balanced split") : par.stage_layers, par.schedule,
              par.schedule == "1f1b" ? fmt::format(" (warm-up margin {})", par.warmup_margin) : "", par.micro_batches,
              tc_.batch_size / par.micro_batches, par.activation_compression);
  }
  const auto& l = config_.local;
  if (aux_heads_)
    log::info("local parallelism: {} chunks of {} blocks ({}, overlap {}), auxiliary heads {} ({} private blocks), "
              "weight {}, {}", l.chunks, config_.model.num_layers / l.chunks, l.mode,
              l.mode == "overlapping" ? l.overlap_blocks : 0, l.aux_head, l.aux_head == "blocks" ? l.aux_head_blocks : 0,
              l.aux_weight, pipelines_ ? "one chunk per pipeline stage" : "in one process");
  if (!synced_) return;
  const auto& d = config_.dist;
  log::info("{} replicas{}, {}{}, compression {}", synced_->size(), pipelines_ ? " of each stage" : "",
            synced_->ddp() ? "data parallel (gradients averaged every step)" : "DiLoCo",
            synced_->ddp() ? "" : fmt::format(" (H = {}, outer lr {}, momentum {})", d.inner_steps, d.outer_lr,
                                                 d.outer_momentum),
            d.compression);
}

bool TrainingRun::sync(int64_t step, double lr) {
  if (!synced_) return false;
  bool synced = synced_->after_step(step, lr, trained_);            // DiLoCo: outer step every H inner steps
  if (step == tc_.steps) synced |= synced_->finish(step, trained_);  // pending inner steps at the end
  return synced;
}

void TrainingRun::report_exchange(int64_t step, bool synced, double elapsed) {
  if (!synced_ || !(synced || (synced_->averaging_gradients() && report_->log_due(step)))) return;
  auto c = synced_->take_stats();
  sync_bytes_ += c.bytes_sent;
  summary_.bytes_sent += c.bytes_sent;
  summary_.bytes_recv += c.bytes_recv;
  summary_.comm_s += c.comm_s;
  const int64_t rejected = replicas_ ? replicas_->take_rejected() : -1;  // -1: not guarded
  summary_.rejected += std::max<int64_t>(0, rejected);
  report_->exchange_done(step, synced_->ddp() ? step : synced_->outer_steps(),
                         synced_->ddp() ? 1 : synced_->inner_steps_now(), c, elapsed,
                         rejected >= 0 ? synced_->size() : 0, rejected);
}

// Fault tolerance: after an outer step the members may have changed (a worker died). The lowest surviving worker
// leads (metrics, evaluation, summary; checkpoints follow the group's rank 0 by themselves), and a step's tokens
// are the survivors'.
void TrainingRun::follow_membership(int64_t step) {
  if (!replicas_ || !replicas_->fault_tolerant()) return;
  tokens_per_step_ = tc_.batch_size * tc_.grad_accum * config_.model.context * replicas_->size();
  summary_.reformations = replicas_->reformations();  // an admission counts at the next outer step
  if (replicas_->rank() != 0 || lead_) return;
  lead_ = true;
  report_->take_lead(step);
  log::warn("worker {} leads the run from step {} on (metrics, evaluation, summary)", options_.dist.rank, step);
}

void TrainingRun::add_stage_stats(const pipeline::PipelineStats& s) {
  stage_stats_.activation_bytes += s.activation_bytes;
  stage_stats_.gradient_bytes += s.gradient_bytes;
  stage_stats_.compute_s += s.compute_s;
  stage_stats_.blocked_s += s.blocked_s;
  sync_bytes_ += double(s.data_parallel_bytes);
  summary_.bytes_sent += double(s.activation_bytes + s.gradient_bytes + s.data_parallel_bytes);
  summary_.comm_s += s.blocked_s;
}

// Every rank of the pipeline takes part; rank 0 writes what pipeline 0's stages measured.
void TrainingRun::summarise_stages(double train_seconds) {
  const auto& s = stage_stats_;
  const auto all = pipelines_->gather_stages({s.compute_s, s.blocked_s, double(s.activation_bytes),
                                              double(s.gradient_bytes), train_seconds, sync_bytes_,
                                              peak_rss_mb_});
  summary_.stages = nlohmann::json::array();
  for (const auto& v : all)
    summary_.stages.push_back({{"compute_s", v[0]}, {"blocked_s", v[1]}, {"bubble", v[4] > 0 ? 1.0 - v[0] / v[4] : 0.0},
                               {"activation_bytes", v[2]}, {"gradient_bytes", v[3]}, {"sync_bytes", v[5]},
                               {"peak_rss_mb", v[6]}});
}

void TrainingRun::save(int64_t step, double elapsed) {
  auto path = save_run({config_, *dataset_, params_, *optimizer_, *loader_, replicas_.get(), pipelines_.get(),
                        &aux_params_},
                       step, progress_.tokens, elapsed);
  if (!path.empty()) summary_.checkpoint = path;
}

// The loop: next batch -> step -> sync -> report / evaluate / checkpoint / stop when due.
TrainSummary TrainingRun::run() {
  auto built = make_train_step({config_, *model_, params_, trained_, aux_heads_.get(), *optimizer_, *loader_,
                                 replicas_.get(), pipelines_.get(), device_});
  take_stage_stats_ = std::move(built.take_stage_stats);
  TrainStep& train_step = *built.step;
  StopAgreement::Vote vote;
  if (replicas_) vote = [this](bool local) { return replicas_->stop_agreed(local); };
  if (pipelines_) vote = [this](bool local) { return pipelines_->stop_agreed(local); };
  StopAgreement stop(vote, options_.stop_after_step, lead_);
  const CosineSchedule schedule{config_.optim.lr, config_.optim.warmup_steps, tc_.steps, config_.optim.min_lr_ratio};
  model_->train();
  run_start_ = Clock::now();
  double train_seconds = 0;
  int64_t step = progress_.step;
  while (step < tc_.steps) {
    const auto step_start = Clock::now();
    const double lr = schedule.lr(step);
    const StepResult result = train_step.run(step, lr);
    step += 1;
    maybe_inject_failure(options_.dist.rank, step);  // tests: TRIBUTARY_FAIL_RANK/STEP
    progress_.tokens += tokens_per_step_;
    const bool synced = sync(step, lr);
    if (synced) follow_membership(step);
    if (take_stage_stats_) {
      add_stage_stats(take_stage_stats_());
      rusage usage{};  // the peak resident memory of training (model, optimizer, stashed activations), read before
      getrusage(RUSAGE_SELF, &usage);  // the last step's consolidation and checkpoint add theirs
      peak_rss_mb_ = double(usage.ru_maxrss) / 1024.0;
    }
    const double dt = seconds_since(step_start);
    train_seconds += dt;
    report_->step_done(dt, tokens_per_step_, result.reported ? std::optional(result.loss) : std::nullopt);
    const double now = elapsed();
    report_exchange(step, synced, now);
    if (result.reported) record(result, step, schedule.lr(step - 1 - result.lag), now);
    const bool last = step == tc_.steps;
    const bool quiescent = !synced_ || synced_->quiescent();
    const bool stop_now = stop.after_step(step, quiescent);
    // DiLoCo replicas hold the global model only right after an outer step: periodic checkpoints then (their
    // model.safetensors is the global model), or at the end. Every rank takes part in a multi-process checkpoint.
    const bool at_global = !synced_ || synced_->averaging_gradients() || synced;
    const bool eval_due = (tc_.eval_every > 0 && step % tc_.eval_every == 0) || last;
    const bool periodic = tc_.checkpoint_every > 0 && step % tc_.checkpoint_every == 0 && at_global && quiescent;
    // Pipeline stages hold only their own parameters current: bring the whole model to every rank first.
    if (pipelines_ && (eval_due || periodic || last || stop_now)) {
      pipelines_->consolidate(params_, config_.model.blocks_per_level());
      if (aux_heads_) pipelines_->consolidate_aux_heads(aux_params_);
    }
    if (lead_ && eval_due) {
      BatchLoader val(val_tokens_, {.batch_size = tc_.batch_size, .context = config_.model.context, .shuffle = false},
                      fmt::format("'{}' val", config_.data.dir));
      const auto eval_start = Clock::now();
      const EvalResult result = evaluate(*model_, val, tc_.eval_batches, device_);
      report_->evaluated(step, progress_.tokens, result, now, eval_seconds_, summary_);
      eval_seconds_ += seconds_since(eval_start);
    }
    if ((lead_ || replicas_ || pipelines_) && (periodic || last || stop_now)) save(step, now);
    if (last || stop_now)  // the numbers of the last steps, when they come late
      for (const StepResult& owed : train_step.drain())
        record(owed, step, schedule.lr(step - 1 - owed.lag), now);
    if (synced && !last && !stop_now && replicas_ && replicas_->joiners_waiting())  // after this step's checkpoint
      replicas_->admit(heal_state(trained_, *optimizer_, *loader_, {step, progress_.tokens, now}));
    if (stop_now && !last) {
      if (lead_) log::info("stopped after step {} (checkpoint '{}'); continue with --resume", step,
                           summary_.checkpoint.string());
      summary_.stopped_early = true;
      break;
    }
  }
  finish(step, train_seconds);
  return summary_;
}

// A step's numbers into the summary and the log. A step that reports late (local stages) gives the numbers of the
// step `result.lag` steps before `step`, the one just run; `lr` is that earlier step's.
void TrainingRun::record(const StepResult& result, int64_t step, double lr, double now) {
  summary_.losses.push_back(result.loss);
  const int64_t of = step - result.lag;
  if (report_->log_due(of))
    report_->log_step(of, progress_.tokens - result.lag * tokens_per_step_, result, lr, now);
}

void TrainingRun::finish(int64_t step, double train_seconds) {
  summary_.steps = step;
  summary_.lead = lead_;
  if (replicas_) summary_.world_size = replicas_->size();
  if (synced_) summary_.outer_steps = synced_->outer_steps();
  if (pipelines_) {
    summary_.world_size = options_.dist.world_size;
    summarise_stages(train_seconds);
  }
  summary_.tokens = progress_.tokens;
  summary_.elapsed_s = elapsed();
  summary_.tokens_per_s = double((step - progress_.step) * tokens_per_step_) / train_seconds;
  summary_.mfu = summary_.tokens_per_s * flops_per_token_ / (summary_.peak_flops * options_.dist.world_size);
  report_->write_summary(summary_,
                         replicas_    ? config_.dist.algorithm
                         : pipelines_ ? (aux_heads_ ? "local-stages" : "pipeline") + std::string(synced_ ? "+diloco" : "")
                         : aux_heads_ ? std::string("local")
                                      : std::string("single"),
                         config_.dist.compression);
}

}  // namespace

TrainSummary train(const RunConfig& config, const TrainOptions& options) {
  TrainingRun run(config, options);
  return run.run();
}

}  // namespace tributary
