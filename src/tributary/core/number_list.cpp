#include "tributary/core/number_list.h"

#include <sstream>
#include <stdexcept>

#include "tributary/core/error.h"

namespace tributary {

std::vector<double> parse_number_list(const std::string& text, const std::string& key, const std::string& hint) {
  std::vector<double> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
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
