#include "tributary/sched/genetic.h"

#include <atomic>
#include <condition_variable>
#include <mutex>

#include "tributary/core/progress.h"

#include "tributary/core/error.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <limits>
#include <optional>
#include <thread>

#include "tributary/core/rng.h"

namespace tributary::sched {
namespace {

using Labels = std::vector<int>;  // labels[device] = stage group

Partition to_partition(const Labels& labels, int d_pp) {
  Partition p(static_cast<size_t>(d_pp));
  for (int d = 0; d < static_cast<int>(labels.size()); ++d) p[labels[d]].push_back(d);
  return p;
}

// A random balanced partition: n / d_dp groups of d_dp devices.
Labels random_labels(int n, int d_dp, SplitMix64& rng) {
  Labels labels(static_cast<size_t>(n));
  for (int d = 0; d < n; ++d) labels[d] = d / d_dp;
  for (int i = n; i > 1; --i) std::swap(labels[i - 1], labels[rng.below(static_cast<uint64_t>(i))]);
  return labels;
}

// Exact cost with per-group DP costs and per-pair bottleneck edges cached, so a swap re-evaluates 2 groups.
class State {
 public:
  State(const CostModel& model, Labels labels) : model_(&model), labels_(std::move(labels)) {
    groups_ = to_partition(labels_, model_->d_pp());
    const int m = model_->d_pp();
    dp_.resize(static_cast<size_t>(m));
    edges_ = Matrix(m);
    for (int g = 0; g < m; ++g) dp_[g] = model_->dp_cost(groups_[g]);
    near_ = Matrix(m);
    for (int a = 0; a < m; ++a)
      for (int b = a + 1; b < m; ++b) {
        edges_(a, b) = edges_(b, a) = model_->bottleneck_matching(groups_[a], groups_[b]);
        near_(a, b) = near_(b, a) = nearest_sum(groups_[a], groups_[b]);
      }
    total_ = compute_total();
    secondary_ = secondary();
  }

  double total() const { return total_; }
  double tie_breaker() const { return secondary_; }
  // Lexicographic order on (cost, tie-breaker): used for selection, replacement and the final pick alike.
  bool better_than(const State& o) const {
    return total_ < o.total_ - 1e-12 || (total_ < o.total_ + 1e-12 && secondary_ < o.secondary_ - 1e-12);
  }
  bool same_as(const State& o) const {
    return std::abs(total_ - o.total_) < 1e-12 && std::abs(secondary_ - o.secondary_) < 1e-9;
  }
  const Labels& labels() const { return labels_; }
  const Partition& groups() const { return groups_; }

  // Swaps devices x and y (in different groups); keeps the swap if the cost drops, else restores. Returns kept.
  bool try_swap(int x, int y) {
    const int a = labels_[x], b = labels_[y];
    const int m = model_->d_pp();
    auto& ga = groups_[a];
    auto& gb = groups_[b];
    auto ia = std::find(ga.begin(), ga.end(), x) - ga.begin();
    auto ib = std::find(gb.begin(), gb.end(), y) - gb.begin();
    std::swap(ga[ia], gb[ib]);
    const double old_dp_a = dp_[a], old_dp_b = dp_[b];
    const std::vector<int> old_order = order_;
    std::vector<double> old_a(static_cast<size_t>(m)), old_b(static_cast<size_t>(m));
    std::vector<double> old_na(static_cast<size_t>(m)), old_nb(static_cast<size_t>(m));
    for (int g = 0; g < m; ++g) {
      old_a[g] = edges_(a, g);
      old_b[g] = edges_(b, g);
      old_na[g] = near_(a, g);
      old_nb[g] = near_(b, g);
    }
    dp_[a] = model_->dp_cost(ga);
    dp_[b] = model_->dp_cost(gb);
    // Cheap bound: PP >= 0, so a swap whose data-parallel cost alone exceeds the total cannot help.
    if (std::max(dp_[a], dp_[b]) > total_ + 1e-12) {
      std::swap(ga[ia], gb[ib]);
      dp_[a] = old_dp_a;
      dp_[b] = old_dp_b;
      return false;
    }
    for (int g = 0; g < m; ++g) {
      if (g != a) {
        edges_(a, g) = edges_(g, a) = model_->bottleneck_matching(ga, groups_[g]);
        near_(a, g) = near_(g, a) = nearest_sum(ga, groups_[g]);
      }
      if (g != b && g != a) {
        edges_(b, g) = edges_(g, b) = model_->bottleneck_matching(gb, groups_[g]);
        near_(b, g) = near_(g, b) = nearest_sum(gb, groups_[g]);
      }
    }
    const double t = compute_total();
    const double sec = secondary();
    ++evaluations;
    // Lexicographic: the cost, then the tie-breaker (secondary()).
    if (t < total_ - 1e-12 || (t < total_ + 1e-12 && sec < secondary_ - 1e-12)) {
      total_ = t;
      secondary_ = sec;
      labels_[x] = b;
      labels_[y] = a;
      return true;
    }
    std::swap(ga[ia], gb[ib]);
    dp_[a] = old_dp_a;
    dp_[b] = old_dp_b;
    for (int g = 0; g < m; ++g) {
      edges_(a, g) = edges_(g, a) = old_a[g];
      edges_(b, g) = edges_(g, b) = old_b[g];
      near_(a, g) = near_(g, a) = old_na[g];
      near_(b, g) = near_(g, b) = old_nb[g];
    }
    order_ = old_order;
    return false;
  }

