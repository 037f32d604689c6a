#include "tributary/model/param_name.h"

#include <charconv>
#include <string_view>

namespace tributary {
namespace {

// Reads "<word>.<number>." at the front of `s`; advances past it.
bool take_indexed(std::string_view& s, std::string_view word, int64_t& out) {
  if (s.substr(0, word.size()) != word || s.size() <= word.size() || s[word.size()] != '.') return false;
  std::string_view rest = s.substr(word.size() + 1);
  const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), out);
  if (ec != std::errc() || end == rest.data() || end == rest.data() + rest.size() || *end != '.' || out < 0)
    return false;
  s = std::string_view(end + 1, size_t(rest.data() + rest.size() - end - 1));
  return true;
}

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

}  // namespace

std::optional<ParamPlace> parse_param_name(const std::string& name) {
  std::string_view s(name);
  ParamPlace p;
  if (starts_with(s, "embed_tok.") || starts_with(s, "embed_pos.")) return p;
  if (starts_with(s, "final_norm.") || starts_with(s, "head.")) {
    p.part = ParamPlace::Part::Final;
    return p;
  }
  if (take_indexed(s, "levels", p.level) && take_indexed(s, "modules", p.module) &&
      take_indexed(s, "blocks", p.block)) {
    p.part = ParamPlace::Part::Block;
    p.rest = std::string(s);
    return p;
  }
  return std::nullopt;
}

std::string with_module_index(const std::string& name, int64_t to) {
  std::string_view s(name);
  int64_t level = 0, module = 0;
  if (!take_indexed(s, "levels", level) || !take_indexed(s, "modules", module)) return name;
  return "levels." + std::to_string(level) + ".modules." + std::to_string(to) + "." + std::string(s);
}

}  // namespace tributary
