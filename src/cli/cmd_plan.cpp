#include <algorithm>
#include <limits>

#include "cli/commands.h"
#include "tributary/comm/codec.h"
#include "tributary/config/run_config.h"
#include "tributary/core/error.h"
#include "tributary/core/fs.h"
#include "tributary/plan/plan_calibrate.h"
#include "tributary/plan/plan_workload.h"
#include "tributary/sched/genetic.h"
#include "tributary/sched/outer_round.h"
#include "tributary/sched/placement.h"
#include "tributary/sched/sites.h"

namespace tributary::cli {

using namespace tributary::sched;

namespace {

struct Plan {
  int d_dp, d_pp;
  double c_dp, c_pp;
  ScheduleResult result;
};

// The paper's communication model, plus (compute = true) each device's tasklet time from its `tflops`.
CostModel make_model(const Cluster& cluster, const Workload& w, int d_dp, int d_pp, bool compute) {
  CostModel model(cluster, w.c_dp(d_dp, d_pp), w.c_pp(d_dp, d_pp), d_dp, d_pp, w.sync_every);
  if (compute) model.set_compute(tasklet_seconds(cluster, w, d_dp, d_pp), static_cast<int>(w.micro_batches));
  return model;
}

Plan plan_layout(const Cluster& cluster, const Workload& w, int d_dp, int d_pp, const GeneticOptions& o, bool compute) {
  const CostModel model = make_model(cluster, w, d_dp, d_pp, compute);
  return {d_dp, d_pp, w.c_dp(d_dp, d_pp), w.c_pp(d_dp, d_pp), schedule_genetic(model, o)};
}

std::string terms(const Evaluation& e, bool compute) {
  return compute ? fmt::format("DP {:.3f} + 2 x PP {:.3f} + compute {:.3f}", e.dp, e.pp, e.compute)
                 : fmt::format("DP {:.3f} + 2 x PP {:.3f}", e.dp, e.pp);
}

void print_eval(const char* name, const Evaluation& e, double reference, bool compute) {
  std::printf("  %-26s total %8.3f s = %s   (%.2fx the plan)\n", name, e.total, terms(e, compute).c_str(),
              e.total / reference);
}

struct Args {
  std::string cluster, workload = "gpt3-xl", out;
  std::vector<std::string> price;  // placement files to price instead of searching
  GeneticOptions ga;
  int64_t shuffle_seed = -1;
  int d_dp = 0, d_pp = 0;
  bool search_shape = false;
  int random_k = 5000;
  int64_t sync_every = 0;  // > 0: overrides the workload's (DiLoCo's H)
  std::string config;      // a training configuration to derive the workload from, instead of a workload file
  std::vector<std::string> overrides;
  bool workload_given = false;
  bool compute = false;    // add each device's compute time (its `tflops`) to the paper's communication cost
  bool calibrate = false;  // measure this machine's speed on --config's model; devices without `tflops` take it
  bool sites = false;      // propose islands from the regions instead of placing a pipeline
  bool overwrite = false;  // --out may replace an existing file
};

// The given layout, or (--search-shape) every D_DP x D_PP that divides the devices and layers.
std::vector<Plan> make_plans(const Cluster& cluster, const Workload& w, int d_dp, int d_pp, const Args& a) {
  std::vector<Plan> plans;
  if (a.search_shape) {
    for (int pp = 1; pp <= cluster.size(); ++pp) {
      if (cluster.size() % pp != 0 || (w.num_layers > 0 && w.num_layers % pp != 0)) continue;
      int dp = cluster.size() / pp;
      if (dp > 64) continue;  // matching works on groups of at most 64
      plans.push_back(plan_layout(cluster, w, dp, pp, a.ga, a.compute));
      std::printf("layout %2d x %2d: cost %.3f s (%.2f s to plan)\n", dp, pp, plans.back().result.evaluation.total,
                  plans.back().result.seconds);
    }
    if (plans.empty()) fail("no D_DP x D_PP layout divides {} devices and {} layers", cluster.size(), w.num_layers);
  } else {
    check_layout(cluster, d_dp, d_pp);
    plans.push_back(plan_layout(cluster, w, d_dp, d_pp, a.ga, a.compute));
  }
  return plans;
}

void print_layout(const Cluster& cluster, const CostModel& model, const Plan& best) {
  const Evaluation& e = best.result.evaluation;
  for (int s = 0; s < best.d_pp; ++s) {
    const auto& g = best.result.partition[e.stage_order[s]];
    std::string regions;
    for (int d : g)
      regions += cluster.devices[d].region.empty() ? fmt::format(" {}", d)
                                                   : fmt::format(" {}:{}", d, cluster.devices[d].region);
    std::printf("  stage %d (group %d, DP %.3f s):%s\n", s, e.stage_order[s], model.dp_cost(g), regions.c_str());
  }
  for (int i = 0; i < best.d_dp; ++i) {
    std::string devs;
    for (int d : e.pipelines[i]) devs += fmt::format(" {}", d);
    std::printf("  pipeline %d:%s\n", i, devs.c_str());
  }
}

void print_beyond(const Cluster& cluster, const Workload& w, const Plan& best) {
  double slowest = 0, memory = w.stage_memory_gb(best.d_dp, best.d_pp);
  std::vector<int> too_small;
  for (int d = 0; d < cluster.size(); ++d) {
    if (cluster.devices[d].tflops > 0)
      slowest = std::max(slowest, w.tasklet_flops(best.d_dp, best.d_pp) / (cluster.devices[d].tflops * 1e12));
    if (cluster.devices[d].memory_gb > 0 && cluster.devices[d].memory_gb < memory) too_small.push_back(d);
  }
  std::printf(
      "beyond the paper: slowest device computes a tasklet in %.3f s; a stage needs ~%.1f GB (%zu devices "
      "have less)\n",
      slowest, memory, too_small.size());
}

// --price: the cost model's prediction for given placements (a plan's, Megatron's, any other), no search.
void price_placements(const Cluster& cluster, const Workload& w, const std::vector<std::string>& files, bool compute) {
  for (const auto& file : files) {
    const Placement placement = read_placement(file);
    if (placement.d_dp * placement.d_pp != cluster.size())
      fail("'{}' places {} x {} ranks but the cluster has {} devices: price it on the cluster it was planned for", file,
           placement.d_dp, placement.d_pp, cluster.size());
    const CostModel model = make_model(cluster, w, placement.d_dp, placement.d_pp, compute);
    const Evaluation e = model.evaluate_pipelines(placement.pipelines);
    std::printf("price %s: %.4f s per iteration = DP %.4f + 2 x PP %.4f", file.c_str(), e.total, e.dp, e.pp);
    if (compute) std::printf(" + compute %.4f", e.compute);
    std::printf("\n");
  }
}

// --calibrate: this machine's speed on the config's model becomes the speed of every device without a `tflops`.
void calibrate(Cluster& cluster, const RunConfig& config) {
  const Calibration c = calibrate_speed(config);
  int filled = 0;
  for (auto& d : cluster.devices)
    if (!(d.tflops > 0)) {
      d.tflops = c.tflops;
      ++filled;
    }
  std::printf(
      "calibrated on this machine: %.4f TFLOP/s (median of %d, %.4f-%.4f; forward + backward of %lld x %lld "
      "tokens, %.3g parameters, %s, %lld threads); %d of %d devices without 'tflops' take it\n",
      c.tflops, c.repeats, c.tflops_min, c.tflops_max, static_cast<long long>(c.sequences),
      static_cast<long long>(c.tokens / std::max<int64_t>(1, c.sequences)), c.parameters, c.device.c_str(),
      static_cast<long long>(c.threads), filled, cluster.size());
}

// One outer round of the islands on the cluster's links (sched/outer_round.h). The payload: --config's
// dist.compression and H (dist.inner_steps), or SparseLoCo at its public settings (4096 / 64 / 2 bits) for a workload
// file, H = --sync-every (50 unless given or the workload's).
void price_round(const Args& a, const Cluster& cluster, const std::vector<Site>& sites) {
  OuterRoundInput in;
  Workload w;
  std::string codec = "SparseLoCo 4096/64/2";
  in.inner_steps = 50;
  if (a.config.empty()) {
    w = load_workload(a.workload);
    in.parameters = w.parameters();
    in.payload_gb = sparseloco_payload_gb(in.parameters, 4096, 64, 2);
    if (w.sync_every > 1) in.inner_steps = w.sync_every;
  } else {
    const RunConfig config = RunConfig::load(a.config, a.overrides);
    w = workload_of(config, cluster.size(), a.config);
    in.parameters = w.parameters();
    const auto& d = config.dist;
    codec = d.compression;
    if (d.compression == "sparseloco") {
      in.payload_gb = sparseloco_payload_gb(in.parameters, d.sparse_chunk, d.sparse_topk, d.sparse_bits);
    } else if (d.compression == "topk" || d.compression == "powersgd") {
      fail("plan --sites prices the ring codecs (fp32, fp16, bf16, int8, fp4, terngrad) and sparseloco, not '{}'",
           d.compression);
    } else {  // the codec's own exact wire size
      in.payload_gb = double(comm::make_codec(d.compression)->encoded_bytes(int64_t(in.parameters))) / 1e9;
    }
    in.inner_steps = d.inner_steps;
  }
  if (a.sync_every > 0) in.inner_steps = a.sync_every;
  in.tokens_per_device = w.global_batch * double(w.seq_len) / cluster.size();
  const OuterRoundCost c = price_outer_round(cluster, sites, in);
  std::printf("one outer round of '%s' (%.3g parameters, H = %lld, %s: %.2f MB per site), on the file's links:\n",
              w.name.c_str(), in.parameters, static_cast<long long>(in.inner_steps), codec.c_str(),
              in.payload_gb * 1e3);
  std::printf("  compute %.2f s; inside a site %.2f s (H data-parallel all-reduces, the shards' all-gather)\n",
              c.compute_s, c.inside_s);
  std::printf(
      "  exchange across the sites: leader %.2f s; sharded %.2f s over each rank's own links, %.2f s when a site's "
      "ranks share one link\n",
      c.leader_s, c.sharded_s, c.sharded_shared_s);
  const double base = c.compute_s + c.inside_s;
  std::printf("  round: %.2f s with the leader, %.2f s sharded (own links), %.2f s sharded (one shared link)\n",
              base + c.leader_s, base + c.sharded_s, base + c.sharded_shared_s);
}

// Islands for a replica run (runtime/sync/island_sync.h): one per region of the cluster file, and how to launch them.
void propose_islands(const Args& a) {
  refuse_existing_out(a.out, a.overwrite);
  const Cluster cluster = load_cluster(a.cluster);
  const std::vector<Site> sites = sites_of(cluster, a.cluster);
  std::printf("islands from the regions of '%s' (fast links inside, slow between):\n", a.cluster.c_str());
  bool equal = true;
  for (const Site& s : sites) {
    std::printf("  %-16s %d device(s): ranks %d..%d\n", s.region.c_str(), s.devices, s.first_device,
                s.first_device + s.devices - 1);
    equal &= s.devices == sites.front().devices;
  }
  if (sites.size() < 2) {
    std::printf("one region: no islands to make (data parallel over its devices: dist.algorithm = ddp)\n");
    return;
  }
  std::printf("  --set parallel.islands=%s\n", islands_key(sites).c_str());
  if (!a.out.empty()) {  // the same islands as a file: --set parallel.placement=FILE
    write_file_atomic(a.out, island_placement_json(sites));
    std::printf("  or --set parallel.placement=%s (written: the islands and their ranks' regions)\n", a.out.c_str());
  }
  if (equal)
    std::printf(
        "  or one launcher per site (R = 0 on SITE0, 1, ...; the same port and secret file on every site): launch "
        "--nproc %d --nnodes %zu --node-rank R --master-addr SITE0 --master-port 29500 --secret-file run.secret -- "
        "train ... --set parallel.islands=machines\n",
        sites.front().devices, sites.size());
  else
    std::printf(
        "  sites of unlike size: one launch of %d workers (a launcher per site needs the same --nproc on "
        "each); unlike speeds: parallel.island_steps\n",
        cluster.size());
  const bool priced = equal && std::all_of(cluster.devices.begin(), cluster.devices.end(),
                                           [](const Device& d) { return d.tflops > 0; });
  if (priced) price_round(a, cluster, sites);
}

void run_plan(Args a) {
  if (a.sites) return propose_islands(a);
  validate(a.ga);  // user limits are user errors, checked before any GA thread starts
  refuse_existing_out(a.out, a.overwrite);
  Cluster cluster = load_cluster(a.cluster);
  std::vector<int> original;
  if (a.shuffle_seed >= 0) cluster = shuffle_ids(cluster, static_cast<uint64_t>(a.shuffle_seed), &original);
  if (!a.config.empty() && a.workload_given)
    fail("plan: give a workload file or --config, not both (--config derives the workload from the training config)");
  if (a.calibrate && a.config.empty())
    fail("plan --calibrate measures the model a training config trains: add --config <train.toml>");
  Workload w;
  if (a.config.empty()) {
    w = load_workload(a.workload);
  } else {
    const RunConfig config = RunConfig::load(a.config, a.overrides);
    w = workload_of(config, cluster.size(), a.config);
    if (a.calibrate) calibrate(cluster, config);
  }
  a.compute |= a.calibrate;
  if (a.sync_every > 0) w.sync_every = a.sync_every;
  if (!a.price.empty()) return price_placements(cluster, w, a.price, a.compute);
  int d_dp = a.d_dp > 0 ? a.d_dp : w.d_dp, d_pp = a.d_pp > 0 ? a.d_pp : w.d_pp;
  if (d_dp == 0) {
    d_pp = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(w.num_layers, 8)));
    d_dp = cluster.size() / d_pp;
  }
  const std::vector<Plan> plans = make_plans(cluster, w, d_dp, d_pp, a);
  const Plan& best = *std::min_element(plans.begin(), plans.end(), [](const Plan& x, const Plan& y) {
    return x.result.evaluation.total < y.result.evaluation.total;
  });
  const CostModel model = make_model(cluster, w, best.d_dp, best.d_pp, a.compute);
  const Evaluation& e = best.result.evaluation;
  std::printf(
      "cluster %s (%d devices%s), workload %s: D_DP %d x D_PP %d, c_DP %.4f GB%s, c_PP %.4f GB\n", cluster.name.c_str(),
      cluster.size(), a.shuffle_seed >= 0 ? ", ids shuffled" : "", w.name.c_str(), best.d_dp, best.d_pp, best.c_dp,
      w.sync_every > 1
          ? fmt::format(" (an exchange every {} iterations: DP priced at 1/{})", w.sync_every, w.sync_every).c_str()
          : "",
      best.c_pp);
  std::printf("plan: %.3f s per iteration = %s   (GA: %lld evaluations in %.2f s%s)\n", e.total,
              terms(e, a.compute).c_str(), static_cast<long long>(best.result.evaluations), best.result.seconds,
              best.result.budget_hit
                  ? fmt::format(", stopped by --budget {:g} s before its {} offspring per GA island: another run may "
                                "find another plan; a larger --budget gives a reproducible one",
                                a.ga.time_budget_s, a.ga.offspring)
                        .c_str()
                  : "");
  print_layout(cluster, model, best);
  std::printf("baselines:\n");
  print_eval("GA plan", e, e.total, a.compute);
  print_eval("Megatron rank order", model.evaluate_megatron(), e.total, a.compute);
  auto random = random_baseline(model, a.random_k, a.ga.seed);
  std::printf("  %-26s best %8.3f s, mean %.3f s over %d   (%.2fx / %.2fx the plan)\n", "random partitions",
              random.best, random.mean, a.random_k, random.best / e.total, random.mean / e.total);
  print_beyond(cluster, w, best);
  if (!a.out.empty()) {
    write_file_atomic(a.out, placement_json(cluster, e, best.d_dp, best.d_pp, original));
    std::printf("placement: %s\n", a.out.c_str());
  }
}

}  // namespace

