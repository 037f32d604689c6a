#include "tributary/runtime/replicas.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cmath>

#include "tributary/core/error.h"
#include "tributary/core/hash.h"
#include "tributary/core/log.h"

namespace tributary {
namespace {

std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }
std::string string_of(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

}  // namespace

Replicas::Replicas(const RunConfig& config, const DistEnv& env)
    : config_(config), ddp_(config.dist.algorithm == "ddp"), current_h_(config.dist.inner_steps) {
  using std::chrono::milliseconds;
  const auto store_timeout = milliseconds(static_cast<int64_t>(config.dist.store_timeout_s * 1000));
  auto store = comm::connect_store(env.master_addr, env.master_port, env.rank, env.world_size, env.use_agent_store,
                                   env.store_prefix + "/tributary", store_timeout);
  // Every rank publishes its resolved config; every rank compares all of them with rank 0's.
  store->set("config/" + std::to_string(env.rank), bytes_of(config.to_toml()));
  std::vector<std::string> keys;
  for (int r = 0; r < env.world_size; ++r) keys.push_back("config/" + std::to_string(r));
  try {
    store->wait(keys, store_timeout);
  } catch (const std::exception& e) {
    throw NetworkError(fmt::format("rank {}: not every rank of {} reached the rendezvous within {} s: {}", env.rank,
                                   env.world_size, config.dist.store_timeout_s, e.what()));
  }
  const auto reference = RunConfig::from_toml(string_of(store->get(keys[0])), "rank 0's config").schema().flatten();
  std::vector<std::string> problems;
  for (int r = 1; r < env.world_size; ++r) {
    auto other = RunConfig::from_toml(string_of(store->get(keys[r])), "rank config").schema().flatten();
    auto diffs = config_differences(reference, other, {"train.threads", "train.device"});
    if (!diffs.empty()) problems.push_back(fmt::format("rank {} differs from rank 0 in {}", r, fmt::join(diffs, ", ")));
  }
  if (!problems.empty())
    fail("workers disagree on the run configuration: {}. Start every worker with the same config and overrides",
         fmt::join(problems, "; "));
  group_ = std::make_unique<comm::Group>(
      store, env.rank, env.world_size,
      comm::GroupOptions{.collective_timeout = milliseconds(static_cast<int64_t>(config.dist.collective_timeout_s * 1000))});
  exchange_ = std::make_unique<comm::Exchange>(
      *group_, comm::ExchangeOptions{.codec = config.dist.compression,
                                     .bucket_mb = config.dist.bucket_mb,
                                     .wan = config.dist.wan,
                                     .topk_ratio = config.dist.topk_ratio,
                                     .powersgd_rank = config.dist.powersgd_rank,
                                     .seed = static_cast<uint64_t>(config.train.seed)});
  if (env.rank == 0 && exchange_->link_model()) log::info("{}", exchange_->link_model()->describe());
}

void Replicas::check_identical(const NamedTensors& params, const std::string& when) {
  Hasher h;
  for (const auto& [name, p] : params) {
    auto c = p.detach().to(torch::kCPU).contiguous();
    h.update(c.data_ptr(), static_cast<size_t>(c.numel()) * c.element_size());
  }
  auto mine = torch::tensor({static_cast<int64_t>(h.digest())}, torch::kInt64);
  auto all = group_->all_gather(mine);
  std::vector<int> differ;
  for (int r = 0; r < size(); ++r)
    if (all[r].item<int64_t>() != all[0].item<int64_t>()) differ.push_back(r);
  if (!differ.empty())
    fail("replicas are not identical {}: ranks {} hold different parameters than rank 0 (same seed and config "
         "should give identical replicas; this is a bug or a corrupted exchange)",
         when, fmt::join(differ, ", "));
}

void Replicas::start(NamedTensors& params) {
  check_identical(params, "at start");
  if (!ddp_) outer_ = std::make_unique<OuterOptimizer>(params, OuterOptions{config_.dist.outer_lr, config_.dist.outer_momentum});
}

void Replicas::after_backward(NamedTensors& params) {
  if (!ddp_) return;
  std::vector<torch::Tensor> grads;
  for (auto& [name, p] : params) grads.push_back(p.mutable_grad());
  exchange_->average(grads);
}

bool Replicas::after_step(int64_t step, double lr, NamedTensors& params) {
  if (ddp_) return false;
  if (config_.dist.qsr_alpha > 0 && lr > 0) {
    // QSR (arXiv 2310.14423): sync less often as the learning rate decays.
    double h = std::floor(std::pow(config_.dist.qsr_alpha / lr, 2.0));
    current_h_ = std::max<int64_t>(config_.dist.inner_steps, static_cast<int64_t>(std::min(h, 1e9)));
  }
  if (step - last_sync_step_ < current_h_) return false;
  outer_round(params);
  last_sync_step_ = step;
  return true;
}

bool Replicas::finish(int64_t step, NamedTensors& params) {
  if (ddp_ || step == last_sync_step_) return false;
  outer_round(params);
  last_sync_step_ = step;
  return true;
}

void Replicas::outer_round(NamedTensors& params) {
  auto delta = outer_->pseudo_gradient(params);
  exchange_->average(delta);
  outer_->step(delta, params);
  outer_steps_ += 1;
  check_identical(params, fmt::format("after outer step {}", outer_steps_));
}

}  // namespace tributary
