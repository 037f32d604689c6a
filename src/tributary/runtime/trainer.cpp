#include "tributary/runtime/trainer.h"

#include <csignal>
#include <thread>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>

#include "tributary/core/error.h"
#include "tributary/core/log.h"
#include "tributary/data/dataset.h"
#include "tributary/data/loader.h"
#include "tributary/model/transformer.h"
#include "tributary/optim/adamw.h"
#include "tributary/optim/schedule.h"
#include "tributary/runtime/checkpoint.h"
#include "tributary/runtime/replica_checkpoint.h"
#include "tributary/runtime/flops.h"
#include "tributary/runtime/inference.h"
#include "tributary/runtime/metrics.h"
#include "tributary/runtime/replicas.h"

namespace tributary {
namespace {

volatile std::sig_atomic_t g_stop_requested = 0;
void on_signal(int) { g_stop_requested = 1; }

std::string format_duration(double seconds) {
  int64_t s = static_cast<int64_t>(seconds);
  if (s >= 3600) return fmt::format("{}h{:02d}m", s / 3600, (s % 3600) / 60);
  return fmt::format("{}m{:02d}s", s / 60, s % 60);
}

std::string thousands(double value) {
  std::string digits = std::to_string(static_cast<int64_t>(std::llround(value)));
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

TrainSummary train(const RunConfig& config_in, const TrainOptions& options) {
  RunConfig config = config_in;
  const auto& tc = config.train;
  const torch::Device device = parse_device(tc.device);
  const DistEnv& env = options.dist;
  const bool lead = env.rank == 0;  // rank 0 writes metrics, evaluations and checkpoints
  if (env.distributed()) log::set_prefix(getenv("TRIBUTARY_LAUNCHED") ? "" : fmt::format("[rank {}] ", env.rank));
  const int64_t threads = configure_threads(tc.threads, env.local_world_size);
  if (lead) check_blas();
  std::unique_ptr<Replicas> replicas;
  if (env.distributed()) replicas = std::make_unique<Replicas>(config, env);

  Dataset dataset = Dataset::open(config.data.dir);
  if (config.model.vocab_size == 0) config.model.vocab_size = dataset.vocab_size();
  if (config.model.vocab_size < dataset.vocab_size())
    fail("model.vocab_size = {} is smaller than the tokenizer of '{}' ({} ids); set it to 0 to take the tokenizer's",
         config.model.vocab_size, config.data.dir, dataset.vocab_size());

  fs::path run_dir = tc.run_dir;
  std::optional<LoadedCheckpoint> ckpt;
  if (options.resume) {
    fs::path from = options.resume_from.empty() ? run_dir : fs::path(options.resume_from);
    ckpt = load_checkpoint(from);
    RunConfig saved = RunConfig::from_toml(ckpt->config_toml, (ckpt->dir / "config.toml").string());
    if (saved.model.vocab_size == 0) saved.model.vocab_size = config.model.vocab_size;
    auto diffs = config_differences(saved.schema().flatten(), config.schema().flatten(), RunConfig::resumable_keys());
    if (!diffs.empty())
      fail("cannot resume from '{}': the configuration differs in {} (checkpoint vs now). Resume with the "
           "checkpoint's config ({}), or start a new run with another train.run_dir",
           ckpt->dir.string(), fmt::join(diffs, ", "), (ckpt->dir / "config.toml").string());
    const int saved_world = ckpt->state.value("world_size", 1);
    if (saved_world != env.world_size)
      fail("cannot resume from '{}': it holds the state of {} worker(s) and this run has {}; resume with the same "
           "number of workers (launch --nproc {})",
           ckpt->dir.string(), saved_world, env.world_size, saved_world);
  } else if (latest_checkpoint(run_dir) && !options.overwrite) {
    fail("train.run_dir '{}' already holds checkpoints: pass --resume to continue that run, --overwrite to start over, "
         "or choose another directory with --set train.run_dir=...",
         run_dir.string());
  }
  // Starting over: the old run's checkpoints go, or a later --resume would continue from them.
  if (lead && options.overwrite && !options.resume) fs::remove_all(run_dir / "checkpoints");
  std::error_code ec;
  if (fs::exists(run_dir, ec) && !fs::is_directory(run_dir, ec))
    fail("train.run_dir = '{}' is a file; choose a directory with --set train.run_dir=...", run_dir.string());
  fs::create_directories(run_dir, ec);
  if (ec) fail("cannot create train.run_dir = '{}': {}; choose a writable directory", run_dir.string(), ec.message());
  if (lead) write_file_atomic(run_dir / "config.toml", config.to_toml());

  // Model and optimizer: the seed fixes the initialisation; a checkpoint then overwrites it.
  torch::manual_seed(static_cast<uint64_t>(tc.seed));
  auto model = std::make_shared<Transformer>(config.model);
  model->to(device);
  NamedTensors params = named_parameters_of(*model);
  AdamW optimizer(params, {.beta1 = config.optim.beta1, .beta2 = config.optim.beta2, .eps = config.optim.eps,
                           .weight_decay = config.optim.weight_decay});
  const CosineSchedule schedule{config.optim.lr, config.optim.warmup_steps, tc.steps, config.optim.min_lr_ratio};

  auto train_tokens = std::make_shared<const std::vector<uint32_t>>(dataset.load_tokens("train"));
  auto val_tokens = std::make_shared<const std::vector<uint32_t>>(dataset.load_tokens("val"));
  const std::string train_label = fmt::format("'{}' train", config.data.dir);
  const std::string val_label = fmt::format("'{}' val", config.data.dir);
  // Each replica reads its own share of the windows (rank-strided), so N replicas x batch b see the windows one
  // process with batch N*b would.
  BatchLoader loader(train_tokens,
                     {.batch_size = tc.batch_size, .context = config.model.context, .seed = static_cast<uint64_t>(tc.seed),
                      .rank = env.rank, .world_size = env.world_size},
                     train_label);
  const LoaderOptions val_options{.batch_size = tc.batch_size, .context = config.model.context, .shuffle = false};
  BatchLoader(val_tokens, val_options, val_label);  // fail now, not at the first evaluation, if val is too small

  if (!ckpt && !tc.init_from.empty()) {
    auto init = load_checkpoint(tc.init_from);
    try {
      load_parameters(*model, init.model);
    } catch (const Error& e) {
      fail("train.init_from = '{}' does not match this run's model: {}", tc.init_from, e.what());
    }
  }
  int64_t start_step = 0, tokens_seen = 0;
  double elapsed_before = 0;
  if (ckpt) {
    // Rank 0's replica is model/optim; the others' are rank-R.* (multi-process checkpoints, see checkpoint.h).
    if (!lead) {
      ckpt->model = ckpt->tensors(replica_model_file(env.rank));
      ckpt->optim = ckpt->tensors(replica_optim_file(env.rank));
    }
    load_parameters(*model, ckpt->model);
    for (const char* key : {"optimizer_steps", "tokens"})  // a model-only checkpoint (an exported path) has neither
      if (!ckpt->state.contains(key) || !ckpt->state[key].is_number_integer())
        fail("cannot resume from '{}': its state.json has no integer '{}' (a model-only checkpoint?); start a new run "
             "with --set train.init_from=... instead",
             ckpt->dir.string(), key);
    optimizer.load_state(ckpt->optim, ckpt->state.at("optimizer_steps").get<int64_t>());
    if (ckpt->optim.contains("rng.cpu")) {
      auto generator = at::detail::getDefaultCPUGenerator();  // a handle: setting its state sets the global one
      generator.set_state(to_torch(ckpt->optim.at("rng.cpu")));
    }
    start_step = ckpt->state.at("step").get<int64_t>();
    tokens_seen = ckpt->state.at("tokens").get<int64_t>();
    elapsed_before = ckpt->state.value("elapsed_s", 0.0);
    const auto& position = ckpt->state.contains("loaders") ? ckpt->state.at("loaders").at(env.rank) : ckpt->state.at("loader");
    loader.set_position({position.at("epoch").get<uint64_t>(), position.at("cursor").get<uint64_t>()});
    log::info("resumed from '{}' at step {}", ckpt->dir.string(), start_step);
  }
  if (start_step >= tc.steps) fail("the checkpoint is at step {} but train.steps = {}: nothing to do", start_step, tc.steps);

  if (replicas && ckpt) {
    std::optional<safetensors::File> outer;
    if (ckpt->has("outer.safetensors")) outer = ckpt->tensors("outer.safetensors");
    replicas->start(params, start_step, outer ? &*outer : nullptr, ckpt->state.at("replicas"));
  } else if (replicas) {
    replicas->start(params);
  }
  // Per-replica peak: in multi-process runs rank 0 measures the machine alone and the local replicas share it.
  const double peak = replicas ? replicas->shared_matmul_peak(device, env.local_world_size) : measure_matmul_peak(device);
  const double flops_per_token = training_flops_per_token(config.model, model->num_matmul_parameters());
  const int64_t tokens_per_step = tc.batch_size * tc.grad_accum * config.model.context;
  const double bytes_per_token = dataset.bytes_per_token("val");
  TrainSummary summary;
  summary.run_dir = run_dir;
  summary.peak_flops = peak;
  summary.num_parameters = model->num_parameters();
  summary.unigram_bpb = dataset.unigram_val_bits_per_token() / bytes_per_token;
  if (lead) log::info("model: {} parameters ({} in matmuls), {} levels x {} blocks, width {}, context {}, vocab {}",
            thousands(double(summary.num_parameters)), thousands(double(model->num_matmul_parameters())),
            config.model.num_levels, config.model.blocks_per_level(), config.model.width, config.model.context,
            config.model.vocab_size);
  if (lead) log::info("data: '{}' ({} train tokens, {} val tokens, tokenizer {}); {} tokens per step; {} threads; matmul peak "
            "{:.1f} GFLOP/s",
            config.data.dir, thousands(double(train_tokens->size())), thousands(double(val_tokens->size())),
            dataset.tokenizer_kind(), thousands(double(tokens_per_step)), threads, peak / 1e9);

  std::unique_ptr<MetricsWriter> metrics_writer;
  if (lead) metrics_writer = std::make_unique<MetricsWriter>(run_dir / "metrics.jsonl", ckpt ? start_step : -1);
  auto write_metrics = [&](const nlohmann::json& line) {
    if (metrics_writer) metrics_writer->write(line.dump());
  };
  if (replicas && lead)
    log::info("{} replicas, {}{}, compression {}", replicas->size(),
              replicas->ddp() ? "data parallel (gradients averaged every step)" : "DiLoCo",
              replicas->ddp() ? "" : fmt::format(" (H = {}, outer lr {}, momentum {})", config.dist.inner_steps,
                                                  config.dist.outer_lr, config.dist.outer_momentum),
              config.dist.compression);
  auto run_eval = [&](int64_t step, double elapsed) {
    BatchLoader val_loader(val_tokens, val_options, val_label);
    auto result = evaluate(*model, val_loader, tc.eval_batches, device);
    summary.val_loss = result.loss;
    summary.evaluated = true;
    summary.val_ppl = std::exp(result.loss);
    summary.val_bpb = result.loss / std::log(2.0) / bytes_per_token;
    write_metrics({{"step", step}, {"tokens", tokens_seen}, {"val_loss", result.loss}, {"val_ppl", summary.val_ppl},
                   {"val_bpb", summary.val_bpb}, {"elapsed_s", elapsed}});
    log::info("eval step {:>5} | val loss {:.4f} | ppl {:.2f} | {:.3f} bits/byte (unigram {:.3f})", step, result.loss,
              summary.val_ppl, summary.val_bpb, summary.unigram_bpb);
  };
  auto save = [&](int64_t step, double elapsed) {
    NamedTensors optim_state = optimizer.state();
    optim_state.emplace_back("rng.cpu", at::detail::getDefaultCPUGenerator().get_state());
    auto pos = loader.position();
    nlohmann::json state = {{"step", step},
                            {"tokens", tokens_seen},
                            {"elapsed_s", elapsed},
                            {"optimizer_steps", optimizer.num_steps()},
                            {"loader", {{"epoch", pos.epoch}, {"cursor", pos.cursor}}},
                            {"tokenizer", dataset.tokenizer_kind()},
                            {"torch_version", TORCH_VERSION}};
    fs::path tok_model = dataset.dir() / "tokenizer.model";
    CheckpointContents contents{params, optim_state, state, config.to_toml(),
                                fs::exists(tok_model) ? tok_model : fs::path(), {}, {}};
    if (replicas && !stage_replica_state(*replicas, run_dir, step, params, optim_state, pos, contents)) return;
    summary.checkpoint = save_checkpoint(run_dir, step, contents, tc.keep_checkpoints);
  };

  g_stop_requested = 0;
  auto old_int = std::signal(SIGINT, on_signal);
  auto old_term = std::signal(SIGTERM, on_signal);

  model->train();
  auto batch = torch::empty({tc.batch_size, config.model.context + 1}, torch::kInt64);  // (B, T+1) host buffer
  const int64_t T = config.model.context;
  const auto run_start = Clock::now();
  double train_seconds = 0, interval_seconds = 0, round_seconds = 0, round_comm_s = 0;
  int64_t interval_tokens = 0;
  double interval_loss = 0;
  int64_t interval_steps = 0;
  int64_t step = start_step;
  bool stop_pending = false;
  while (step < tc.steps) {
    const auto step_start = Clock::now();
    const double lr = schedule.lr(step);
    optimizer.zero_grad();
    double step_loss = 0;
    for (int64_t micro = 0; micro < tc.grad_accum; ++micro) {
      loader.next(batch.data_ptr<int64_t>());
      auto on_device = batch.to(device);
      auto loss = Transformer::loss(model->forward(on_device.narrow(1, 0, T)), on_device.narrow(1, 1, T));
      if (replicas) replicas->before_backward(micro + 1 == tc.grad_accum, tc.grad_accum == 1);
      (tc.grad_accum > 1 ? loss / double(tc.grad_accum) : loss).backward();
      step_loss += loss.item<double>() / double(tc.grad_accum);
    }
    maybe_inject_failure(env.rank, step + 1);
    if (replicas) replicas->after_backward(params);  // data parallel: average gradients
    if (!std::isfinite(step_loss))
      fail("loss became {} at step {}: lower optim.lr or raise optim.warmup_steps", step_loss, step + 1);
    const double grad_norm = clip_grad_norm(params, config.optim.grad_clip);
    optimizer.step(lr);
    step += 1;
    tokens_seen += tokens_per_step * env.world_size;
    bool synced = false;
    if (replicas) {
      synced = replicas->after_step(step, lr, params);             // DiLoCo: outer step every H inner steps
      if (step == tc.steps) synced |= replicas->finish(step, params);  // pending inner steps at the end
    }
    const double dt = seconds_since(step_start);
    round_seconds += dt;
    train_seconds += dt;
    interval_seconds += dt;
    interval_tokens += tokens_per_step * env.world_size;
    interval_loss += step_loss;
    interval_steps += 1;
    summary.losses.push_back(step_loss);
    const double elapsed = elapsed_before + seconds_since(run_start);

    if (replicas && (synced || (replicas->averaging_gradients() && (step % tc.log_every == 0 || step == tc.steps)))) {
      auto c = replicas->take_stats();
      round_comm_s += c.comm_s;
      summary.bytes_sent += c.bytes_sent;
      summary.bytes_recv += c.bytes_recv;
      summary.comm_s += c.comm_s;
      write_metrics({{"step", step},
                     {"outer_step", replicas->ddp() ? step : replicas->outer_steps()},
                     {"bytes_sent", c.bytes_sent},
                     {"bytes_recv", c.bytes_recv},
                     {"comm_s", c.comm_s},
                     {"modelled_link_s", c.modelled_s},
                     {"compute_s", round_seconds - c.comm_s},
                     {"inner_steps", replicas->ddp() ? 1 : replicas->inner_steps_now()},
                     {"elapsed_s", elapsed_before + seconds_since(run_start)}});
      round_seconds = 0;
    }
    if (step % tc.log_every == 0 || step == tc.steps) {
      const double tps = double(interval_tokens) / interval_seconds;
      const double mfu = tps * flops_per_token / (peak * env.world_size);
      const double eta = double(tc.steps - step) * interval_seconds / double(interval_steps);
      write_metrics({{"step", step}, {"tokens", tokens_seen}, {"loss", step_loss},
                     {"loss_avg", interval_loss / double(interval_steps)}, {"lr", lr}, {"grad_norm", grad_norm},
                     {"tokens_per_s", tps}, {"mfu", mfu}, {"elapsed_s", elapsed}});
      std::string comm_share =
          replicas ? fmt::format(" | comm {:.0f}%", 100.0 * round_comm_s / interval_seconds) : std::string();
      round_comm_s = 0;
      if (lead)
        log::info("step {:>5}/{} | loss {:.4f} | lr {:.2e} | grad {:.2f} | {} tok/s | MFU {:.1f}%{} | ETA {}", step,
                  tc.steps, interval_loss / double(interval_steps), lr, grad_norm, thousands(tps), 100 * mfu,
                  comm_share, format_duration(eta));
      interval_seconds = 0;
      interval_tokens = 0;
      interval_loss = 0;
      interval_steps = 0;
    }
    const bool last = step == tc.steps;
    // A stop (signal or --stop-after-step) must happen at the same step on every rank: a signal is agreed on by a
    // lagged vote every step (comm/lagged_vote.h), so DiLoCo stops within a few steps instead of at its next outer
    // step (which may be minutes away) — and the stop waits until no exchange is in flight.
    if (options.stop_after_step > 0 && step >= options.stop_after_step) stop_pending = true;
    if (!replicas) {
      stop_pending |= g_stop_requested != 0;
    } else if (!stop_pending) {
      stop_pending = replicas->stop_agreed(g_stop_requested != 0);
      if (stop_pending && lead) log::info("stop agreed by every rank at step {}", step);
    }
    const bool quiescent = !replicas || replicas->quiescent();
    const bool stop = stop_pending && quiescent;
    // DiLoCo replicas hold the global model only right after an outer step: periodic checkpoints then (their
    // model.safetensors is the global model), or at the end. Every rank takes part in a multi-process checkpoint.
    const bool at_global = !replicas || replicas->averaging_gradients() || synced;
    if (lead && ((tc.eval_every > 0 && step % tc.eval_every == 0) || last)) run_eval(step, elapsed);
    if ((lead || replicas) &&
        (((tc.checkpoint_every > 0 && step % tc.checkpoint_every == 0) && at_global && quiescent) || last || stop))
      save(step, elapsed);
    if (stop && !last) {
      if (lead) log::info("stopped after step {} (checkpoint '{}'); continue with --resume", step, summary.checkpoint.string());
      summary.stopped_early = true;
      break;
    }
  }
  std::signal(SIGINT, old_int);
  std::signal(SIGTERM, old_term);

  summary.steps = step;
  if (replicas) {
    summary.world_size = replicas->size();
    summary.outer_steps = replicas->outer_steps();
  }
  summary.tokens = tokens_seen;
  summary.elapsed_s = elapsed_before + seconds_since(run_start);
  const int64_t steps_run = step - start_step;
  summary.tokens_per_s = double(steps_run * tokens_per_step * env.world_size) / train_seconds;
  summary.mfu = summary.tokens_per_s * flops_per_token / (peak * env.world_size);
  nlohmann::json summary_json = {{"steps", summary.steps},           {"tokens", summary.tokens},
                                 {"val_loss", summary.val_loss},     {"val_bpb", summary.val_bpb},
                                 {"val_ppl", summary.val_ppl},       {"unigram_bpb", summary.unigram_bpb},
                                 {"tokens_per_s", summary.tokens_per_s}, {"mfu", summary.mfu},
                                 {"peak_flops", summary.peak_flops}, {"elapsed_s", summary.elapsed_s},
                                 {"num_parameters", summary.num_parameters},
                                 {"checkpoint", summary.checkpoint.string()}, {"stopped_early", summary.stopped_early},
                                 {"world_size", summary.world_size}, {"bytes_sent", summary.bytes_sent},
                                 {"bytes_recv", summary.bytes_recv}, {"comm_s", summary.comm_s},
                                 {"outer_steps", summary.outer_steps},
                                 {"algorithm", replicas ? config.dist.algorithm : std::string("single")},
                                 {"compression", config.dist.compression}};
  if (!summary.evaluated)  // a 0.0 loss would read as a perfect model
    for (const char* key : {"val_loss", "val_bpb", "val_ppl"}) summary_json[key] = nullptr;
  if (lead) write_file_atomic(run_dir / "summary.json", summary_json.dump(2) + "\n");
  return summary;
}

}  // namespace tributary
