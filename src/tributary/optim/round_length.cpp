#include "tributary/optim/round_length.h"

#include <algorithm>
#include <cmath>

namespace tributary {

RoundLength::RoundLength(int64_t inner_steps, int64_t ramp_steps, double qsr_alpha)
    : inner_steps_(inner_steps), ramp_steps_(ramp_steps), qsr_alpha_(qsr_alpha), h_(inner_steps) {}

void RoundLength::observe_lr(double lr) {
  if (qsr_alpha_ <= 0 || lr <= 0) return;
  const double h = std::floor(std::pow(qsr_alpha_ / lr, 2.0));
  h_ = std::max<int64_t>(inner_steps_, static_cast<int64_t>(std::min(h, 1e9)));
}

int64_t RoundLength::of_round(int64_t since_start) const {
  if (ramp_steps_ <= 0 || since_start >= ramp_steps_) return h_;
  const double h = std::round(double(inner_steps_) * double(since_start) / double(ramp_steps_));
  return std::clamp<int64_t>(static_cast<int64_t>(h), 1, inner_steps_);
}

}  // namespace tributary
