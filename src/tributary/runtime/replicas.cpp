#include "tributary/runtime/replicas.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <regex>

#include "tributary/core/error.h"
#include "tributary/core/hash.h"
#include "tributary/core/log.h"
#include "tributary/runtime/flops.h"
#include "tributary/runtime/wan.h"

namespace tributary {
namespace {

std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }
std::string string_of(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

}  // namespace

c10::intrusive_ptr<c10d::Store> rendezvous(const RunConfig& config, const DistEnv& env) {
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
    auto diffs = config_differences(reference, other, {"train.threads", "train.device", "dist.compute_nice"});
    if (!diffs.empty()) problems.push_back(fmt::format("rank {} differs from rank 0 in {}", r, fmt::join(diffs, ", ")));
  }
  if (!problems.empty())
    fail("workers disagree on the run configuration: {}. Start every worker with the same config and overrides",
         fmt::join(problems, "; "));
  return store;
}

Replicas::Replicas(const RunConfig& config, const DistEnv& env)
    : config_(config), ddp_(config.dist.algorithm == "ddp"), current_h_(config.dist.inner_steps) {
  using std::chrono::milliseconds;
  auto store = rendezvous(config, env);
  group_ = std::make_unique<comm::Group>(
      store, env.rank, env.world_size,
      comm::GroupOptions{.collective_timeout = milliseconds(static_cast<int64_t>(config.dist.collective_timeout_s * 1000))});
  stop_vote_ = std::make_unique<comm::LaggedVote>(
      store, env.rank, env.world_size,
      comm::GroupOptions{.collective_timeout = milliseconds(static_cast<int64_t>(config.dist.collective_timeout_s * 1000))});
  exchange_ = std::make_unique<comm::Exchange>(
      *group_, comm::ExchangeOptions{.codec = config.dist.compression,
                                     .bucket_mb = config.dist.bucket_mb,
                                     .link = wan_link_model_or_none(config.dist.wan, env.world_size),
                                     .topk_ratio = config.dist.topk_ratio,
                                     .powersgd_rank = config.dist.powersgd_rank,
                                     .seed = static_cast<uint64_t>(config.train.seed)});
  if (env.rank == 0 && exchange_->link_model()) log::info("{}", exchange_->link_model()->describe());
  if (env.rank == 0 && !ddp_ && config.dist.overlap_steps > 0 &&
      config.dist.overlap_steps >= config.dist.inner_steps / config.dist.fragments)
    log::warn("dist.overlap_steps = {} >= dist.inner_steps / dist.fragments = {}: an exchange is always in flight, so "
              "checkpoints and stops wait for the end of the run",
              config.dist.overlap_steps, config.dist.inner_steps / config.dist.fragments);
  comm_thread_ = std::thread([this] {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  });
  // Overlapped communication (DDP's buckets during backward, overlapped fragments) needs the communication thread to
  // run while training computes. With more workers than cores every training thread of every worker competes with
  // it; a nicer training thread lets it (and Gloo's threads, started above at the old priority) run as soon as data
  // arrives. Linux nice values are per thread.
  if (config.dist.compute_nice > 0) {
    const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
    errno = 0;
    const int now = ::getpriority(PRIO_PROCESS, tid);
    if (errno != 0 || ::setpriority(PRIO_PROCESS, tid, now + static_cast<int>(config.dist.compute_nice)) != 0)
      log::warn("rank {}: could not lower the training thread's priority (dist.compute_nice = {}): {}", env.rank,
                config.dist.compute_nice, std::strerror(errno));
  }
}

Replicas::~Replicas() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  comm_thread_.join();
}

template <typename T>
std::future<T> Replicas::enqueue(std::function<T()> job) {
  auto task = std::make_shared<std::packaged_task<T()>>(std::move(job));
  auto result = task->get_future();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    jobs_.push_back([task] { (*task)(); });
  }
  cv_.notify_one();
  return result;
}

template <typename T>
T Replicas::on_comm_thread(std::function<T()> job) {
  auto result = enqueue<T>(std::move(job));
  const auto start = std::chrono::steady_clock::now();
  T value = result.get();  // rethrows the job's NetworkError / Error
  blocked_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return value;
}

std::future<std::vector<torch::Tensor>> Replicas::async_average(std::vector<torch::Tensor> tensors) {
  return enqueue<std::vector<torch::Tensor>>([this, t = std::move(tensors)]() mutable {
    exchange_->average(t);
    return t;
  });
}

