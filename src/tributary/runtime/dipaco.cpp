#include "tributary/runtime/dipaco.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <chrono>
#include <csignal>
#include <cmath>
#include <nlohmann/json.hpp>

#include "tributary/comm/exchange.h"
#include "tributary/comm/group.h"
#include "tributary/core/error.h"
#include "tributary/core/hash.h"
#include "tributary/core/log.h"
#include "tributary/data/dataset.h"
#include "tributary/data/loader.h"
#include "tributary/optim/adamw.h"
#include "tributary/optim/module_outer.h"
#include "tributary/optim/outer.h"
#include "tributary/optim/schedule.h"
#include "tributary/routing/router.h"
#include "tributary/routing/units.h"
#include "tributary/runtime/flops.h"
#include "tributary/runtime/inference.h"
#include "tributary/runtime/metrics.h"
#include "tributary/runtime/modules.h"
#include "tributary/runtime/replicas.h"
#include "tributary/runtime/task_queue.h"

namespace tributary {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A path's routed shard: training stream (units of T+1 tokens) and the held-out slice for early stopping.
struct PathData {
  std::shared_ptr<const std::vector<uint32_t>> train;
  torch::Tensor holdout;  // (H, T+1)
  double weight = 0;      // w_p: training tokens of the shard
};

PathData load_path_data(const fs::path& routes, int64_t path, const RunConfig& config) {
  const fs::path dir = routes / fmt::format("path-{}", path);
  Dataset ds = Dataset::open(dir);
  const int64_t row = config.model.context + 1;
  auto tokens = ds.load_tokens("train");
  const int64_t units = static_cast<int64_t>(tokens.size()) / row;
  const int64_t held = config.dipaco.holdout_permille > 0
                           ? std::max<int64_t>(1, units * config.dipaco.holdout_permille / 1000)
                           : 0;
  const int64_t b = config.train.batch_size;
  if (units - held < b)
    fail("path {}'s shard '{}' has {} training units of {} tokens ({} held out), fewer than one batch of {}: route "
         "with fewer modules, --overlap 2 or balanced k-means, or lower train.batch_size",
         path, dir.string(), units - held, row, held, b);
  PathData d;
  std::vector<int64_t> h(tokens.end() - held * row, tokens.end());
  d.holdout = held > 0 ? torch::tensor(h, torch::kInt64).reshape({held, row}) : torch::Tensor();
  tokens.resize(static_cast<size_t>((units - held) * row));
  d.weight = double(tokens.size());
  d.train = std::make_shared<const std::vector<uint32_t>>(std::move(tokens));
  return d;
}

int64_t module_hash(const ModuleSet& modules) {
  Hasher h;
  for (const auto& [id, tensors] : modules)
    for (const auto& [name, t] : tensors) {
      auto c = t.contiguous();
      h.update(c.data_ptr(), static_cast<size_t>(c.numel()) * c.element_size());
    }
  return static_cast<int64_t>(h.digest());
}

// Fault injection for tests: TRIBUTARY_FAIL_RANK=R TRIBUTARY_FAIL_STEP=S kills worker R (SIGKILL) at its S-th inner
// step, counted over all its tasks.
void maybe_inject_failure(int worker, int64_t inner_steps_done) {
  static const char* rank = std::getenv("TRIBUTARY_FAIL_RANK");
  static const char* at = std::getenv("TRIBUTARY_FAIL_STEP");
  if (rank && at && std::atoi(rank) == worker && std::atoll(at) == inner_steps_done) ::raise(SIGKILL);
}

}  // namespace

