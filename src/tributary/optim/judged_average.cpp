#include "tributary/optim/judged_average.h"

#include "tributary/core/error.h"
#include "tributary/core/log.h"

namespace tributary {

int64_t JudgedAverage::average(comm::Exchange& exchange, comm::Group& group, std::vector<torch::Tensor>& tensors,
                               const std::vector<int>& ids, int epoch, const std::string& noun, int64_t number,
                               Adversary* adversary, int stream) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> parts;
  for (const auto& t : tensors) parts.push_back(t.detach().reshape({-1}).to(torch::kFloat32));
  const auto gathered = exchange.gather(torch::cat(parts));
  TRIB_CHECK(ids.size() == gathered.size(), "{} participants' ids for {} gathered updates", ids.size(),
             gathered.size());
  if (epoch != epoch_) {  // a joiner has no fingerprints: nor do the others
    aggregate_.forget_fingerprints();
    epoch_ = epoch;
  }
  if (adversary) adversary->saw(gathered[size_t(group.rank() + 1) % gathered.size()], stream);
  std::vector<double> improvements;
  const bool probing = jury_ && jury_->applies(gathered[size_t(group.rank())].numel());
  if (probing) improvements = jury_->improvements(exchange, group.rank(), gathered, number);
  const Aggregated a = aggregate_.combine(gathered, ids, probing ? &improvements : nullptr);
  if (group.rank() == 0) {
    for (const Refusal& r : a.refused)
      log::warn("{} {}'s update refused in exchange {} ({} of {} accepted, dist.aggregate = {}): {}", noun,
                ids[r.participant], number, a.accepted, gathered.size(), aggregate_.options().rule, r.reason);
    for (int id : a.evicted)
      log::warn("{} {} evicted in exchange {}: its updates are refused from now on (dist.evict_after = {})", noun, id,
                number, aggregate_.options().evict_after);
  }
  for (const Refusal& r : a.refused)  // the participant itself learns why, once
    if (r.participant == group.rank() && r.reason.rfind("evicted", 0) == 0 && !told_evicted_) {
      told_evicted_ = true;
      log::error("this {} ({} {}) was evicted by the others; its updates no longer count: {}", noun, noun,
                 ids[r.participant], r.reason);
    }
  {
    std::lock_guard<std::mutex> lock(scores_mutex_);
    scores_.clear();
    for (size_t i = 0; i < ids.size(); ++i) scores_[ids[i]] = a.scores[i];
  }
  int64_t offset = 0;
  for (auto& t : tensors) {
    const int64_t n = t.numel();
    t.copy_(a.value.narrow(0, offset, n).view(t.sizes()));
    offset += n;
  }
  return int64_t(a.refused.size());
}

void JudgedAverage::adopt(RobustAggregate::Verdicts v, int epoch) {
  aggregate_.adopt(std::move(v));
  epoch_ = epoch;
}

}  // namespace tributary