  int64_t evaluations = 1;

 private:
  double compute_total() {
    double dp = 0;
    for (double v : dp_) dp = std::max(dp, v);
    const double pp = CostModel::open_tsp(edges_, &order_);
    if (!model_->has_compute()) return dp + 2.0 * pp;
    return dp + 2.0 * pp + model_->compute_cost(model_->pipelines_of(groups_, order_));
  }

  // Tie-breaker on the plateaus of the max/bottleneck terms: every group's DP cost, and for consecutive stages of the
  // current stage order the distance of each device to its nearest partner in the neighbouring group (which falls as
  // soon as one device gets a close partner, long before the bottleneck of the whole matching does).
  double secondary() const {
    double sum = 0;
    for (double v : dp_) sum += v;
    for (size_t s = 0; s + 1 < order_.size(); ++s) sum += near_(order_[s], order_[s + 1]);
    return sum;
  }

  double nearest_sum(const std::vector<int>& a, const std::vector<int>& b) const {
    double sum = 0;
    for (int x : a) {
      double best = std::numeric_limits<double>::infinity();
      for (int y : b) best = std::min(best, model_->w_pp(x, y));
      sum += best;
    }
    for (int y : b) {
      double best = std::numeric_limits<double>::infinity();
      for (int x : a) best = std::min(best, model_->w_pp(x, y));
      sum += best;
    }
    return sum;
  }

