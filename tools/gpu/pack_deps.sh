#!/usr/bin/env bash
# Packs the Debian build dependencies that a GPU machine lacks (CLI11, nlohmann-json, toml++, fmt, xxhash,
# SentencePiece, zlib, GoogleTest: headers, CMake configs, libraries) into a prefix, .gpu/deps, that travels with
# the working tree (`carry: [".gpu"]`) and goes on CMAKE_PREFIX_PATH there. The libraries are Debian 12's, built
# with the C++11 ABI that PyTorch 2.x wheels use too. Run here after ./run setup; see tools/gpu/cuda_check.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
D=.gpu/deps
rm -rf "$D"; mkdir -p "$D/include" "$D/lib/x86_64-linux-gnu/cmake" "$D/share/cmake"
mkdir -p "$(git rev-parse --git-dir)/info"; EX="$(git rev-parse --git-dir)/info/exclude"
grep -qx "/.gpu/" "$EX" 2>/dev/null || echo "/.gpu/" >> "$EX"
for h in CLI nlohmann toml++ fmt gtest gmock sentencepiece_processor.h sentencepiece_trainer.h xxh3.h xxhash.h \
         xxh_x86dispatch.h zconf.h zlib.h; do
  cp -a "/usr/include/$h" "$D/include/"
done
L=/usr/lib/x86_64-linux-gnu
cp -a $L/libfmt.so* $L/libtomlplusplus.so* $L/libxxhash.so* $L/libsentencepiece.so* $L/libz.so* \
      $L/libgtest.a $L/libgtest_main.a $L/libgmock.a $L/libgmock_main.a "$D/lib/x86_64-linux-gnu/"
cp -a $L/cmake/fmt $L/cmake/tomlplusplus $L/cmake/GTest "$D/lib/x86_64-linux-gnu/cmake/"
cp -a /usr/share/cmake/CLI11 /usr/share/cmake/nlohmann_json "$D/share/cmake/"
du -sh "$D"

# PyTorch wheels ship c10d's ProcessGroupGloo.hpp but not the Gloo headers it includes. Debian's Gloo (2022) stands
# in: we only construct the group (its code is in libtorch) and read Options, whose layout does not depend on Gloo's
# internals. Its rendezvous::Store predates the "v2" virtuals that c10d's GlooStore overrides, and declares an
# out-of-line destructor; add both, as newer Gloo has them.
cp -a /usr/include/gloo "$D/include/"
python3 - "$D/include/gloo/rendezvous/store.h" <<'PY'
import sys
p = sys.argv[1]; s = open(p).read()
s = s.replace('#include "gloo/common/logging.h"', '#include <cstdint>\n#include "gloo/common/error.h"\n#include "gloo/common/logging.h"')
s = s.replace("virtual ~Store();", "virtual ~Store() = default;")
v2 = '''
  virtual bool has_v2_support() { return false; }
  virtual std::vector<std::vector<char>> multi_get(const std::vector<std::string>&) {
    GLOO_THROW_INVALID_OPERATION_EXCEPTION("this store doesn't support multi_get");
  }
  virtual void multi_set(const std::vector<std::string>&, const std::vector<std::vector<char>>&) {
    GLOO_THROW_INVALID_OPERATION_EXCEPTION("this store doesn't support multi_set");
  }
  virtual void append(const std::string&, const std::vector<char>&) {
    GLOO_THROW_INVALID_OPERATION_EXCEPTION("this store doesn't support append");
  }
  virtual int64_t add(const std::string&, int64_t) {
    GLOO_THROW_INVALID_OPERATION_EXCEPTION("this store doesn't support add");
  }
};
'''
i = s.rindex("};")
s = s[:i] + v2.lstrip("\n") + s[i + 2:]
open(p, "w").write(s)
PY
du -sh "$D"
