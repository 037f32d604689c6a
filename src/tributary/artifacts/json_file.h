// JSON files a user can hand us or corrupt (route.json, dipaco.json, a best-path record): parse and read them so
// that a syntax error, a missing key or a wrong type is an Error naming the file and what to do, never a bug exit.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "tributary/core/error.h"
#include "tributary/core/fs.h"

namespace tributary {

// `use(json)` reads the parsed file; a json exception inside it (missing key, wrong type) names the file too.
template <typename Use>
auto with_json_file(const fs::path& file, const std::string& remedy, Use&& use) {
  try {
    return use(nlohmann::json::parse(read_file(file)));
  } catch (const nlohmann::json::exception& e) {
    fail("'{}' is not a valid file of its kind ({}); {}", file.string(), e.what(), remedy);
  }
}

}  // namespace tributary
