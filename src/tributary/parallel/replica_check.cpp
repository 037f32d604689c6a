#include "tributary/parallel/replica_check.h"

#include <fmt/format.h>

#include "tributary/core/error.h"
#include "tributary/core/hash.h"
#include "tributary/core/log.h"

namespace tributary {
namespace {

torch::Tensor parameter_hash(const NamedTensors& params) {
  Hasher h;
  hash_tensors(h, params);
  return torch::tensor({static_cast<int64_t>(h.digest())}, torch::kInt64);
}

void compare_hashes(const std::vector<torch::Tensor>& all, const std::string& when) {
  std::vector<int> differ;  // none when the check was skipped (`all` empty)
  for (size_t r = 0; r < all.size(); ++r)
    if (all[r].item<int64_t>() != all[0].item<int64_t>()) differ.push_back(static_cast<int>(r));
  if (!differ.empty())
    fail(
        "replicas are not identical {}: ranks {} hold different parameters than rank 0 (same seed and config "
        "should give identical replicas; this is a bug or a corrupted exchange)",
        when, fmt::join(differ, ", "));
}

}  // namespace

std::vector<torch::Tensor> ReplicaCheck::gather(const torch::Tensor& mine, const std::string& when) {
  if (!abandon_) return group_.all_gather(mine);
  group_.set_abandon(abandon_);
  try {
    auto all = group_.all_gather(mine);
    group_.set_abandon({});
    return all;
  } catch (const NetworkError& e) {
    group_.set_abandon({});
    log::warn(
        "rank {}: the replica check {} was interrupted ({}); skipped: the next round re-forms the group without "
        "the dead",
        group_.rank(), when, e.what());
    return {};
  }
}

void ReplicaCheck::now(const NamedTensors& params, const std::string& when) {
  auto mine = parameter_hash(params);
  compare_hashes(thread_.run<std::vector<torch::Tensor>>([&] { return gather(mine, when); }), when);
}

void ReplicaCheck::later(const NamedTensors& params, const std::string& when) {
  auto mine = parameter_hash(params);
  pending_.push_back(
      {thread_.enqueue<std::vector<torch::Tensor>>([this, mine, when]() { return gather(mine, when); }), when});
}

void ReplicaCheck::verify(bool wait) {
  while (!pending_.empty()) {
    auto& check = pending_.front();
    if (!wait && check.hashes.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return;
    compare_hashes(thread_.wait(std::move(check.hashes)), check.when);
    pending_.pop_front();
  }
}

}  // namespace tributary
