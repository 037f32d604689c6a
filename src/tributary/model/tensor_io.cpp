#include "tributary/model/tensor_io.h"

#include "tributary/core/error.h"

namespace tributary {
namespace {

safetensors::DType to_st_dtype(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat32:
      return safetensors::DType::F32;
    case torch::kFloat64:
      return safetensors::DType::F64;
    case torch::kFloat16:
      return safetensors::DType::F16;
    case torch::kBFloat16:
      return safetensors::DType::BF16;
    case torch::kInt64:
      return safetensors::DType::I64;
    case torch::kInt32:
      return safetensors::DType::I32;
    case torch::kInt16:
      return safetensors::DType::I16;
    case torch::kInt8:
      return safetensors::DType::I8;
    case torch::kUInt8:
      return safetensors::DType::U8;
    case torch::kBool:
      return safetensors::DType::BOOL;
    default:
      fail("cannot store tensor dtype {} in safetensors", c10::toString(t));
  }
}

torch::ScalarType to_torch_dtype(safetensors::DType d) {
  switch (d) {
    case safetensors::DType::F32:
      return torch::kFloat32;
    case safetensors::DType::F64:
      return torch::kFloat64;
    case safetensors::DType::F16:
      return torch::kFloat16;
    case safetensors::DType::BF16:
      return torch::kBFloat16;
    case safetensors::DType::I64:
      return torch::kInt64;
    case safetensors::DType::I32:
      return torch::kInt32;
    case safetensors::DType::I16:
      return torch::kInt16;
    case safetensors::DType::I8:
      return torch::kInt8;
    case safetensors::DType::U8:
      return torch::kUInt8;
    case safetensors::DType::BOOL:
      return torch::kBool;
    default:
      fail("safetensors dtype {} has no torch equivalent here", safetensors::dtype_name(d));
  }
}

}  // namespace

std::string tensors_to_safetensors(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata) {
  std::vector<torch::Tensor> keep;
  std::vector<safetensors::Entry> entries;
  for (const auto& [name, t] : tensors) {
    auto c = t.detach().to(torch::kCPU).contiguous();
    keep.push_back(c);
    entries.push_back({name, to_st_dtype(c.scalar_type()), c.sizes().vec(), c.data_ptr(),
                       static_cast<size_t>(c.numel()) * c.element_size()});
  }
  return safetensors::serialize(entries, metadata);
}

torch::Tensor to_torch(const safetensors::TensorView& view) {
  auto out = torch::empty(view.shape, torch::TensorOptions().dtype(to_torch_dtype(view.dtype)));
  std::memcpy(out.data_ptr(), view.data, view.num_bytes);
  return out;
}

NamedTensors named_parameters_of(const torch::nn::Module& module) {
  NamedTensors out;
  for (const auto& item : module.named_parameters()) out.emplace_back(item.key(), item.value());
  return out;
}

void load_parameters(torch::nn::Module& module, const safetensors::File& file) {
  torch::NoGradGuard no_grad;
  auto params = module.named_parameters();
  for (const auto& item : params) {
    const auto& name = item.key();
    if (!file.contains(name))
      fail("'{}' has no tensor '{}': the checkpoint was written by a different model configuration", file.origin(),
           name);
    auto src = to_torch(file.at(name));
    if (src.sizes() != item.value().sizes())
      fail("'{}': tensor '{}' has shape {} but the model expects {}: the checkpoint's model config differs",
           file.origin(), name, fmt::format("{}", fmt::join(src.sizes(), "x")),
           fmt::format("{}", fmt::join(item.value().sizes(), "x")));
    item.value().copy_(src);
  }
  for (const auto& [name, view] : file.tensors())
    if (!params.contains(name))
      fail("'{}' holds tensor '{}' that the model does not have: the checkpoint's model config differs", file.origin(),
           name);
}

void hash_tensors(Hasher& hasher, const NamedTensors& tensors) {
  for (const auto& [name, t] : tensors) {
    auto c = t.detach().to(torch::kCPU).contiguous();
    hasher.update(c.data_ptr(), static_cast<size_t>(c.numel()) * c.element_size());
  }
}

}  // namespace tributary
