#include "tributary/parallel/data_parallel.h"

namespace tributary {

DataParallel::DataParallel(NamedTensors& params, double bucket_mb, Reducer& reducer) : reducer_(reducer) {
  const int64_t cap = std::max<int64_t>(1, static_cast<int64_t>(bucket_mb * (1 << 20) / 4));
  bucket_of_.assign(params.size(), 0);
  offset_in_bucket_.assign(params.size(), 0);
  int64_t filled = 0;
  for (size_t k = params.size(); k-- > 0;) {
    const int64_t n = params[k].second.numel();
    if (buckets_.empty() || (filled > 0 && filled + n > cap)) {
      buckets_.emplace_back();
      filled = 0;
    }
    bucket_of_[k] = buckets_.size() - 1;
    offset_in_bucket_[k] = static_cast<size_t>(filled);
    buckets_.back().params.push_back(k);
    filled += n;
  }
  for (auto& b : buckets_) {
    int64_t n = 0;
    for (size_t k : b.params) n += params[k].second.numel();
    b.flat = torch::zeros({n}, torch::kFloat32);
  }
  for (size_t k = 0; k < params.size(); ++k)
    params[k].second.register_hook([this, k](torch::Tensor grad) {
      on_gradient(k, grad);
      return grad;
    });
}

void DataParallel::before_backward(bool last_micro_batch, bool single_micro_batch, bool averaging) {
  armed_ = averaging && last_micro_batch && single_micro_batch;
}

void DataParallel::on_gradient(size_t k, const torch::Tensor& grad) {
  if (!armed_) return;
  Bucket& b = buckets_[bucket_of_[k]];
  b.flat.narrow(0, static_cast<int64_t>(offset_in_bucket_[k]), grad.numel())
      .copy_(grad.detach().reshape({-1}).to(torch::kCPU, torch::kFloat32));
  if (++b.ready == static_cast<int64_t>(b.params.size()))
    b.pending = reducer_.start({b.flat}, static_cast<int>(bucket_of_[k]));
}

void DataParallel::after_backward(NamedTensors& params) {
  if (!armed_) {  // gradient accumulation: average once, after the last micro-batch
    std::vector<torch::Tensor> grads;
    for (auto& [name, p] : params) grads.push_back(p.mutable_grad());
    reducer_.wait(reducer_.start(grads, static_cast<int>(buckets_.size())));  // averaged in place (its own stream)
    return;
  }
  torch::NoGradGuard no_grad;
  for (auto& b : buckets_) {
    if (b.ready != static_cast<int64_t>(b.params.size()))  // a parameter without gradient: send what we have
      b.pending = reducer_.start({b.flat}, static_cast<int>(&b - buckets_.data()));
    auto averaged = reducer_.wait(std::move(b.pending))[0];
    for (size_t k : b.params) {
      auto& p = params[k].second;
      p.mutable_grad().copy_(averaged.narrow(0, static_cast<int64_t>(offset_in_bucket_[k]), p.numel()).view(p.sizes()));
    }
    b.ready = 0;
  }
  armed_ = false;
}

}  // namespace tributary
