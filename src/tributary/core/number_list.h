// A comma-separated list of numbers in one config value ("3,5" blocks per stage, "1,0.5" learning-rate multipliers).
#pragma once

#include <string>
#include <vector>

namespace tributary {

// The items of a comma-separated list, each as written (empty items kept); empty text: {}.
std::vector<std::string> split_list(const std::string& text);
// Each item parsed whole; Error "<key> = '<text>': '<item>' is not a number (<hint>)" otherwise. Empty text: {}.
std::vector<double> parse_number_list(const std::string& text, const std::string& key, const std::string& hint);

}  // namespace tributary
