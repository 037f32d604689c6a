#include "tributary/runtime/sync/replica_sync.h"

#include <fmt/ranges.h>

#include <chrono>
#include <cmath>
#include <exception>

#include "tributary/comm/average_check.h"
#include "tributary/comm/sealed_store.h"
#include "tributary/core/error.h"
#include "tributary/core/log.h"
#include "tributary/launch/launcher.h"
#include "tributary/perf/flops.h"
#include "tributary/runtime/rendezvous.h"
#include "tributary/runtime/run_state.h"

namespace tributary {

ReplicaSync::ReplicaSync(const Session& session)
    : config_(session.config()),
      launched_rank_(session.env().rank),
      launched_(session.env().world_size),
      local_workers_(session.env().local_world_size) {
  const RunConfig& config = session.config();
  const DistEnv& env = session.env();
  comm::Store store = session.store();
  const std::optional<comm::LinkModel>& link = session.links();
  identity_ = session.identity();
  if (identity_) identity_store_ = store;
  if (identity_ && !config.dist.admission.empty()) admitted_ = comm::read_admission_list(config.dist.admission);
  if (config.dist.fault_tolerant) {
    if (env.rank == 0 && !env.use_agent_store)
      log::warn(
          "dist.fault_tolerant: rank 0 hosts the run's store, so the run cannot outlive rank 0; start the "
          "workers with `tributary launch` (it hosts the store itself)");
    join_members({.store = store,
                  .heartbeat_store = session.reconnect(),
                  .id = env.rank,
                  .size = env.world_size,
                  .joining = env.joining,
                  .link = link,
                  .signer = session.membership_signer()});
    return;
  }
  stop_vote_ = std::make_unique<comm::LaggedVote>(store, env.rank, env.world_size, session.group_options());
  build(store, env.rank, env.world_size, link, "group0", link, false);
}

ReplicaSync::ReplicaSync(const RunConfig& config, MemberGroup members) : config_(config) {
  TRIB_CHECK(config.dist.fault_tolerant, "a member group without dist.fault_tolerant");
  join_members(std::move(members));
}

void ReplicaSync::join_members(MemberGroup m) {
  membership_ =
      std::make_unique<comm::Membership>(m.store, m.heartbeat_store, m.id, m.size, config_.dist.heartbeat_timeout_s,
                                         m.joining, group_options(config_).collective_timeout, m.noun, m.signer);
  store_ = m.store;
  if (m.joining) {  // a group of one until the members admit it (join())
    build(m.store, 0, 1, m.link ? std::optional(m.link->subset({m.id})) : std::nullopt,
          fmt::format("ft/joining-{}-{}", m.id, ::getpid()), m.link, false);
    return;
  }
  build(m.store, m.id, m.size, m.link, membership_->group_prefix(), m.link, false);
}

ReplicaSync::ReplicaSync(const RunConfig& config, ReplicaGroup group) : config_(config) {
  build(group.store, group.rank, group.size, group.link, group.prefix, group.link, group.part);
}

std::string ReplicaSync::key_of(int group_rank) {
  const int epoch = membership_ ? membership_->epoch() : 0;
  if (epoch != pinned_epoch_) {  // a new membership may hold a restarted worker with a new identity
    pinned_keys_.clear();
    pinned_epoch_ = epoch;
  }
  const int rank = membership_ ? membership_->members()[size_t(group_rank)] : group_rank;
  return published_key(*identity_store_, admitted_, rank, pinned_keys_);
}

void ReplicaSync::install_adversary(const std::string& kind) {
  reducer_->set_adversary(std::make_unique<Adversary>(kind, uint64_t(config_.train.seed) + uint64_t(launched_rank_)));
}

void ReplicaSync::judge_by_loss(const ProbeMaker& probe) {
  TRIB_CHECK(reducer_->judge(), "(loss scores need a robust rule: the configuration's check)");
  reducer_->judge()->set_jury(std::make_unique<ProbeJury>(probe([this] { return rounds_->outer_globals(); }),
                                                          int(config_.dist.probe_evaluators),
                                                          uint64_t(config_.train.seed)));
}

void ReplicaSync::build(const comm::Store& store, int rank, int size, std::optional<comm::LinkModel> link,
                        const std::string& prefix, std::optional<comm::LinkModel> world_link, bool part) {
  const auto& d = config_.dist;
  comm::GroupOptions options = group_options(config_);
  // Fault tolerant: a member that dies (or freezes) before the group formed ends the wait at its heartbeat deadline,
  // not at the collective deadline; the run then stops before anything was trained (launch may start it again).
  if (membership_) options.abandon_forming = [m = membership_.get()] { return m->member_dead(); };
  group_ = std::make_unique<comm::Group>(store, rank, size, options, prefix);
  comm::Store run_store = store;
  const std::optional<comm::RunKey> invocation_key = comm::invocation_key(run_store);  // this invocation's MACs
  exchange_ = std::make_unique<comm::Exchange>(
      *group_,
      comm::ExchangeOptions{
          .codec = d.compression,
          .bucket_mb = d.bucket_mb,
          .link = link,
          .topk_ratio = d.topk_ratio,
          .powersgd_rank = d.powersgd_rank,
          .sparse = {.chunk = d.sparse_chunk, .k = d.sparse_topk, .bits = static_cast<int>(d.sparse_bits)},
          .sparse_decay = d.error_feedback_decay,
          .seed = static_cast<uint64_t>(config_.train.seed),
          .mac_key = invocation_key,
          .identity = identity_,
          .public_key_of = identity_ ? std::function<std::string(int)>([this](int r) { return key_of(r); }) : nullptr});
  if (rank == 0 && exchange_->link_model()) log::info("{}", exchange_->link_model()->describe());
  if (rank == 0 && d.diloco() && d.overlap_steps > 0 && d.overlap_steps >= d.inner_steps / d.fragments)
    log::warn(
        "dist.overlap_steps = {} >= dist.inner_steps / dist.fragments = {}: an exchange is always in flight, so "
        "checkpoints and stops wait for the end of the run",
        d.overlap_steps, d.inner_steps / d.fragments);
  thread_ = std::make_unique<comm::CommThread>();
  reducer_ = std::make_unique<ResilientAverage>(
      *thread_, *exchange_, *group_, membership_.get(),
      AggregateOptions{.rule = d.aggregate,
                       .trim_fraction = d.trim_fraction,
                       .norm_factor = d.reject_norm_factor,
                       .clip_radius = d.clip_radius,
                       .evict_after = int(d.evict_after),
                       .min_score = d.min_score,
                       .loss_scores = d.score == "loss"},
      std::move(world_link),
      [](const std::vector<int>& dropped, const comm::Membership& now) {  // on the communication thread
        if (now.rank() == 0)
          log::warn("{0}(s) {1} dropped out; {2} {0}(s) {3} go on as epoch {4} ({0} {5} leads)", now.noun(),
                    fmt::join(dropped, ", "), now.size(), fmt::join(now.members(), ", "), now.epoch(),
                    now.members().front());
      });
  // Gloo's pairs are unauthenticated: with the run's secret, every average is checked against what was sent.
  const auto key = comm::run_key_from_environment();
  const auto tolerance = comm::AverageCheck::tolerance_of(d.compression, group_->size());
  if (key && tolerance)
    reducer_->check_averages(std::make_unique<comm::AverageCheck>(
        *key, *tolerance, std::chrono::milliseconds(int64_t(1000 * d.collective_timeout_s))));
  std::function<bool()> abandon;
  if (membership_) abandon = [m = membership_.get()] { return m->should_abandon("check"); };
  check_ = std::make_unique<ReplicaCheck>(*thread_, *group_, std::move(abandon));
  const ReplicaChannel channel{*group_, *exchange_, *thread_, *reducer_, *check_};
  ReplicaRounds::AdmissionHooks hooks;
  if (membership_)
    hooks = {.round_ended = [this] { admission_->round_ended(); },
             .start_round = [this](const std::string& round) { return admission_->start_round(round); }};
  rounds_ = std::make_unique<ReplicaRounds>(config_, channel, part, std::move(hooks));
  if (membership_) admission_ = std::make_unique<Admission>(config_, *membership_, *store_, channel, *rounds_);
}

Started ReplicaSync::start(const StartState& s) {
  std::string words;
  Started started{.peak_flops = shared_matmul_peak(s.device, words)};
  started.peak_words = std::move(words);
  if (s.loss_probe) judge_by_loss(s.loss_probe);
  if (s.joining) {  // its data is re-sharded over the members when it becomes one (MembershipFollower)
    started.pending = join_run(*admission_, s.trained, s.optimizer, s.loader, s.progress, s.total_steps);
    return started;
  }
  if (!s.ckpt) {
    rounds_->start(s.trained);
    return started;
  }
  const ReplicaResume resume = replica_resume(*s.ckpt);
  rounds_->start(s.trained, s.progress.step, resume.outer ? &*resume.outer : nullptr, resume.progress);
  return started;
}

StepPeers ReplicaSync::step_peers() {
  return {.rounds = rounds_.get(), .blocked_s = [this] { return thread_->blocked_total_s(); }};
}

RunPeers ReplicaSync::peers() {
  return {.checkpoint = checkpoint_peers(), .stop = [this](bool local) { return stop_agreed(local); }};
}

CheckpointPeers ReplicaSync::checkpoint_peers() {
  return {.rank = rank(),
          .size = size(),
          .barrier = [this] { barrier(); },
          .all_gather = [this](const torch::Tensor& t) { return all_gather(t); }};
}

bool ReplicaSync::checkpoint_part(const fs::path& run_dir, int64_t step, const RankState& mine,
                                  CheckpointContents& contents) {
  const NamedTensors codec = codec_state();
  // Every replica's auxiliary heads are alike: rank 0's, beside the model, are the checkpoint's.
  const RankState state{
      .params = mine.params, .optim_state = mine.optim_state, .position = mine.position, .codec = &codec};
  if (!stage_rank_state(checkpoint_peers(), run_dir, step, state, contents)) return false;
  contents.state["replicas"] = rounds_->progress();
  auto outer = rounds_->outer_state();
  if (!outer.empty()) contents.extra_tensors.emplace_back(kOuterFile, std::move(outer));
  return true;
}

bool ReplicaSync::stop_agreed(bool local_stop) {
  if (membership_) {
    reducer_->set_stop_wish(local_stop);
    return reducer_->stop_decided();
  }
  TRIB_CHECK(stop_vote_, "the replicas of a part of the model have no stop vote: the run's covers every rank");
  return stop_vote_->step(local_stop);
}

ReplicaSync::~ReplicaSync() {
  thread_.reset();  // join the communication thread before what its jobs use goes
  // The lead at the end of the run: workers still waiting to join give up. Not while an error unwinds (an island's
  // rank 0 whose island lost a rank): the run goes on without it, and its island's next life joins it.
  if (membership_ && group_ && rank() == 0 && !membership_->members().empty() && std::uncaught_exceptions() == 0) try {
      membership_->finish();
    } catch (const std::exception&) {
    }
}

// The peak a worker divides by is what it gets under the run's conditions: every rank measures at once, after a
// barrier, with its own thread count, over the same 1 s window (flops.h says why not best-of-N), so the workers
// sharing a machine contend for it as they will in training; the run's value is the mean over ranks (one figure on
// every console line and in the metrics). Measured by rank 0 while the others were still building their models it
// came out ~2x low (the chaos run's MFU read 111-123%); measured by rank 0 alone on every core and divided by the
// local workers, it assumed they share it evenly. A joiner takes the run's value from the store: measuring while the
// members train would be as wrong.
// Each rank's measurement is kept per machine as a single process's is (perf/flops.h best_known_peak, keyed by the
// workers sharing the machine): one taken while other work loaded the machine yields to the best seen.
double ReplicaSync::shared_matmul_peak(const torch::Device& device, std::string& words) {
  const std::string key = "run/peak_flops";
  if (membership_ && membership_->members().empty() && store_->check({key})) {
    words = "the run's, as its members measured it";
    return std::stod(store_->get(key));
  }
  thread_->run<int>([&] {
    group_->barrier();  // every rank idle before all of them measure
    return 0;
  });
  const KnownPeak mine = best_known_peak(measure_matmul_sustained(device, 1.0),
                                         peak_key(device, torch::kFloat32, torch::get_num_threads(), local_workers_));
  auto peak = torch::full({1}, mine.flops, torch::kFloat64);
  thread_->run<int>([&] {
    std::vector<torch::Tensor> t = {peak};
    group_->all_reduce_sum(t);
    return 0;
  });
  const double per_worker = peak.item<double>() / std::max<int64_t>(1, group_->size());
  words = mine.from_file() ? fmt::format("per worker, the mean of the workers' best (this one's kept in {})", mine.file)
                           : std::string("per worker, measured by all workers at once");
  if (store_ && rank() == 0 && !membership_->members().empty()) {  // the run's rank 0, not a joiner's group of one
    store_->set(key, fmt::format("{:.17g}", per_worker));
    store_->set(kRunStartedKey, "1");  // every member got here: launch may restart the dead from now on
  }
  return per_worker;
}

// Fault tolerance: a checkpoint's collectives give up when a member dies (its heartbeat, or its launch's report),
// not at the collective deadline, so that the living can settle and take the checkpoint again.
template <typename T>
T ReplicaSync::abandoning_on_death(const std::function<T()>& collective) {
  return thread_->run<T>([&] {
    if (!membership_) return collective();
    group_->set_abandon([m = membership_.get()] { return m->member_dead(); });
    try {
      T result = collective();
      group_->set_abandon({});
      return result;
    } catch (...) {
      group_->set_abandon({});
      throw;
    }
  });
}

void ReplicaSync::barrier() {
  abandoning_on_death<int>([&] {
    group_->barrier();
    return 0;
  });
}

std::vector<torch::Tensor> ReplicaSync::all_gather(const torch::Tensor& tensor) {
  return abandoning_on_death<std::vector<torch::Tensor>>([&] { return group_->all_gather(tensor); });
}

}  // namespace tributary
