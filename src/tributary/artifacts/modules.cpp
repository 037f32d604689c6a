#include "tributary/artifacts/modules.h"

#include "tributary/artifacts/json_file.h"

#include <nlohmann/json.hpp>

#include "tributary/artifacts/checkpoint.h"
#include "tributary/core/error.h"
#include "tributary/core/hash.h"
#include "tributary/data/tokenizer.h"
#include "tributary/model/param_name.h"

namespace tributary {

std::string renumber_module(const std::string& name, int64_t to) { return with_module_index(name, to); }

ModuleSet split_by_module(const NamedTensors& params, const PathGrid& grid, int64_t path) {
  ModuleSet out;
  for (const auto& [name, t] : params) out[grid.module_of_param(name, path)].emplace_back(name, t);
  return out;
}

ModuleSet initial_modules(const ModelConfig& model, const PathGrid& grid, uint64_t seed, const std::string& init_from) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(seed);
  Transformer dense(model);
  if (!init_from.empty()) {
    auto ckpt = load_checkpoint(init_from);
    try {
      load_parameters(dense, ckpt.model);
    } catch (const Error& e) {
      fail(
          "dipaco.init_from = '{}' does not match the model of this run ({}); train the dense model with the same "
          "model.* settings (model.num_levels included)",
          init_from, e.what());
    }
  }
  NamedTensors dense_params = named_parameters_of(dense);
  ModuleSet out;
  for (const std::string& module : grid.modules()) {
    // A module's tensors are the dense model's, renamed to the module's index (every module starts equal).
    const int64_t path = grid.paths_through(module).front();
    const auto mods = grid.path_modules(path);
    for (const auto& [name, t] : dense_params) {
      std::string renamed = name;
      if (name.rfind("levels.", 0) == 0) {
        const int64_t level = std::stoll(name.substr(7, name.find('.', 7) - 7));
        renamed = renumber_module(name, mods[size_t(level)]);
      }
      if (grid.module_of_param(renamed, path) == module) out[module].emplace_back(renamed, t.detach().clone());
    }
  }
  return out;
}

void load_path(Transformer& model, const PathGrid& grid, const ModuleSet& modules, int64_t path) {
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) {
    const std::string module = grid.module_of_param(item.key(), path);
    auto it = modules.find(module);
    if (it == modules.end()) fail("module '{}' of path {} is missing", module, path);
    bool found = false;
    for (const auto& [name, t] : it->second)
      if (name == item.key()) {
        item.value().copy_(t);
        found = true;
        break;
      }
    if (!found) fail("module '{}' has no tensor '{}' (path {})", module, item.key(), path);
  }
}

void save_modules(const fs::path& run_dir, const RunConfig& config, const PathGrid& grid, const ModuleSet& modules,
                  int64_t round) {
  fs::create_directories(run_dir / "modules");
  nlohmann::json files = nlohmann::json::object();
  for (const auto& [module, tensors] : modules) {
    const std::string bytes = tensors_to_safetensors(tensors, {{"module", module}});
    write_file_atomic(run_dir / "modules" / (module + ".safetensors"), bytes);
    files[module] = {{"size", bytes.size()}, {"xxh64", fmt::format("{:016x}", hash64(bytes.data(), bytes.size()))}};
  }
  write_file_atomic(run_dir / "config.toml", config.to_toml());
  nlohmann::json j = {{"format", "tributary-dipaco"},   {"round", round},
                      {"modules", grid.describe()},     {"private_stem", grid.private_stem()},
                      {"routes", config.dipaco.routes}, {"files", files}};
  write_file_atomic(run_dir / "dipaco.json", j.dump(2) + "\n");  // last: the set of module files is complete
}

bool is_dipaco_run(const fs::path& dir) { return fs::exists(dir / "dipaco.json"); }

