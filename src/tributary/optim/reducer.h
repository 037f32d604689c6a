// How tensors become their average across replicas, as the outer loop and data parallel see it: start() hands them
// over (it returns at once when the reduction runs elsewhere), wait() collects the result. ResilientAverage
// (optim/resilient_average.h) is the real one (comm/exchange.h on the communication thread, the wait counted as blocked
// time, with rejection and fault tolerance); tests pass fakes.
// Units with one owner each (DiPaCo's modules) use the other reduction, optim/owner_reducer.h.
#pragma once

#include <torch/torch.h>

#include <future>
#include <vector>

#include "tributary/comm/comm_thread.h"
#include "tributary/comm/exchange.h"

namespace tributary {

class Reducer {
 public:
  virtual ~Reducer() = default;
  // `stream`: which of the caller's recurring reductions this is (a fragment, a bucket); stateful codecs keep their
  // error feedback per stream (comm::Exchange::average).
  virtual std::future<std::vector<torch::Tensor>> start(std::vector<torch::Tensor> tensors, int stream = 0) = 0;
  virtual std::vector<torch::Tensor> wait(std::future<std::vector<torch::Tensor>> pending) { return pending.get(); }
};

}  // namespace tributary
