#include "tributary/parallel/local/chunks.h"

#include <cmath>

#include "tributary/core/error.h"
#include "tributary/optim/adamw.h"

namespace tributary::local {

ChunkPlan ChunkPlan::make(int64_t num_blocks, int64_t chunks, const std::string& mode, int64_t overlap_blocks) {
  TRIB_CHECK(chunks >= 1 && num_blocks % chunks == 0, "local.chunks = {} must divide {} blocks", chunks, num_blocks);
  ChunkPlan plan{pipeline::StageLayout::balanced(num_blocks, chunks), 0};
  if (mode == "overlapping" && chunks > 1) {
    TRIB_CHECK(overlap_blocks < num_blocks / chunks, "local.overlap_blocks = {} leaves chunk blocks", overlap_blocks);
    plan.overlap = overlap_blocks;
  }
  return plan;
}

ChunkForward chunk_forward(Transformer& model, const ChunkPlan& plan, int64_t chunk, const torch::Tensor& x) {
  const int64_t begin = plan.layout.begin(chunk), end = plan.layout.end(chunk);
  const bool split = plan.overlap > 0 && chunk + 1 < plan.chunks();  // the last chunk has no next loss
  if (!split) return {model.blocks(x, begin, end), {}, {}};
  ChunkForward f;
  f.below = model.blocks(x, begin, end - plan.overlap);
  f.split = f.below.detach().requires_grad_(true);
  f.y = model.blocks(f.split, end - plan.overlap, end);
  return f;
}

torch::Tensor chunk_loss(Transformer& model, AuxHeads& heads, const ChunkPlan& plan, int64_t chunk,
                         const torch::Tensor& y, const torch::Tensor& targets) {
  const bool last = chunk + 1 == plan.chunks();
  return Transformer::loss(last ? model.logits(y) : heads.head(chunk).forward(y, model.rope_cos(), model.rope_sin()),
                           targets);
}

void chunk_backward(const torch::Tensor& loss, const ChunkForward& f, double weight, int64_t divisor) {
  torch::Tensor scaled = loss;
  if (weight != 1.0) scaled = scaled * weight;
  if (divisor > 1) scaled = scaled / double(divisor);
  if (!f.split.defined()) return scaled.backward();
  scaled.backward({}, /*retain_graph=*/true);  // the graph above `split` takes the next chunk's gradient later
  f.below.backward(f.split.grad());
  f.split.mutable_grad() = torch::Tensor();  // what arrives at `split` from the next chunk goes nowhere
}

std::vector<double> local_forward_backward(Transformer& model, AuxHeads& heads, const ChunkPlan& plan,
                                           const torch::Tensor& tokens, const torch::Tensor& targets,
                                           const std::vector<double>& weights, int64_t divisor) {
  const int64_t K = plan.chunks();
  TRIB_CHECK(static_cast<int64_t>(weights.size()) == K);
  std::vector<double> losses(static_cast<size_t>(K));
  torch::Tensor previous_y;  // chunk k-1's output, its graph above `split` kept (overlapping)
  for (int64_t k = 0; k < K; ++k) {
    torch::Tensor x = k == 0 ? model.embed(tokens) : previous_y.detach();
    if (k > 0 && plan.overlap > 0) x.requires_grad_(true);  // L_k's gradient at the input goes back to chunk k-1
    const ChunkForward f = chunk_forward(model, plan, k, x);
    const torch::Tensor loss = chunk_loss(model, heads, plan, k, f.y, targets);
    losses[size_t(k)] = loss.item<double>();
    chunk_backward(loss, f, weights[size_t(k)], divisor);
    if (k > 0 && plan.overlap > 0) previous_y.backward(x.grad());  // through chunk k-1's last o blocks only
    previous_y = f.y;
  }
  return losses;
}

std::vector<NamedTensors> clip_groups(const NamedTensors& model_params, const NamedTensors& aux_params,
                                      const ChunkPlan& plan, int64_t blocks_per_level, bool tied_embeddings) {
  const int64_t K = plan.chunks();
  if (K == 1) return {model_params};
  std::vector<NamedTensors> groups;
  NamedTensors tied;
  for (int64_t k = 0; k < K; ++k) {
    NamedTensors group;
    for (auto& [name, t] : pipeline::stage_params(model_params, plan.layout, k, blocks_per_level, tied_embeddings)) {
      if (tied_embeddings && name == pipeline::kTiedEmbedding) {
        if (k == 0) tied.emplace_back(name, t);
        continue;
      }
      group.emplace_back(name, t);
    }
    const std::string prefix = fmt::format("aux.{}.", k);
    for (const auto& [name, t] : aux_params)
      if (name.rfind(prefix, 0) == 0) group.emplace_back(name, t);
    groups.push_back(std::move(group));
  }
  if (!tied.empty()) groups.push_back(std::move(tied));
  return groups;
}

std::vector<NamedTensors> clip_groups(const Transformer& model, const AuxHeads& heads, const ChunkPlan& plan) {
  return clip_groups(named_parameters_of(model), named_parameters_of(heads), plan, model.config().blocks_per_level(),
                     model.config().tie_embeddings);
}

void set_chunk_lr_scales(AdamW& optimizer, const std::vector<NamedTensors>& groups,
                         const std::vector<int64_t>& chunk_of, const std::vector<double>& scales) {
  if (scales.empty()) return;
  TRIB_CHECK(chunk_of.size() == groups.size(), "{} chunk numbers for {} groups", chunk_of.size(), groups.size());
  for (size_t g = 0; g < groups.size(); ++g) optimizer.set_lr_scale(groups[g], scales.at(size_t(chunk_of[g])));
}

double clip_chunks(const std::vector<NamedTensors>& groups, double max_norm) {
  double squared = 0;
  for (const auto& group : groups) {
    const double norm = clip_grad_norm(group, max_norm);
    squared += norm * norm;
  }
  return std::sqrt(squared);
}

}  // namespace tributary::local
