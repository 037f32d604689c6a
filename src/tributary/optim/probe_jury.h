// dist.score = "loss": who measures each update of a robust exchange with the UpdateProbe (optim/update_probe.h),
// and how the measurements become one number per update that every rank holds alike.
//   jurors     update i is evaluated by the `evaluators` ranks after its sender in the group, never by its sender
//   batch      drawn from a seed of the run's seed, the exchange and a sample of every update's values: no sender
//              knows it when it sends
//   weight     each update applied at 1/n, its weight in the round's mean
//   verdict    the evaluations are all-gathered (comm::Exchange::gather_values: fp64, signed); an update's
//              improvement is its jurors' median, so one lying juror of three moves nothing
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "tributary/comm/exchange.h"
#include "tributary/optim/update_probe.h"

namespace tributary {

// The probe batch's seed of an exchange: the run's `seed`, the exchange's number and 1,024 strided values of every
// update, so that no sender knows the batch when it sends.
uint64_t probe_batch_seed(uint64_t seed, const std::vector<torch::Tensor>& updates, int64_t exchange);

class ProbeJury {
 public:
  ProbeJury(std::unique_ptr<UpdateProbe> probe, int evaluators, uint64_t seed)
      : probe_(std::move(probe)), evaluators_(evaluators), seed_(seed) {}

  bool applies(int64_t numel) const { return probe_->applies(numel); }
  // Every update's lowering of the probe's loss (NaN: not measured), for `gathered` (comm::Exchange::gather's
  // result: this rank is `rank` of its group) in exchange `exchange`. Collective over `exchange_group`.
  std::vector<double> improvements(comm::Exchange& exchange_group, int rank, const std::vector<torch::Tensor>& gathered,
                                   int64_t exchange);

 private:
  std::unique_ptr<UpdateProbe> probe_;
  int evaluators_;
  uint64_t seed_;
};

}  // namespace tributary
