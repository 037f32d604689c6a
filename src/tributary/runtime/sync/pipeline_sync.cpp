#include "tributary/runtime/sync/pipeline_sync.h"

#include <chrono>

#include "tributary/core/error.h"
#include "tributary/core/log.h"
#include "tributary/runtime/run_state.h"

namespace tributary {

PipelineSync::PipelineSync(const Session& session, const Layout& layout)
    : blocks_per_level_(session.config().model.blocks_per_level()), launched_rank_(session.env().rank) {
  const RunConfig& config = session.config();
  const DistEnv& env = session.env();
  const auto& par = config.parallel;
  const int64_t p = layout.stages();
  layout_ = pipeline::StageLayout::parse(par.stage_layers, config.model.num_layers, p, "parallel.stage_layers");
  schedule_ = {pipeline::parse_schedule(par.schedule, "parallel.schedule"), p, par.micro_batches, par.warmup_margin};
  place_ = layout;
  line_ = fmt::format(
      "{} pipeline(s) of {} stages (blocks per stage from {}), schedule {}{}, {} micro-batches of {}, "
      "activations on the wire as {}",
      layout.replicas(), layout.stages(), par.stage_layers.empty() ? std::string("a balanced split") : par.stage_layers,
      par.schedule, par.schedule == "1f1b" ? fmt::format(" (warm-up margin {})", par.warmup_margin) : "",
      par.micro_batches, config.train.batch_size / par.micro_batches, par.activation_compression);
  const bool diloco = layout.sync() == SyncKind::kDiloco;
  if (diloco)
    for (int64_t s = 0; s < p; ++s)  // a stage's fragments are its blocks strided: each needs one
      if (layout_.end(s) - layout_.begin(s) < config.dist.fragments)
        fail(
            "dist.fragments = {} but pipeline stage {} owns {} block(s): DiLoCo per stage splits each stage's blocks "
            "into the fragments; use at most {} fragments or give every stage more blocks (parallel.stage_layers)",
            config.dist.fragments, s, layout_.end(s) - layout_.begin(s), layout_.end(s) - layout_.begin(s));
  log::info("rank {} runs stage {} of pipeline {} (blocks {}..{})", env.rank, stage(), place_.replica(),
            layout_.begin(stage()), layout_.end(stage()) - 1);
  if (session.links() && env.rank == 0) log::info("pipelines on {}", session.links()->describe());
  auto options_among = [&](const std::vector<int>& members) { return session.group_options(members); };
  const std::vector<int> pipe_members = layout.pipeline_ranks(), data_members = layout.stage_replica_ranks();
  comm::Store store = session.store();
  const std::optional<comm::RunKey> key = comm::invocation_key(store);  // this invocation's MACs
  if (key) {
    mac_.emplace(*key);
    store_ = store;
  }
  // Each group has its own store prefix; every member creates it with its rank within the group.
  pipe_ = std::make_unique<comm::Group>(store, int(stage()), int(p), options_among(pipe_members),
                                        fmt::format("pipe.{}", place_.replica()));
  const int64_t d = layout.pipelines_per_island();
  if (d > 1) {  // several pipelines per island: a stage's replicas in the island average every step
    data_ = std::make_unique<comm::Group>(store, int(layout.pipeline_in_island()), int(d),
                                          options_among(layout.island_stage_ranks()),
                                          fmt::format("data.{}.{}", place_.replica() / d, stage()));
  } else if (layout.stage_data_parallel_steps() != 0) {  // data parallel, or DiLoCo's warm-up
    data_ = std::make_unique<comm::Group>(store, int(place_.replica()), int(place_.replicas()),
                                          options_among(data_members), fmt::format("data.{}", stage()));
  }
  // DiLoCo per stage across the pipelines, or across the islands through each island's first pipeline. The exchange
  // pads with the modelled time itself.
  const std::vector<int> across = d > 1 ? layout.lead_stage_ranks() : data_members;
  if (diloco && layout.pipeline_in_island() == 0)
    stage_replicas_ =
        std::make_unique<ReplicaSync>(config, ReplicaGroup{.store = store,
                                                           .rank = int(d > 1 ? place_.replica() / d : place_.replica()),
                                                           .size = int(across.size()),
                                                           .link = session.links_among(across),
                                                           .prefix = fmt::format("diloco.{}", stage())});
  if (config.model.tie_embeddings && (stage() == 0 || stage() == p - 1))
    tie_ = std::make_unique<comm::Group>(store, stage() == 0 ? 0 : 1, 2,
                                         options_among({pipe_members.front(), pipe_members.back()}),
                                         fmt::format("tie.{}", place_.replica()));
  if (key) {
    if (tie_) tie_sealed_ = std::make_unique<comm::Exchange>(*tie_, comm::ExchangeOptions{.mac_key = key});
    if (data_) data_sealed_ = std::make_unique<comm::Exchange>(*data_, comm::ExchangeOptions{.mac_key = key});
  }
  const comm::GroupOptions options = session.group_options();
  if (config.local.chunks > 0)  // local stages: their lagged report, outside the link emulation like the stop vote
    report_ =
        std::make_unique<comm::LaggedReduce>(store, int(stage()), int(p), options,
                                             fmt::format("report.{}", place_.replica()), int(config.local.queue_steps));
  world_ = std::make_unique<comm::Group>(store, env.rank, env.world_size, options, "world");
  stop_vote_ = std::make_unique<comm::LaggedVote>(store, env.rank, env.world_size, options);
}

PipelineSync::~PipelineSync() = default;

Started PipelineSync::start(const StartState& s) {
  Started started = Sync::start(s);
  if (!stage_replicas_) return started;
  if (!s.ckpt) {
    stage_replicas_->rounds().start(s.trained);
    return started;
  }
  const ReplicaResume resume = replica_resume(*s.ckpt, replica_outer_file(launched_rank_));  // the rank's own
  stage_replicas_->rounds().start(s.trained, s.progress.step, resume.outer ? &*resume.outer : nullptr, resume.progress);
  return started;
}

void PipelineSync::before_read(NamedTensors& params, NamedTensors* aux_params) {
  consolidate(params);
  if (aux_params && !aux_params->empty()) consolidate_aux_heads(*aux_params);
}

bool PipelineSync::checkpoint_part(const fs::path& run_dir, int64_t step, const RankState& rank_state,
                                   CheckpointContents& contents) {
  ReplicaSync* replicas = stage_replicas_.get();
  const NamedTensors outer = replicas ? replicas->rounds().outer_state() : NamedTensors{};
  const NamedTensors codec = replicas ? replicas->codec_state() : NamedTensors{};
  RankState mine = rank_state;
  if (replicas) {
    mine.outer = &outer;
    mine.codec = &codec;
  }
  if (!stage_rank_state(group_peers(*world_), run_dir, step, mine, contents)) return false;
  contents.state["replicas"] = replicas ? replicas->rounds().progress() : nlohmann::json::array();
  return true;
}

AfterStep PipelineSync::after_step(int64_t step, double lr, NamedTensors& trained, bool last) {
  bool landed = false;
  quiescent_ = true;
  if (stage_replicas_) {
    const AfterStep after = stage_replicas_->rounds().step_ended(step, lr, trained, last);
    landed = after.landed;
    quiescent_ = after.quiescent;
  }
  if (!data_ || place_.pipelines_per_island() <= 1) return {.landed = landed, .quiescent = quiescent_};
  // The island's other pipelines learn from its first what happened across, and take the stage it landed.
  std::vector<torch::Tensor> flags = {torch::tensor({int64_t(landed), int64_t(quiescent_)}, torch::kInt64)};
  data_->broadcast(flags, 0);
  landed = flags[0][0].item<int64_t>() != 0;
  quiescent_ = flags[0][1].item<int64_t>() != 0;
  if (landed) {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> buffers;
    for (auto& [name, t] : trained) buffers.push_back(t.detach().to(torch::kCPU).contiguous());
    data_->broadcast(buffers, 0);
    if (data_->rank() != 0)
      for (size_t i = 0; i < trained.size(); ++i) trained[i].second.copy_(buffers[i]);
  }
  return {.landed = landed, .quiescent = quiescent_};
}

std::vector<std::vector<double>> PipelineSync::gather_stages(const std::vector<double>& mine) {
  auto all = pipe_->all_gather(torch::tensor(mine, torch::kFloat64));
  std::vector<std::vector<double>> out;
  for (const auto& t : all) out.emplace_back(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
  return out;
}

void PipelineSync::broadcast_sealed(std::vector<torch::Tensor>& buffers, int root) {
  const std::string key = fmt::format("sealed/{}/{}", pipe_->prefix(), broadcasts_++);
  if (mac_ && pipe_->rank() == root) store_->set(key, mac_->tag_hex(buffers, key));
  pipe_->broadcast(buffers, root);
  if (mac_ && pipe_->rank() != root && store_->get(key) != mac_->tag_hex(buffers, key))
    throw NetworkError(fmt::format(
        "stage {}: the parameters stage {} broadcast over its pipeline ({}) do not carry the run's MAC: they were "
        "changed in flight (someone on the path between the stages) or sent by a process without the run's secret. "
        "Nothing of them is used (docs/distributed.md, threat model)",
        pipe_->rank(), root, key));
}

void PipelineSync::consolidate(NamedTensors& all_params) {
  torch::NoGradGuard no_grad;
  for (int64_t s = 0; s < layout_.stages(); ++s) {
    // Without the last stage's copy of a tied embedding: it equals stage 0's, which is broadcast.
    auto owned = pipeline::stage_params(all_params, layout_, s, blocks_per_level_, /*tied_embeddings=*/false);
    std::vector<torch::Tensor> buffers;
    for (auto& [name, t] : owned) buffers.push_back(t.detach().to(torch::kCPU).contiguous());
    broadcast_sealed(buffers, int(s));
    for (size_t i = 0; i < owned.size(); ++i) owned[i].second.copy_(buffers[i]);
  }
}

void PipelineSync::consolidate_aux_heads(NamedTensors& aux_params) {
  torch::NoGradGuard no_grad;
  for (int64_t s = 0; s + 1 < layout_.stages(); ++s) {
    const std::string prefix = fmt::format("aux.{}.", s);
    std::vector<torch::Tensor*> owned;
    std::vector<torch::Tensor> buffers;
    for (auto& [name, t] : aux_params)
      if (name.rfind(prefix, 0) == 0) {
        owned.push_back(&t);
        buffers.push_back(t.detach().to(torch::kCPU).contiguous());
      }
    broadcast_sealed(buffers, int(s));
    for (size_t i = 0; i < owned.size(); ++i) owned[i]->copy_(buffers[i]);
  }
}

}  // namespace tributary
