// Mixed precision (train.precision = "bf16"): while an Autocast lives, LibTorch's autocast runs the matmuls of the
// forward pass in bf16 on the tensors' device (CPU or CUDA), the ops it keeps in fp32 in fp32; parameters, gradients,
// AdamW state and pseudo-gradients stay fp32 (the master copies). Scope it around the forward pass only: the loss is
// taken on fp32 logits and the backward pass follows the forward's dtypes by itself, as with torch.autocast.
#pragma once

#include <ATen/autocast_mode.h>

namespace tributary {

class Autocast {
 public:
  Autocast(bool bf16, c10::DeviceType device) : on_(bf16), device_(device) {
    if (!on_) return;
    was_enabled_ = at::autocast::is_autocast_enabled(device_);
    was_dtype_ = at::autocast::get_autocast_dtype(device_);
    at::autocast::set_autocast_enabled(device_, true);
    at::autocast::set_autocast_dtype(device_, at::kBFloat16);
    at::autocast::increment_nesting();
  }
  ~Autocast() {
    if (!on_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();  // the bf16 copies of the weights
    at::autocast::set_autocast_enabled(device_, was_enabled_);
    at::autocast::set_autocast_dtype(device_, was_dtype_);
  }
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  bool on_;
  c10::DeviceType device_;
  bool was_enabled_ = false;
  at::ScalarType was_dtype_ = at::kBFloat16;
};

}  // namespace tributary
