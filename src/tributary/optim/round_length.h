// How many inner steps a DiLoCo round lasts (H). Two rules bend the fixed H:
//   ramp  a round that begins within `ramp_steps` steps of DiLoCo's start lasts max(1, round(H * s / ramp_steps))
//         steps, s = steps since the start: from scratch the replicas drift apart fastest while the loss falls
//         fastest, so the first rounds are short and lengthen in proportion to the run so far, reaching H at
//         `ramp_steps`. The cost is about (ramp_steps / H) * ln(ramp_steps) extra exchanges, not the data-parallel
//         warm-up's one per step (docs/benchmarks.md §22);
//   QSR   (arXiv 2310.14423) H rises to floor((alpha / lr)^2) as the learning rate decays; it follows the learning
//         rate of every step, so a round may lengthen while it runs.
// No LibTorch.
#pragma once

#include <cstdint>

namespace tributary {

class RoundLength {
 public:
  RoundLength(int64_t inner_steps, int64_t ramp_steps, double qsr_alpha);

  void observe_lr(double lr);  // QSR: the learning rate of the step just taken (0 leaves H as it was)
  // The length of the round that began `since_start` steps after DiLoCo's start.
  int64_t of_round(int64_t since_start) const;
  int64_t now() const { return h_; }  // H as the rules leave it outside the ramp

 private:
  int64_t inner_steps_, ramp_steps_;
  double qsr_alpha_;
  int64_t h_;
};

}  // namespace tributary
