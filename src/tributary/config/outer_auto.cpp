#include "tributary/config/outer_auto.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <vector>

#include "tributary/optim/round_length.h"

namespace tributary {

namespace {
constexpr int64_t kManyOuterSteps = 1000;  // from here on, the paper's outer Nesterov
constexpr int64_t kFewOuterSteps = 20;     // fewer than this: a data-parallel warm-up first
}  // namespace

int64_t count_rounds(const DistConfig& dist, int64_t steps) {
  const int64_t start = std::max<int64_t>(0, dist.warmup_ddp_steps);
  const RoundLength length(std::max<int64_t>(1, dist.inner_steps), dist.ramp_steps, 0);
  int64_t rounds = 0;
  for (int64_t s = start; s < steps; s += length.of_round(s - start)) ++rounds;
  return rounds;
}

std::string resolve_outer_auto(DistConfig& dist, int64_t steps, bool islands) {
  const bool auto_warmup = dist.warmup_ddp_steps < 0, auto_momentum = dist.outer_momentum < 0,
             auto_lr = dist.outer_lr < 0;
  if (!auto_warmup && !auto_momentum && !auto_lr) return "";
  const int64_t h = std::max<int64_t>(1, dist.inner_steps);
  if (auto_warmup) dist.warmup_ddp_steps = steps / h < kFewOuterSteps && !islands ? steps / 3 : 0;
  const int64_t rounds = count_rounds(dist, steps);
  const bool paper = rounds >= kManyOuterSteps;
  if (auto_momentum) dist.outer_momentum = paper ? 0.9 : 0.0;
  if (auto_lr) dist.outer_lr = dist.outer_momentum > 0 ? 0.7 : 1.0;
  std::vector<std::string> chosen;
  if (auto_warmup) chosen.push_back(fmt::format("{} data-parallel warm-up steps", dist.warmup_ddp_steps));
  if (auto_lr || auto_momentum)
    chosen.push_back(dist.outer_momentum == 0 && dist.outer_lr == 1.0
                         ? std::string("plain averaging (outer lr 1, momentum 0)")
                         : fmt::format("outer lr {:.3g}, momentum {:.3g}", dist.outer_lr, dist.outer_momentum));
  // SparseLoCo's average carries about 1/N of what each replica sent: from scratch, plain averaging loses 9% where
  // outer lr 3 is +0.7% (median of three seeds; docs/benchmarks.md §48); after pre-training plain averaging was
  // measured fine (§13.2), and this rule cannot tell the two apart, so it says so instead of choosing.
  const bool sparse_hint = auto_lr && dist.compression == "sparseloco" && dist.outer_lr == 1.0;
  return fmt::format("DiLoCo settings from the run ({} steps, H = {}: {} outer steps{}): {}{}", steps, h, rounds,
                     dist.warmup_ddp_steps > 0 ? " after the warm-up" : "", fmt::join(chosen, ", "),
                     sparse_hint ? "; SparseLoCo from scratch does better with --set dist.outer_lr=3 "
                                   "(configs/sparseloco.toml)"
                                 : "");
}

}  // namespace tributary
