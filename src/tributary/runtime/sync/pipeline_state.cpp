#include "tributary/runtime/sync/pipeline_state.h"

#include <set>

namespace tributary {

PipelineState::PipelineState(NamedTensors& params, AdamW& optimizer, const pipeline::StageLayout& layout, int64_t stage,
                             int64_t blocks_per_level, bool tied_embeddings, Broadcast broadcast)
    : broadcast_(std::move(broadcast)), tensors_(params), num_params_(params.size()) {
  for (int64_t s = 0; s < layout.stages(); ++s) {
    const size_t first = tensors_.size();
    if (s == stage) {
      for (auto& t : optimizer.state()) tensors_.push_back(std::move(t));  // the moments themselves: filled in place
    } else {
      // The order AdamW::state() has on stage s: per parameter, its first then its second moment.
      for (const auto& [name, p] : pipeline::stage_params(params, layout, s, blocks_per_level, tied_embeddings))
        for (const char* suffix : {".exp_avg", ".exp_avg_sq"})
          tensors_.emplace_back(name + suffix, torch::zeros_like(p));
    }
    stage_range_.emplace_back(first, tensors_.size());
  }
}

void PipelineState::broadcast(std::vector<torch::Tensor>& tensors, int root) {
  std::vector<torch::Tensor> buffers;
  for (const auto& t : tensors) buffers.push_back(t.detach().to(torch::kCPU).contiguous());
  broadcast_(buffers, root);
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < tensors.size(); ++i)
    if (!buffers[i].is_same(tensors[i])) tensors[i].copy_(buffers[i]);
}

void PipelineState::gather_moments() {
  for (size_t s = 0; s < stage_range_.size(); ++s) {
    const auto [first, end] = stage_range_[s];
    std::vector<torch::Tensor> moments;
    for (size_t i = first; i < end; ++i) moments.push_back(tensors_[i].second);
    broadcast(moments, int(s));
  }
}

void PipelineState::from_lead() {
  std::vector<torch::Tensor> all;
  for (auto& [name, t] : tensors_) all.push_back(t.detach());
  broadcast(all, 0);
}

NamedTensors PipelineState::moments() const {
  NamedTensors out;
  std::set<std::string> seen;
  for (size_t i = num_params_; i < tensors_.size(); ++i)
    if (seen.insert(tensors_[i].first).second) out.push_back(tensors_[i]);
  return out;
}

}  // namespace tributary

namespace tributary {

std::vector<double> PipelineState::moment_sums() const {
  std::vector<double> out;
  for (const auto& [first, end] : stage_range_) {
    double sum = 0;
    for (size_t i = first; i < end; ++i) sum += tensors_[i].second.abs().sum().item<double>();
    out.push_back(sum);
  }
  return out;
}

}  // namespace tributary
