#include "tributary/runtime/pipelines.h"

#include <chrono>

#include "tributary/core/error.h"
#include "tributary/core/log.h"
#include "tributary/runtime/rendezvous.h"
#include "tributary/runtime/wan.h"
#include "tributary/sched/placement.h"

namespace tributary {

Pipelines::Pipelines(const RunConfig& config, const DistEnv& env) {
  const auto& par = config.parallel;
  const int64_t p = par.pipeline_stages;
  if (env.world_size % p != 0)
    fail("parallel.pipeline_stages = {} does not divide the world size {}: launch D_DP x D_PP workers (e.g. "
         "launch --nproc {})",
         p, env.world_size, p);
  layout_ = pipeline::StageLayout::parse(par.stage_layers, config.model.num_layers, p, "parallel.stage_layers");
  schedule_ = {pipeline::parse_schedule(par.schedule, "parallel.schedule"), p, par.micro_batches, par.warmup_margin};
  num_pipelines_ = env.world_size / p;
  if (num_pipelines_ > 1 && config.dist.algorithm == "diloco")
    for (int64_t s = 0; s < p; ++s)  // a stage's fragments are its blocks strided: each needs one
      if (layout_.end(s) - layout_.begin(s) < config.dist.fragments)
        fail("dist.fragments = {} but pipeline stage {} owns {} block(s): DiLoCo per stage splits each stage's blocks "
             "into the fragments; use at most {} fragments or give every stage more blocks (parallel.stage_layers)",
             config.dist.fragments, s, layout_.end(s) - layout_.begin(s), layout_.end(s) - layout_.begin(s));
  // rank_at[i][j] = the rank that runs stage j of pipeline i. Megatron's order (TP = 1): stage j's replicas are the
  // consecutive ranks j*D_DP .. j*D_DP + D_DP - 1, pipeline i is ranks i, i + D_DP, ... (sched's evaluate_megatron
  // prices the same order), unless a placement renames the ranks (DT-FM applies it the same way).
  // device_of_rank = the cluster device each rank emulates under dist.wan.
  std::vector<std::vector<int>> rank_at(size_t(num_pipelines_), std::vector<int>(size_t(p), 0));
  std::vector<int> device_of_rank(size_t(env.world_size));
  for (int r = 0; r < env.world_size; ++r)
    rank_at[size_t(r % num_pipelines_)][size_t(r / num_pipelines_)] = device_of_rank[size_t(r)] = r;
  if (!par.placement.empty()) {
    const auto placement = sched::read_placement(par.placement);
    if (placement.d_pp != p || placement.d_dp * placement.d_pp != env.world_size)
      fail("parallel.placement = '{}' places {} pipelines x {} stages but this run has {} x {} (world size {}, "
           "parallel.pipeline_stages {}): plan for this world, or launch --nproc {}",
           par.placement, placement.d_dp, placement.d_pp, num_pipelines_, p, env.world_size, p,
           placement.d_dp * placement.d_pp);
    rank_at = placement.pipelines;
    device_of_rank = placement.cluster_device;
  }
  for (size_t i = 0; i < rank_at.size(); ++i)
    for (size_t j = 0; j < rank_at[i].size(); ++j)
      if (rank_at[i][j] == env.rank) pipeline_ = int64_t(i), stage_ = int64_t(j);
  log::info("rank {} runs stage {} of pipeline {} (blocks {}..{})", env.rank, stage_, pipeline_, layout_.begin(stage_),
            layout_.end(stage_) - 1);
  const auto world_links = wan_link_model_or_none(config.dist.wan, device_of_rank);
  if (world_links && env.rank == 0) log::info("pipelines on {}", world_links->describe());
  auto options_among = [&](std::vector<int> members) {  // a group's options: its view of the emulated links
    comm::GroupOptions options = group_options(config);
    if (world_links) options.link = world_links->subset(members);
    return options;
  };
  std::vector<int> pipe_members = rank_at[size_t(pipeline_)], data_members;
  for (const auto& pipeline : rank_at) data_members.push_back(pipeline[size_t(stage_)]);
  auto store = rendezvous(config, env);
  // Each group has its own store prefix; every member creates it with its rank within the group.
  pipe_ = std::make_unique<comm::Group>(store, int(stage_), int(p), options_among(pipe_members),
                                        fmt::format("pipe.{}", pipeline_));
  const bool diloco = config.dist.algorithm == "diloco";
  if (num_pipelines_ > 1 && (!diloco || config.dist.warmup_ddp_steps > 0)) {  // data parallel, or DiLoCo's warm-up
    data_ = std::make_unique<comm::Group>(store, int(pipeline_), int(num_pipelines_), options_among(data_members),
                                          fmt::format("data.{}", stage_));
    data_parallel_steps_ = diloco ? config.dist.warmup_ddp_steps : -1;
  }
  if (num_pipelines_ > 1 && config.dist.algorithm == "diloco")  // the exchange pads with the modelled time itself
    stage_replicas_ = std::make_unique<Replicas>(
        config, ReplicaGroup{.store = store, .rank = int(pipeline_), .size = int(num_pipelines_),
                             .link = world_links ? std::optional(world_links->subset(data_members)) : std::nullopt,
                             .prefix = fmt::format("diloco.{}", stage_)});
  if (config.model.tie_embeddings && (stage_ == 0 || stage_ == p - 1))
    tie_ = std::make_unique<comm::Group>(store, stage_ == 0 ? 0 : 1, 2,
                                         options_among({pipe_members.front(), pipe_members.back()}),
                                         fmt::format("tie.{}", pipeline_));
  const comm::GroupOptions options = group_options(config);
  if (config.local.chunks > 0)  // local stages: their lagged report, outside the link emulation like the stop vote
    report_ = std::make_unique<comm::LaggedReduce>(store, int(stage_), int(p), options,
                                                   fmt::format("report.{}", pipeline_), int(config.local.queue_steps));
  world_ = std::make_unique<comm::Group>(store, env.rank, env.world_size, options, "world");
  stop_vote_ = std::make_unique<comm::LaggedVote>(store, env.rank, env.world_size, options);
}

Pipelines::~Pipelines() = default;

std::vector<std::vector<double>> Pipelines::gather_stages(const std::vector<double>& mine) {
  auto all = pipe_->all_gather(torch::tensor(mine, torch::kFloat64));
  std::vector<std::vector<double>> out;
  for (const auto& t : all) out.emplace_back(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
  return out;
}

void Pipelines::consolidate(NamedTensors& all_params, int64_t blocks_per_level) {
  torch::NoGradGuard no_grad;
  for (int64_t s = 0; s < stages(); ++s) {
    // Without the last stage's copy of a tied embedding: it equals stage 0's, which is broadcast.
    auto owned = pipeline::stage_params(all_params, layout_, s, blocks_per_level, /*tied_embeddings=*/false);
    std::vector<torch::Tensor> buffers;
    for (auto& [name, t] : owned) buffers.push_back(t.detach().to(torch::kCPU).contiguous());
    pipe_->broadcast(buffers, int(s));
    for (size_t i = 0; i < owned.size(); ++i) owned[i].second.copy_(buffers[i]);
  }
}

void Pipelines::consolidate_aux_heads(NamedTensors& aux_params) {
  torch::NoGradGuard no_grad;
  for (int64_t s = 0; s + 1 < stages(); ++s) {
    const std::string prefix = fmt::format("aux.{}.", s);
    std::vector<torch::Tensor*> owned;
    std::vector<torch::Tensor> buffers;
    for (auto& [name, t] : aux_params)
      if (name.rfind(prefix, 0) == 0) {
        owned.push_back(&t);
        buffers.push_back(t.detach().to(torch::kCPU).contiguous());
      }
    pipe_->broadcast(buffers, int(s));
    for (size_t i = 0; i < owned.size(); ++i) owned[i]->copy_(buffers[i]);
  }
}

}  // namespace tributary