DipacoSummary train_dipaco(const RunConfig& config_in, const TrainOptions& options) {
  RunConfig config = config_in;
  const auto& tc = config.train;
  const DistEnv& env = options.dist;
  const torch::Device device = parse_device(tc.device);
  const bool lead = env.rank == 0;
  if (env.distributed()) log::set_prefix(getenv("TRIBUTARY_LAUNCHED") ? "" : fmt::format("[rank {}] ", env.rank));
  configure_threads(tc.threads > 0 ? tc.threads
                                   : std::max<int64_t>(1, int64_t(std::thread::hardware_concurrency()) /
                                                              env.local_world_size));
  if (options.resume) fail("--resume is not supported for DiPaCo runs yet; start a new run (train.run_dir)");
  const PathGrid grid = PathGrid::parse(config.dipaco.modules, config.model.num_levels, config.dipaco.private_stem,
                                        "dipaco.modules");
  const fs::path routes = config.dipaco.routes;
  if (!fs::exists(routes / "route.json"))
    fail("dipaco.routes = '{}' is not a complete routes directory (no route.json); write it with `tributary route`",
         routes.string());
  const auto route_info = nlohmann::json::parse(read_file(routes / "route.json"));
  if (route_info.at("modules").get<std::string>() != grid.describe())
    fail("dipaco.routes = '{}' was routed for a {} grid but dipaco.modules = '{}'; route again with --modules {}",
         routes.string(), route_info.at("modules").get<std::string>(), grid.describe(), grid.describe());
  if (route_info.at("context").get<int64_t>() != config.model.context)
    fail("dipaco.routes = '{}' holds units of {} tokens but model.context = {}; route with --context {}",
         routes.string(), route_info.at("context").get<int64_t>() + 1, config.model.context, config.model.context);
  const int64_t P = grid.num_paths(), tau = config.dist.inner_steps, rounds = tc.steps / tau;
  std::vector<PathData> data;
  for (int64_t p = 0; p < P; ++p) data.push_back(load_path_data(routes, p, config));
  Dataset path0 = Dataset::open(routes / "path-0");
  if (config.model.vocab_size == 0) config.model.vocab_size = path0.vocab_size();

  const fs::path run_dir = tc.run_dir;
  if (is_dipaco_run(run_dir) && !options.overwrite)
    fail("train.run_dir '{}' already holds a DiPaCo run: pass --overwrite to start over or choose another directory",
         run_dir.string());
  if (lead) {
    fs::remove_all(run_dir / "inner");
    fs::remove_all(run_dir / "best");
    fs::remove(run_dir / "dipaco.json");
  }

  // Store, group, exchange, queue. A single process uses an in-memory store and a group of one.
  using std::chrono::milliseconds;
  c10::intrusive_ptr<c10d::Store> store, hb_store;
  if (env.distributed()) {
    store = rendezvous(config, env);
    hb_store = comm::connect_store(env.master_addr, env.master_port, env.rank, env.world_size, true,
                                   env.store_prefix + "/tributary",
                                   milliseconds(int64_t(config.dist.store_timeout_s * 1000)));
  } else {
    store = c10::make_intrusive<c10d::HashStore>();
    hb_store = store;
  }
  const comm::GroupOptions group_options{
      .collective_timeout = milliseconds(static_cast<int64_t>(config.dist.collective_timeout_s * 1000))};
  auto group = std::make_unique<comm::Group>(store, env.rank, env.world_size, group_options, "dipaco/g0");
  const comm::ExchangeOptions exchange_options{.codec = config.dist.compression, .bucket_mb = config.dist.bucket_mb,
                                               .wan = config.dist.wan, .topk_ratio = config.dist.topk_ratio,
                                               .powersgd_rank = config.dist.powersgd_rank,
                                               .seed = static_cast<uint64_t>(tc.seed)};
  auto exchange = std::make_unique<comm::Exchange>(*group, exchange_options);
  if (env.distributed()) group->barrier();  // everyone is connected before the leader cleans the run directory
  TaskQueue queue(store, hb_store, env.rank, config.dipaco.heartbeat_timeout_s);

  ModuleSet global = initial_modules(config.model, grid, static_cast<uint64_t>(tc.seed), config.dipaco.init_from);
  const std::vector<std::string> module_ids = grid.modules();
  std::vector<int> members(static_cast<size_t>(env.world_size));
  std::iota(members.begin(), members.end(), 0);
  // Owners: modules dealt round-robin over the initial workers; a dead owner's modules pass to a survivor, which
  // restarts their momentum from zero (the state died with the owner).
  auto owner_of = [&](size_t i) {
    const int first = static_cast<int>(i % size_t(env.world_size));
    if (std::find(members.begin(), members.end(), first) != members.end()) return first;
    return members[i % members.size()];
  };
  std::map<std::string, std::unique_ptr<OuterOptimizer>> outer;
  const OuterOptions outer_options{config.dist.outer_lr, config.dist.outer_momentum};
  auto ensure_owned = [&]() {
    for (size_t i = 0; i < module_ids.size(); ++i)
      if (owner_of(i) == env.rank && !outer.count(module_ids[i]))
        outer[module_ids[i]] = std::make_unique<OuterOptimizer>(global[module_ids[i]], outer_options);
  };
  ensure_owned();

  auto check_identical = [&](const std::string& when) {
    auto all = group->all_gather(torch::tensor({module_hash(global)}, torch::kInt64));
    for (size_t r = 1; r < all.size(); ++r)
      if (all[r].item<int64_t>() != all[0].item<int64_t>())
        fail("DiPaCo workers hold different global modules {} (worker {} vs {}); this is a bug or a corrupted "
             "exchange", when, members[r], members[0]);
  };
  check_identical("at start");

  const CosineSchedule schedule{config.optim.lr, config.optim.warmup_steps, tc.steps, config.optim.min_lr_ratio};
  const int64_t T = config.model.context;
  if (lead) {
    fs::create_directories(run_dir);
    write_file_atomic(run_dir / "config.toml", config.to_toml());
    int64_t params_path = 0;
    {
      Transformer probe(config.model, grid.path_modules(0));
      params_path = probe.num_parameters();
    }
    int64_t params_total = 0;
    for (const auto& [id, tensors] : global)
      for (const auto& [n, t] : tensors) params_total += t.numel();
    log::info("DiPaCo {} grid: {} paths over {} modules; {} parameters per path, {} in all; {} rounds of tau = {} "
              "inner steps; {} worker(s); routes '{}'",
              grid.describe(), P, module_ids.size(), params_path, params_total, rounds, tau, env.world_size,
              routes.string());
  }
  fs::create_directories(run_dir / "inner");
  fs::create_directories(run_dir / "best");
  MetricsWriter metrics(run_dir / (lead ? std::string("metrics.jsonl") : fmt::format("metrics-rank{}.jsonl", env.rank)),
                        -1);

  DipacoSummary summary;
  summary.run_dir = run_dir;
  const auto run_start = Clock::now();
  int64_t inner_steps_done = 0;
  std::vector<double> best_holdout(static_cast<size_t>(P), std::numeric_limits<double>::infinity());
  auto batch = torch::empty({tc.batch_size, T + 1}, torch::kInt64);

  for (int64_t round = 0; round < rounds; ++round) {
    const auto round_start = Clock::now();
    std::map<std::string, ModuleAccumulator> accs;
    std::vector<int64_t> round_tasks(static_cast<size_t>(P));
    std::iota(round_tasks.begin(), round_tasks.end(), 0);
    std::vector<int64_t> tasks = round_tasks;
    double compute_s = 0;
    int64_t gen = 0, tasks_this_round = 0;
    std::vector<int64_t> dropped;
    for (;;) {
      while (auto claimed = queue.claim(round, gen, tasks)) {
        const int64_t p = *claimed;
        const auto task_start = Clock::now();
        Transformer model(config.model, grid.path_modules(p));
        load_path(model, grid, global, p);
        model.to(device);
        model.train();
        NamedTensors params = named_parameters_of(model);
        AdamW optimizer(params, {.beta1 = config.optim.beta1, .beta2 = config.optim.beta2, .eps = config.optim.eps,
                                 .weight_decay = config.optim.weight_decay});
        // Inner state per (path, round): a task re-run after its worker died starts from the previous round's state
        // even if the dead worker had already written this round's.
        auto inner_file = [&](int64_t r) { return run_dir / "inner" / fmt::format("path-{}.round-{}.safetensors", p, r); };
        if (round > 0 && fs::exists(inner_file(round - 1))) {
          auto f = safetensors::File::load(inner_file(round - 1));
          optimizer.load_state(f, std::stoll(f.metadata().at("steps")));
        }
        BatchLoader loader(data[p].train,
                           {.batch_size = tc.batch_size, .context = T, .seed = static_cast<uint64_t>(tc.seed + p),
                            .stride = T + 1},
                           fmt::format("path {} shard", p));
        const uint64_t consumed = static_cast<uint64_t>(round * tau * tc.batch_size);
        const uint64_t per_epoch = static_cast<uint64_t>(loader.num_windows());
        loader.set_position({consumed / per_epoch, consumed % per_epoch});
        double loss_sum = 0;
        for (int64_t i = 0; i < tau; ++i) {
          const int64_t step = round * tau + i;
          optimizer.zero_grad();
          loader.next(batch.data_ptr<int64_t>());
          auto on_device = batch.to(device);
          auto loss = Transformer::loss(model.forward(on_device.narrow(1, 0, T)), on_device.narrow(1, 1, T));
          loss.backward();
          const double l = loss.item<double>();
          if (!std::isfinite(l))
            fail("path {}: loss became {} at inner step {}: lower optim.lr or dist.outer_lr", p, l, step + 1);
          loss_sum += l;
          clip_grad_norm(params, config.optim.grad_clip);
          optimizer.step(schedule.lr(step));
          maybe_inject_failure(env.rank, ++inner_steps_done);
        }
        // Pseudo-gradients per module, weighted by the shard size.
        {
          torch::NoGradGuard no_grad;
          ModuleSet local = split_by_module(params, grid, p);
          for (auto& [module, tensors] : local) {
            const auto& g = global.at(module);
            std::vector<torch::Tensor> delta;
            for (size_t k = 0; k < tensors.size(); ++k) {
              TRIB_CHECK(g[k].first == tensors[k].first, "module tensor order");
              delta.push_back(g[k].second - tensors[k].second.detach().to(torch::kCPU, torch::kFloat32));
            }
            accs[module].add(data[p].weight, delta);
          }
        }
        double holdout = 0;
        if (data[p].holdout.defined()) {
          holdout = evaluate_units(model, data[p].holdout, kRoutingPrefix, device).mean();
          const fs::path best_json = run_dir / "best" / fmt::format("path-{}.json", p);
          double best = std::numeric_limits<double>::infinity();
          if (fs::exists(best_json)) best = nlohmann::json::parse(read_file(best_json)).at("holdout_loss").get<double>();
          if (holdout < best) {
            write_file_atomic(best_path_file(run_dir, p), tensors_to_safetensors(params));
            write_file_atomic(best_json, nlohmann::json{{"round", round}, {"holdout_loss", holdout}}.dump());
          }
        }
        write_file_atomic(inner_file(round),
                          tensors_to_safetensors(optimizer.state(), {{"steps", std::to_string(optimizer.num_steps())}}));
        if (round > 1) fs::remove(inner_file(round - 2));
        const double dt = seconds_since(task_start);
        compute_s += dt;
        // step/tokens count one path's inner steps (every path takes the same number), so `tributary plot` works.
        metrics.write(nlohmann::json{{"round", round}, {"path", p}, {"worker", env.rank}, {"step", (round + 1) * tau},
                                     {"tokens", (round + 1) * tau * tc.batch_size * T},
                                     {"loss", loss_sum / double(tau)},
                                     {"holdout_loss", holdout}, {"task_s", dt},
                                     {"tokens_per_s", double(tau * tc.batch_size * T) / dt}}
                          .dump());
        log::info("round {:>3}/{} | path {:>3} | loss {:.4f} | held-out {:.4f} | {:.1f} s", round + 1, rounds, p,
                  loss_sum / double(tau), holdout, dt);
        queue.done(round, p);
        tasks_this_round += 1;
      }
      Verdict verdict = queue.settle(round, gen, members, round_tasks, config.dipaco.on_failure == "requeue");
      if (verdict.members != members) {
        members = verdict.members;
        const auto me = std::find(members.begin(), members.end(), env.rank);
        group->reform(fmt::format("dipaco/r{}g{}", round, gen), static_cast<int>(me - members.begin()),
                      static_cast<int>(members.size()));
        exchange = std::make_unique<comm::Exchange>(*group, exchange_options);  // error feedback restarts
        ensure_owned();
        if (lead) log::warn("DiPaCo: continuing with {} worker(s): {}", members.size(), fmt::join(members, ", "));
      }
      dropped.insert(dropped.end(), verdict.dropped.begin(), verdict.dropped.end());
      if (!verdict.again) break;
      tasks = verdict.tasks;
      gen += 1;
    }
    summary.tasks_run += tasks_this_round;
    summary.tasks_dropped += static_cast<int64_t>(dropped.size());

    // Exchange: every module's accumulated sum (zeros where this worker ran no path through it); the weights and
    // path counts exactly (fp32 all-reduce).
    const auto comm_start = Clock::now();
    auto counts = torch::zeros({static_cast<int64_t>(module_ids.size()), 2}, torch::kFloat64);
    for (size_t i = 0; i < module_ids.size(); ++i) {
      auto it = accs.find(module_ids[i]);
      counts[int64_t(i)][0] = it == accs.end() ? 0.0 : it->second.weight;
      counts[int64_t(i)][1] = it == accs.end() ? 0.0 : double(it->second.paths);
    }
    std::vector<torch::Tensor> count_list{counts};
    group->all_reduce_sum(count_list);
    auto sum_of = [&](size_t i, size_t k) {
      auto it = accs.find(module_ids[i]);
      return it == accs.end() ? torch::zeros_like(global.at(module_ids[i])[k].second) : it->second.sum[k];
    };
    auto paths_of = [&](size_t i) { return static_cast<int64_t>(std::llround(counts[int64_t(i)][1].item<double>())); };
    // The owner's outer step: Nesterov on the module's master copy; returns master - replica (what the replicas add).
    auto outer_step = [&](size_t i, const std::vector<torch::Tensor>& sum) {
      const std::string& id = module_ids[i];
      std::vector<torch::Tensor> change;
      auto& opt = *outer.at(id);
      if (paths_of(i) > 0)  // else every path through it was dropped: the module keeps its parameters
        opt.apply(finalize(sum, counts[int64_t(i)][0].item<double>(), paths_of(i), config.dipaco.norm_rescale));
      for (size_t k = 0; k < global.at(id).size(); ++k) change.push_back(opt.global()[k].second - global.at(id)[k].second);
      return change;
    };
    const int n = static_cast<int>(members.size());
    auto group_rank_of = [&](int worker) {
      return static_cast<int>(std::find(members.begin(), members.end(), worker) - members.begin());
    };
    if (exchange->supports_reduce_update_gather()) {
      // One ring: reduce-scatter where chunk c holds the modules owned by group rank (c + n - 1) mod n, each owner
      // steps its modules in place, all-gather of the changes: an all-reduce's bytes for the whole round.
      std::vector<std::vector<size_t>> owned_by(static_cast<size_t>(n));
      for (size_t i = 0; i < module_ids.size(); ++i) owned_by[size_t(group_rank_of(owner_of(i)))].push_back(i);
      std::vector<size_t> order;
      std::vector<int64_t> begin{0};
      std::vector<torch::Tensor> parts;
      for (int c = 0; c < n; ++c) {
        int64_t end = begin.back();
        for (size_t i : owned_by[size_t((c + n - 1) % n)]) {
          order.push_back(i);
          for (size_t k = 0; k < global.at(module_ids[i]).size(); ++k) {
            parts.push_back(sum_of(i, k).reshape({-1}));
            end += parts.back().numel();
          }
        }
        begin.push_back(end);
      }
      auto flat = torch::cat(parts).contiguous();
      exchange->reduce_update_gather(flat, begin, [&](torch::Tensor& chunk) {
        int64_t offset = 0;
        for (size_t i : owned_by[size_t(group_rank_of(env.rank))]) {
          std::vector<torch::Tensor> sum;
          for (const auto& [name, t] : global.at(module_ids[i])) {
            sum.push_back(chunk.narrow(0, offset, t.numel()).view(t.sizes()));
            offset += t.numel();
          }
          auto change = outer_step(i, sum);
          for (size_t k = 0; k < sum.size(); ++k) sum[k].copy_(change[k]);
        }
      });
      int64_t offset = 0;
      for (size_t i : order)
        for (auto& [name, t] : global.at(module_ids[i])) {
          t = t + flat.narrow(0, offset, t.numel()).view(t.sizes());
          offset += t.numel();
        }
    } else {
      // top-k / PowerSGD: their own averaging, then each owner steps and broadcasts its modules' changes.
      std::vector<torch::Tensor> flat;
      for (size_t i = 0; i < module_ids.size(); ++i)
        for (size_t k = 0; k < global.at(module_ids[i]).size(); ++k) flat.push_back(sum_of(i, k));
      exchange->average(flat);  // mean over members; x members = sum
      size_t offset = 0;
      for (size_t i = 0; i < module_ids.size(); ++i) {
        const size_t count = global.at(module_ids[i]).size();
        std::vector<torch::Tensor> sum(flat.begin() + offset, flat.begin() + offset + count);
        offset += count;
        for (auto& t : sum) t.mul_(double(n));
        std::vector<torch::Tensor> change;
        if (owner_of(i) == env.rank) change = outer_step(i, sum);
        else
          for (const auto& [name, t] : global.at(module_ids[i])) change.push_back(torch::empty_like(t));
        exchange->broadcast(change, group_rank_of(owner_of(i)));
        for (size_t k = 0; k < count; ++k) global.at(module_ids[i])[k].second += change[k];
      }
    }
    check_identical(fmt::format("after round {}", round + 1));
    auto stats = exchange->take_stats();
    const double comm_s = seconds_since(comm_start);
    summary.bytes_sent += stats.bytes_sent;
    summary.bytes_recv += stats.bytes_recv;
    summary.comm_s += comm_s;
    summary.rounds = round + 1;
    metrics.write(nlohmann::json{{"outer_step", round + 1}, {"round", round + 1}, {"bytes_sent", stats.bytes_sent},
                                 {"bytes_recv", stats.bytes_recv}, {"comm_s", comm_s}, {"compute_s", compute_s},
                                 {"tasks", tasks_this_round}, {"dropped", dropped}, {"members", members},
                                 {"modelled_link_s", stats.modelled_s}, {"round_s", seconds_since(round_start)},
                                 {"elapsed_s", seconds_since(run_start)}}
                      .dump());
    if (lead) {
      save_modules(run_dir, config, grid, global, round + 1);
      log::info("round {:>3}/{} done | {} task(s) here | {:.2f} MB sent | comm {:.1f} s of {:.1f} s{}", round + 1,
                rounds, tasks_this_round, stats.bytes_sent / 1e6, comm_s, seconds_since(round_start),
                dropped.empty() ? std::string() : fmt::format(" | dropped paths {}", fmt::join(dropped, ", ")));
    }
  }
  summary.elapsed_s = seconds_since(run_start);
  if (lead) {
    auto routed = evaluate_routed(run_dir, false, config.dipaco.eval_units, device);
    auto early = evaluate_routed(run_dir, true, config.dipaco.eval_units, device);
    summary.val_loss = routed.loss;
    summary.val_ppl = std::exp(routed.loss);
    summary.val_loss_early = early.loss;
    summary.val_ppl_early = std::exp(early.loss);
    nlohmann::json j = {{"algorithm", "dipaco"}, {"modules", grid.describe()}, {"paths", P},
                        {"rounds", summary.rounds}, {"val_loss", routed.loss}, {"val_ppl", summary.val_ppl},
                        {"val_loss_early_stopped", early.loss}, {"val_ppl_early_stopped", summary.val_ppl_early},
                        {"eval_tokens", routed.num_tokens}, {"units_per_path", routed.units_per_path},
                        {"loss_per_path", routed.loss_per_path}, {"bytes_sent", summary.bytes_sent},
                        {"bytes_recv", summary.bytes_recv}, {"comm_s", summary.comm_s},
                        {"tasks_dropped", summary.tasks_dropped}, {"elapsed_s", summary.elapsed_s},
                        {"world_size", env.world_size}};
    write_file_atomic(run_dir / "summary.json", j.dump(2) + "\n");
    log::info("DiPaCo {}: routed val loss {:.4f} (ppl {:.3f}) on tokens after the {}-token prefix; early-stopped "
              "{:.4f} (ppl {:.3f})",
              grid.describe(), routed.loss, summary.val_ppl, kRoutingPrefix, early.loss, summary.val_ppl_early);
  }
  if (env.distributed()) group->barrier();  // the leader hosts the store: others leave only after the evaluation
  return summary;
}

