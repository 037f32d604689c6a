#include "tributary/runtime/run_state.h"

#include <cmath>
#include <set>

#include "tributary/core/counted.h"
#include "tributary/core/error.h"
#include "tributary/core/log.h"
#include "tributary/model/param_name.h"
#include "tributary/runtime/replica_checkpoint.h"
#include "tributary/runtime/run_report.h"

namespace tributary {
namespace {

// The fields of state.json a resume reads, each of the type and range train writes: an Error naming the file and
// field before anything reads them (a hand-edited or damaged state.json is the user's to fix, not a crash).
void check_resume_state(const LoadedCheckpoint& ckpt) {
  const std::string file = (ckpt.dir / "state.json").string();
  const nlohmann::json& s = ckpt.state;
  auto count = [&](const nlohmann::json& j, const std::string& what, int64_t most) {
    if (!j.is_number_integer() || j.get<int64_t>() < 0 || j.get<int64_t>() > most)
      fail("'{}': {} = {} is not an integer in [0, {}]; use another checkpoint", file, what, j.dump(), most);
    return j.get<int64_t>();
  };
  for (const char* key : {"optimizer_steps", "tokens"})  // a model-only checkpoint (an exported path) has neither
    if (!s.contains(key) || !s[key].is_number_integer())
      fail(
          "cannot resume from '{}': its state.json has no integer '{}' (a model-only checkpoint?); start a new run "
          "with --set train.init_from=... instead",
          ckpt.dir.string(), key);
  constexpr int64_t kMost = int64_t(1) << 62;
  count(s["optimizer_steps"], "optimizer_steps", kMost);
  count(s["tokens"], "tokens", kMost);
  const int64_t world = s.contains("world_size") ? count(s["world_size"], "world_size", 1 << 20) : 1;
  if (world < 1) fail("'{}': world_size = 0; use another checkpoint", file);
  if (s.contains("replica_rank")) count(s["replica_rank"], "replica_rank", world - 1);
  if (s.contains("elapsed_s") && (!s["elapsed_s"].is_number() || !std::isfinite(s["elapsed_s"].get<double>())))
    fail("'{}': elapsed_s = {} is not a finite number; use another checkpoint", file, s["elapsed_s"].dump());
  auto position = [&](const nlohmann::json& j, const std::string& what) {
    if (!j.is_object() || !j.contains("epoch") || !j.contains("cursor"))
      fail("'{}': {} is not a loader position {{\"epoch\": E, \"cursor\": C}}; use another checkpoint", file, what);
    count(j["epoch"], what + ".epoch", kMost);
    count(j["cursor"], what + ".cursor", kMost);
  };
  if (s.contains("loaders")) {
    if (!s["loaders"].is_array() || int64_t(s["loaders"].size()) != world)
      fail("'{}': loaders is not a list of {} loader positions (world_size); use another checkpoint", file, world);
    for (size_t r = 0; r < s["loaders"].size(); ++r) position(s["loaders"][r], fmt::format("loaders[{}]", r));
  } else {
    if (!s.contains("loader")) fail("'{}' has no loader position ('loader'); use another checkpoint", file);
    position(s["loader"], "loader");
  }
  if (s.contains("replicas")) {
    if (!s["replicas"].is_array()) fail("'{}': replicas is not a list; use another checkpoint", file);
    for (size_t u = 0; u < s["replicas"].size(); ++u) {
      const auto& unit = s["replicas"][u];
      if (!unit.is_object() || !unit.contains("last_sync") || !unit.contains("outer_steps"))
        fail("'{}': replicas[{}] has no last_sync and outer_steps; use another checkpoint", file, u);
      count(unit["last_sync"], fmt::format("replicas[{}].last_sync", u), kMost);
      count(unit["outer_steps"], fmt::format("replicas[{}].outer_steps", u), kMost);
    }
  }
}

void check_resumable(const LoadedCheckpoint& ckpt, const RunConfig& config, int world_size, bool lead) {
  check_resume_state(ckpt);
  const std::string saved_file = (ckpt.dir / "config.toml").string();
  config.check_resumable_from(RunConfig::from_toml(ckpt.config_toml, saved_file), ckpt.dir.string(), saved_file);
  const int saved_world = ckpt.state.value("world_size", 1);
  if (saved_world == world_size) return;
  // A fault-tolerant pipelines' checkpoint is its leads' (each the whole model and every stage's moments): every
  // stage takes its part of lead 0's.
  if (config.parallel.pipeline_stages > 1 && !config.dist.fault_tolerant)
    fail(
        "cannot resume from '{}': it holds the state of {} worker(s) and this run has {}; a pipeline run resumes "
        "with the same number of workers (launch --nproc {})",
        ckpt.dir.string(), saved_world, world_size, saved_world);
  if (world_size > 1 && config.dist.diloco() && !ckpt.has(kOuterFile))
    fail(
        "cannot resume '{}' (one process, no DiLoCo outer state) with {} DiLoCo workers: resume it with one "
        "process, or start a DiLoCo run from its weights with --set train.init_from={}",
        ckpt.dir.string(), world_size, ckpt.dir.string());
  if (lead)
    log::warn(
        "resuming a checkpoint of {} worker(s) with {}: every worker starts from rank 0's parameters, AdamW "
        "state and data position (re-sharded over {})",
        saved_world, world_size, world_size);
}

// What a rank resumes from: its run directory's latest checkpoint (or the one --resume DIR names), unless it keeps its
// own directory (replica_checkpoint.h) with a newer one (or, for --resume DIR, one of the same step).
fs::path resume_source(const fs::path& run_dir, const fs::path& own_dir, const TrainOptions& options) {
  const fs::path shared = options.resume_from.empty() ? run_dir : fs::path(options.resume_from);
  if (options.dist.rank == 0) return shared;
  if (!options.resume_from.empty()) {
    const fs::path same_step = own_dir / "checkpoints" / shared.filename();
    return fs::exists(same_step / "manifest.json") ? same_step : shared;
  }
  const auto own = latest_checkpoint(own_dir);
  if (!own) return shared;
  const auto theirs = latest_checkpoint(run_dir);
  return !theirs || own->filename().string() > theirs->filename().string() ? own_dir : shared;
}

}  // namespace

namespace {

// What a run writes into its directory (any of them there: it is a run directory, from this run or an earlier one).
bool is_run_entry(const std::string& name) {
  static const std::set<std::string> kRun = {"config.toml",  "metrics.jsonl", "summary.json", "checkpoints",
                                             "tb",           "workers",       "ranks",        "report.html",
                                             "merges.jsonl", "modules",       "best",         "dipaco.json"};
  // Also a file being written (write_file_atomic's NAME.tmp-PID: rank 0's config.toml while another rank looks).
  return kRun.count(name) > 0 || name.rfind("metrics-rank", 0) == 0 || name.rfind(".tributary", 0) == 0 ||
         name.find(".tmp") != std::string::npos;
}

// A run writes metrics.jsonl, summary.json, config.toml and checkpoints/ into its directory and --overwrite clears
// them: a filesystem root, or a directory of other files that no run wrote, is refused before anything is written.
void check_run_dir(const fs::path& run_dir) {
  std::error_code ec;
  const fs::path absolute = fs::weakly_canonical(fs::absolute(run_dir), ec);
  if (!ec && absolute == absolute.root_path())
    fail(
        "train.run_dir = '{}' is a filesystem root: a run writes metrics.jsonl, summary.json, config.toml and "
        "checkpoints/ into its directory; give it one of its own, e.g. --set train.run_dir=runs/NAME",
        run_dir.string());
  if (!fs::is_directory(run_dir, ec)) return;
  std::vector<std::string> others;
  bool run = false;
  for (const auto& e : fs::directory_iterator(run_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (is_run_entry(name))
      run = true;
    else if (others.size() < 5)
      others.push_back(name);
  }
  if (!run && !others.empty())
    fail(
        "train.run_dir = '{}' holds files no run wrote ({}{}): a run writes its files among them; give an empty or "
        "new directory, e.g. --set train.run_dir=runs/NAME",
        run_dir.string(), fmt::join(others, ", "), others.size() == 5 ? ", ..." : "");
}

}  // namespace

std::optional<LoadedCheckpoint> prepare_run(RunConfig& config, const TrainOptions& options, const Dataset& dataset) {
  if (config.model.vocab_size == 0) config.model.vocab_size = dataset.vocab_size();
  if (config.model.vocab_size < dataset.vocab_size())
    fail("model.vocab_size = {} is smaller than the tokenizer of '{}' ({} ids); set it to 0 to take the tokenizer's",
         config.model.vocab_size, config.data.dir, dataset.vocab_size());
  const fs::path run_dir = config.train.run_dir;
  const bool lead = options.dist.lead();
  std::optional<LoadedCheckpoint> ckpt;
  if (options.dist.joining) {  // a restarted worker: the running run's directory is not its to check or clear
    if (!config.dist.fault_tolerant && !config.dist.async_diloco())
      fail("worker {} was restarted to join a running run, but only dist.fault_tolerant = true runs take joiners",
           options.dist.rank);
    return ckpt;
  }
  const fs::path own_dir = own_run_dir(run_dir, options.dist.rank);  // where a rank apart from rank 0's keeps its own
  check_run_dir(run_dir);
  if (options.resume) {
    ckpt = load_checkpoint(resume_source(run_dir, own_dir, options));
    check_resumable(*ckpt, config, options.dist.world_size, lead);
  } else if ((latest_checkpoint(run_dir) || (!lead && latest_checkpoint(own_dir))) && !options.overwrite) {
    fail(
        "train.run_dir '{}' already holds checkpoints: pass --resume to continue that run, --overwrite to start over, "
        "or choose another directory with --set train.run_dir=...",
        run_dir.string());
  }
  // Starting over: the old run's checkpoints go, or a later --resume would continue from them.
  if (options.overwrite && !options.resume) fs::remove_all((lead ? run_dir : own_dir) / "checkpoints");
  if (lead && !options.resume) forget_earlier_results(run_dir);  // a failed run must not show the last one's results
  std::error_code ec;
  if (fs::exists(run_dir, ec) && !fs::is_directory(run_dir, ec))
    fail("train.run_dir = '{}' is a file; choose a directory with --set train.run_dir=...", run_dir.string());
  fs::create_directories(run_dir, ec);
  if (ec) fail("cannot create train.run_dir = '{}': {}; choose a writable directory", run_dir.string(), ec.message());
  if (lead) write_file_atomic(run_dir / "config.toml", config.to_toml());
  return ckpt;
}

std::vector<int64_t> resumable_steps(const std::optional<LoadedCheckpoint>& ckpt, const TrainOptions& options) {
  if (!ckpt) return {};
  if (!options.resume_from.empty()) return {ckpt->state.at("step").get<int64_t>()};
  return checkpoint_steps(ckpt->dir.parent_path().parent_path());  // RUN_DIR/checkpoints/step-N
}

void resume_at(LoadedCheckpoint& ckpt, int64_t step) {
  if (ckpt.state.at("step").get<int64_t>() == step) return;
  ckpt = load_checkpoint(checkpoint_dir(ckpt.dir.parent_path().parent_path(), step));
}

HealState heal_state(const NamedTensors& trained, const AdamW& optimizer, const BatchLoader& loader,
                     const RunProgress& progress) {
  HealState state{.tensors = trained, .num_params = trained.size()};
  for (auto& t : optimizer.state()) state.tensors.push_back(std::move(t));
  state.meta = {{"step", progress.step},
                {"tokens", progress.tokens},
                {"elapsed_s", progress.elapsed_before},
                {"optimizer_steps", optimizer.num_steps()},
                {"loader_epoch", loader.position().epoch},
                {"loader_cursor", loader.position().cursor},
                {"loader_world", loader.world_size()}};
  return state;
}

std::optional<PendingHeal> join_run(Admission& admission, NamedTensors& trained, AdamW& optimizer, BatchLoader& loader,
                                    RunProgress& progress, int64_t total_steps) {
  return join_run(admission, trained, heal_state(trained, optimizer, loader, progress), optimizer, loader, progress,
                  total_steps);
}

std::optional<PendingHeal> join_run(Admission& admission, NamedTensors& params, HealState state, AdamW& optimizer,
                                    BatchLoader& loader, RunProgress& progress, int64_t total_steps) {
  const auto meta = admission.join(params, std::move(state));
  if (meta.value("finished", false)) {
    progress.step = total_steps;
    return std::nullopt;
  }
  progress.step = meta.at("step").get<int64_t>();
  progress.tokens = meta.at("tokens").get<int64_t>();
  progress.elapsed_before = meta.at("elapsed_s").get<double>();
  optimizer.set_num_steps(meta.at("optimizer_steps").get<int64_t>());
  // The lead's position counts its share of the windows under its world; the trainer re-shards to the new one.
  loader.reshard(0, meta.at("loader_world").get<int64_t>());
  const LoaderPosition lead{meta.at("loader_epoch").get<uint64_t>(), meta.at("loader_cursor").get<uint64_t>()};
  loader.set_position(lead);
  if (!meta.value("pending", false)) return std::nullopt;
  loader.set_position({lead.epoch + 1, lead.cursor});
  return PendingHeal{lead, progress.step, meta.at("members_world").get<int64_t>()};
}

namespace {

// A block parameter's place independent of how blocks are grouped into levels ("block 3: attn.qkv.weight"), so that
// a dense checkpoint of 1 level (an imported Llama) starts a model of 2 and the other way round; other names as they
// are. Modules other than 0 (a DiPaCo grid) keep their level-bound name.
std::string level_free_name(const std::string& name, int64_t blocks_per_level) {
  const auto place = parse_param_name(name);
  if (!place || place->part != ParamPlace::Part::Block || place->module != 0) return name;
  return fmt::format("block {}: {}", place->model_block(blocks_per_level), place->rest);
}

}  // namespace

void init_from(Transformer& model, const std::string& from) {
  auto init = load_checkpoint(from);
  const RunConfig saved = RunConfig::from_toml(init.config_toml, (init.dir / "config.toml").string());
  const ModelConfig& ours = model.config();
  if (saved.model.num_levels == ours.num_levels || saved.model.num_layers != ours.num_layers) {
    try {
      load_parameters(model, init.model);
    } catch (const Error& e) {
      fail(
          "train.init_from = '{}' does not match this run's model: {} (train --init-from {} takes the model's shape "
          "from the checkpoint)",
          from, e.what(), from);
    }
    return;
  }
  std::map<std::string, std::string> source;  // level-free name -> the checkpoint's name
  for (const auto& [name, view] : init.model.tensors())
    source.emplace(level_free_name(name, saved.model.blocks_per_level()), name);
  torch::NoGradGuard no_grad;
  for (auto& [name, t] : named_parameters_of(model)) {
    const auto it = source.find(level_free_name(name, ours.blocks_per_level()));
    if (it == source.end())
      fail(
          "train.init_from = '{}' does not match this run's model: it has no tensor for '{}' (train --init-from {} "
          "takes the model's shape from the checkpoint)",
          from, name, from);
    const torch::Tensor w = to_torch(init.model.at(it->second));
    if (w.sizes() != t.sizes())
      fail(
          "train.init_from = '{}' does not match this run's model: '{}' has shape {} where '{}' needs {} (train "
          "--init-from {} takes the model's shape from the checkpoint)",
          from, it->second, fmt::format("{}", fmt::join(w.sizes(), "x")), name,
          fmt::format("{}", fmt::join(t.sizes(), "x")), from);
    t.copy_(w);
  }
  log::info("train.init_from = '{}': blocks in {} there, {} here (blocks matched in model order)", from,
            counted(saved.model.num_levels, "level"), ours.num_levels);
}

RunProgress restore(LoadedCheckpoint& ckpt, Transformer& model, AdamW& optimizer, BatchLoader& loader, int rank,
                    int world_size) {
  // Rank 0's replica is model/optim; the others' are rank-R.* (multi-process checkpoints, see checkpoint.h).
  check_resume_state(ckpt);
  const int saved_world = ckpt.state.value("world_size", 1);
  // check_resumable allowed another world: everyone takes rank 0's; so does every replica of asynchronous DiLoCo,
  // whose checkpoints are the lead's alone (runtime/sync/async_sync.h).
  const bool elastic = saved_world != world_size || ckpt.state.contains("async");
  const int replica_rank = ckpt.state.value("replica_rank", 0);  // whose replica model/optim are (own_run_dir)
  if (elastic && replica_rank != 0)
    fail(
        "cannot resume '{}' with {} workers: it holds rank {}'s replica of a run of {} kept on its own machine, and a "
        "resume with another number of workers starts every worker from rank 0's. Copy rank 0's checkpoint to this "
        "machine and pass its directory to --resume (train --resume DIR), or resume with {} workers",
        ckpt.dir.string(), world_size, replica_rank, saved_world, saved_world);
  if (rank != 0 && !elastic && replica_rank != rank) {
    ckpt.model = ckpt.tensors(replica_model_file(rank));
    ckpt.optim = ckpt.tensors(replica_optim_file(rank));
  }
  load_parameters(model, ckpt.model);
  optimizer.load_state(ckpt.optim, ckpt.state.at("optimizer_steps").get<int64_t>());
  if (ckpt.optim.contains("rng.cpu")) {
    auto generator = at::detail::getDefaultCPUGenerator();  // a handle: setting its state sets the global one
    generator.set_state(to_torch(ckpt.optim.at("rng.cpu")));
  }
  RunProgress progress{.step = ckpt.state.at("step").get<int64_t>(),
                       .tokens = ckpt.state.at("tokens").get<int64_t>(),
                       .elapsed_before = ckpt.state.value("elapsed_s", 0.0)};
  const auto& position =
      ckpt.state.contains("loaders") ? ckpt.state.at("loaders").at(elastic ? 0 : rank) : ckpt.state.at("loader");
  const int64_t loader_rank = loader.rank(), loader_world = loader.world_size();
  if (elastic) loader.reshard(0, saved_world);  // the position counts rank 0's share under the saved world
  try {
    loader.set_position({position.at("epoch").get<uint64_t>(), position.at("cursor").get<uint64_t>()});
  } catch (const Error& e) {
    fail("cannot resume from '{}': {}", ckpt.dir.string(), e.what());
  }
  if (elastic) loader.reshard(loader_rank, loader_world);
  log::info("resumed from '{}' at step {}", ckpt.dir.string(), progress.step);
  return progress;
}

fs::path save_run(const SaveRequest& r, int64_t step, int64_t tokens, double elapsed) {
  NamedTensors optim_state = r.optimizer_state ? *r.optimizer_state : r.optimizer.state();
  optim_state.emplace_back("rng.cpu", at::detail::getDefaultCPUGenerator().get_state());
  auto pos = r.loader.position();
  nlohmann::json state = {{"step", step},
                          {"tokens", tokens},
                          {"elapsed_s", elapsed},
                          {"optimizer_steps", r.optimizer.num_steps()},
                          {"loader", {{"epoch", pos.epoch}, {"cursor", pos.cursor}}},
                          {"tokenizer", r.dataset.tokenizer_kind()},
                          {"torch_version", TORCH_VERSION}};
  if (const auto eot = r.dataset.eot_id()) state["eot_id"] = *eot;
  CheckpointContents contents{
      r.params, optim_state, state, r.config.to_toml(), tokenizer_files(r.dataset.dir(), r.dataset.tokenizer_kind()),
      {},       {}};
  const fs::path run_dir = r.config.train.run_dir;
  const RankState mine{.params = r.params, .optim_state = optim_state, .position = pos, .aux = r.aux_heads};
  if (r.stage_state && !r.stage_state(run_dir, step, mine, contents)) return {};
  const fs::path dir = publish_dir(run_dir, contents);
  // The model's auxiliary heads; a rank keeping its own directory has its own copy (rank-R.aux_heads) already.
  if (r.aux_heads && !r.aux_heads->empty() && dir == run_dir)
    contents.extra_tensors.emplace_back(kAuxHeadsFile, *r.aux_heads);
  return save_checkpoint(dir, step, contents, r.config.train.keep_checkpoints);
}

}  // namespace tributary