void add_plan(CLI::App& app) {
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("plan", "place pipeline and data-parallel work on a cluster (cost model + GA)");
  cmd->add_option("cluster", a->cluster, "cluster JSON, or a preset: case1-datacenter-on-demand ... case5-worldwide")
      ->required();
  cmd->add_option("workload", a->workload, "workload JSON, or the preset gpt3-xl (default)");
  cmd->add_option("--out", a->out, "write the placement as JSON (rank -> stage, pipeline; with --sites: the islands)");
  cmd->add_flag("--overwrite", a->overwrite, "let --out replace an existing file");
  cmd->add_option("--price", a->price, "print the cost model's time for these placement files instead of searching");
  cmd->add_option("--shuffle-ids", a->shuffle_seed, "relabel devices randomly (seed) before scheduling");
  cmd->add_option("--seed", a->ga.seed, "GA seed");
  cmd->add_option("--budget", a->ga.time_budget_s, "time budget in seconds (a safety cap)");
  cmd->add_option("--offspring", a->ga.offspring, "offspring per island");
  cmd->add_option("--population", a->ga.population, "population size");
  cmd->add_option("--islands", a->ga.islands, "parallel GA islands (threads)");
  cmd->add_option("--d-dp", a->d_dp, "data-parallel degree (default: the workload's)");
  cmd->add_option("--d-pp", a->d_pp, "pipeline degree (default: the workload's)");
  cmd->add_option("--sync-every", a->sync_every,
                  "iterations per data-parallel exchange (DiLoCo per stage: dist.inner_steps); default: the workload's "
                  "sync_every, 1 = data parallel")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  cmd->add_option("--config", a->config,
                  "derive the workload from this training config (model, batch, parallel.pipeline_stages, wire "
                  "compression, DiLoCo's inner_steps), so the plan prices the run `train` will do");
  cmd->add_option("--set", a->overrides, "override a key of --config: --set model.width=512 (repeatable)");
  cmd->add_flag("--compute", a->compute,
                "beyond the paper: add compute time per iteration from each device's 'tflops' (every device needs "
                "one) to the communication cost, GPipe fill and drain over parallel.micro_batches");
  cmd->add_flag("--calibrate", a->calibrate,
                "measure this machine's training speed on --config's model (forward + backward, median of 5) and give "
                "it to every device without 'tflops'; implies --compute");
  cmd->add_flag("--sites", a->sites,
                "propose islands for a DiLoCo run (parallel.islands: data parallel inside a site, DiLoCo across) from "
                "the cluster file's regions, and how to launch them");
  cmd->add_flag("--search-shape", a->search_shape, "also search D_DP x D_PP over the divisors of the device count");
  cmd->add_option("--random", a->random_k, "random partitions for the random baseline")->check(CLI::Range(1, 10000000));
  cmd->get_option("--d-dp")->check(CLI::Range(0, 1 << 20));
  cmd->get_option("--d-pp")->check(CLI::Range(0, 1 << 20));
  cmd->get_option("--shuffle-ids")->check(CLI::Range(int64_t{-1}, std::numeric_limits<int64_t>::max()));
  cmd->callback([a, cmd]() {
    a->workload_given = cmd->get_option("workload")->count() > 0;
    run_plan(*a);
  });
}

}  // namespace tributary::cli
