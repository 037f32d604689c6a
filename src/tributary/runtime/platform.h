#pragma once
// What this build runs on, for `tributary --version` and bug reports: Tributary's own version, the LibTorch it was
// compiled against, the BLAS and thread pool LibTorch computes with, and
// whether CUDA is usable here (device names and count).
#include <string>

namespace tributary {

std::string platform_report();

}  // namespace tributary
