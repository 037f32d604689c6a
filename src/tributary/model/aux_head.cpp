#include "tributary/model/aux_head.h"

#include <cmath>

namespace tributary {

AuxHeadImpl::AuxHeadImpl(const ModelConfig& config, int64_t num_blocks) {
  auto list = register_module("blocks", std::make_shared<torch::nn::Module>());
  for (int64_t b = 0; b < num_blocks; ++b)
    blocks.push_back(list->register_module(std::to_string(b), std::make_shared<BlockImpl>(config)));
  norm = register_module("norm", std::make_shared<RMSNormImpl>(config.width, config.norm_eps));
  proj =
      register_module("proj", torch::nn::Linear(torch::nn::LinearOptions(config.width, config.vocab_size).bias(false)));
}

torch::Tensor AuxHeadImpl::forward(torch::Tensor x, const torch::Tensor& rope_cos, const torch::Tensor& rope_sin) {
  for (auto& block : blocks) x = block->forward(x, rope_cos, rope_sin);
  return proj->forward(norm->forward(x));
}

AuxHeads::AuxHeads(const ModelConfig& config, int64_t chunks, int64_t blocks_per_head) {
  auto list = register_module("aux", std::make_shared<torch::nn::Module>());
  torch::NoGradGuard no_grad;
  const double std = config.init_std;
  // The private blocks sit on top of the chunk's residual stream like the model's: same residual scaling.
  const double residual_std = std / std::sqrt(2.0 * double(config.num_layers));
  for (int64_t k = 0; k + 1 < chunks; ++k) {
    auto head = list->register_module(std::to_string(k), std::make_shared<AuxHeadImpl>(config, blocks_per_head));
    for (auto& block : head->blocks) init_block(*block, std, residual_std);
    head->norm->weight.fill_(1.0);
    head->proj->weight.normal_(0.0, std);
    heads_.push_back(head);
  }
}

int64_t AuxHeads::num_matmul_parameters() const {
  int64_t n = 0;
  for (const auto& p : parameters())
    if (p.dim() >= 2) n += p.numel();
  return n;
}

int64_t AuxHeads::num_blocks() const {
  int64_t n = 0;
  for (const auto& head : heads_) n += static_cast<int64_t>(head->blocks.size());
  return n;
}

}  // namespace tributary