double Replicas::shared_matmul_peak(const torch::Device& device, int local_world_size) {
  auto peak = torch::zeros({1}, torch::kFloat64);
  if (rank() == 0) {
    const int threads = at::get_num_threads();
    at::set_num_threads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
    peak.fill_(measure_matmul_peak(device));
    at::set_num_threads(threads);
  }
  on_comm_thread<int>([&] {
    std::vector<torch::Tensor> t = {peak};
    group_->broadcast(t, 0);
    return 0;
  });
  return peak.item<double>() / std::max(1, local_world_size);
}

comm::CommStats Replicas::take_stats() {
  comm::CommStats s = exchange_->take_stats();
  s.comm_s = blocked_s_;
  blocked_s_ = 0;
  return s;
}

namespace {

torch::Tensor parameter_hash(const NamedTensors& params) {
  Hasher h;
  hash_tensors(h, params);
  return torch::tensor({static_cast<int64_t>(h.digest())}, torch::kInt64);
}

void compare_hashes(const std::vector<torch::Tensor>& all, const std::string& when) {
  std::vector<int> differ;
  for (size_t r = 0; r < all.size(); ++r)
    if (all[r].item<int64_t>() != all[0].item<int64_t>()) differ.push_back(static_cast<int>(r));
  if (!differ.empty())
    fail("replicas are not identical {}: ranks {} hold different parameters than rank 0 (same seed and config "
         "should give identical replicas; this is a bug or a corrupted exchange)",
         when, fmt::join(differ, ", "));
}

}  // namespace

void Replicas::check_identical_later(const NamedTensors& params, const std::string& when) {
  auto mine = parameter_hash(params);
  pending_checks_.push_back(
      {enqueue<std::vector<torch::Tensor>>([this, mine]() { return group_->all_gather(mine); }), when});
}