DipacoRun load_dipaco_run(const fs::path& dir) {
  if (!is_dipaco_run(dir))
    fail("'{}' is not a DiPaCo run directory (no dipaco.json); train one with dipaco.modules set", dir.string());
  DipacoRun run;
  run.dir = dir;
  with_json_file(
      dir / "dipaco.json", "the run directory is damaged; train the run again", [&](const nlohmann::json& j) {
        run.config = RunConfig::from_toml(read_file(dir / "config.toml"), (dir / "config.toml").string());
        run.grid = PathGrid::parse(j.at("modules").get<std::string>(), run.config.model.num_levels,
                                   j.at("private_stem").get<bool>(), (dir / "dipaco.json").string());
        run.round = j.at("round").get<int64_t>();
        if (!j.at("round").is_number_integer() || run.round < 0)
          fail("'{}': round {} is not a round number; the run directory is damaged, train the run again",
               (dir / "dipaco.json").string(), j.at("round").dump());
        for (const std::string& module : run.grid.modules()) {
          const fs::path file = dir / "modules" / (module + ".safetensors");
          if (!j.at("files").contains(module))
            fail("'{}' lists no file for module '{}'", (dir / "dipaco.json").string(), module);
          std::string bytes = read_file(file);
          const auto& meta = j.at("files").at(module);
          if (bytes.size() != meta.at("size").get<size_t>() ||
              fmt::format("{:016x}", hash64(bytes.data(), bytes.size())) != meta.at("xxh64").get<std::string>())
            fail("module file '{}' does not match its checksum in dipaco.json (corrupted or from another round)",
                 file.string());
          auto f = safetensors::File::parse(std::move(bytes), file.string());
          NamedTensors tensors;
          for (const auto& [name, view] : f.tensors()) tensors.emplace_back(name, to_torch(view));
          run.modules[module] = std::move(tensors);
        }
      });
  return run;
}

fs::path best_path_file(const fs::path& run_dir, int64_t path) {
  return run_dir / "best" / fmt::format("path-{}.safetensors", path);
}

std::shared_ptr<Transformer> assemble_dense(const DipacoRun& run, int64_t path, bool early_stopped) {
  torch::NoGradGuard no_grad;
  Transformer routed(run.config.model, run.grid.path_modules(path));
  if (early_stopped && fs::exists(best_path_file(run.dir, path))) {
    load_parameters(routed, safetensors::File::load(best_path_file(run.dir, path)));
  } else {
    load_path(routed, run.grid, run.modules, path);
  }
  auto dense = std::make_shared<Transformer>(run.config.model);
  auto src = routed.named_parameters();
  for (auto& item : dense->named_parameters()) {
    bool copied = false;
    for (const auto& s : src)
      if (renumber_module(s.key(), 0) == item.key()) {
        item.value().copy_(s.value());
        copied = true;
        break;
      }
    if (!copied) fail("path {} has no tensor for '{}'", path, item.key());
  }
  return dense;
}

fs::path export_path(const DipacoRun& run, int64_t path, const fs::path& out_dir, bool early_stopped) {
  auto dense = assemble_dense(run, path, early_stopped);
  RunConfig config = run.config;
  config.dipaco = DipacoConfig{};  // a standalone dense model
  config.data.dir = (fs::path(run.config.dipaco.routes) / fmt::format("path-{}", path)).string();
  nlohmann::json state = {{"step", run.config.train.steps},
                          {"tokens", 0},
                          {"dipaco",
                           {{"run", fs::absolute(run.dir).string()},
                            {"path", path},
                            {"modules", run.grid.modules_of_path(path)},
                            {"early_stopped", early_stopped}}}};
  const auto tokenizer = load_tokenizer(config.data.dir);
  state["tokenizer"] = tokenizer->kind();
  state["eot_id"] = tokenizer->eot_id();
  return save_checkpoint(
      out_dir, run.config.train.steps,
      {named_parameters_of(*dense), {}, state, config.to_toml(), tokenizer_files(config.data.dir, tokenizer->kind())},
      1);
}

}  // namespace tributary
