// The global modules of a DiPaCo run, keyed by module id (model/path_grid.h). Each module is a list of named tensors
// whose names are those of a path model ("levels.1.modules.0.blocks.2.mlp.fc.weight", "embed_tok.weight"), so a path
// is assembled by copying its modules in, and a module is stored, shipped and loaded on its own:
//   RUN_DIR/modules/{module}.safetensors   the module's global parameters
//   RUN_DIR/dipaco.json                    written last: round, grid, routes, the module files and their xxh64
//   RUN_DIR/config.toml                    the run's configuration
#pragma once

#include <map>
#include <memory>
#include <string>

#include "tributary/config/run_config.h"
#include "tributary/core/fs.h"
#include "tributary/model/path_grid.h"
#include "tributary/model/tensor_io.h"
#include "tributary/model/transformer.h"

namespace tributary {

using ModuleSet = std::map<std::string, NamedTensors>;

// Every module from the seed (all modules of a level start equal, like copies of one dense model), or from the
// dense checkpoint `init_from` (refused, naming the tensor, when its model does not match model.*).
ModuleSet initial_modules(const ModelConfig& model, const PathGrid& grid, uint64_t seed, const std::string& init_from);
// Copies path `path`'s modules into `model` (built with grid.path_modules(path)).
void load_path(Transformer& model, const PathGrid& grid, const ModuleSet& modules, int64_t path);
// The parameters of `model` (a path model) split by module.
ModuleSet split_by_module(const NamedTensors& params, const PathGrid& grid, int64_t path);
// "levels.{l}.modules.{m}." -> "levels.{l}.modules.{to}." (a path exported as a dense model uses module 0).
std::string renumber_module(const std::string& name, int64_t to);

struct DipacoRun {
  RunConfig config;
  PathGrid grid;
  ModuleSet modules;
  int64_t round = 0;
  fs::path dir;
};
void save_modules(const fs::path& run_dir, const RunConfig& config, const PathGrid& grid, const ModuleSet& modules,
                  int64_t round);
bool is_dipaco_run(const fs::path& dir);
DipacoRun load_dipaco_run(const fs::path& dir);  // verifies every module file's checksum

// Path `path` of a run as an ordinary dense model (module indices renumbered to 0). early_stopped: the path's
// parameters from the round where its held-out loss was lowest (RUN_DIR/best/path-{p}.safetensors).
std::shared_ptr<Transformer> assemble_dense(const DipacoRun& run, int64_t path, bool early_stopped = false);
fs::path best_path_file(const fs::path& run_dir, int64_t path);
// Writes path `path` as a standalone dense checkpoint under out_dir (load_model, eval and generate accept it).
fs::path export_path(const DipacoRun& run, int64_t path, const fs::path& out_dir, bool early_stopped);

}  // namespace tributary