RoutedEval evaluate_routed(const fs::path& run_dir, bool early_stopped, int64_t max_units, const torch::Device& device,
                           int64_t reroute_every) {
  DipacoRun run = load_dipaco_run(run_dir);
  Routes routes = load_routes(run.config.dipaco.routes, device);
  Dataset source = Dataset::open(routes.info.at("data").get<std::string>());
  Units val = cut_units(source, "val", run.config.model.context);
  if (max_units > 0 && val.size() > max_units) val.tokens = val.tokens.narrow(0, 0, max_units);
  auto features = routing_features(*routes.feature_model, val.tokens, device);
  auto path_of = routes.router.route(features, 1).select(1, 0);
  const int64_t P = run.grid.num_paths();
  RoutedEval out;
  out.units_per_path.assign(size_t(P), 0);
  out.loss_per_path.assign(size_t(P), 0.0);
  if (reroute_every > 0) {
    // Every path scores every unit once; each token then takes the loss of the path its chunk was routed to.
    const int64_t T = val.tokens.size(1) - 1;
    std::vector<torch::Tensor> losses;  // P x (N, T + 1 - prefix)
    for (int64_t p = 0; p < P; ++p) {
      auto model = assemble_dense(run, p, early_stopped);
      model->to(device);
      losses.push_back(per_token_loss(*model, val.tokens, kRoutingPrefix, device));
    }
    auto all = torch::stack(losses, 0);                      // (P, N, T')
    auto choice = torch::empty({val.size(), T + 1 - kRoutingPrefix}, torch::kInt64);
    for (int64_t b = kRoutingPrefix; b <= T; b += reroute_every) {
      const int64_t len = std::min(reroute_every, T + 1 - b);
      auto window = val.tokens.narrow(1, b - kRoutingPrefix, kRoutingPrefix);
      auto path = b == kRoutingPrefix ? path_of
                                      : routes.router.route(routing_features(*routes.feature_model, window, device), 1)
                                            .select(1, 0);
      choice.narrow(1, b - kRoutingPrefix, len).copy_(path.unsqueeze(1).expand({-1, len}));
    }
    auto picked = all.gather(0, choice.unsqueeze(0)).squeeze(0);
    for (int64_t p = 0; p < P; ++p) {
      auto mine = choice == p;
      out.units_per_path[size_t(p)] = mine.sum().item<int64_t>();
      if (out.units_per_path[size_t(p)] > 0) out.loss_per_path[size_t(p)] = picked.masked_select(mine).mean().item<double>();
    }
    out.num_tokens = picked.numel();
    out.loss = picked.to(torch::kFloat64).mean().item<double>();
    return out;
  }
  double total = 0;
  for (int64_t p = 0; p < P; ++p) {
    auto idx = (path_of == p).nonzero().select(1, 0);
    out.units_per_path[size_t(p)] = idx.size(0);
    if (idx.size(0) == 0) continue;
    auto model = assemble_dense(run, p, early_stopped);
    model->to(device);
    auto r = evaluate_units(*model, val.tokens.index_select(0, idx), kRoutingPrefix, device);
    out.loss_per_path[size_t(p)] = r.mean();
    total += r.loss_sum;
    out.num_tokens += r.num_tokens;
  }
  out.loss = out.num_tokens > 0 ? total / double(out.num_tokens) : 0.0;
  return out;
}

}  // namespace tributary
