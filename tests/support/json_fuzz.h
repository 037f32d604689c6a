// Seeded structural mutations of a JSON document, for fuzz tests of the files a user can hand us or corrupt
// (dataset.json, plan cluster/workload files, ...): each mutation deletes a member, swaps a value for one of another
// type or an extreme number, or damages the text. Deterministic for a seed.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <typeinfo>
#include <vector>

#include "tributary/core/error.h"
#include "tributary/core/rng.h"

namespace tributary::test_support {

inline void collect_pointers(const nlohmann::json& j, const nlohmann::json::json_pointer& at,
                             std::vector<nlohmann::json::json_pointer>& out) {
  out.push_back(at);
  if (j.is_object())
    for (auto it = j.begin(); it != j.end(); ++it) collect_pointers(*it, at / it.key(), out);
  if (j.is_array())
    for (size_t i = 0; i < j.size(); ++i) collect_pointers(j[i], at / i, out);
}

inline std::string mutate_json(const nlohmann::json& valid, SplitMix64& rng) {
  static const std::vector<nlohmann::json> replacements = {nullptr,
                                                           true,
                                                           "text",
                                                           "../../etc/passwd",
                                                           "/abs/path",
                                                           -1,
                                                           0,
                                                           1,
                                                           2147483648LL,
                                                           -9223372036854775807LL,
                                                           1e308,
                                                           -1e308,
                                                           0.5,
                                                           nlohmann::json::array(),
                                                           nlohmann::json::object(),
                                                           nlohmann::json::array({1, "x"}),
                                                           std::string(300, 'a')};
  nlohmann::json j = valid;
  const int mutations = 1 + static_cast<int>(rng.below(3));
  for (int m = 0; m < mutations; ++m) {
    std::vector<nlohmann::json::json_pointer> pointers;
    collect_pointers(j, nlohmann::json::json_pointer(), pointers);
    const auto& at = pointers[rng.below(pointers.size())];
    const uint64_t kind = rng.below(4);
    if (kind == 0 && !at.empty()) {  // delete the member or element
      auto parent = at.parent_pointer();
      if (j.at(parent).is_object())
        j.at(parent).erase(at.back());
      else if (j.at(parent).is_array() && !j.at(parent).empty())
        j.at(parent).erase(j.at(parent).begin());
    } else if (kind == 1 && j.at(at).is_number()) {  // a nearby or extreme number of the same kind
      const double v = j.at(at).get<double>();
      const double choices[] = {-v, v * 1e6, v + 1, v - 1, 0, -1};
      j.at(at) = j.at(at).is_number_integer() ? nlohmann::json(static_cast<int64_t>(choices[rng.below(6)]))
                                              : nlohmann::json(choices[rng.below(6)]);
    } else {
      j.at(at) = replacements[rng.below(replacements.size())];
    }
  }
  std::string text = j.dump();
  if (rng.below(8) == 0) text = text.substr(0, rng.below(text.size() + 1));  // a torn write
  if (rng.below(8) == 0 && !text.empty()) text[rng.below(text.size())] = static_cast<char>(rng.below(256));
  return text;
}

// Runs `load`: "ok", "error" (a tributary::Error naming `origin`), or a description of the bug (an Error that does not
// name it, or another exception type escaping: exit 3 in the CLI).
template <typename Load>
std::string fuzz_outcome(const std::string& origin, Load&& load) {
  try {
    load();
    return "ok";
  } catch (const Error& e) {
    return std::string(e.what()).find(origin) != std::string::npos ? "error" : "unnamed: " + std::string(e.what());
  } catch (const std::exception& e) {
    return "escaped " + std::string(typeid(e).name()) + ": " + e.what();
  }
}

}  // namespace tributary::test_support
