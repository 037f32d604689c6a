// A typed configuration tree bound to plain structs. Each field is registered once with its dotted key, help text and
// valid range; TOML files and `--set key=value` overrides are applied on top of the defaults (precedence:
// overrides > file > defaults). Unknown keys, wrong types and out-of-range values raise Error naming the key and
// where it came from. The resolved tree is written back as TOML with every run and checkpoint.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace tributary {

class ConfigSchema {
 public:
  ConfigSchema() = default;
  ConfigSchema(const ConfigSchema&) = delete;  // fields point into the bound struct
  ConfigSchema& operator=(const ConfigSchema&) = delete;

  void add(std::string key, int64_t& field, std::string help, int64_t min = INT64_MIN, int64_t max = INT64_MAX);
  void add(std::string key, double& field, std::string help, double min = -1e300, double max = 1e300);
  void add(std::string key, bool& field, std::string help);
  void add(std::string key, std::string& field, std::string help, std::vector<std::string> choices = {});

  // An old name of `key` that keeps working: each use sets `key` and warns once per process, naming the new key.
  void rename(std::string old_key, std::string key, std::string why);

  void merge_toml_file(const std::string& path);
  void merge_toml(std::string_view text, const std::string& origin);
  void apply_override(std::string_view assignment);  // "optim.lr=3e-4"

  std::string to_toml() const;
  std::map<std::string, std::string> flatten() const;  // key -> value rendered as TOML, for comparing configs
  std::string help() const;                            // every key, its default/current value and help

 private:
  enum class Kind { integer, number, boolean, string };
  struct Field {
    std::string key;
    Kind kind;
    void* ptr;
    std::string help;
    double min = 0, max = 0;
    int64_t imin = 0, imax = 0;
    std::vector<std::string> choices;
  };
  Field& find(const std::string& key, const std::string& origin);
  std::string render(const Field& f) const;
  void set_from_text(Field& f, std::string_view value, const std::string& origin);
  std::vector<Field> fields_;
  struct Renamed {
    std::string old_key, key, why;
  };
  std::vector<Renamed> renamed_;
};

// Keys whose value may differ between two configs that describe the same run (e.g. logging cadence when resuming).
std::vector<std::string> config_differences(const std::map<std::string, std::string>& a,
                                            const std::map<std::string, std::string>& b,
                                            const std::vector<std::string>& ignore = {});

}  // namespace tributary
