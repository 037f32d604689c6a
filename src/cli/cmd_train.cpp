#include <algorithm>
#include <cmath>

#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "tributary/artifacts/checkpoint.h"
#include "tributary/core/error.h"
#include "tributary/core/fs.h"
#include "tributary/core/log.h"
#include "tributary/launch/dist_env.h"
#include "tributary/runtime/trainer.h"

namespace tributary::cli {
namespace {

// Every key with its default; with a config file or overrides, with their values instead, a * before each key that
// differs from its default.
void print_config_help(const std::string& file, const std::vector<std::string>& overrides) {
  const std::string defaults = RunConfig().schema().help();
  if (file.empty() && overrides.empty()) {
    std::printf("%s", defaults.c_str());
    return;
  }
  const std::string values = RunConfig::load(file, overrides).schema().help();
  std::printf("every key as %s%s sets it (* differs from the default):\n", file.empty() ? "" : file.c_str(),
              overrides.empty() ? "" : (file.empty() ? "--set" : " and --set"));
  std::istringstream mine(values), base(defaults);
  std::string line, default_line;
  while (std::getline(mine, line)) {
    std::getline(base, default_line);
    if (line != default_line && !line.empty()) line[0] = '*';
    std::printf("%s\n", line.c_str());
  }
}

// The last line of a multi-process run: what kind of run, and what rank 0 sent (pipelines: activations and their
// gradients, plus its stage's exchanges with the other pipelines; no received count, which they do not keep).
std::string traffic_line(const TrainSummary& s) {
  const std::string blocked = fmt::format("{:.1f} s blocked in communication", s.comm_s);
  if (s.kind == RunKind::kPipelines) {
    const int64_t stages = std::max<int64_t>(1, int64_t(s.stages.size()));
    const int64_t pipelines = s.world_size / stages;
    const std::string across = pipelines == 1 ? std::string()
                               : s.sync == SyncKind::kDiloco
                                   ? fmt::format(" and its stage's pseudo-gradients ({} outer steps)", s.outer_steps)
                                   : std::string(" and its stage's gradients");
    return fmt::format("{} pipeline(s) of {} stages: rank 0 sent {:.2f} MB (activations, their gradients{}); {}",
                       pipelines, stages, s.bytes_sent / 1e6, across, blocked);
  }
  if (s.kind == RunKind::kIslands && s.sync == SyncKind::kAsyncDiloco)
    return fmt::format(
        "{} islands ({} ranks), asynchronous DiLoCo across: rank 0 posted {:.2f} MB of updates and fetched {:.2f} MB "
        "of global versions over the slow link, and sent {:.2f} MB of gradients inside its island; it ended at "
        "version {}",
        s.islands, s.world_size, s.bytes_sent / 1e6, s.bytes_recv / 1e6, s.bytes_inside / 1e6, s.outer_steps);
  if (s.kind == RunKind::kIslands)
    return fmt::format(
        "{} islands ({} ranks), DiLoCo across: rank 0 sent {:.2f} MB of its outer shard in {} outer steps over the "
        "slow link and {:.2f} MB of gradients inside its island; {}",
        s.islands, s.world_size, s.bytes_sent / 1e6, s.outer_steps, s.bytes_inside / 1e6, blocked);
  if (s.sync == SyncKind::kAsyncDiloco)
    return fmt::format(
        "{} replicas, asynchronous DiLoCo: rank 0 posted {:.2f} MB of updates and fetched {:.2f} MB of global "
        "versions; it ended at version {}",
        s.world_size, s.bytes_sent / 1e6, s.bytes_recv / 1e6, s.outer_steps);
  if (s.sync == SyncKind::kDiloco)
    return fmt::format("{} replicas, DiLoCo: rank 0 sent {:.2f} MB and received {:.2f} MB in {} outer steps; {}",
                       s.world_size, s.bytes_sent / 1e6, s.bytes_recv / 1e6, s.outer_steps, blocked);
  return fmt::format("{} replicas, data parallel: rank 0 sent {:.2f} MB and received {:.2f} MB in {} steps; {}",
                     s.world_size, s.bytes_sent / 1e6, s.bytes_recv / 1e6, s.steps, blocked);
}

// `--init-from PATH`: the model.* keys of the checkpoint at PATH (a checkpoint, or a run directory: its newest) as
// overrides, so that the model has the checkpoint's shape whatever the config file says; the user's own --set come
// after them and win. Then train.init_from = that checkpoint. Not taken: what shapes no weight — the context a run
// trains at (an imported model's is its longest, max_position_embeddings; unless positions are learned) and the
// initialisation's scale.
std::vector<std::string> init_from_overrides(const std::string& path) {
  std::error_code ec;
  fs::path dir = path;
  if (fs::is_directory(dir / "checkpoints", ec)) {
    const auto latest = latest_checkpoint(dir);
    if (!latest) fail("--init-from '{}': a run directory without a complete checkpoint", path);
    dir = *latest;
  }
  if (!fs::is_regular_file(dir / "config.toml", ec))
    fail(
        "--init-from '{}': no config.toml there: give a checkpoint (tributary import --out DIR writes one) or a run "
        "directory",
        path);
  const RunConfig saved = RunConfig::from_toml(read_file(dir / "config.toml"), (dir / "config.toml").string());
  std::vector<std::string> overrides;
  const bool learned_positions = saved.model.positions == "learned";
  for (const auto& [key, value] : saved.schema().flatten())
    if (key.starts_with("model.") && key != "model.init_std" && (key != "model.context" || learned_positions))
      overrides.push_back(key + "=" + value);
  overrides.push_back("train.init_from=\"" + dir.string() + "\"");
  log::info("--init-from {}: the model's shape ({} model.* keys) from its config.toml, the rest from the config",
            dir.string(), overrides.size() - 1);
  return overrides;
}

}  // namespace

void add_train(CLI::App& app) {
  struct Args {
    std::string config;
    std::vector<std::string> overrides;
    std::string resume_from;
    bool resume = false;
    bool overwrite = false;
    bool help_config = false;
    int64_t stop_after = 0;
    std::string adversary;
    std::string init_from;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "train", "train a model: one process, or one worker of a launched run (tributary launch --nproc N -- train ...)");
  cmd->add_option("config", args->config, "TOML config file (keys not given keep their defaults)");
  cmd->add_option("--set", args->overrides, "override a config key: --set optim.lr=3e-4 (repeatable)");
  auto* resume = cmd->add_option("--resume", args->resume_from,
                                 "continue from a checkpoint (default: the latest in train.run_dir)")
                     ->expected(0, 1);
  cmd->add_flag("--overwrite", args->overwrite, "start over: delete the checkpoints train.run_dir already has");
  cmd->add_option("--init-from", args->init_from,
                  "start from a checkpoint's weights (an imported model, another run's checkpoint or run directory): "
                  "the model's shape comes from its config.toml, everything else from the config and --set");
  cmd->add_option("--stop-after-step", args->stop_after, "checkpoint and stop after this step (resume later)")
      ->check(CLI::Range(int64_t{0}, std::numeric_limits<int64_t>::max()));
  cmd->add_option("--adversary", args->adversary,
                  "RANK:KIND: that rank lies in every exchange (tests and benchmarks of dist.aggregate; kinds: nan, "
                  "scaled, sign_flip, noise, zeros, replay, copy, poison)");
  cmd->add_flag("--help-config", args->help_config,
                "list every config key with its default and exit; with a config (and --set), its values, the ones "
                "that differ from the defaults marked *");
  cmd->callback([args, resume]() {
    if (args->help_config) {
      print_config_help(args->config, args->overrides);
      return;
    }
    // `train --resume CFG.toml`: the option takes the next word, but a TOML file is never a checkpoint, so it is the
    // config and the run resumes from its latest checkpoint, as `train CFG.toml --resume` does.
    if (args->config.empty() && fs::path(args->resume_from).extension() == ".toml" &&
        fs::is_regular_file(args->resume_from)) {
      args->config = std::exchange(args->resume_from, std::string());
      log::info("--resume {}: a config file, not a checkpoint; resuming from the latest checkpoint of its run",
                args->config);
    }
    std::vector<std::string> overrides = args->overrides;
    if (!args->init_from.empty()) {
      overrides = init_from_overrides(args->init_from);
      overrides.insert(overrides.end(), args->overrides.begin(), args->overrides.end());
    }
    RunConfig config = RunConfig::load(args->config, overrides);
    TrainOptions options{.resume = resume->count() > 0,
                         .resume_from = args->resume_from,
                         .stop_after_step = args->stop_after,
                         .overwrite = args->overwrite,
                         .dist = resolve_dist_env_from_process(),
                         .faults = fault_plan_from_environment()};
    if (!args->adversary.empty()) parse_adversary(args->adversary, options.faults);
    TrainSummary s = train(config, options);
    if (!s.lead) {  // rank 0, or the worker that took over from it (fault tolerance), tells the run's outcome
      if (options.dist.distributed() && options.dist.local_rank == 0 && s.kind != RunKind::kDipaco)
        log::info(
            "done on this machine: rank {} took {} steps in {:.0f} s{}; the run's evaluation, summary.json and "
            "checkpoints are the lead's (rank 0's machine, its run directory)",
            options.dist.rank, s.steps, s.elapsed_s, s.stopped_early ? " (stopped early)" : "");
      return;
    }
    if (s.kind == RunKind::kDipaco) {
      log::info(
          "done: DiPaCo {} rounds in {:.0f} s | routed val loss {:.4f} (ppl {:.3f}) | early-stopped {:.4f} | "
          "{:.2f} MB sent by the lead | run directory {}",
          s.outer_steps, s.elapsed_s, s.val_loss, s.val_ppl, s.val_loss_early, s.bytes_sent / 1e6, s.run_dir.string());
      return;
    }
    // A run stopped before its first evaluation has no validation loss (summary.json: null), not a loss of 0.
    const std::string val = s.evaluated ? fmt::format("val loss {:.4f} | {:.3f} bits/byte (unigram baseline {:.3f})",
                                                      s.val_loss, s.val_bpb, s.unigram_bpb)
                                        : std::string("not evaluated");
    log::info("done: {} steps, {} tokens in {:.0f} s | {} | {:.0f} tok/s | MFU {:.1f}%", s.steps, s.tokens, s.elapsed_s,
              val, s.tokens_per_s, 100 * s.mfu);
    if (s.world_size > 1) log::info("{}", traffic_line(s));
    log::info("run directory: {} (metrics.jsonl, summary.json, checkpoints/)", s.run_dir.string());
  });
}

}  // namespace tributary::cli
