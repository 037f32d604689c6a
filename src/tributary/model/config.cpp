#include "tributary/model/config.h"

namespace tributary {

int64_t ModelConfig::resolved_mlp_hidden() const {
  if (mlp_hidden > 0) return mlp_hidden;
  if (mlp == "gelu") return 4 * width;
  int64_t h = (8 * width + 2) / 3;
  return (h + 63) / 64 * 64;
}


}  // namespace tributary
