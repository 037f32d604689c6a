#include "tributary/runtime/sync/pipeline_sync.h"

#include <chrono>

#include "tributary/core/error.h"
#include "tributary/core/log.h"
#include "tributary/launch/launcher.h"
#include "tributary/runtime/rendezvous.h"
#include "tributary/runtime/run_state.h"
#include "tributary/runtime/sync/lead_following.h"

namespace tributary {

PipelineSync::PipelineSync(const Session& session, const Layout& layout)
    : blocks_per_level_(session.config().model.blocks_per_level()),
      launched_rank_(session.env().rank),
      launched_world_(session.env().world_size),
      tied_embeddings_(session.config().model.tie_embeddings),
      fault_tolerant_(session.config().dist.fault_tolerant) {
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
  check_shape(session, layout);
  log::info("rank {} runs stage {} of pipeline {} (blocks {}..{})", env.rank, stage(), place_.replica(),
            layout_.begin(stage()), layout_.end(stage()) - 1);
  if (session.links() && env.rank == 0) log::info("pipelines on {}", session.links()->describe());
  // Fault tolerant, the stages wait for their lead (at its next step, or for what it tells them) while it is in a
  // round of the quorum, which may wait a whole collective deadline for a peer pipeline and then a heartbeat
  // deadline: they give up on it only after that. A stage lost inside the pipeline is its launch's to notice.
  const auto following = std::chrono::milliseconds(
      int64_t((2 * config.dist.collective_timeout_s + config.dist.heartbeat_timeout_s) * 1000));
  auto options_among = [&](const std::vector<int>& members) {
    comm::GroupOptions options = session.group_options(members);
    if (fault_tolerant_) options.collective_timeout = following;
    return options;
  };
  const std::string life = env.island_life > 0 ? fmt::format(".life{}", env.island_life) : "";
  const std::vector<int> pipe_members = layout.pipeline_ranks(), data_members = layout.stage_replica_ranks();
  comm::Store store = session.store();
  const std::optional<comm::RunKey> key = comm::invocation_key(store);  // this invocation's MACs
  if (key) mac_.emplace(*key);
  store_ = store;
  // Each group has its own store prefix; every member creates it with its rank within the group.
  pipe_ = std::make_unique<comm::Group>(store, int(stage()), int(p), options_among(pipe_members),
                                        fmt::format("pipe.{}{}", place_.replica(), life));
  const int64_t d = layout.pipelines_per_island();
  if (d > 1) {  // several pipelines per island: a stage's replicas in the island average every step
    data_ = std::make_unique<comm::Group>(store, int(layout.pipeline_in_island()), int(d),
                                          options_among(layout.island_stage_ranks()),
                                          fmt::format("data.{}.{}", place_.replica() / d, stage()));
  } else if (layout.stage_data_parallel_steps() != 0) {  // data parallel, or DiLoCo's warm-up
    data_ = std::make_unique<comm::Group>(store, int(place_.replica()), int(place_.replicas()),
                                          options_among(data_members), fmt::format("data.{}", stage()));
  }
  form_replicas(session, layout);
  if (config.model.tie_embeddings && (stage() == 0 || stage() == p - 1))
    tie_ = std::make_unique<comm::Group>(store, stage() == 0 ? 0 : 1, 2,
                                         options_among({pipe_members.front(), pipe_members.back()}),
                                         fmt::format("tie.{}{}", place_.replica(), life));
  if (key) {
    if (tie_) tie_sealed_ = std::make_unique<comm::Exchange>(*tie_, comm::ExchangeOptions{.mac_key = key});
    if (data_) data_sealed_ = std::make_unique<comm::Exchange>(*data_, comm::ExchangeOptions{.mac_key = key});
  }
  const comm::GroupOptions options = session.group_options();
  if (config.local.chunks > 0)  // local stages: their lagged report, outside the link emulation like the stop vote
    report_ =
        std::make_unique<comm::LaggedReduce>(store, int(stage()), int(p), options,
                                             fmt::format("report.{}", place_.replica()), int(config.local.queue_steps));
  if (env.joining) return;  // a pipeline started again: its lead speaks for it; nothing is collective over the run
  world_ = std::make_unique<comm::Group>(store, env.rank, env.world_size, options, "world");
  if (!fault_tolerant_)  // fault tolerant, the stop travels with the quorum's rounds
    stop_vote_ = std::make_unique<comm::LaggedVote>(store, env.rank, env.world_size, options);
}

PipelineSync::~PipelineSync() = default;

void PipelineSync::check_shape(const Session& session, const Layout& layout) const {
  const RunConfig& config = session.config();
  if (layout.sync() == SyncKind::kDiloco)
    for (int64_t s = 0; s < layout.stages(); ++s)  // a stage's fragments are its blocks strided: each needs one
      if (layout_.end(s) - layout_.begin(s) < config.dist.fragments)
        fail(
            "dist.fragments = {} but pipeline stage {} owns {} block(s): DiLoCo per stage splits each stage's blocks "
            "into the fragments; use at most {} fragments or give every stage more blocks (parallel.stage_layers)",
            config.dist.fragments, s, layout_.end(s) - layout_.begin(s), layout_.end(s) - layout_.begin(s));
  if (fault_tolerant_ && session.env().island_life < 0)
    fail(
        "dist.fault_tolerant = true with pipelines: start every machine's pipeline with `tributary launch "
        "--restart-island --max-restarts N` (a pipeline that loses a stage starts again as a whole)");
  TRIB_CHECK(!fault_tolerant_ || layout.pipelines_per_island() == 1, "a fault-tolerant pipeline is one machine's");
}

// DiLoCo per stage across the pipelines, or across the islands through each island's first pipeline (the exchange
// pads with the modelled time itself); fault tolerant, the pipelines' leads' replicas of the whole model instead.
void PipelineSync::form_replicas(const Session& session, const Layout& layout) {
  const RunConfig& config = session.config();
  const DistEnv& env = session.env();
  if (fault_tolerant_) {
    if (stage() != 0) return;
    across_ = std::make_unique<ReplicaSync>(
        config, MemberGroup{.store = session.reconnect(kIslandsScope),
                            .heartbeat_store = session.reconnect(kIslandsScope),
                            .id = int(layout.islands().island()),
                            .size = int(layout.islands().count()),
                            .joining = env.joining,
                            .link = session.links_among(layout.lead_stage_ranks()),
                            .noun = "pipeline",
                            .signer = session.membership_signer(
                                int(layout.islands().island()), [leads = layout.lead_stage_ranks()](int i) {
                                  return i >= 0 && size_t(i) < leads.size() ? leads[size_t(i)] : -1;
                                })});
    if (env.rank == 0 && !env.joining)
      log::info(
          "fault-tolerant pipelines: the quorum's members are the pipelines, each spoken for by its stage 0, which "
          "exchanges the whole model");
    return;
  }
  if (layout.sync() != SyncKind::kDiloco || layout.pipeline_in_island() != 0) return;
  const int64_t d = layout.pipelines_per_island();
  const std::vector<int> across = d > 1 ? layout.lead_stage_ranks() : layout.stage_replica_ranks();
  stage_replicas_ =
      std::make_unique<ReplicaSync>(config, ReplicaGroup{.store = session.store(),
                                                         .rank = int(d > 1 ? place_.replica() / d : place_.replica()),
                                                         .size = int(across.size()),
                                                         .link = session.links_among(across),
                                                         .prefix = fmt::format("diloco.{}", stage())});
}

Started PipelineSync::start(const StartState& s) {
  Started started = Sync::start(s);
  if (s.loss_probe && replicas()) replicas()->judge_by_loss(s.loss_probe);  // the leads' whole-model exchange
  if (fault_tolerant_) {
    TRIB_CHECK(s.params, "a fault-tolerant pipeline starts with the whole model's parameters");
    params_ = *s.params;
    state_ =
        std::make_unique<PipelineState>(params_, s.optimizer, layout_, stage(), blocks_per_level_, tied_embeddings_,
                                        [this](std::vector<torch::Tensor>& t, int root) { broadcast_sealed(t, root); });
    if (s.joining) {
      started.pending = join(s);
      return started;
    }
    if (across_) {
      const ReplicaResume resume = s.ckpt ? replica_resume(*s.ckpt) : ReplicaResume{};
      if (s.ckpt && !resume.outer)
        fail("the checkpoint at step {} has no DiLoCo outer state ({}): resume from an earlier one", s.progress.step,
             kOuterFile);
      across_->rounds().start(params_, s.progress.step, resume.outer ? &*resume.outer : nullptr, resume.progress);
    }
    world_->barrier();  // every rank got here: a worker that dies from now on is restarted by its launch
    if (launched_rank_ == 0) store_->set(kRunStartedKey, "1");
    return started;
  }
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
  if (!fault_tolerant_) return;
  state_->gather_moments();
  if (across_) moments_ = state_->moments();
}

std::optional<PendingHeal> PipelineSync::join(const StartState& s) {
  std::optional<PendingHeal> pending;
  if (across_) {  // the lead heals the pipeline's whole state from a peer pipeline's lead
    HealState heal = heal_state(s.trained, s.optimizer, s.loader, s.progress);
    heal.tensors = state_->tensors();
    heal.num_params = state_->num_params();
    pending =
        join_run(*across_->admission(), params_, std::move(heal), s.optimizer, s.loader, s.progress, s.total_steps);
  }
  // What the lead healed, to its stages: the step, tokens, elapsed time and optimizer steps, then the parameters and
  // every stage's moments.
  auto meta = torch::tensor({s.progress.step, s.progress.tokens, s.optimizer.num_steps()}, torch::kInt64);
  auto elapsed = torch::full({1}, s.progress.elapsed_before, torch::kFloat64);
  std::vector<torch::Tensor> told = {meta, elapsed};
  broadcast_sealed(told, 0);
  s.progress.step = told[0][0].item<int64_t>();
  s.progress.tokens = told[0][1].item<int64_t>();
  s.optimizer.set_num_steps(told[0][2].item<int64_t>());
  s.progress.elapsed_before = told[1].item<double>();
  state_->from_lead();
  // Each stage's sum of the moments its own optimizer now holds.
  std::vector<double> took;
  for (const auto& sums : gather_stages({state_->moment_sums()[size_t(stage())]})) took.push_back(sums.at(0));
  if (across_ && s.progress.step < s.total_steps)
    log::info("pipeline {}: its {} stages took the parameters and AdamW moments healed (moment sums {:.6e})",
              place_.islands().island(), layout_.stages(), fmt::join(took, ", "));
  return pending;
}

AfterStep PipelineSync::member_after_step(int64_t step, double lr, bool last) {
  // The lead's whole model is made current only for a round: each stage broadcasts its own parameters.
  const bool due = lead_says(*pipe_, across_ && across_->rounds().round_due(step, lr, last)) != 0;
  if (due) consolidate(params_);
  AfterStep after{.quiescent = quiescent_};
  if (across_) after = across_->rounds().step_ended(step, lr, params_, last);
  if (!due) return {.landed = false, .quiescent = quiescent_};
  std::vector<torch::Tensor> flags = {torch::tensor({int64_t(after.landed), int64_t(after.quiescent)}, torch::kInt64)};
  pipe_->broadcast(flags, 0);
  const bool landed = flags[0][0].item<int64_t>() != 0;
  quiescent_ = flags[0][1].item<int64_t>() != 0;
  if (landed) {  // the round's result, to every stage
    std::vector<torch::Tensor> whole;
    for (auto& [name, t] : params_) whole.push_back(t.detach().to(torch::kCPU).contiguous());
    broadcast_sealed(whole, 0);
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < whole.size(); ++i)
      if (!whole[i].is_same(params_[i].second)) params_[i].second.copy_(whole[i]);
  }
  return {.landed = landed, .quiescent = quiescent_};
}

