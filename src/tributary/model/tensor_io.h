// safetensors <-> torch tensors. Weights cross machines and tools only in this format (never pickles).
#pragma once

#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "tributary/core/hash.h"
#include "tributary/core/safetensors.h"

namespace tributary {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// Serialised safetensors bytes of CPU-contiguous copies of `tensors`.
std::string tensors_to_safetensors(const NamedTensors& tensors,
                                   const std::map<std::string, std::string>& metadata = {});
torch::Tensor to_torch(const safetensors::TensorView& view);  // owns a copy

NamedTensors named_parameters_of(const torch::nn::Module& module);
// Feeds the bytes of every tensor (CPU copies, in order) to `hasher`: replicas compare digests to prove they agree.
void hash_tensors(Hasher& hasher, const NamedTensors& tensors);
// Copies every parameter of `module` from `file`. Missing tensors, unexpected tensors and shape mismatches are
// refused with an Error naming the tensor and the file.
void load_parameters(torch::nn::Module& module, const safetensors::File& file);

}  // namespace tributary
