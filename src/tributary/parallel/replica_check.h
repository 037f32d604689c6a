// Replicas that should be identical are verified so (xxh64 of the parameters, all-gathered): a mismatch is an Error
// naming the ranks, never a silent drift. A check can block, or queue behind the exchanges in flight and be verified
// later (overlap mode), at the latest when the caller waits for all of them.
// Fault tolerant replicas pass `abandon` (true once a member is dead): a check the death interrupts is skipped with a
// warning instead of failing the run — the next round finds the dead member and re-forms without it.
#pragma once

#include <deque>
#include <functional>
#include <future>
#include <string>

#include "tributary/comm/comm_thread.h"
#include "tributary/comm/group.h"
#include "tributary/model/tensor_io.h"

namespace tributary {

class ReplicaCheck {
 public:
  ReplicaCheck(comm::CommThread& thread, comm::Group& group, std::function<bool()> abandon = {})
      : thread_(thread), group_(group), abandon_(std::move(abandon)) {}
  void now(const NamedTensors& params, const std::string& when);
  void later(const NamedTensors& params, const std::string& when);
  void verify(bool wait);  // the checks that have arrived (all of them when `wait`)

 private:
  struct Pending {
    std::future<std::vector<torch::Tensor>> hashes;
    std::string when;
  };
  std::vector<torch::Tensor> gather(const torch::Tensor& mine, const std::string& when);  // communication thread

  comm::CommThread& thread_;
  comm::Group& group_;
  std::function<bool()> abandon_;
  std::deque<Pending> pending_;
};

}  // namespace tributary
