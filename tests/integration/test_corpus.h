// The integration tests' corpus (a small slice of the built-in one) when the CTest fixture testdata.build did not
// make it: a test binary run on its own builds it at the first test that needs it.
#pragma once

#include "tributary/core/fs.h"
#include "tributary/data/dataset.h"

namespace tributary::test_support {

inline void ensure_test_corpus(const fs::path& dir) {
  if (!fs::exists(dir / "dataset.json"))
    build_dataset(build_default_corpus({.max_bytes_per_domain = 300 << 10}), dir, {.val_permille = 50});
}

}  // namespace tributary::test_support
