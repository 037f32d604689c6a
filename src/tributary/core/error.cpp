#include "tributary/core/error.h"

namespace tributary {

void internal_failure(const char* file, int line, const std::string& what) {
  throw std::logic_error(
      fmt::format("internal error at {}:{}: {} (this is a bug in Tributary; please report it)", file, line, what));
}

}  // namespace tributary
