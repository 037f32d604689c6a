#include "tributary/optim/adamw.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "tributary/core/error.h"
#include "tributary/core/row_split.h"

namespace tributary {

AdamW::AdamW(NamedTensors params, AdamWOptions options) : params_(std::move(params)), options_(options) {
  for (const auto& [name, p] : params_) {
    exp_avg_.push_back(torch::zeros_like(p));
    exp_avg_sq_.push_back(torch::zeros_like(p));
    decay_.push_back(p.dim() >= 2);
  }
  lr_scale_.assign(params_.size(), 1.0);
}

void AdamW::set_lr_scale(const NamedTensors& group, double scale) {
  TRIB_CHECK(scale > 0 && std::isfinite(scale), "learning-rate scale {}", scale);
  for (const auto& [name, tensor] : group) {
    size_t i = 0;
    while (i < params_.size() && !params_[i].second.is_same(tensor)) ++i;
    TRIB_CHECK(i < params_.size(), "'{}' is not a parameter of this optimizer", name);
    lr_scale_[i] = scale;
  }
}

namespace {

// The step as one pass over each element (torch.optim.AdamW's fused=True idea on the CPU): the composite form below
// reads and writes the parameter and both moments in nine passes and allocates two temporaries per parameter, which
// cost ~3% of a step of the 6-layer model. The arithmetic is the composite form's, in float and in its order, so the
// results agree to rounding (not bit for bit: ATen's vector kernels may fuse a multiply-add).
bool fusable(const torch::Tensor& p, const torch::Tensor& g, const torch::Tensor& m, const torch::Tensor& v) {
  for (const auto* t : {&p, &g, &m, &v})
    if (!t->device().is_cpu() || t->layout() != torch::kStrided || t->scalar_type() != torch::kFloat32 ||
        !t->is_contiguous())
      return false;
  return g.numel() == p.numel();
}

struct StepScalars {
  float decay, beta1, one_minus_beta1, beta2, one_minus_beta2, bias_correction2_sqrt, eps, neg_step_size;
};

void fused_step(torch::Tensor& p, const torch::Tensor& g, torch::Tensor& m, torch::Tensor& v, const StepScalars& s) {
  float* pp = p.data_ptr<float>();
  const float* gp = g.data_ptr<float>();
  float* mp = m.data_ptr<float>();
  float* vp = v.data_ptr<float>();
  at::parallel_for(0, p.numel(), 1 << 14, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const float gi = gp[i];
      const float mi = mp[i] * s.beta1 + s.one_minus_beta1 * gi;
      const float vi = vp[i] * s.beta2 + s.one_minus_beta2 * gi * gi;
      const float denom = std::sqrt(vi) / s.bias_correction2_sqrt + s.eps;
      mp[i] = mi;
      vp[i] = vi;
      pp[i] = pp[i] * s.decay + s.neg_step_size * mi / denom;
    }
  });
}

}  // namespace

std::optional<std::vector<AdamW::FusedGroup>> AdamW::fused_groups(bool forced) const {
  std::vector<FusedGroup> groups;
  torch::Tensor first;
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& whole = params_[i].second;
    if (!whole.grad().defined()) continue;
    auto p = rows_of(whole);
    const auto g = rows_of(whole.grad());
    if (p.numel() == 0) continue;
    if (!first.defined()) first = p;
    const bool suits = p.device() == first.device() && p.scalar_type() == first.scalar_type() &&
                       g.scalar_type() == p.scalar_type() && g.device() == p.device() && g.is_contiguous() &&
                       p.is_contiguous() && g.numel() == p.numel();
    if (!suits) {
      TRIB_CHECK(!forced, "AdamW: '{}' does not suit ATen's fused kernel (device, dtype or layout)", params_[i].first);
      return std::nullopt;
    }
    const double wd = decay_[i] ? options_.weight_decay : 0.0;
    auto it = std::find_if(groups.begin(), groups.end(), [&](const FusedGroup& group) {
      return group.lr_scale == lr_scale_[i] && group.weight_decay == wd;
    });
    if (it == groups.end()) it = groups.insert(groups.end(), FusedGroup{lr_scale_[i], wd});
    it->params.push_back(p);
    it->grads.push_back(g);
    it->exp_avgs.push_back(exp_avg_[i]);
    it->exp_avg_sqs.push_back(exp_avg_sq_[i]);
  }
  return groups;
}

