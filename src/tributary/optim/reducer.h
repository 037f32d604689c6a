// How tensors become their average across replicas, as the outer loop and data parallel see it: start() hands them
// over (it returns at once when the reduction runs elsewhere), wait() collects the result. ExchangeAverage is the
// real one (comm/exchange.h on the communication thread, the wait counted as blocked time); tests pass fakes.
// DiPaCo's weighted owner ring is the other reduction (optim/module_ring.h).
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
  virtual std::future<std::vector<torch::Tensor>> start(std::vector<torch::Tensor> tensors) = 0;
  virtual std::vector<torch::Tensor> wait(std::future<std::vector<torch::Tensor>> pending) { return pending.get(); }
};

// The tensors (fp32, CPU) are averaged in place; the future yields the same tensors.
class ExchangeAverage : public Reducer {
 public:
  ExchangeAverage(comm::CommThread& thread, comm::Exchange& exchange) : thread_(thread), exchange_(exchange) {}
  std::future<std::vector<torch::Tensor>> start(std::vector<torch::Tensor> tensors) override {
    return thread_.enqueue<std::vector<torch::Tensor>>([this, t = std::move(tensors)]() mutable {
      exchange_.average(t);
      return t;
    });
  }
  std::vector<torch::Tensor> wait(std::future<std::vector<torch::Tensor>> pending) override {
    return thread_.wait(std::move(pending));
  }

 private:
  comm::CommThread& thread_;
  comm::Exchange& exchange_;
};

}  // namespace tributary
