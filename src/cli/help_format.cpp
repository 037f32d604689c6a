#include "cli/help_format.h"

#include <fmt/format.h>

#include <regex>

namespace tributary::cli {

std::string readable_bounds(const std::string& description) {
  static const std::regex range(R"(\s*[A-Z]+ in \[(-?[0-9.e+-]+) - (-?[0-9.e+-]+)\]\s*)");
  std::smatch m;
  if (!std::regex_match(description, m, range)) return description;
  const std::string lo = m[1], hi = m[2];
  // A bound of ten digits or more is the type's limit or a sanity cap, not a number a user would aim at.
  if (hi.size() >= 10) return "at least " + lo;
  return lo + " to " + hi;
}

std::string HelpFormatter::make_option_opts(const CLI::Option* opt) const {
  if (!opt->get_option_text().empty() || opt->get_type_size() == 0) return CLI::Formatter::make_option_opts(opt);
  // get_type_name() is the type, then ":" and each validator's description.
  const std::string full = opt->get_type_name();
  std::vector<std::string> notes;
  size_t start = full.find(':');
  std::string out = " " + full.substr(0, start);
  while (start != std::string::npos) {
    const size_t next = full.find(':', start + 1);
    notes.push_back(readable_bounds(full.substr(start + 1, next == std::string::npos ? next : next - start - 1)));
    start = next;
  }
  if (!opt->get_default_str().empty()) notes.push_back("default " + opt->get_default_str());
  if (!notes.empty()) out += fmt::format(" ({})", fmt::join(notes, "; "));
  if (opt->get_expected_max() == CLI::detail::expected_max_vector_size)
    out += " ...";
  else if (opt->get_expected_min() > 1)
    out += " x " + std::to_string(opt->get_expected());
  if (opt->get_required()) out += " REQUIRED";
  return out;
}

}  // namespace tributary::cli