  const CostModel* model_;
  Labels labels_;
  Partition groups_;
  std::vector<double> dp_;
  Matrix edges_, near_;
  std::vector<int> order_;  // stage order of the last evaluated layout (from the TSP)
  double total_, secondary_;
};

// The fastest (lowest w_PP) pair inside a group.
std::pair<int, int> fastest_pair(const CostModel& model, const std::vector<int>& g) {
  std::pair<int, int> best{g[0], g.size() > 1 ? g[1] : g[0]};
  double w = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < g.size(); ++i)
    for (size_t j = i + 1; j < g.size(); ++j)
      if (model.w_pp(g[i], g[j]) < w) {
        w = model.w_pp(g[i], g[j]);
        best = {g[i], g[j]};
      }
  return best;
}

double mean_w(const CostModel& model, int d, const std::vector<int>& g) {
  double s = 0;
  for (int e : g) s += model.w_pp(d, e);
  return s / double(g.size());
}

void local_search(State& state, const CostModel& model, SplitMix64& rng, int random_swaps, const auto& out_of_time) {
  const int m = model.d_pp(), n = model.num_devices();
  for (bool improved = true; improved && !out_of_time();) {
    improved = false;
    // The paper's candidates: for groups (a, b), the fastest pairs (x1, x2) in a and (y1, y2) in b give the swaps
    // x <-> y ranked by GAIN = mean w(x, C_b) - w(x, partner(x)) + mean w(y, C_a) - w(y, partner(y)).
    for (int a = 0; a < m && !improved; ++a)
      for (int b = a + 1; b < m && !improved; ++b) {
        const auto& ga = state.groups()[a];
        const auto& gb = state.groups()[b];
        if (ga.size() < 2) continue;
        auto [x1, x2] = fastest_pair(model, ga);
        auto [y1, y2] = fastest_pair(model, gb);
        struct Cand {
          double gain;
          int x, y;
        };
        std::vector<Cand> cands;
        for (auto [x, px] : {std::pair{x1, x2}, std::pair{x2, x1}})
          for (auto [y, py] : {std::pair{y1, y2}, std::pair{y2, y1}})
            cands.push_back(
                {mean_w(model, x, gb) - model.w_pp(x, px) + mean_w(model, y, ga) - model.w_pp(y, py), x, y});
        std::sort(cands.begin(), cands.end(), [](const Cand& l, const Cand& r) { return l.gain > r.gain; });
        for (const auto& c : cands)
          if (state.try_swap(c.x, c.y)) {
            improved = true;
            break;
          }
      }
    // Then random swaps between groups.
    for (int t = 0; t < random_swaps && !improved; ++t) {
      int x = static_cast<int>(rng.below(static_cast<uint64_t>(n)));
      int y = static_cast<int>(rng.below(static_cast<uint64_t>(n)));
      if (state.labels()[x] != state.labels()[y] && state.try_swap(x, y)) improved = true;
    }
    // Finally the whole swap neighbourhood (in a random order), so the result is a true 1-swap local optimum.
    if (!improved) {
      std::vector<std::pair<int, int>> pairs;
      for (int x = 0; x < n; ++x)
        for (int y = x + 1; y < n; ++y)
          if (state.labels()[x] != state.labels()[y]) pairs.emplace_back(x, y);
      for (size_t i = pairs.size(); i > 1; --i) std::swap(pairs[i - 1], pairs[rng.below(i)]);
      for (const auto& [x, y] : pairs)
        if (state.try_swap(x, y)) {
          improved = true;
          break;
        }
    }
  }
}

// Relabels `b` so its groups line up with `a`'s (greedy maximum overlap): crossover must not mix unrelated labels.
Labels normalise(const Labels& a, const Labels& b, int m) {
  std::vector<std::vector<int>> overlap(static_cast<size_t>(m), std::vector<int>(static_cast<size_t>(m), 0));
  for (size_t d = 0; d < a.size(); ++d) overlap[b[d]][a[d]]++;
  std::vector<int> map(static_cast<size_t>(m), -1);
  std::vector<bool> used(static_cast<size_t>(m), false);
  for (int round = 0; round < m; ++round) {
    int bi = -1, ai = -1, best = -1;
    for (int i = 0; i < m; ++i) {
      if (map[i] >= 0) continue;
      for (int j = 0; j < m; ++j)
        if (!used[j] && overlap[i][j] > best) {
          best = overlap[i][j];
          bi = i;
          ai = j;
        }
    }
    map[bi] = ai;
    used[ai] = true;
  }
  Labels out(b.size());
  for (size_t d = 0; d < b.size(); ++d) out[d] = map[b[d]];
  return out;
}

Labels crossover(const Labels& a, const Labels& b_raw, int d_dp, int m, SplitMix64& rng) {
  const int n = static_cast<int>(a.size());
  Labels b = normalise(a, b_raw, m);
  std::vector<int> cuts;
  for (int i = 0; i < 5; ++i) cuts.push_back(static_cast<int>(rng.below(static_cast<uint64_t>(n))));
  std::sort(cuts.begin(), cuts.end());
  Labels child(a.size());
  int segment = 0;
  for (int d = 0, c = 0; d < n; ++d) {
    while (c < 5 && cuts[c] <= d) {
      ++c;
      segment ^= 1;
    }
    child[d] = segment ? b[d] : a[d];
  }
  // Repair: move random devices out of over-full groups into under-full ones.
  std::vector<int> count(static_cast<size_t>(m), 0);
  for (int l : child) count[l]++;
  std::vector<int> order(static_cast<size_t>(n));
  for (int d = 0; d < n; ++d) order[d] = d;
  for (int i = n; i > 1; --i) std::swap(order[i - 1], order[rng.below(static_cast<uint64_t>(i))]);
  for (int d : order) {
    if (count[child[d]] <= d_dp) continue;
    int target = 0;
    while (count[target] >= d_dp) ++target;
    count[child[d]]--;
    child[d] = target;
    count[target]++;
  }
  return child;
}

struct Island {
  State best;
  int64_t evaluations;
  bool budget_hit;
};

Island run_island(const CostModel& model, const GeneticOptions& o, uint64_t seed,
                  std::chrono::steady_clock::time_point deadline, std::atomic<int64_t>& offspring_done) {
  SplitMix64 rng(seed);
  const int n = model.num_devices(), d_dp = model.d_dp(), m = model.d_pp();
  bool budget_hit = false;
  auto out_of_time = [&]() {
    if (std::chrono::steady_clock::now() > deadline) budget_hit = true;
    return budget_hit;
  };
  std::vector<State> population;
  int64_t evaluations = 0;
  for (int i = 0; i < o.population; ++i) population.emplace_back(model, random_labels(n, d_dp, rng));
  auto tournament = [&]() {
    size_t a = rng.below(population.size()), b = rng.below(population.size());
    return population[b].better_than(population[a]) ? b : a;
  };
  for (int k = 0; k < o.offspring && !out_of_time(); ++k) {
    size_t pa = tournament(), pb = tournament();
    if (pa == pb) pb = (pa + 1 + rng.below(population.size() - 1)) % population.size();
    State child(model, crossover(population[pa].labels(), population[pb].labels(), d_dp, m, rng));
    local_search(child, model, rng, o.random_swaps, out_of_time);
    evaluations += child.evaluations;
    size_t worse = population[pa].better_than(population[pb]) ? pb : pa;
    bool duplicate = false;
    for (const auto& s : population) duplicate |= s.same_as(child);
    if (!duplicate && child.better_than(population[worse])) population[worse] = std::move(child);
    offspring_done += 1;
  }
  size_t best = 0;
  for (size_t i = 1; i < population.size(); ++i)
    if (population[i].better_than(population[best])) best = i;
  return {population[best], evaluations + o.population, budget_hit};
}

}  // namespace