void Replicas::verify_checks(bool wait) {
  while (!pending_checks_.empty()) {
    auto& check = pending_checks_.front();
    if (!wait && check.hashes.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return;
    const auto start = std::chrono::steady_clock::now();
    auto all = check.hashes.get();
    blocked_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    compare_hashes(all, check.when);
    pending_checks_.pop_front();
  }
}

void Replicas::check_identical(const NamedTensors& params, const std::string& when) {
  auto mine = parameter_hash(params);
  auto all = on_comm_thread<std::vector<torch::Tensor>>([&] { return group_->all_gather(mine); });
  compare_hashes(all, when);
}

NamedTensors Replicas::subset(const NamedTensors& params, const Fragment& f) const {
  NamedTensors out;
  for (size_t i : f.params) out.push_back(params[i]);
  return out;
}

void Replicas::start(NamedTensors& params, int64_t step, const safetensors::File* outer,
                     const nlohmann::json& fragments) {
  const std::string when = step == 0 ? "at start" : fmt::format("when resuming at step {}", step);
  in_warmup_ = !ddp_ && step < config_.dist.warmup_ddp_steps;
  if (ddp_ || in_warmup_) {
    build_buckets(params);
    check_identical(params, when);
    return;
  }
  // DiLoCo: the fragments' offsets count from the end of the warm-up (0 without one); a resumed run takes each
  // fragment's last sync and outer state from the checkpoint. Replicas differ between syncs, so the identity check
  // is on the global parameters (at step 0 they are the parameters).
  build_fragments(params, config_.dist.warmup_ddp_steps);
  NamedTensors globals;
  for (size_t f = 0; f < fragments_.size(); ++f) {
    auto& frag = fragments_[f];
    if (step > 0) {
      // dist.fragments is part of the config a resume must match, and outer.safetensors is written with them
      TRIB_CHECK(outer && fragments.size() == fragments_.size(), "checkpoint without the outer state of every fragment");
      frag.last_sync = fragments[f].at("last_sync").get<int64_t>();
      frag.outer->load_state(*outer, fragments[f].at("outer_steps").get<int64_t>());
    }
    for (const auto& g : frag.outer->global()) globals.push_back(g);
  }
  check_identical(globals, when);
}

void Replicas::build_buckets(NamedTensors& params) {
  // Buckets of <= bucket_mb in reverse parameter order (a parameter larger than that gets a bucket of its own), and a
  // hook per parameter that copies its gradient into its bucket and starts the bucket's all-reduce as soon as the
  // bucket is complete (overlap with backward).
  const int64_t cap = std::max<int64_t>(1, static_cast<int64_t>(config_.dist.bucket_mb * (1 << 20) / 4));
  bucket_of_.assign(params.size(), 0);
  offset_in_bucket_.assign(params.size(), 0);
  int64_t filled = 0;
  for (size_t k = params.size(); k-- > 0;) {
    const int64_t n = params[k].second.numel();
    if (buckets_.empty() || (filled > 0 && filled + n > cap)) {
      buckets_.emplace_back();
      filled = 0;
    }
    bucket_of_[k] = buckets_.size() - 1;
    offset_in_bucket_[k] = static_cast<size_t>(filled);
    buckets_.back().params.push_back(k);
    filled += n;
  }
  for (auto& b : buckets_) {
    int64_t n = 0;
    for (size_t k : b.params) n += params[k].second.numel();
    b.flat = torch::zeros({n}, torch::kFloat32);
  }
  for (size_t k = 0; k < params.size(); ++k)
    params[k].second.register_hook([this, k](torch::Tensor grad) {
      on_gradient(k, grad);
      return grad;
    });
}

void Replicas::build_fragments(NamedTensors& params, int64_t step) {
  const int64_t num_fragments = config_.dist.fragments;
  fragments_.resize(static_cast<size_t>(num_fragments));
  // Blocks strided over the fragments; everything outside the blocks (embeddings, final norm, head) in fragment 0.
  const std::regex block(R"(^levels\.(\d+)\.modules\.\d+\.blocks\.(\d+)\.)");
  for (size_t i = 0; i < params.size(); ++i) {
    std::smatch m;
    int64_t f = 0;
    if (std::regex_search(params[i].first, m, block))
      f = (std::stoll(m[1]) * config_.model.blocks_per_level() + std::stoll(m[2])) % num_fragments;
    fragments_[f].params.push_back(i);
  }
  for (int64_t f = 0; f < num_fragments; ++f) {
    auto& frag = fragments_[f];
    if (frag.params.empty())
      fail("dist.fragments = {} but fragment {} holds no parameters (the model has {} blocks); use fewer fragments",
           num_fragments, f, config_.model.num_layers);
    frag.outer = std::make_unique<OuterOptimizer>(subset(params, frag),
                                                  OuterOptions{config_.dist.outer_lr, config_.dist.outer_momentum});
    frag.last_sync = step + f * config_.dist.inner_steps / num_fragments;  // first sync H steps later
  }
}

void Replicas::before_backward(bool last_micro_batch, bool single_micro_batch) {
  hooks_armed_ = averaging_gradients() && last_micro_batch && single_micro_batch;
}

void Replicas::on_gradient(size_t k, const torch::Tensor& grad) {
  if (!hooks_armed_) return;
  Bucket& b = buckets_[bucket_of_[k]];
  b.flat.narrow(0, static_cast<int64_t>(offset_in_bucket_[k]), grad.numel())
      .copy_(grad.detach().reshape({-1}).to(torch::kCPU, torch::kFloat32));
  if (++b.ready == static_cast<int64_t>(b.params.size())) b.pending = async_average({b.flat});
}

void Replicas::after_backward(NamedTensors& params) {
  if (!averaging_gradients()) return;
  if (!hooks_armed_) {  // gradient accumulation: average once, after the last micro-batch
    std::vector<torch::Tensor> grads;
    for (auto& [name, p] : params) grads.push_back(p.mutable_grad());
    on_comm_thread<int>([&] {
      exchange_->average(grads);
      return 0;
    });
    return;
  }
  torch::NoGradGuard no_grad;
  for (auto& b : buckets_) {
    if (b.ready != static_cast<int64_t>(b.params.size()))  // a parameter without gradient: send what we have
      b.pending = async_average({b.flat});
    const auto start = std::chrono::steady_clock::now();
    auto averaged = b.pending.get()[0];
    blocked_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (size_t k : b.params) {
      auto& p = params[k].second;
      p.mutable_grad().copy_(averaged.narrow(0, static_cast<int64_t>(offset_in_bucket_[k]), p.numel()).view(p.sizes()));
    }
    b.ready = 0;
  }
  hooks_armed_ = false;
}

void Replicas::send(Fragment& f, int64_t step, NamedTensors& params, int64_t overlap_steps) {
  f.pending = async_average(f.outer->pseudo_gradient(subset(params, f)));
  f.apply_step = step + overlap_steps;
  f.merge = overlap_steps > 0;
  f.last_sync = step;
}

void Replicas::land(Fragment& f, NamedTensors& params) {
  const auto start = std::chrono::steady_clock::now();
  auto averaged = f.pending.get();  // rethrows a failed exchange
  blocked_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  f.apply_step = -1;
  auto local = subset(params, f);
  if (!f.merge) {
    f.outer->step(averaged, local);  // every replica continues from the new global parameters
  } else {
    // The replicas trained tau more steps meanwhile: merge them with the new global parameters.
    f.outer->apply(averaged);
    torch::NoGradGuard no_grad;
    const double a = config_.dist.merge_alpha;
    for (size_t i = 0; i < local.size(); ++i) {
      auto& p = local[i].second;
      p.mul_(a).add_(f.outer->global()[i].second.to(p.device(), p.scalar_type()), 1.0 - a);
    }
  }
  if (!f.merge) {
    check_identical(f.outer->global(), fmt::format("after outer step {}", outer_steps()));
  } else {
    check_identical_later(f.outer->global(), fmt::format("after outer step {}", outer_steps()));
  }
}

bool Replicas::after_step(int64_t step, double lr, NamedTensors& params) {
  if (ddp_) return false;
  if (in_warmup_) {
    if (step < config_.dist.warmup_ddp_steps) return false;
    // Warm-up done: the replicas are identical; DiLoCo starts from here.
    in_warmup_ = false;
    check_identical(params, fmt::format("after {} data-parallel warm-up steps", step));
    build_fragments(params, step);
    return false;
  }
  if (config_.dist.qsr_alpha > 0 && lr > 0) {
    // QSR (arXiv 2310.14423): sync less often as the learning rate decays.
    double h = std::floor(std::pow(config_.dist.qsr_alpha / lr, 2.0));
    current_h_ = std::max<int64_t>(config_.dist.inner_steps, static_cast<int64_t>(std::min(h, 1e9)));
  }
  verify_checks(/*wait=*/false);
  bool landed = false;
  for (auto& f : fragments_) {
    if (f.apply_step >= 0 && step >= f.apply_step) {
      land(f, params);
      landed = true;
    }
    if (f.apply_step < 0 && step - f.last_sync >= current_h_) {
      send(f, step, params, config_.dist.overlap_steps);
      if (!f.merge) {
        land(f, params);
        landed = true;
      }
    }
  }
  return landed;
}

bool Replicas::finish(int64_t step, NamedTensors& params) {
  if (ddp_ || in_warmup_) return false;
  bool landed = false;
  for (auto& f : fragments_) {
    if (f.apply_step >= 0) {
      land(f, params);
      landed = true;
    }
    if (step > f.last_sync) {  // pending inner steps: one last synchronous outer step
      send(f, step, params, /*overlap_steps=*/0);
      land(f, params);
      landed = true;
    }
  }
  verify_checks(/*wait=*/true);
  return landed;
}

bool Replicas::quiescent() const {
  for (const auto& f : fragments_)
    if (f.apply_step >= 0) return false;
  return true;
}

NamedTensors Replicas::outer_state() const {
  NamedTensors out;
  for (const auto& f : fragments_) {
    for (const auto& g : f.outer->global()) out.push_back(g);
    for (auto& m : f.outer->state()) out.push_back(std::move(m));
  }
  return out;
}

int64_t Replicas::outer_steps() const {
  int64_t n = 0;
  for (const auto& f : fragments_) n += f.outer->num_steps();
  return n;
}

nlohmann::json Replicas::progress() const {
  nlohmann::json fragments = nlohmann::json::array();
  for (const auto& f : fragments_) fragments.push_back({{"last_sync", f.last_sync}, {"outer_steps", f.outer->num_steps()}});
  return fragments;
}

void Replicas::barrier() {
  on_comm_thread<int>([&] {
    group_->barrier();
    return 0;
  });
}

std::vector<torch::Tensor> Replicas::all_gather(const torch::Tensor& tensor) {
  return on_comm_thread<std::vector<torch::Tensor>>([&] { return group_->all_gather(tensor); });
}

bool Replicas::stop_agreed(bool local_stop) { return stop_vote_->step(local_stop); }

}  // namespace tributary
