// The hybrid genetic scheduler of Yuan et al. (after Kang & Moon's multiway partitioning GA): a population of
// balanced partitions of the devices into D_PP stage groups of D_DP, five-point crossover on label-normalised
// parents with a balance repair, local search on every offspring, steady-state replacement of the worse parent.
//
// Local search: candidate swaps come from the paper's rule (the fastest pair inside each of two groups gives four
// swap candidates, ranked by the paper's GAIN on w_PP), followed by random swaps; a swap is kept only if the exact
// cost (cost_model.h, evaluated incrementally) goes down. Fixing the paper code's defects: replacement compares costs,
// and the RNG is seeded, so a seed gives the same plan.
//
// Both cores: independent islands (one thread each, seeds derived from the seed) with a fixed number of offspring;
// the best plan wins. The time budget is a safety cap: if it cuts a run short the result says so (and is then no
// longer reproducible).
#pragma once

#include <cstdint>

#include "tributary/sched/cost_model.h"

namespace tributary::sched {

struct GeneticOptions {
  uint64_t seed = 1;
  int population = 100;
  int offspring = 16;  // per island (each offspring is locally optimised: ~0.1 s on 64 devices)
  int islands = 2;     // threads
  double time_budget_s = 5.0;
  int random_swaps = 64;  // random swap tries per local-search round, after the paper's candidates
};

struct ScheduleResult {
  Partition partition;
  Evaluation evaluation;
  int64_t evaluations = 0;  // full or incremental cost evaluations
  double seconds = 0;
  bool budget_hit = false;
};

// Error (naming the flag) for options out of range; schedule_genetic checks them before any thread starts.
void validate(const GeneticOptions& options);
ScheduleResult schedule_genetic(const CostModel& model, const GeneticOptions& options);

struct RandomBaseline {
  double best = 0, mean = 0;
  Partition best_partition;
};
// k random balanced partitions (each evaluated with the full cost model: matching and TSP included).
RandomBaseline random_baseline(const CostModel& model, int k, uint64_t seed);

}  // namespace tributary::sched
