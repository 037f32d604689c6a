#include "tributary/runtime/dipaco/resume.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <system_error>

#include "tributary/core/error.h"
#include "tributary/core/log.h"
#include "tributary/runtime/run_report.h"

namespace tributary {
namespace {

fs::path outer_file(const fs::path& run_dir, const std::string& module, int64_t round) {
  return run_dir / "outer" / fmt::format("{}.round-{}.safetensors", module, round);
}

fs::path feedback_file(const fs::path& run_dir, int worker, int64_t round) {
  return run_dir / "outer" / fmt::format("feedback-worker-{}.round-{}.safetensors", worker, round);
}

// One module's outer state (master copy, momentum, step count) from `file`; Error naming a damaged one.
void load_outer_state(const fs::path& file, OuterOptimizer& opt) {
  auto f = safetensors::File::load(file);
  int64_t steps = -1;
  try {
    steps = std::stoll(f.metadata().at("steps"));
  } catch (const std::exception&) {
    fail("'{}' has no step count in its metadata: it is not an outer-state file of this run", file.string());
  }
  opt.load_state(f, steps);
}

// Workers that share a run directory clear it at the same time: a file another worker removed first is no error (the
// tree is gone either way); any other failure is.
void remove_tree_together(const fs::path& dir) {
  for (int attempt = 0;; ++attempt) {
    std::error_code error;
    fs::remove_all(dir, error);
    if (!error || !fs::exists(dir)) return;
    if (error != std::errc::no_such_file_or_directory || attempt == 100)
      throw fs::filesystem_error("cannot remove all", dir, error);
  }
}

}  // namespace

DipacoRun load_resumable_dipaco_run(const fs::path& run_dir, const RunConfig& config) {
  if (!is_dipaco_run(run_dir))
    fail("cannot resume: train.run_dir '{}' holds no DiPaCo run (no dipaco.json); start one without --resume",
         run_dir.string());
  DipacoRun run = load_dipaco_run(run_dir);
  config.check_resumable_from(run.config, run_dir.string(), (run_dir / "config.toml").string());
  if (run.round * config.dist.inner_steps >= config.train.steps)
    fail("the DiPaCo run in '{}' has done all its {} rounds: nothing to resume", run_dir.string(), run.round);
  return run;
}

std::optional<DipacoRun> open_dipaco_run_dir(const fs::path& run_dir, const RunConfig& config, bool resume,
                                             const std::string& resume_from, bool overwrite) {
  if (resume) {
    if (!resume_from.empty() && fs::weakly_canonical(resume_from) != fs::weakly_canonical(run_dir))
      fail(
          "a DiPaCo run resumes in its own directory (its per-path state lives there): pass --resume without a path "
          "and --set train.run_dir={}",
          resume_from);
    return load_resumable_dipaco_run(run_dir, config);
  }
  if (is_dipaco_run(run_dir) && !overwrite)
    fail(
        "train.run_dir '{}' already holds a DiPaCo run: pass --resume to continue it, --overwrite to start over, or "
        "choose another directory",
        run_dir.string());
  return std::nullopt;
}

void adopt_modules(ModuleSet& modules, const ModuleSet& resumed, const fs::path& run_dir) {
  torch::NoGradGuard no_grad;
  for (auto& [module, tensors] : modules) {
    const auto it = resumed.find(module);
    if (it == resumed.end()) fail("cannot resume: the run in '{}' has no module '{}'", run_dir.string(), module);
    for (auto& [name, t] : tensors) {
      const auto src =
          std::find_if(it->second.begin(), it->second.end(), [&](const auto& e) { return e.first == name; });
      if (src == it->second.end() || src->second.sizes() != t.sizes())
        fail("cannot resume: module '{}' of the run in '{}' has no tensor '{}' of shape {}", module, run_dir.string(),
             name, fmt::join(t.sizes(), "x"));
      t.copy_(src->second);
    }
  }
}

void save_outer_states(const fs::path& run_dir, int64_t round, const OuterStates& outer) {
  fs::create_directories(run_dir / "outer");
  for (const auto& [module, opt] : outer) {
    NamedTensors tensors = opt->global();
    for (auto& t : opt->state()) tensors.push_back(std::move(t));
    write_file_atomic(
        outer_file(run_dir, module, round),
        tensors_to_safetensors(tensors, {{"module", module}, {"steps", std::to_string(opt->num_steps())}}));
    if (round >= 2) fs::remove(outer_file(run_dir, module, round - 2));
  }
}

void load_outer_states(const fs::path& run_dir, int64_t round, const OuterStates& outer) {
  for (const auto& [module, opt] : outer) {
    const fs::path file = outer_file(run_dir, module, round);
    if (!fs::exists(file))
      fail(
          "cannot resume: '{}' (module {}'s outer state after round {}) is missing: the run directory is incomplete, "
          "or (path-local workers with their own directories) this worker did not own the module before; resume "
          "with the same workers, each in its own directory, or start the run again",
          file.string(), module, round);
    load_outer_state(file, *opt);
  }
}

std::vector<std::string> take_over_outer_states(const fs::path& run_dir, int64_t round, const OuterStates& outer) {
  std::vector<std::string> fresh;
  for (const auto& [module, opt] : outer) {
    const fs::path file = outer_file(run_dir, module, round);
    if (fs::exists(file))
      load_outer_state(file, *opt);
    else
      fresh.push_back(module);
  }
  return fresh;
}

void save_feedback(const fs::path& run_dir, int64_t round, int worker, const ModuleFeedback& feedback) {
  fs::create_directories(run_dir / "outer");
  write_file_atomic(feedback_file(run_dir, worker, round), tensors_to_safetensors(feedback.state(), {}));
  if (round >= 2) fs::remove(feedback_file(run_dir, worker, round - 2));
}

void load_feedback(const fs::path& run_dir, int64_t round, int worker, ModuleFeedback& feedback,
                   const std::vector<int64_t>& numel) {
  const fs::path file = feedback_file(run_dir, worker, round);
  if (!fs::exists(file)) {
    log::info("worker {}: no error feedback after round {} ('{}'): SparseLoCo's feedback starts from zero", worker,
              round, file.string());
    return;
  }
  auto f = safetensors::File::load(file);
  std::vector<std::pair<std::string, torch::Tensor>> state;
  for (const auto& [name, view] : f.tensors()) state.emplace_back(name, to_torch(view));
  feedback.load_state(state, numel, file.string());
  log::info("worker {}: SparseLoCo's error feedback of {} module(s) resumed from '{}'", worker, state.size(),
            file.string());
}

int64_t agree_on_resumed_round(comm::Group& group, int64_t round, bool from_lead) {
  std::vector<torch::Tensor> lead = {torch::tensor({round}, torch::kInt64)};
  group.broadcast(lead, 0);
  const int64_t agreed = lead[0].item<int64_t>();
  if (!from_lead && agreed != round)
    fail(
        "cannot resume: this worker's run directory says round {} but the lead's says round {}; resume every worker "
        "from the same stop (or give each its own directory)",
        round, agreed);
  return agreed;
}

void republish_path_state(PathState& state, comm::Group& group, int64_t num_paths, int64_t round) {
  state.republish_inner(num_paths, round - 1);       // a task of round `round` loads its path's state after round - 1
  for (int turn = 0; turn < group.size(); ++turn) {  // in turn: the latest early-stopping copy wins
    if (turn == group.rank()) state.republish_best(num_paths);
    group.barrier();
  }
}

void clear_earlier_run(const fs::path& run_dir, bool lead) {
  remove_tree_together(run_dir / "inner");
  remove_tree_together(run_dir / "best");
  fs::remove(run_dir / "dipaco.json");
  if (lead) forget_earlier_results(run_dir);  // the lead writes them (a shared directory: once)
}

}  // namespace tributary