void validate(const GeneticOptions& o) {
  if (o.population < 2 || o.population > 100000) fail("--population must be from 2 to 100000 (got {})", o.population);
  if (o.offspring < 1 || o.offspring > 100000) fail("--offspring must be from 1 to 100000 (got {})", o.offspring);
  if (o.islands < 1 || o.islands > 256) fail("--islands must be from 1 to 256 (got {})", o.islands);
  if (!(o.time_budget_s > 0) || o.time_budget_s > 86400)
    fail("--budget must be a number of seconds above 0 and at most 86400 (got {})", o.time_budget_s);
  if (o.random_swaps < 0) fail("random_swaps must be non-negative (got {})", o.random_swaps);
}

ScheduleResult schedule_genetic(const CostModel& model, const GeneticOptions& options) {
  validate(options);
  auto start = std::chrono::steady_clock::now();
  auto deadline = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(options.time_budget_s));
  std::vector<std::optional<Island>> islands(static_cast<size_t>(std::max(1, options.islands)));
  std::vector<std::thread> threads;
  // An exception must not leave a thread (std::terminate): each island's is kept and the first rethrown here.
  std::vector<std::exception_ptr> errors(islands.size());
  std::atomic<int64_t> offspring_done{0};
  int64_t finished = 0;  // islands done, under `mutex`: the progress loop wakes at once when the last one ends
  std::mutex mutex;
  std::condition_variable ended;
  for (size_t i = 0; i < islands.size(); ++i)
    threads.emplace_back([&, i]() {
      try {
        islands[i] = run_island(model, options, SplitMix64(options.seed * 0x9E3779B97F4A7C15ULL + i).next(), deadline,
                                offspring_done);
      } catch (...) {
        errors[i] = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mutex);
      finished += 1;
      ended.notify_one();
    });
  {  // the offspring made so far, and the time budget's end as the ETA's bound
    Progress progress("plan: genetic search", int64_t(options.offspring) * int64_t(islands.size()), "offspring");
    std::unique_lock<std::mutex> lock(mutex);
    for (int64_t shown = 0; finished < int64_t(islands.size());) {
      ended.wait_for(lock, std::chrono::milliseconds(100));
      const int64_t now = offspring_done;
      progress.advance(now - shown);
      shown = now;
    }
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  size_t best = 0;
  ScheduleResult result;
  for (size_t i = 0; i < islands.size(); ++i) {
    if (islands[i]->best.better_than(islands[best]->best)) best = i;
    result.evaluations += islands[i]->evaluations;
    result.budget_hit |= islands[i]->budget_hit;
  }
  result.partition = islands[best]->best.groups();
  result.evaluation = model.evaluate(result.partition);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

RandomBaseline random_baseline(const CostModel& model, int k, uint64_t seed) {
  SplitMix64 rng(seed);
  RandomBaseline out;
  out.best = std::numeric_limits<double>::infinity();
  double sum = 0;
  for (int i = 0; i < k; ++i) {
    Partition p = to_partition(random_labels(model.num_devices(), model.d_dp(), rng), model.d_pp());
    double c = model.cost(p);
    sum += c;
    if (c < out.best) {
      out.best = c;
      out.best_partition = p;
    }
  }
  out.mean = sum / k;
  return out;
}

}  // namespace tributary::sched
