// DiPaCo's grid of modules (arXiv 2403.10616): the blocks are split into L levels; level l has K_l alternative
// modules; a path takes one module per level, so there are P = prod K_l paths. Path ids are mixed-radix numbers with
// level 0 most significant: path (m_0, m_1) of a 2x2 grid is m_0 * 2 + m_1.
//
// Module ids name the units that are averaged, stored and shipped on their own:
//   "level{l}.module{m}"  the blocks of module m at level l (parameters "levels.{l}.modules.{m}.*")
//   "stem"                embeddings, final norm and head, shared by every path
//   "stem.path{p}"        the same, private to path p (private_stem = true): never averaged with other paths, but it
//                         still takes the outer step
// A level with one module is shared by every path. No LibTorch here: the grid is pure bookkeeping.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tributary {

class PathGrid {
 public:
  PathGrid() = default;
  PathGrid(std::vector<int64_t> modules_per_level, bool private_stem);
  // "2x2", "4x4", "1x8": one factor per level; Error naming `key` when malformed or when the number of factors
  // differs from num_levels.
  static PathGrid parse(const std::string& spec, int64_t num_levels, bool private_stem, const std::string& key);

  int64_t num_levels() const { return static_cast<int64_t>(k_.size()); }
  int64_t num_paths() const;
  const std::vector<int64_t>& modules_per_level() const { return k_; }
  bool private_stem() const { return private_stem_; }
  std::string describe() const;  // "2x2"

  std::vector<int64_t> path_modules(int64_t path) const;  // module index per level; Error when out of range
  int64_t path_id(const std::vector<int64_t>& modules) const;

  std::vector<std::string> modules() const;  // every module id, in a fixed order (stem first, then by level)
  std::vector<std::string> modules_of_path(int64_t path) const;
  std::vector<int64_t> paths_through(const std::string& module) const;
  // The module a parameter of path `path` belongs to ("levels.1.modules.0.blocks.2.mlp.fc.weight" -> "level1.module0").
  std::string module_of_param(const std::string& param_name, int64_t path) const;

 private:
  std::vector<int64_t> k_;
  bool private_stem_ = false;
};

}  // namespace tributary
