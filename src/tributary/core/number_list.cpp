#include "tributary/core/number_list.h"

#include <sstream>
#include <stdexcept>

#include "tributary/core/error.h"

namespace tributary {

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

std::vector<double> parse_number_list(const std::string& text, const std::string& key, const std::string& hint) {
  std::vector<double> out;
  for (const std::string& item : split_list(text)) {
    try {
      size_t used = 0;
      out.push_back(std::stod(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      fail("{} = '{}': '{}' is not a number ({})", key, text, item, hint);
    }
  }
  return out;
}

}  // namespace tributary
