// Pipeline schedules without processes (shared/reference/pipeline-and-local.md §3.1): for p in 1..8 and m in 1..3p,
// GPipe and 1F1B(d) dry-run without deadlock, every send received, each micro-batch forwarded before it is backwarded,
// the activations held as the formulas say, and at zero latency the idle fraction (p-1)/(m+p-1).
#include <gtest/gtest.h>

#include <map>

#include "tributary/core/error.h"
#include "tributary/parallel/pipeline/schedule.h"

using namespace tributary;
using namespace tributary::pipeline;

TEST(PipelineSchedule, EveryScheduleRunsWithoutDeadlockAndMatchesTheFormulas) {
  int checked = 0;
  for (int64_t p = 1; p <= 8; ++p) {
    for (int64_t m = 1; m <= 3 * p; ++m) {
      for (auto [kind, d] : std::vector<std::pair<ScheduleKind, int64_t>>{
               {ScheduleKind::GPipe, 0}, {ScheduleKind::OneFOneB, 0}, {ScheduleKind::OneFOneB, 2}}) {
        const ScheduleSpec spec{kind, p, m, d};
        SCOPED_TRACE(testing::Message() << "p=" << p << " m=" << m << " kind=" << int(kind) << " d=" << d);
        for (int64_t i = 0; i < p; ++i) {
          // forwards precede their backwards, each exactly once
          std::map<int64_t, int> forwarded, backwarded;
          for (const Action& a : stage_actions(spec, i)) {
            if (a.op == Op::Forward) forwarded[a.mb] += 1;
            if (a.op == Op::Backward) {
              ASSERT_EQ(forwarded[a.mb], 1) << "backward before forward of micro-batch " << a.mb;
              backwarded[a.mb] += 1;
            }
          }
          ASSERT_EQ(int64_t(forwarded.size()), m);
          ASSERT_EQ(int64_t(backwarded.size()), m);
        }
        const DryRun run = dry_run(spec);
        ASSERT_FALSE(run.deadlock) << run.why;
        EXPECT_EQ(run.messages, 2 * m * (p - 1));  // activations down, gradients up
        for (int64_t i = 0; i < p; ++i)            // GPipe: m; 1F1B: min(m, w_i + 1)
          EXPECT_EQ(run.peak_held[size_t(i)], peak_activations(spec, i)) << i;
        EXPECT_NEAR(run.idle_fraction(), double(p - 1) / double(m + p - 1), 1e-12);
        EXPECT_NEAR(run.makespan, double(m + p - 1) * 3.0, 1e-9);  // t_f = 1, t_b = 2
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 3 * 108);
}

TEST(PipelineSchedule, OneFOneBHoldsFewerActivationsThanGPipe) {
  const ScheduleSpec gpipe{ScheduleKind::GPipe, 4, 8, 0}, one{ScheduleKind::OneFOneB, 4, 8, 0};
  const auto a = dry_run(gpipe), b = dry_run(one);
  EXPECT_EQ(a.peak_held, (std::vector<int64_t>{8, 8, 8, 8}));
  EXPECT_EQ(b.peak_held, (std::vector<int64_t>{4, 3, 2, 1}));  // Megatron: p - i
}

TEST(PipelineSchedule, AWarmUpMarginHidesLinkLatency) {
  // Reference §5 (p = 8, m = 32, t_f = 1, t_b = 2): GPipe's time is (m+p-1)(t_f+t_b) + 2(p-1)L; plain 1F1B is far
  // slower on a slow link, and 1F1B(d) with d >= ceil(2L/(t_f+t_b)) catches up.
  for (double L : {1.5, 4.0, 11.0}) {
    SCOPED_TRACE(L);
    const DryRunCosts costs{.latency = L};
    const double gpipe = dry_run({ScheduleKind::GPipe, 8, 32, 0}, costs).makespan;
    EXPECT_NEAR(gpipe, 39 * 3.0 + 14 * L, 1e-9);
    const double plain = dry_run({ScheduleKind::OneFOneB, 8, 32, 0}, costs).makespan;
    EXPECT_GT(plain, 1.4 * gpipe);
    const auto d = static_cast<int64_t>(std::ceil(2 * L / 3.0));
    EXPECT_NEAR(dry_run({ScheduleKind::OneFOneB, 8, 32, d}, costs).makespan, gpipe, 1e-9) << "d = " << d;
  }
}

TEST(PipelineSchedule, AMisorderedListIsCaughtAsADeadlock) {
  // The dry run must be able to fail: stage 0 waits for a gradient stage 1 never sends; then both stages receive
  // before they send (a cycle).
  const std::vector<std::vector<Action>> missing = {
      {{Op::Forward, 0}, {Op::SendAct, 0}, {Op::RecvGrad, 0}, {Op::Backward, 0}},
      {{Op::RecvAct, 0}, {Op::Forward, 0}, {Op::Backward, 0}}};
  const DryRun a = dry_run(missing);
  EXPECT_TRUE(a.deadlock);
  EXPECT_NE(a.why.find("stage 0 waits in recv-gradient of micro-batch 0"), std::string::npos) << a.why;
  const std::vector<std::vector<Action>> cycle = {
      {{Op::RecvGrad, 0}, {Op::Forward, 0}, {Op::SendAct, 0}, {Op::Backward, 0}},
      {{Op::RecvAct, 0}, {Op::Forward, 0}, {Op::Backward, 0}, {Op::SendGrad, 0}}};
  EXPECT_TRUE(dry_run(cycle).deadlock);
  const std::vector<std::vector<Action>> unmatched = {{{Op::Forward, 0}, {Op::SendAct, 0}, {Op::Backward, 0}}, {}};
  EXPECT_TRUE(dry_run(unmatched).deadlock);
  EXPECT_THROW(parse_schedule("zero-bubble", "parallel.schedule"), Error);
}
