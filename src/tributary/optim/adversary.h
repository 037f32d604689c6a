// A participant that holds the run's secret and still sends what it should not: the one seam through which tests and
// benchmarks make a replica lie (`train --adversary RANK:KIND`, or TRIBUTARY_BAD_UPDATE for the older two kinds);
// never installed by default. It rewrites this replica's update just before the exchange sends it (ResilientAverage),
// so everything downstream — the ring or the robust rule, the logs, the metrics — sees what a lying peer would send.
//   nan        one value NaN (and the rest x100)        scaled     x100 (scale100 is its older name)
//   sign_flip  the update negated                        noise      Gaussian noise of the update's norm
//   zeros      nothing (a free rider)                    replay     again what it sent two exchanges before
//   stale      its own honest update of two exchanges before, never sent (a delayed update: new values, old model)
//   copy       another participant's update of the last exchange (what the robust rule gathered; on the ring,
//              the average it received)
//   poison     an honest update of poisoned data: the replica's windows are shuffled token by token (data/loader.h)
#pragma once

#include <torch/torch.h>

#include <deque>
#include <map>
#include <string>
#include <vector>

namespace tributary {

class Adversary {
 public:
  static const std::vector<std::string>& kinds();
  // Error naming the kinds when `kind` is not one. `seed`: the noise's.
  Adversary(std::string kind, uint64_t seed);

  const std::string& kind() const { return kind_; }
  // This replica's update for the caller's recurring exchange `stream`, replaced in place before it is sent.
  void corrupt(std::vector<torch::Tensor>& update, int stream);
  // What the exchange let this replica see of the others (one dimension, the update's length): another participant's
  // update as received, or the average. The copy sends it next time.
  void saw(const torch::Tensor& other, int stream) { seen_[stream] = other.clone(); }

 private:
  std::string kind_;
  std::map<int, std::deque<std::vector<torch::Tensor>>> own_;  // replay, stale: the last two, newest last
  std::map<int, torch::Tensor> seen_;                          // copy
  at::Generator gen_;
};

}  // namespace tributary
