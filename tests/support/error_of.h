// The message of the tributary::Error that `f` throws, or "" when it throws none: tests check that bad input is
// refused with a message naming the key, file or rank.
#pragma once

#include <functional>
#include <string>

#include "tributary/core/error.h"

namespace tributary::test_support {

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace tributary::test_support
