// The islands' outer round on a cluster's links (sched/outer_round.h), checked against hand-computed values.
#include <gtest/gtest.h>

#include "support/error_of.h"
#include "tributary/sched/outer_round.h"

using namespace tributary;
using namespace tributary::sched;
using tributary::test_support::error_of;

namespace {

// Two sites of two devices: 10 Gbit/s and no latency inside a site, 100 Mbit/s and 50 ms between (the testbed's
// link of docs/benchmarks.md §18.1, with a latency).
Cluster two_sites(double tflops = 10) {
  Cluster c;
  for (int d = 0; d < 4; ++d) c.devices.push_back({d < 2 ? "a" : "b", tflops, 16});
  c.latency_ms = Matrix(4);
  c.bandwidth_gbps = Matrix(4);
  for (int i = 0; i < 4; ++i)
    for (int k = 0; k < 4; ++k) {
      const bool same = (i < 2) == (k < 2);
      c.latency_ms(i, k) = same ? 0 : 50;
      c.bandwidth_gbps(i, k) = same ? 10 : 0.1;
    }
  return c;
}

}  // namespace

TEST(OuterRound, TheShardedExchangeGainsOnlyWhereEachRankHasItsOwnLink) {
  const Cluster c = two_sites();
  const std::vector<Site> sites = {{"a", 0, 2}, {"b", 2, 2}};
  const OuterRoundCost cost = price_outer_round(
      c, sites, {.parameters = 1e6, .tokens_per_device = 1000, .payload_gb = 0.0125, .inner_steps = 10});
  EXPECT_NEAR(cost.leader_s, 0.05 + 0.0125 * 8 / 0.1, 1e-12);            // 1.05 s: one stream carries it all
  EXPECT_NEAR(cost.sharded_s, 0.05 + 0.00625 * 8 / 0.1, 1e-12);          // 0.55 s: two streams on their own links
  EXPECT_NEAR(cost.sharded_shared_s, 0.05 + 0.00625 * 8 / 0.05, 1e-12);  // 1.05 s: two streams on one link
  EXPECT_NEAR(cost.compute_s, 10 * 6 * 1e6 * 1000 / 10e12, 1e-12);
  // Inside: 10 ring all-reduces of 4 MB of gradients between two devices (2 x 2 MB each way) and one all-gather of
  // a 2 MB shard, all at 10 Gbit/s.
  EXPECT_NEAR(cost.inside_s, 10 * 2 * 0.002 * 8 / 10 + 0.002 * 8 / 10, 1e-12);
}

TEST(OuterRound, SitesOfUnlikeSizeOrDevicesWithoutASpeedAreNamed) {
  const Cluster c = two_sites();
  EXPECT_NE(error_of([&] { price_outer_round(c, {{"a", 0, 1}, {"b", 1, 3}}, {}); }).find("site 'b' has 3 device(s)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { price_outer_round(two_sites(0), {{"a", 0, 2}, {"b", 2, 2}}, {}); }).find("no 'tflops'"),
            std::string::npos);
}

TEST(OuterRound, SparseLoCosPayloadIsItsWireFormat) {
  // comm/sparse_chunks.h at 4096 / 64 / 2 bits: 8 bytes + 64 x 14 bits = 120 bytes per full chunk.
  EXPECT_NEAR(sparseloco_payload_gb(4096.0 * 1000, 4096, 64, 2), 120e3 / 1e9, 1e-15);
}
