// Replicas that should be identical are verified so (xxh64 of the parameters, all-gathered): a mismatch is an Error
// naming the ranks, never a silent drift. A check can block, or queue behind the exchanges in flight and be verified
// later (overlap mode), at the latest when the caller waits for all of them.
#pragma once

#include <deque>
#include <future>
#include <string>

#include "tributary/comm/comm_thread.h"
#include "tributary/comm/group.h"
#include "tributary/model/tensor_io.h"

namespace tributary {

class ReplicaCheck {
 public:
  ReplicaCheck(comm::CommThread& thread, comm::Group& group) : thread_(thread), group_(group) {}
  void now(const NamedTensors& params, const std::string& when);
  void later(const NamedTensors& params, const std::string& when);
  void verify(bool wait);  // the checks that have arrived (all of them when `wait`)

 private:
  struct Pending {
    std::future<std::vector<torch::Tensor>> hashes;
    std::string when;
  };
  comm::CommThread& thread_;
  comm::Group& group_;
  std::deque<Pending> pending_;
};

}  // namespace tributary
