#pragma once
// What this build runs on, for `tributary --version` and bug reports: Tributary's own version, the LibTorch it was
// compiled against, the BLAS and thread pool LibTorch computes with, and
// whether CUDA is usable here (device names and count).
#include <string>

namespace tributary {

std::string platform_report();

// The BLAS LibTorch was built with (at::show_config's BLAS_INFO: "mkl" in PyTorch's x86 wheels, linked inside).
std::string libtorch_blas();

}  // namespace tributary
