#include "tributary/model/path_grid.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tributary/core/error.h"

namespace tributary {

PathGrid::PathGrid(std::vector<int64_t> modules_per_level, bool private_stem)
    : k_(std::move(modules_per_level)), private_stem_(private_stem) {
  if (k_.empty()) fail("a path grid needs at least one level");
  for (int64_t k : k_)
    if (k < 1 || k > 4096) fail("a level must have between 1 and 4096 modules, not {}", k);
}

PathGrid PathGrid::parse(const std::string& spec, int64_t num_levels, bool private_stem, const std::string& key) {
  std::vector<int64_t> k;
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t end = spec.find('x', pos);
    if (end == std::string::npos) end = spec.size();
    const std::string part = spec.substr(pos, end - pos);
    char* stop = nullptr;
    const long value = part.empty() ? 0 : std::strtol(part.c_str(), &stop, 10);
    if (part.empty() || *stop != '\0' || value < 1 || value > 4096)
      fail("{} = '{}': expected modules per level separated by 'x', e.g. '2x2' or '4x4'", key, spec);
    k.push_back(value);
    pos = end + 1;
  }
  if (static_cast<int64_t>(k.size()) != num_levels)
    fail("{} = '{}' names {} levels but model.num_levels = {}; give one factor per level", key, spec, k.size(),
         num_levels);
  return PathGrid(std::move(k), private_stem);
}

int64_t PathGrid::num_paths() const {
  int64_t p = 1;
  for (int64_t k : k_) p *= k;
  return p;
}

std::string PathGrid::describe() const { return fmt::format("{}", fmt::join(k_, "x")); }

std::vector<int64_t> PathGrid::path_modules(int64_t path) const {
  if (path < 0 || path >= num_paths())
    fail("path {} is out of range: the {} grid has paths 0..{}", path, describe(), num_paths() - 1);
  std::vector<int64_t> m(k_.size());
  for (size_t l = k_.size(); l-- > 0;) {
    m[l] = path % k_[l];
    path /= k_[l];
  }
  return m;
}

int64_t PathGrid::path_id(const std::vector<int64_t>& modules) const {
  if (modules.size() != k_.size())
    fail("a path of the {} grid has {} modules, not {}", describe(), k_.size(), modules.size());
  int64_t id = 0;
  for (size_t l = 0; l < k_.size(); ++l) {
    if (modules[l] < 0 || modules[l] >= k_[l])
      fail("module {} does not exist at level {} of the {} grid", modules[l], l, describe());
    id = id * k_[l] + modules[l];
  }
  return id;
}

std::vector<std::string> PathGrid::modules() const {
  std::vector<std::string> out;
  if (private_stem_) {
    for (int64_t p = 0; p < num_paths(); ++p) out.push_back(fmt::format("stem.path{}", p));
  } else {
    out.push_back("stem");
  }
  for (size_t l = 0; l < k_.size(); ++l)
    for (int64_t m = 0; m < k_[l]; ++m) out.push_back(fmt::format("level{}.module{}", l, m));
  return out;
}

std::vector<std::string> PathGrid::modules_of_path(int64_t path) const {
  auto m = path_modules(path);
  std::vector<std::string> out{private_stem_ ? fmt::format("stem.path{}", path) : std::string("stem")};
  for (size_t l = 0; l < m.size(); ++l) out.push_back(fmt::format("level{}.module{}", l, m[l]));
  return out;
}

std::vector<int64_t> PathGrid::paths_through(const std::string& module) const {
  std::vector<int64_t> out;
  for (int64_t p = 0; p < num_paths(); ++p) {
    auto mods = modules_of_path(p);
    if (std::find(mods.begin(), mods.end(), module) != mods.end()) out.push_back(p);
  }
  if (out.empty()) fail("'{}' is not a module of the {} grid", module, describe());
  return out;
}

std::string PathGrid::module_of_param(const std::string& name, int64_t path) const {
  // "levels.{l}.modules.{m}." prefix -> level module; everything else is the stem.
  if (name.rfind("levels.", 0) == 0) {
    int l = -1, m = -1;
    if (std::sscanf(name.c_str(), "levels.%d.modules.%d.", &l, &m) == 2) return fmt::format("level{}.module{}", l, m);
    fail("parameter '{}' does not follow the levels.L.modules.M.* naming", name);
  }
  return private_stem_ ? fmt::format("stem.path{}", path) : std::string("stem");
}

}  // namespace tributary
