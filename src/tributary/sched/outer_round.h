// One outer round of islands (parallel.islands: data parallel inside a site, DiLoCo across; runtime/sync/island_sync.h)
// priced on a cluster file's links, to compare the outer exchange carried by one leader per site with the sharded one
// (rank r of every site exchanges the r-th 1/N of the pseudo-gradient with rank r of the other sites, then the site
// all-gathers the N shards). The links are the cost model's (cost_model.h: alpha in ms, beta in Gbit/s per device
// pair, c in GB); an exchange among one device per site is an all-gather of every site's payload (SparseLoCo's
// collective; dense codecs' ring all-reduce costs about the same per rank for many sites):
//   across(G, c) = max_{d in G} sum_{d' in G, d' != d} (alpha(d,d') + c / beta(d,d'))
//   leader              across(first device of every site, payload)
//   sharded, own links  max over r of across(device r of every site, payload / N): the N groups run at once, each
//                       on its own device pairs (the cost model's assumption, also the case of one NIC per GPU)
//   sharded, one uplink the same with beta / N: the site's N streams share one link (what the testbed measured,
//                       docs/benchmarks.md §18.1; then sharding saves per-rank bytes, not time)
//   inside              H ring all-reduces of the fp32 gradients among the site's devices (the paper's DP term) plus
//                       the all-gather of the shards after the exchange
//   compute             H x 6 x parameters x tokens per device per step / the slowest device's tflops
// No LibTorch.
#pragma once

#include <cstdint>
#include <vector>

#include "tributary/sched/cluster.h"
#include "tributary/sched/sites.h"

namespace tributary::sched {

struct OuterRoundInput {
  double parameters = 0;         // of the model
  double tokens_per_device = 0;  // per step
  double payload_gb = 0;         // what one site sends in the exchange (encoded pseudo-gradient)
  int64_t inner_steps = 50;      // H
};

struct OuterRoundCost {
  double compute_s = 0, inside_s = 0;
  double leader_s = 0, sharded_s = 0, sharded_shared_s = 0;  // the exchange across the sites
};

// Error when a site is empty, the sites are not of one size (the sharded exchange pairs rank r of every site), or a
// device has no `tflops`.
OuterRoundCost price_outer_round(const Cluster& cluster, const std::vector<Site>& sites, const OuterRoundInput& in);

// SparseLoCo's payload for `parameters` values (comm/sparse_chunks.h's layout: two fp32 per chunk, then k (index,
// code) pairs per chunk), in GB.
double sparseloco_payload_gb(double parameters, int64_t chunk, int64_t k, int64_t bits);

}  // namespace tributary::sched
