// Precompiled header for every translation unit that uses LibTorch. Only the targets that link `tributary`
// pay for it; core/ and sched/ never include torch.
#pragma once
#include <torch/torch.h>