void AdamW::write_device_step(const torch::Tensor& like) {
  // The kernel reads the step count (already advanced) from a tensor on the parameters' device, as torch.optim does;
  // written in place, so that a captured step (CUDA graphs) reads each step's count.
  if (!device_step_.defined() || device_step_.device() != like.device())
    device_step_ = torch::empty({}, like.options().dtype(torch::kFloat32));
  device_step_.fill_(double(num_steps_));
}

void AdamW::launch_fused(const FusedGroup& group) const {
  const std::vector<torch::Tensor> steps(group.params.size(), device_step_);
  at::_fused_adamw_(group.params, group.grads, group.exp_avgs, group.exp_avg_sqs, {}, steps, group.lr, options_.beta1,
                    options_.beta2, group.weight_decay, options_.eps, /*amsgrad=*/false, /*maximize=*/false);
}

bool AdamW::aten_fused_step(double lr, bool forced) {
  auto groups = fused_groups(forced);
  if (!groups) return false;
  if (groups->empty()) return true;
  write_device_step(groups->front().params.front());
  for (auto& group : *groups) {
    group.lr = torch::full({}, lr * group.lr_scale, group.params.front().options().dtype(torch::kFloat32));
    launch_fused(group);
  }
  return true;
}

void AdamW::prepare_device_step(double lr) {
  TRIB_CHECK(shard_count_ == 1, "AdamW: a device step (CUDA graphs) cannot be sharded (ZeRO-1 gathers after it)");
  num_steps_ += 1;
  if (device_groups_.empty()) {
    auto groups = fused_groups(/*forced=*/true);
    TRIB_CHECK(!groups->empty(), "AdamW: a device step needs the gradients to exist (run one step before)");
    device_groups_ = std::move(*groups);
    for (auto& group : device_groups_)
      group.lr = torch::empty({}, group.params.front().options().dtype(torch::kFloat32));
  }
  for (auto& group : device_groups_) group.lr.fill_(lr * group.lr_scale);
  write_device_step(device_groups_.front().params.front());
}

void AdamW::device_step() {
  TRIB_CHECK(!device_groups_.empty(), "AdamW::device_step before prepare_device_step");
  for (const auto& group : device_groups_) launch_fused(group);
}

void AdamW::keep_rows(int64_t index, int64_t count, MakeWhole make_whole) {
  TRIB_CHECK(count >= 1 && index >= 0 && index < count && shard_count_ == 1, "AdamW rows {} of {}", index, count);
  shard_index_ = index;
  shard_count_ = count;
  make_whole_ = std::move(make_whole);
  for (size_t i = 0; i < params_.size(); ++i) {
    TRIB_CHECK(params_[i].second.dim() >= 1, "'{}': a scalar parameter cannot be sharded", params_[i].first);
    exp_avg_[i] = rows_of(exp_avg_[i]).clone();
    exp_avg_sq_[i] = rows_of(exp_avg_sq_[i]).clone();
  }
}

torch::Tensor AdamW::rows_of(const torch::Tensor& t) const {
  if (shard_count_ == 1) return t;
  const RowRange r = row_split(t.size(0), shard_index_, shard_count_);
  return t.narrow(0, r.begin, r.rows);
}

void AdamW::step(double lr) {
  torch::NoGradGuard no_grad;
  num_steps_ += 1;
  const auto kernel = options_.kernel;
  const bool off_cpu = std::any_of(params_.begin(), params_.end(), [](const auto& p) { return !p.second.is_cpu(); });
  if ((kernel == AdamWKernel::kATenFused || (kernel == AdamWKernel::kAuto && off_cpu)) &&
      aten_fused_step(lr, kernel == AdamWKernel::kATenFused)) {
    make_whole_after_step();
    return;
  }
  const double b1 = options_.beta1, b2 = options_.beta2;
  const double bias_correction1 = 1.0 - std::pow(b1, double(num_steps_));
  const double bias_correction2_sqrt = std::sqrt(1.0 - std::pow(b2, double(num_steps_)));
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& whole = params_[i].second;
    if (!whole.grad().defined()) continue;
    auto p = rows_of(whole);  // ZeRO-1: this rank's rows; the others arrive through make_whole_
    const auto g = rows_of(whole.grad());
    if (p.numel() == 0) continue;
    const double lr_i = lr * lr_scale_[i];  // exactly lr where the scale is 1
    const double step_size = lr_i / bias_correction1;
    const bool decays = decay_[i] && options_.weight_decay != 0;
    if (kernel != AdamWKernel::kComposite && fusable(p, g, exp_avg_[i], exp_avg_sq_[i])) {
      const StepScalars s{float(decays ? 1.0 - lr_i * options_.weight_decay : 1.0),
                          float(b1),
                          float(1.0 - b1),
                          float(b2),
                          float(1.0 - b2),
                          float(bias_correction2_sqrt),
                          float(options_.eps),
                          float(-step_size)};
      fused_step(p, g, exp_avg_[i], exp_avg_sq_[i], s);
      whole.unsafeGetTensorImpl()->bump_version();  // as an in-place op would: autograd sees the parameter changed
      continue;
    }
    if (decays) p.mul_(1.0 - lr_i * options_.weight_decay);
    exp_avg_[i].mul_(b1).add_(g, 1.0 - b1);
    exp_avg_sq_[i].mul_(b2).addcmul_(g, g, 1.0 - b2);
    auto denom = (exp_avg_sq_[i].sqrt() / bias_correction2_sqrt).add_(options_.eps);
    p.addcdiv_(exp_avg_[i], denom, -step_size);
  }
  make_whole_after_step();
}

