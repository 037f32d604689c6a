#!/usr/bin/env bash
# Packs the Debian build dependencies that a GPU machine without network access lacks (CLI11, nlohmann-json, toml++, fmt, xxhash,
# SentencePiece, PCRE2, utf8proc, zlib, GoogleTest, OpenSSL's libcrypto: headers, CMake configs, libraries) into a prefix, .gpu/deps, that travels with
# the working tree (`carry: [".gpu"]`) and goes on CMAKE_PREFIX_PATH there. The libraries are Debian 12's, built
# with the C++11 ABI that PyTorch 2.x wheels use too. Run here after ./run setup; see tools/gpu/cuda_check.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
D=.gpu/deps
rm -rf "$D"; mkdir -p "$D/include" "$D/lib/x86_64-linux-gnu/cmake" "$D/share/cmake"
mkdir -p "$(git rev-parse --git-dir)/info"; EX="$(git rev-parse --git-dir)/info/exclude"
grep -qx "/.gpu/" "$EX" 2>/dev/null || echo "/.gpu/" >> "$EX"
for h in CLI nlohmann toml++ fmt gtest sentencepiece_processor.h sentencepiece_trainer.h xxh3.h xxhash.h \
         xxh_x86dispatch.h zconf.h zlib.h pcre2.h utf8proc.h; do
  cp -a "/usr/include/$h" "$D/include/"
done
L=/usr/lib/x86_64-linux-gnu
# OpenSSL: the run secret's cipher (comm/sealed_store); Debian keeps two of its headers in the multiarch folder.
cp -a /usr/include/openssl "$D/include/"
cp -a /usr/include/x86_64-linux-gnu/openssl/. "$D/include/openssl/"
cp -a $L/libfmt.so* $L/libtomlplusplus.so* $L/libxxhash.so* $L/libsentencepiece.so* $L/libsentencepiece_train.so* $L/libz.so* \
      $L/libpcre2-8.so* $L/libutf8proc.so* \
      $L/libcrypto.so* $L/libssl.so* \
      $L/libgtest.a $L/libgtest_main.a "$D/lib/x86_64-linux-gnu/"
cp -a $L/cmake/fmt $L/cmake/tomlplusplus $L/cmake/GTest "$D/lib/x86_64-linux-gnu/cmake/"
cp -a /usr/share/cmake/CLI11 /usr/share/cmake/nlohmann_json "$D/share/cmake/"
du -sh "$D"

# Gloo's headers, as ./run setup gets them on a networked machine (libgloo-dev): CMakeLists.txt explains why Debian's
# stand in for the wheel's and the test gloo.abi proves no code of ours is compiled from them.
cp -a /usr/include/gloo "$D/include/"
du -sh "$D"
