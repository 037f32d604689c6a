#include "tributary/core/config.h"

#include <set>

#include <toml++/toml.h>
#include <algorithm>
#include <cmath>
#include <sstream>

#include "tributary/core/error.h"
#include "tributary/core/fs.h"
#include "tributary/core/log.h"

namespace tributary {

void ConfigSchema::add(std::string key, int64_t& field, std::string help, int64_t min, int64_t max) {
  fields_.push_back(
      {.key = std::move(key), .kind = Kind::integer, .ptr = &field, .help = std::move(help), .imin = min, .imax = max});
}
void ConfigSchema::add(std::string key, double& field, std::string help, double min, double max) {
  fields_.push_back(
      {.key = std::move(key), .kind = Kind::number, .ptr = &field, .help = std::move(help), .min = min, .max = max});
}
void ConfigSchema::add(std::string key, bool& field, std::string help) {
  fields_.push_back({.key = std::move(key), .kind = Kind::boolean, .ptr = &field, .help = std::move(help)});
}
void ConfigSchema::add(std::string key, std::string& field, std::string help, std::vector<std::string> choices) {
  fields_.push_back({.key = std::move(key),
                     .kind = Kind::string,
                     .ptr = &field,
                     .help = std::move(help),
                     .choices = std::move(choices)});
}

void ConfigSchema::rename(std::string old_key, std::string key, std::string why) {
  renamed_.push_back({std::move(old_key), std::move(key), std::move(why)});
}

ConfigSchema::Field& ConfigSchema::find(const std::string& key, const std::string& origin) {
  for (auto& f : fields_)
    if (f.key == key) return f;
  for (const auto& r : renamed_)
    if (r.old_key == key) {
      static std::set<std::string> warned;  // once per process: configs are loaded several times
      if (warned.insert(key).second)
        log::warn("{}: config key '{}' is deprecated, use '{}' ({})", origin, key, r.key, r.why);
      return find(r.key, origin);
    }
  // Suggest the keys of the same section, which is where typos usually are.
  std::string section = key.substr(0, key.find('.'));
  std::vector<std::string> near;
  for (const auto& f : fields_)
    if (f.key.rfind(section + ".", 0) == 0) near.push_back(f.key);
  std::string hint = near.empty() ? "run `tributary train --help-config` to list every key"
                                  : fmt::format("known keys in [{}]: {}", section, fmt::join(near, ", "));
  fail("{}: unknown config key '{}' ({})", origin, key, hint);
}

namespace {

const char* kind_name(int kind) {
  static const char* names[] = {"an integer", "a number", "a boolean (true/false)", "a string"};
  return names[kind];
}

void walk(const toml::table& table, const std::string& prefix,
          std::vector<std::pair<std::string, const toml::node*>>& out) {
  for (const auto& [k, v] : table) {
    std::string key = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (const auto* sub = v.as_table()) {
      walk(*sub, key, out);
    } else {
      out.emplace_back(key, &v);
    }
  }
}

std::string describe(const toml::node& node) {
  if (node.is_string()) return fmt::format("the string \"{}\"", node.as_string()->get());
  if (node.is_integer()) return fmt::format("the integer {}", node.as_integer()->get());
  if (node.is_floating_point()) return fmt::format("the number {}", node.as_floating_point()->get());
  if (node.is_boolean()) return node.as_boolean()->get() ? "true" : "false";
  if (node.is_array()) return "an array";
  return "a value of another type";
}

std::string quote(const std::string& s) {
  std::ostringstream os;
  os << toml::value<std::string>(s);
  return os.str();
}

}  // namespace

void ConfigSchema::merge_toml_file(const std::string& path) {
  // A config is a small text file: not a device (/dev/zero would be read until memory ran out) nor a pipe.
  constexpr uintmax_t kMaxConfigBytes = 16 << 20;
  std::error_code ec;
  if (!fs::exists(path, ec)) fail("config file '{}' does not exist", path);
  if (fs::is_directory(path, ec)) fail("config file '{}' is a directory: give a TOML file", path);
  if (!fs::is_regular_file(path, ec)) fail("config file '{}' is not a regular file: give a TOML file", path);
  if (fs::file_size(path, ec) > kMaxConfigBytes)
    fail("config file '{}' is larger than {} MiB: is it a TOML config?", path, kMaxConfigBytes >> 20);
  merge_toml(read_file(path), path);
}

void ConfigSchema::merge_toml(std::string_view text, const std::string& origin) {
  toml::table table;
  try {
    table = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    fail("{}:{}:{}: invalid TOML: {}", origin, e.source().begin.line, e.source().begin.column, e.description());
  }
  std::vector<std::pair<std::string, const toml::node*>> leaves;
  walk(table, "", leaves);
  for (const auto& [key, node] : leaves) {
    Field& f = find(key, origin);
    const auto wrong = [&]() {
      fail("{}: key '{}' must be {}, got {}", origin, key, kind_name(static_cast<int>(f.kind)), describe(*node));
    };
    switch (f.kind) {
      case Kind::integer:
        if (!node->is_integer()) wrong();
        *static_cast<int64_t*>(f.ptr) = node->as_integer()->get();
        break;
      case Kind::number:
        if (node->is_integer()) {
          *static_cast<double*>(f.ptr) = static_cast<double>(node->as_integer()->get());
        } else if (node->is_floating_point()) {
          *static_cast<double*>(f.ptr) = node->as_floating_point()->get();
        } else {
          wrong();
        }
        break;
      case Kind::boolean:
        if (!node->is_boolean()) wrong();
        *static_cast<bool*>(f.ptr) = node->as_boolean()->get();
        break;
      case Kind::string:
        if (!node->is_string()) wrong();
        *static_cast<std::string*>(f.ptr) = node->as_string()->get();
        break;
    }
    // Range and choice checks right away, so the message can say where the value came from.
    set_from_text(f, render(f), origin);
  }
}

void ConfigSchema::set_from_text(Field& f, std::string_view value, const std::string& origin) {
  std::string text(value);
  toml::table parsed;
  bool parsed_ok = true;
  try {
    parsed = toml::parse("v = " + text);
  } catch (const toml::parse_error&) {
    parsed_ok = false;
  }
  const toml::node* node = parsed_ok ? parsed.get("v") : nullptr;
  const auto wrong = [&]() {
    fail("{}: key '{}' must be {}, got '{}'", origin, f.key, kind_name(static_cast<int>(f.kind)), text);
  };
  switch (f.kind) {
    case Kind::integer: {
      if (!node || !node->is_integer()) wrong();
      int64_t v = node->as_integer()->get();
      if (v < f.imin || v > f.imax) {
        if (f.imax == INT64_MAX) fail("{}: key '{}' must be >= {}, got {}", origin, f.key, f.imin, v);
        fail("{}: key '{}' must be in [{}, {}], got {}", origin, f.key, f.imin, f.imax, v);
      }
      *static_cast<int64_t*>(f.ptr) = v;
      break;
    }
    case Kind::number: {
      double v = 0;
      if (node && node->is_integer()) {
        v = static_cast<double>(node->as_integer()->get());
      } else if (node && node->is_floating_point()) {
        v = node->as_floating_point()->get();
      } else {
        wrong();
      }
      if (!std::isfinite(v) || v < f.min || v > f.max)
        fail("{}: key '{}' must be in [{}, {}], got {}", origin, f.key, f.min, f.max, v);
      *static_cast<double*>(f.ptr) = v;
      break;
    }
    case Kind::boolean:
      if (!node || !node->is_boolean()) wrong();
      *static_cast<bool*>(f.ptr) = node->as_boolean()->get();
      break;
    case Kind::string: {
      // Overrides may omit the quotes: --set data.dir=data/x
      std::string v = (node && node->is_string()) ? node->as_string()->get() : text;
      if (!f.choices.empty() && std::find(f.choices.begin(), f.choices.end(), v) == f.choices.end())
        fail("{}: key '{}' must be one of {}, got '{}'", origin, f.key, fmt::join(f.choices, ", "), v);
      *static_cast<std::string*>(f.ptr) = v;
      break;
    }
  }
}

void ConfigSchema::apply_override(std::string_view assignment) {
  auto eq = assignment.find('=');
  if (eq == std::string_view::npos || eq == 0)
    fail("--set '{}': expected KEY=VALUE, e.g. --set optim.lr=3e-4", assignment);
  std::string key(assignment.substr(0, eq));
  std::string value(assignment.substr(eq + 1));
  std::string origin = fmt::format("--set {}", assignment);
  set_from_text(find(key, "--set"), value, origin);
}

std::string ConfigSchema::render(const Field& f) const {
  switch (f.kind) {
    case Kind::integer:
      return std::to_string(*static_cast<const int64_t*>(f.ptr));
    case Kind::number: {
      double v = *static_cast<const double*>(f.ptr);
      std::string s = fmt::format("{}", v);
      if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
      return s;
    }
    case Kind::boolean:
      return *static_cast<const bool*>(f.ptr) ? "true" : "false";
    case Kind::string:
      return quote(*static_cast<const std::string*>(f.ptr));
  }
  return {};
}

std::string ConfigSchema::to_toml() const {
  std::map<std::string, std::vector<const Field*>> sections;
  for (const auto& f : fields_) sections[f.key.substr(0, f.key.rfind('.'))].push_back(&f);
  std::string out;
  for (const auto& [section, fields] : sections) {
    out += fmt::format("[{}]\n", section);
    for (const Field* f : fields) out += fmt::format("{} = {}\n", f->key.substr(f->key.rfind('.') + 1), render(*f));
    out += "\n";
  }
  return out;
}

std::map<std::string, std::string> ConfigSchema::flatten() const {
  std::map<std::string, std::string> out;
  for (const auto& f : fields_) out[f.key] = render(f);
  return out;
}

std::string ConfigSchema::help() const {
  std::string out;
  for (const auto& f : fields_) {
    out += fmt::format("  {:<28} = {:<14} {}", f.key, render(f), f.help);
    if (!f.choices.empty()) out += fmt::format(" [{}]", fmt::join(f.choices, "|"));
    out += "\n";
  }
  return out;
}

std::vector<std::string> config_differences(const std::map<std::string, std::string>& a,
                                            const std::map<std::string, std::string>& b,
                                            const std::vector<std::string>& ignore) {
  std::vector<std::string> diffs;
  auto ignored = [&](const std::string& k) { return std::find(ignore.begin(), ignore.end(), k) != ignore.end(); };
  for (const auto& [k, v] : a) {
    if (ignored(k)) continue;
    auto it = b.find(k);
    if (it == b.end()) {
      diffs.push_back(fmt::format("{} ({} vs missing)", k, v));
    } else if (it->second != v) {
      diffs.push_back(fmt::format("{} ({} vs {})", k, v, it->second));
    }
  }
  for (const auto& [k, v] : b)
    if (!ignored(k) && !a.count(k)) diffs.push_back(fmt::format("{} (missing vs {})", k, v));
  return diffs;
}

}  // namespace tributary
