// The communication cost model of Yuan et al. (arXiv 2206.01288), exactly as the paper/public code computes it,
// so numbers compare with theirs (shared/reference/scheduling.md):
//   w_DP(d,d') = alpha(d,d') + c_DP / (D_DP * beta(d,d'))       w_PP(d,d') = alpha(d,d') + c_PP / beta(d,d')
//   DP(C_j)    = max_{d in C_j} sum_{d' in C_j, d' != d} 2 * w_DP(d,d');   DP = max_j DP(C_j)
//   edge(C_j, C_j') = bottleneck perfect matching of the two groups under w_PP
//   PP         = open-loop TSP (Hamiltonian path) over the D_PP groups with those edges
//   total      = DP + 2 * PP   (seconds of communication per iteration)
// Beyond the paper: with sync_every = H (DiLoCo per stage: the replicas exchange every H iterations) w_DP is divided by
// H, latency included, so DP is the exchange's share of one iteration; H = 1 is the paper's model.
// Units: alpha in ms -> s, c in GB -> Gbit (x8), beta in Gbit/s.
// Beyond the paper, only when set_compute() is given per-device speeds (a cluster's `tflops`, measured by
// `tributary plan --calibrate`): compute = max over pipelines i of (sum_s t_is + (m - 1) max_s t_is) / m, t_is the
// seconds of stage s's tasklet on pipeline i's device and m the micro-batches (GPipe's fill and drain over uneven
// stages: m = 1 runs the stages one after another, many micro-batches run at the slowest stage's pace); the
// data-parallel replicas wait for the slowest pipeline. total = DP + 2 * PP + compute. Without it the model is the
// paper's.
#pragma once

#include <string>
#include <vector>

#include "tributary/sched/cluster.h"
#include "tributary/sched/workload.h"

namespace tributary::sched {

// groups[j] = the devices of stage group C_j (the data-parallel group of one stage), each of size d_dp.
using Partition = std::vector<std::vector<int>>;

struct Evaluation {
  double dp = 0, pp = 0, compute = 0, total = 0;  // compute: 0 unless the model has per-device speeds
  std::vector<int> stage_order;                   // group index per pipeline position
  std::vector<std::vector<int>> pipelines;        // pipelines[i][s] = device of pipeline i at stage position s
};

class CostModel {
 public:
  CostModel(const Cluster& cluster, double c_dp_gb, double c_pp_gb, int d_dp, int d_pp, int64_t sync_every = 1);

  int d_dp() const { return d_dp_; }
  int d_pp() const { return d_pp_; }
  int num_devices() const { return n_; }
  double w_pp(int a, int b) const { return w_pp_(a, b); }
  double w_dp(int a, int b) const { return w_dp_(a, b); }

  double dp_cost(const std::vector<int>& group) const;
  // Bottleneck perfect matching between equal-size groups; match[i] = index in b of a[i]'s partner.
  double bottleneck_matching(const std::vector<int>& a, const std::vector<int>& b,
                             std::vector<int>* match = nullptr) const;
  // Cheapest open Hamiltonian path over a complete graph (exact Held-Karp up to 16 nodes, 2-opt beyond).
  static double open_tsp(const Matrix& edges, std::vector<int>* order = nullptr);

  // Beyond the paper: seconds of one tasklet (forward + backward of one stage on one macro-batch) per device, and the
  // micro-batches m per macro-batch. Error when a size or value is wrong.
  void set_compute(std::vector<double> tasklet_s, int micro_batches);
  bool has_compute() const { return !tasklet_s_.empty(); }
  // The compute term above for these pipelines (pipelines[i][s] = device); 0 without set_compute.
  double compute_cost(const std::vector<std::vector<int>>& pipelines) const;
  // The pipelines a partition forms along a stage order: each stage group's device follows the bottleneck matching
  // with the previous group.
  std::vector<std::vector<int>> pipelines_of(const Partition& p, const std::vector<int>& stage_order) const;

  double cost(const Partition& p) const;  // total only (the scheduler's fitness)
  Evaluation evaluate(const Partition& p) const;
  // Megatron's rank order: stage j on devices j*d_dp .. j*d_dp + d_dp - 1, stages in id order, the i-th device of a
  // stage feeding the i-th device of the next (no matching, no TSP).
  Evaluation evaluate_megatron() const;
  // A fixed placement (pipelines[i][j] = device of stage j of pipeline i, e.g. a placement.json's): no matching, no
  // TSP, only its cost.
  Evaluation evaluate_pipelines(const std::vector<std::vector<int>>& pipelines) const;

 private:
  int n_, d_dp_, d_pp_;
  Matrix w_pp_, w_dp_;
  std::vector<double> tasklet_s_;  // empty: communication only (the paper's model)
  int micro_batches_ = 1;
};

// Seconds of one tasklet on every device: the workload's tasklet FLOPs over the device's `tflops`. Error naming the
// first device without a speed (give every device `tflops`, or calibrate).
std::vector<double> tasklet_seconds(const Cluster& cluster, const Workload& workload, int d_dp, int d_pp);

// Checks that the layout covers the cluster; Error naming the fields otherwise.
constexpr int kMaxDataParallel = 64;  // d_dp limit of the matching (one 64-bit mask per stage group)
void check_layout(const Cluster& cluster, int d_dp, int d_pp);

}  // namespace tributary::sched
