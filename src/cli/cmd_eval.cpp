#include <cmath>

#include "cli/commands.h"
#include "tributary/artifacts/checkpoint.h"
#include "tributary/artifacts/inference.h"
#include "tributary/artifacts/modules.h"
#include "tributary/artifacts/routed_eval.h"
#include "tributary/core/error.h"
#include "tributary/core/log.h"
#include "tributary/data/dataset.h"
#include "tributary/model/aux_head.h"
#include "tributary/parallel/local/head_eval.h"
#include "tributary/perf/flops.h"
#include "tributary/routing/units.h"
#include "tributary/runtime/run_state.h"

namespace tributary::cli {
namespace {

// --all-heads: every chunk head's loss of a local-parallel checkpoint (local.chunks >= 2) on the same batches.
void print_all_heads(const std::string& checkpoint, LoadedModel& loaded, BatchLoader& loader, int64_t batches,
                     const torch::Device& device) {
  const LocalConfig& l = loaded.config.local;  // l.chunks >= 2: checked before the evaluation
  const auto ckpt = load_checkpoint(checkpoint);
  AuxHeads heads(loaded.config.model, l.chunks, l.aux_head == "blocks" ? l.aux_head_blocks : 0);
  load_parameters(heads, ckpt.tensors(kAuxHeadsFile));
  heads.to(device);
  const auto plan = local::ChunkPlan::make(loaded.config.model.num_layers, l.chunks, l.mode, l.overlap_blocks);
  loader.set_position({0, 0});
  const auto losses = local::evaluate_heads(*loaded.model, heads, plan, loader, batches, device);
  for (size_t k = 0; k < losses.size(); ++k)
    std::printf(
        "  chunk %zu (blocks %lld-%lld) %s head: loss %.4f\n", k, static_cast<long long>(plan.layout.begin(int64_t(k))),
        static_cast<long long>(plan.layout.end(int64_t(k)) - 1), k + 1 == losses.size() ? "model" : "aux", losses[k]);
}

// Why this loss need not be the run's own evaluation (summary.json, metrics.jsonl): that one scored the first
// train.eval_batches batches of train.batch_size sequences of the validation split; say so, and how to get it.
void explain_scope(const TrainConfig& run, const std::string& split, int64_t asked, int64_t batches,
                   int64_t batch_size) {
  if (split != "val" || run.eval_batches <= 0) return;
  if (asked == run.eval_batches && batch_size == run.batch_size) return;
  std::printf(
      "  (%s: %lld batches of %lld sequences; the run's own evaluation scored the first %lld batches of %lld, and "
      "--batches %lld --batch-size %lld gives its number)\n",
      asked > 0 ? "these" : "the whole split", static_cast<long long>(batches), static_cast<long long>(batch_size),
      static_cast<long long>(run.eval_batches), static_cast<long long>(run.batch_size),
      static_cast<long long>(run.eval_batches), static_cast<long long>(run.batch_size));
}

struct EvalArgs {
  std::string checkpoint, data, device = "cpu", split = "val";
  int64_t batches = 0, batch_size = 16, threads = 0, prefix = -1, units = 0, reroute = 0;
  bool early_stopped = false, all_heads = false;
};

// A DiPaCo run: every unit of its validation split routed to one path by its first 32 tokens.
void eval_dipaco(const EvalArgs& args, const torch::Device& device) {
  auto r = evaluate_routed(args.checkpoint, args.early_stopped, args.units, device, args.reroute);
  std::printf("DiPaCo routed val loss %.4f | ppl %.3f | %lld tokens after the %lld-token prefix%s\n", r.loss,
              std::exp(r.loss), static_cast<long long>(r.num_tokens), static_cast<long long>(kRoutingPrefix),
              args.reroute > 0 ? fmt::format(" | re-routed every {} tokens", args.reroute).c_str() : "");
  for (size_t p = 0; p < r.units_per_path.size(); ++p)
    std::printf("  path %zu: %lld %s, loss %.4f\n", p, static_cast<long long>(r.units_per_path[p]),
                args.reroute > 0 ? "tokens" : "units", r.loss_per_path[p]);
}

// --prefix: the split cut into units of context + 1 tokens, only the tokens after the prefix scored (DiPaCo's
// protocol).
void eval_units(const EvalArgs& args, LoadedModel& loaded, const Dataset& dataset, const torch::Device& device) {
  if (args.prefix >= loaded.config.model.context)
    fail("--prefix {} leaves nothing to score: the model's context is {} tokens; use a prefix below it", args.prefix,
         loaded.config.model.context);
  Units units = cut_units(dataset, args.split, loaded.config.model.context);
  if (args.units > 0 && units.size() > args.units) units.tokens = units.tokens.narrow(0, 0, args.units);
  auto r = evaluate_units(*loaded.model, units.tokens, args.prefix, device);
  std::printf("step %lld | %s loss %.4f | ppl %.3f | %lld tokens after the %lld-token prefix of %lld units\n",
              static_cast<long long>(loaded.step), args.split.c_str(), r.mean(), std::exp(r.mean()),
              static_cast<long long>(r.num_tokens), static_cast<long long>(args.prefix),
              static_cast<long long>(units.size()));
}

// The split's windows of context + 1 tokens, batch by batch, as the run's evaluations score them.
void eval_windows(const EvalArgs& args, LoadedModel& loaded, const Dataset& dataset, const torch::Device& device) {
  auto tokens = std::make_shared<const std::vector<uint32_t>>(dataset.load_tokens(args.split));
  BatchLoader loader(tokens, {.batch_size = args.batch_size, .context = loaded.config.model.context, .shuffle = false},
                     dataset.dir().string() + " " + args.split);
  int64_t batches = args.batches > 0 ? std::min(args.batches, loader.num_windows() / args.batch_size)
                                     : loader.num_windows() / args.batch_size;
  Progress progress("eval: " + args.split, batches, "batches");
  auto result = evaluate(*loaded.model, loader, batches, device, &progress);
  progress.done();
  double bpb = result.loss / std::log(2.0) / dataset.bytes_per_token(args.split);
  std::printf("step %lld | %s loss %.4f | ppl %.3f | %.4f bits/byte | %lld tokens | unigram %.4f bits/byte\n",
              static_cast<long long>(loaded.step), args.split.c_str(), result.loss, std::exp(result.loss), bpb,
              static_cast<long long>(result.num_tokens),
              dataset.unigram_val_bits_per_token() / dataset.bytes_per_token("val"));
  explain_scope(loaded.config.train, args.split, args.batches, batches, args.batch_size);
  if (args.all_heads) print_all_heads(args.checkpoint, loaded, loader, batches, device);
}

}  // namespace

void add_eval(CLI::App& app) {
  auto args = std::make_shared<EvalArgs>();
  auto* cmd = app.add_subcommand("eval", "evaluate a checkpoint: loss, perplexity, bits per byte");
  cmd->add_option("checkpoint", args->checkpoint, "checkpoint directory or run directory")->required();
  auto* data = cmd->add_option("--data", args->data, "dataset directory (default: the checkpoint's data.dir)");
  auto* split = cmd->add_option("--split", args->split, "train or val")->check(CLI::IsMember({"train", "val"}));
  auto* batches_opt = cmd->add_option("--batches", args->batches, "number of batches (default: the whole split)")
                          ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  auto* batch_size =
      cmd->add_option("--batch-size", args->batch_size, "sequences per batch")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--device", args->device, "torch device");
  cmd->add_option("--threads", args->threads, "intra-op threads (0: all cores)")
      ->check(CLI::Range(int64_t{0}, kMaxThreads));
  auto* prefix =
      cmd->add_option(
             "--prefix", args->prefix,
             "DiPaCo protocol: cut the split into units of context+1 tokens and score only the tokens after the "
             "first PREFIX (32 for DiPaCo comparisons)")
          ->check(CLI::Range(int64_t{-1}, int64_t{1} << 30));
  auto* units = cmd->add_option("--units", args->units,
                                "with --prefix or a DiPaCo run: evaluate at most this many units (0: all)")
                    ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  auto* reroute =
      cmd->add_option("--reroute-every", args->reroute, "DiPaCo run: re-route every W tokens after the prefix")
          ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  auto* early =
      cmd->add_flag("--early-stopped", args->early_stopped, "DiPaCo run: each path's best held-out parameters");
  auto* heads =
      cmd->add_flag("--all-heads", args->all_heads, "local parallelism: also the loss of every chunk's auxiliary head");
  cmd->callback([=]() {
    // A flag that does not apply to this kind of checkpoint is refused, not ignored.
    const bool dipaco = is_dipaco_run(args->checkpoint), by_units = args->prefix >= 0;
    const auto refuse = [&](CLI::Option* flag, bool applies, const char* why) {
      if (flag->count() > 0 && !applies) fail("eval {}: {}", flag->get_name(), why);
    };
    const char* routed = "a DiPaCo run is evaluated by routing each unit of its validation split; drop the flag";
    for (CLI::Option* flag : {data, split, batches_opt, batch_size, prefix, heads}) refuse(flag, !dipaco, routed);
    refuse(early, dipaco, "applies to DiPaCo runs only (each path's best held-out parameters)");
    refuse(reroute, dipaco, "applies to DiPaCo runs only (re-routing along a unit)");
    refuse(units, dipaco || by_units, "counts units: it applies with --prefix or to a DiPaCo run");
    for (CLI::Option* flag : {batches_opt, batch_size, heads})
      refuse(flag, !by_units, "does not apply with --prefix, which scores whole units");
    configure_threads(args->threads);
    check_blas();
    auto device = parse_device(args->device);
    if (dipaco) return eval_dipaco(*args, device);
    auto loaded = load_model(args->checkpoint, device);
    if (args->all_heads && loaded.config.local.chunks < 2)  // said before the evaluation, not after it
      fail("--all-heads: '{}' was not trained with local parallelism (local.chunks = {}), so it has no auxiliary heads",
           args->checkpoint, loaded.config.local.chunks);
    Dataset dataset = Dataset::open(args->data.empty() ? loaded.config.data.dir : args->data);
    if (dataset.vocab_size() > loaded.config.model.vocab_size)
      fail("dataset '{}' has {} token ids but the model only {}: evaluate on data built with the same tokenizer",
           dataset.dir().string(), dataset.vocab_size(), loaded.config.model.vocab_size);
    if (args->prefix >= 0) return eval_units(*args, loaded, dataset, device);
    eval_windows(*args, loaded, dataset, device);
  });
}

}  // namespace tributary::cli
