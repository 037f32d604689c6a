#include "tributary/model/eval.h"

#include "tributary/core/error.h"

namespace tributary {

torch::Tensor per_token_loss(Transformer& model, const torch::Tensor& units, int64_t prefix,
                             const torch::Device& device, int64_t batch) {
  torch::NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  const int64_t T = units.size(1) - 1;
  const int64_t first = std::max<int64_t>(0, prefix - 1);
  std::vector<torch::Tensor> out;
  for (int64_t i = 0; i < units.size(0); i += batch) {
    auto chunk = units.narrow(0, i, std::min(batch, units.size(0) - i)).to(device);
    auto logits = model.forward(chunk.narrow(1, 0, T)).narrow(1, first, T - first);
    auto targets = chunk.narrow(1, 1 + first, T - first);
    auto loss =
        torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}),
                                             torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
    out.push_back(loss.reshape({chunk.size(0), -1}).to(torch::kCPU, torch::kFloat32));
  }
  if (was_training) model.train();
  return torch::cat(out);
}

UnitLoss evaluate_units(Transformer& model, const torch::Tensor& units, int64_t prefix, const torch::Device& device,
                        int64_t batch) {
  auto losses = per_token_loss(model, units, prefix, device, batch);
  return {losses.to(torch::kFloat64).sum().item<double>(), losses.numel()};
}

std::vector<int32_t> generate(Transformer& model, const std::vector<int32_t>& prompt_ids, int32_t eot_id,
                              const GenerateOptions& options, const torch::Device& device) {
  torch::NoGradGuard no_grad;
  auto generator = at::detail::createCPUGenerator(options.seed);
  std::vector<int64_t> ids(prompt_ids.begin(), prompt_ids.end());
  if (ids.empty()) ids.push_back(eot_id);  // an empty prompt starts a new document
  std::vector<int32_t> out;
  const int64_t context = model.config().context;
  for (int64_t i = 0; i < options.max_new_tokens; ++i) {
    int64_t start = std::max<int64_t>(0, static_cast<int64_t>(ids.size()) - context);
    auto input = torch::tensor(std::vector<int64_t>(ids.begin() + start, ids.end()), torch::kInt64).unsqueeze(0);
    auto logits = model.forward(input.to(device)).select(1, -1).squeeze(0).to(torch::kCPU).to(torch::kFloat64);  // (V)
    int64_t next;
    if (options.temperature <= 0) {
      next = logits.argmax().item<int64_t>();
    } else {
      logits = logits / options.temperature;
      if (options.top_k > 0 && options.top_k < logits.size(0)) {
        auto kth = std::get<0>(logits.topk(options.top_k)).min();
        logits = logits.masked_fill(logits < kth, -std::numeric_limits<double>::infinity());
      }
      auto probs = torch::softmax(logits, 0);
      next = at::multinomial(probs, 1, false, generator).item<int64_t>();
    }
    if (options.stop_at_eot && next == eot_id) break;
    ids.push_back(next);
    out.push_back(static_cast<int32_t>(next));
  }
  return out;
}

}  // namespace tributary