void AdamW::make_whole_after_step() {
  if (!make_whole_) return;
  std::vector<torch::Tensor> whole;
  for (const auto& [name, p] : params_) whole.push_back(p.detach());
  make_whole_(whole);
}

double AdamW::held_bytes() const {
  double bytes = 0;
  for (size_t i = 0; i < exp_avg_.size(); ++i) bytes += double(exp_avg_[i].nbytes()) + double(exp_avg_sq_[i].nbytes());
  return bytes;
}

void AdamW::zero_grad() {
  for (auto& [name, p] : params_) {
    auto& g = p.mutable_grad();
    if (g.defined()) g.zero_();
  }
}

NamedTensors AdamW::state() const {
  NamedTensors out;
  std::vector<torch::Tensor> whole;
  for (size_t i = 0; i < params_.size(); ++i) {
    for (auto [suffix, mine] : {std::pair{".exp_avg", &exp_avg_[i]}, std::pair{".exp_avg_sq", &exp_avg_sq_[i]}}) {
      torch::Tensor t = *mine;
      if (shard_count_ > 1) {  // whole-size, this rank's rows filled, the others' by make_whole_
        t = torch::zeros_like(params_[i].second);
        rows_of(t).copy_(*mine);
        whole.push_back(t);
      }
      out.emplace_back(params_[i].first + suffix, t);
    }
  }
  if (!whole.empty()) make_whole_(whole);
  return out;
}

void AdamW::load_state(const safetensors::File& file, int64_t num_steps) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    for (auto [suffix, target] : {std::pair{".exp_avg", &exp_avg_[i]}, std::pair{".exp_avg_sq", &exp_avg_sq_[i]}}) {
      auto name = params_[i].first + suffix;
      auto src = to_torch(file.at(name));
      if (shard_count_ > 1 && src.dim() >= 1) src = rows_of(src);
      if (src.sizes() != target->sizes())
        fail("'{}': optimizer tensor '{}' has the wrong shape: the checkpoint's model config differs", file.origin(),
             name);
      target->copy_(src);
    }
  }
  num_steps_ = num_steps;
}

double clip_grad_norm(const NamedTensors& params, double max_norm) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const auto& [name, p] : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return 0.0;
  // Off the CPU: multi-tensor kernels, one host read. On the CPU the per-tensor form, whose sums the golden runs
  // recorded.
  if (!grads.front().is_cpu()) return clip_grad_norm_on_device(params, max_norm).item<double>();
  std::vector<torch::Tensor> norms;
  for (const auto& g : grads) norms.push_back(g.norm(2));
  const double total = torch::stack(norms).norm(2).item<double>();
  if (max_norm > 0 && total > max_norm) {
    const double scale = max_norm / (total + 1e-6);
    for (auto& g : grads) g.mul_(scale);
  }
  return total;
}

torch::Tensor clip_grad_norm_on_device(const NamedTensors& params, double max_norm) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const auto& [name, p] : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  TRIB_CHECK(!grads.empty(), "clip_grad_norm_on_device: no parameter has a gradient");
  auto total = torch::stack(at::_foreach_norm(grads, 2)).norm(2);
  if (max_norm > 0) at::_foreach_mul_(grads, torch::clamp_max(max_norm / (total + 1e-6), 1.0));
  return total;
}

}  // namespace tributary