std::optional<HealState> PipelineSync::heal_made_together(bool heals, const std::function<HealState()>& own) {
  if (!fault_tolerant_ || lead_says(*pipe_, heals) == 0) return std::nullopt;
  consolidate(params_);
  state_->gather_moments();
  if (!across_) return std::nullopt;
  log::info("pipeline {}: a heal's state made by its {} stages (moment sums {:.6e})", place_.islands().island(),
            layout_.stages(), fmt::join(state_->moment_sums(), ", "));
  HealState heal = own();
  heal.tensors = state_->tensors();
  heal.num_params = state_->num_params();
  return heal;
}

int64_t PipelineSync::follow_lead(BatchLoader& loader, int64_t tokens_per_step) {
  return fault_tolerant_ ? follow_lead_loader(*pipe_, loader, tokens_per_step, 0) : tokens_per_step;
}

bool PipelineSync::stop_agreed(bool local_stop) {
  if (!fault_tolerant_) return stop_vote_->step(local_stop);
  // Any stage's wish is its pipeline's: the lead votes with it in the quorum's rounds and tells the pipeline.
  return member_stop(*pipe_, local_stop, [this](bool wish) { return across_ && across_->stop_agreed(wish); });
}

bool PipelineSync::checkpoint_part(const fs::path& run_dir, int64_t step, const RankState& rank_state,
                                   CheckpointContents& contents) {
  if (fault_tolerant_) {
    // The leads' checkpoint, as the whole model's fault-tolerant replicas take it (the living ones): the whole model
    // and every stage's moments (before_read gathered them), with the lead's own random state.
    if (!across_) return false;
    NamedTensors optim = moments_;
    for (const auto& entry : rank_state.optim_state)
      if (entry.first == "rng.cpu") optim.push_back(entry);
    const RankState lead{.params = rank_state.params, .optim_state = optim, .position = rank_state.position};
    return across_->checkpoint_part(run_dir, step, lead, contents);
  }
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
  if (fault_tolerant_) return member_after_step(step, lr, last);
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
