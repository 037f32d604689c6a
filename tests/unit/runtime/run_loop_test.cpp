// The one run loop (runtime/run_loop.h) over a scripted source of work: the order of a unit's steps, the end, and a
// planned stop, without a model or processes.
#include "tributary/runtime/run_loop.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

using namespace tributary;

namespace {

// Units of `steps_per_unit` steps up to `total`; records what the loop asked, in order.
class ScriptedWork : public WorkSource {
 public:
  ScriptedWork(int64_t start, int64_t total, int64_t steps_per_unit, bool quiet_every_other = false)
      : step_(start), total_(total), per_unit_(steps_per_unit), quiet_every_other_(quiet_every_other) {}
  StopAgreement::Vote stop_vote() override { return {}; }
  bool lead() const override { return true; }
  bool done() const override { return step_ >= total_; }
  UnitDone next() override {
    step_ += per_unit_;
    calls.push_back("unit " + std::to_string(step_));
    const bool quiescent = !quiet_every_other_ || (step_ / per_unit_) % 2 == 0;
    return {.step = step_, .quiescent = quiescent, .synced = true, .round = true};
  }
  Due due_after(const UnitDone& unit, bool stop) override {
    return {.last = unit.step == total_, .stop = stop, .eval = unit.step % 4 == 0, .checkpoint = stop};
  }
  void when_due(const UnitDone& unit, const Due& due) override {
    if (due.eval) calls.push_back("eval " + std::to_string(unit.step));
    if (due.checkpoint) calls.push_back("checkpoint " + std::to_string(unit.step));
  }
  void between_units(const UnitDone& unit) override { calls.push_back("between " + std::to_string(unit.step)); }
  TrainSummary finish(bool stopped_early) override {
    calls.push_back(stopped_early ? "finish stopped" : "finish");
    TrainSummary s;
    s.steps = step_;
    s.stopped_early = stopped_early;
    return s;
  }
  std::vector<std::string> calls;

 private:
  int64_t step_, total_, per_unit_;
  bool quiet_every_other_;
};

}  // namespace

TEST(RunLoop, DrivesUnitsToTheLastAndAsksWhatIsDueAfterEach) {
  ScriptedWork work(0, 6, 2);
  const TrainSummary s = run_loop(work, 0);
  EXPECT_EQ(s.steps, 6);
  EXPECT_FALSE(s.stopped_early);
  EXPECT_EQ(work.calls,
            (std::vector<std::string>{"unit 2", "between 2", "unit 4", "eval 4", "between 4", "unit 6", "finish"}));
}

TEST(RunLoop, APlannedStopEndsAfterTheUnitThatReachesItWithACheckpoint) {
  ScriptedWork work(0, 20, 3);  // units end at 3, 6, 9: the stop after step 5 lands at 6
  const TrainSummary s = run_loop(work, 5);
  EXPECT_TRUE(s.stopped_early);
  EXPECT_EQ(s.steps, 6);
  EXPECT_EQ(work.calls.back(), "finish stopped");
  EXPECT_EQ(work.calls[work.calls.size() - 2], "checkpoint 6");
}

TEST(RunLoop, AStopWaitsForAQuiescentUnit) {
  ScriptedWork work(0, 20, 1, /*quiet_every_other=*/true);  // steps 1, 3, 5 have an exchange in flight
  const TrainSummary s = run_loop(work, 3);
  EXPECT_EQ(s.steps, 4);
  EXPECT_TRUE(s.stopped_early);
}

TEST(RunLoop, AStopAtTheLastStepIsTheEndNotAnEarlyStop) {
  ScriptedWork work(0, 4, 2);
  EXPECT_FALSE(run_loop(work, 4).stopped_early);
}

TEST(RunLoop, ASourceThatStartsDoneIsFinishedWithoutAUnit) {
  ScriptedWork work(8, 8, 2);  // e.g. a joiner that found the run over
  const TrainSummary s = run_loop(work, 0);
  EXPECT_EQ(work.calls, (std::vector<std::string>{"finish"}));
  EXPECT_EQ(s.steps, 8);
}
