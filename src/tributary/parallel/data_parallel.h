// Data parallel (DDP): gradients averaged across replicas every step. Parameters are grouped into buckets of
// <= bucket_mb in reverse order (the order backward produces their gradients; a parameter larger than that gets a
// bucket of its own); a hook per parameter copies its gradient into its bucket and starts the bucket's all-reduce
// (Reducer::start) as soon as the bucket is complete, so communication overlaps the backward pass. With
// gradient accumulation the gradients are averaged once, after the last micro-batch.
#pragma once

#include <torch/torch.h>

#include <future>
#include <vector>

#include "tributary/model/tensor_io.h"
#include "tributary/optim/reducer.h"

namespace tributary {

class DataParallel {
 public:
  // Registers the gradient hooks on `params` (they stay registered; they act only while armed).
  DataParallel(NamedTensors& params, double bucket_mb, Reducer& reducer);
  // Before each micro-batch's backward: the hooks are armed for the last micro-batch of a single-micro-batch step.
  void before_backward(bool last_micro_batch, bool single_micro_batch, bool averaging);
  void after_backward(NamedTensors& params);  // every gradient is the replicas' average afterwards

 private:
  struct Bucket {
    std::vector<size_t> params;
    torch::Tensor flat;
    int64_t ready = 0;
    std::future<std::vector<torch::Tensor>> pending;
  };
  void on_gradient(size_t param, const torch::Tensor& grad);

  Reducer& reducer_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_, offset_in_bucket_;
  bool armed_ = false;
};

}  // namespace tributary
