#include "tributary/sched/cost_model.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "tributary/core/error.h"

namespace tributary::sched {

void check_layout(const Cluster& cluster, int d_dp, int d_pp) {
  if (d_dp <= 0 || d_pp <= 0) fail("d_dp ({}) and d_pp ({}) must be positive", d_dp, d_pp);
  // The bottleneck matching between pipelines works on one 64-bit mask per stage group.
  if (d_dp > kMaxDataParallel)
    fail(
        "d_dp = {} exceeds the scheduler's limit of {} pipelines per stage; use a larger d_pp (--d-pp) so that "
        "d_dp = devices / d_pp <= {}",
        d_dp, kMaxDataParallel, kMaxDataParallel);
  if (d_dp * d_pp != cluster.size())
    fail(
        "d_dp x d_pp = {} x {} = {} does not cover the cluster's {} devices (one tasklet per device); change d_dp/d_pp "
        "or use --search-shape",
        d_dp, d_pp, d_dp * d_pp, cluster.size());
}

CostModel::CostModel(const Cluster& cluster, double c_dp_gb, double c_pp_gb, int d_dp, int d_pp, int64_t sync_every)
    : n_(cluster.size()), d_dp_(d_dp), d_pp_(d_pp), w_pp_(n_), w_dp_(n_) {
  check_layout(cluster, d_dp, d_pp);
  if (sync_every < 1) fail("sync_every = {}: the replicas exchange every H >= 1 iterations", sync_every);
  for (int a = 0; a < n_; ++a)
    for (int b = 0; b < n_; ++b) {
      if (a == b) continue;
      const double alpha = cluster.latency_ms(a, b) / 1000.0, beta = cluster.bandwidth_gbps(a, b);
      w_pp_(a, b) = alpha + c_pp_gb * 8.0 / beta;
      w_dp_(a, b) = (alpha + c_dp_gb * 8.0 / (double(d_dp) * beta)) / double(sync_every);
    }
}

double CostModel::dp_cost(const std::vector<int>& group) const {
  double worst = 0;
  for (int d : group) {
    double sum = 0;
    for (int e : group)
      if (e != d) sum += 2.0 * w_dp_(d, e);
    worst = std::max(worst, sum);
  }
  return worst;
}

namespace {

// Kuhn's augmenting paths on a k x k bipartite graph given as an adjacency bitmask per left node (k <= 64).
bool try_kuhn(int u, const std::vector<uint64_t>& adj, std::vector<int>& match_right, uint64_t& seen) {
  uint64_t cand = adj[u] & ~seen;
  while (cand) {
    int v = __builtin_ctzll(cand);
    cand &= cand - 1;
    seen |= uint64_t{1} << v;
    if (match_right[v] < 0 || try_kuhn(match_right[v], adj, match_right, seen)) {
      match_right[v] = u;
      return true;
    }
  }
  return false;
}

bool perfect_matching(const std::vector<uint64_t>& adj, std::vector<int>& match_right) {
  const int k = static_cast<int>(adj.size());
  std::fill(match_right.begin(), match_right.end(), -1);
  for (int u = 0; u < k; ++u) {
    uint64_t seen = 0;
    if (!try_kuhn(u, adj, match_right, seen)) return false;
  }
  return true;
}

}  // namespace

double CostModel::bottleneck_matching(const std::vector<int>& a, const std::vector<int>& b,
                                      std::vector<int>* match) const {
  const int k = static_cast<int>(a.size());
  TRIB_CHECK(k == static_cast<int>(b.size()) && k <= 64);
  std::vector<double> weights;
  weights.reserve(static_cast<size_t>(k) * k);
  for (int i = 0; i < k; ++i)
    for (int j = 0; j < k; ++j) weights.push_back(w_pp_(a[i], b[j]));
  std::sort(weights.begin(), weights.end());
  weights.erase(std::unique(weights.begin(), weights.end()), weights.end());
  std::vector<uint64_t> adj(static_cast<size_t>(k));
  std::vector<int> match_right(static_cast<size_t>(k));
  auto feasible = [&](double threshold) {
    for (int i = 0; i < k; ++i) {
      adj[i] = 0;
      for (int j = 0; j < k; ++j)
        if (w_pp_(a[i], b[j]) <= threshold) adj[i] |= uint64_t{1} << j;
    }
    return perfect_matching(adj, match_right);
  };
  // The answer is one of the edge weights; at least k of them are needed for a perfect matching.
  size_t lo = 0, hi = weights.size() - 1;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (feasible(weights[mid])) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  if (match) {
    feasible(weights[lo]);
    match->assign(static_cast<size_t>(k), -1);
    for (int j = 0; j < k; ++j) (*match)[match_right[j]] = j;
  }
  return weights[lo];
}

namespace {

// Exact open TSP by Held-Karp: O(2^m m^2), m <= 16.
double held_karp(const Matrix& edges, std::vector<int>* order) {
  const int m = edges.n;
  const size_t full = size_t{1} << m;
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> best(full * m, inf);
  std::vector<int8_t> parent(full * m, -1);
  for (int v = 0; v < m; ++v) best[(size_t{1} << v) * m + v] = 0;  // a path may start anywhere
  for (size_t mask = 1; mask < full; ++mask)
    for (int last = 0; last < m; ++last) {
      double cur = best[mask * m + last];
      if (cur == inf) continue;
      for (int next = 0; next < m; ++next) {
        if (mask & (size_t{1} << next)) continue;
        size_t nm = mask | (size_t{1} << next);
        double c = cur + edges(last, next);
        if (c < best[nm * m + next]) {
          best[nm * m + next] = c;
          parent[nm * m + next] = static_cast<int8_t>(last);
        }
      }
    }
  int last = 0;
  for (int v = 1; v < m; ++v)
    if (best[(full - 1) * m + v] < best[(full - 1) * m + last]) last = v;
  double total = best[(full - 1) * m + last];
  if (order) {
    order->clear();
    size_t mask = full - 1;
    for (int v = last; v >= 0;) {
      order->push_back(v);
      int p = parent[mask * m + v];
      mask &= ~(size_t{1} << v);
      v = p;
    }
    std::reverse(order->begin(), order->end());
  }
  return total;
}

// Larger: nearest neighbour from every start, then 2-opt.
double nearest_neighbour_2opt(const Matrix& edges, std::vector<int>* order) {
  const int m = edges.n;
  std::vector<int> best_order;
  double best_cost = std::numeric_limits<double>::infinity();
  for (int start = 0; start < m; ++start) {
    std::vector<int> path = {start};
    std::vector<bool> used(static_cast<size_t>(m));
    used[start] = true;
    for (int step = 1; step < m; ++step) {
      int cur = path.back(), pick = -1;
      for (int v = 0; v < m; ++v)
        if (!used[v] && (pick < 0 || edges(cur, v) < edges(cur, pick))) pick = v;
      used[pick] = true;
      path.push_back(pick);
    }
    for (bool improved = true; improved;) {
      improved = false;
      for (int i = 0; i + 1 < m; ++i)
        for (int j = i + 1; j < m; ++j) {
          std::vector<int> cand = path;
          std::reverse(cand.begin() + i, cand.begin() + j + 1);
          double before = 0, after = 0;
          for (int s = 0; s + 1 < m; ++s) {
            before += edges(path[s], path[s + 1]);
            after += edges(cand[s], cand[s + 1]);
          }
          if (after < before - 1e-12) {
            path = cand;
            improved = true;
          }
        }
    }
    double c = 0;
    for (int s = 0; s + 1 < m; ++s) c += edges(path[s], path[s + 1]);
    if (c < best_cost) {
      best_cost = c;
      best_order = path;
    }
  }
  if (order) *order = best_order;
  return best_cost;
}

}  // namespace

double CostModel::open_tsp(const Matrix& edges, std::vector<int>* order) {
  const int m = edges.n;
  if (m == 1) {
    if (order) *order = {0};
    return 0;
  }
  return m <= 16 ? held_karp(edges, order) : nearest_neighbour_2opt(edges, order);
}

double CostModel::cost(const Partition& p) const {
  if (has_compute()) return evaluate(p).total;  // the compute term needs the pipelines the matchings form
  double dp = 0;
  for (const auto& g : p) dp = std::max(dp, dp_cost(g));
  Matrix edges(d_pp_);
  for (int i = 0; i < d_pp_; ++i)
    for (int j = i + 1; j < d_pp_; ++j) edges(i, j) = edges(j, i) = bottleneck_matching(p[i], p[j]);
  return dp + 2.0 * open_tsp(edges);
}

Evaluation CostModel::evaluate(const Partition& p) const {
  Evaluation e;
  for (const auto& g : p) e.dp = std::max(e.dp, dp_cost(g));
  Matrix edges(d_pp_);
  for (int i = 0; i < d_pp_; ++i)
    for (int j = i + 1; j < d_pp_; ++j) edges(i, j) = edges(j, i) = bottleneck_matching(p[i], p[j]);
  e.pp = open_tsp(edges, &e.stage_order);
  e.pipelines = pipelines_of(p, e.stage_order);
  e.compute = compute_cost(e.pipelines);
  e.total = e.dp + 2.0 * e.pp + e.compute;
  return e;
}

std::vector<std::vector<int>> CostModel::pipelines_of(const Partition& p, const std::vector<int>& stage_order) const {
  std::vector<std::vector<int>> pipelines(static_cast<size_t>(d_dp_));
  for (int i = 0; i < d_dp_; ++i) pipelines[i].push_back(p[stage_order[0]][i]);
  for (int s = 1; s < d_pp_; ++s) {
    const auto& prev = p[stage_order[s - 1]];
    const auto& next = p[stage_order[s]];
    std::vector<int> match;
    bottleneck_matching(prev, next, &match);
    for (int i = 0; i < d_dp_; ++i) {
      int pos = static_cast<int>(std::find(prev.begin(), prev.end(), pipelines[i].back()) - prev.begin());
      pipelines[i].push_back(next[match[pos]]);
    }
  }
  return pipelines;
}

void CostModel::set_compute(std::vector<double> tasklet_s, int micro_batches) {
  if (static_cast<int>(tasklet_s.size()) != n_)
    fail("{} tasklet times for a cluster of {} devices", tasklet_s.size(), n_);
  for (size_t d = 0; d < tasklet_s.size(); ++d)
    if (!(tasklet_s[d] >= 0) || !std::isfinite(tasklet_s[d]))
      fail("device {}: tasklet time {} s is not a finite non-negative number", d, tasklet_s[d]);
  if (micro_batches < 1) fail("micro_batches = {}: a macro-batch has at least one micro-batch", micro_batches);
  tasklet_s_ = std::move(tasklet_s);
  micro_batches_ = micro_batches;
}

double CostModel::compute_cost(const std::vector<std::vector<int>>& pipelines) const {
  if (tasklet_s_.empty()) return 0;
  double worst = 0;
  for (const auto& pipeline : pipelines) {
    double sum = 0, slowest = 0;
    for (int d : pipeline) {
      sum += tasklet_s_[static_cast<size_t>(d)];
      slowest = std::max(slowest, tasklet_s_[static_cast<size_t>(d)]);
    }
    worst = std::max(worst, (sum + double(micro_batches_ - 1) * slowest) / double(micro_batches_));
  }
  return worst;
}

std::vector<double> tasklet_seconds(const Cluster& cluster, const Workload& workload, int d_dp, int d_pp) {
  const double flops = workload.tasklet_flops(d_dp, d_pp);
  if (!(flops > 0))
    fail("workload '{}': no tasklet FLOPs (give num_layers, width, seq_len and global_batch) to price compute",
         workload.name);
  std::vector<double> seconds;
  for (int d = 0; d < cluster.size(); ++d) {
    const Device& dev = cluster.devices[d];
    if (!(dev.tflops > 0))
      fail(
          "cluster '{}': device {}{} has no 'tflops': give every device its measured speed (run `tributary plan "
          "--calibrate --config <train.toml>` on that machine) or leave compute out",
          cluster.name, d, dev.region.empty() ? "" : fmt::format(" ({})", dev.region));
    seconds.push_back(flops / (dev.tflops * 1e12));
  }
  return seconds;
}

Evaluation CostModel::evaluate_megatron() const {
  std::vector<std::vector<int>> pipelines(static_cast<size_t>(d_dp_));
  for (int i = 0; i < d_dp_; ++i)
    for (int j = 0; j < d_pp_; ++j) pipelines[i].push_back(j * d_dp_ + i);
  return evaluate_pipelines(pipelines);
}

Evaluation CostModel::evaluate_pipelines(const std::vector<std::vector<int>>& pipelines) const {
  TRIB_CHECK(int(pipelines.size()) == d_dp_, "{} pipelines for D_DP = {}", pipelines.size(), d_dp_);
  Evaluation e;
  for (int j = 0; j < d_pp_; ++j) {
    std::vector<int> group;
    for (const auto& pipeline : pipelines) group.push_back(pipeline.at(size_t(j)));
    e.dp = std::max(e.dp, dp_cost(group));
  }
  for (int j = 0; j + 1 < d_pp_; ++j) {  // the stage boundary waits for its slowest pipeline's link
    double worst = 0;
    for (const auto& pipeline : pipelines) worst = std::max(worst, w_pp_(pipeline[size_t(j)], pipeline[size_t(j + 1)]));
    e.pp += worst;
  }
  e.compute = compute_cost(pipelines);
  e.total = e.dp + 2.0 * e.pp + e.compute;
  for (int j = 0; j < d_pp_; ++j) e.stage_order.push_back(j);
  e.pipelines = pipelines;
  return e;
}

}  // namespace tributary::sched
