#include "tributary/comm/lagged_reduce.h"

#include <exception>

namespace tributary::comm {

LaggedReduce::LaggedReduce(const Store& store, int rank, int world_size, GroupOptions options,
                           const std::string& prefix, int lag)
    : group_(store, rank, world_size, std::move(options), prefix), lag_(std::max(0, lag)) {}

LaggedReduce::~LaggedReduce() {
  // Every rank started the same sums, so on a normal end they complete; after an error (a dead peer) waiting could
  // take the whole collective deadline, so only drain when no exception is on its way.
  if (std::uncaught_exceptions() > 0) return;
  for (auto& p : pending_) {
    try {
      p.work.wait();
    } catch (const std::exception&) {
    }
  }
}

std::vector<double> LaggedReduce::finish(Pending& p) {
  p.work.wait();
  const auto* v = p.value.data_ptr<double>();
  return std::vector<double>(v, v + p.value.numel());
}

std::optional<std::vector<double>> LaggedReduce::step(const std::vector<double>& mine) {
  auto value = torch::tensor(mine, torch::kFloat64);
  auto work = group_.all_reduce_sum_async(value);
  pending_.push_back({value, std::move(work)});
  if (static_cast<int>(pending_.size()) <= lag_) return std::nullopt;
  Pending oldest = std::move(pending_.front());
  pending_.pop_front();
  return finish(oldest);
}

std::vector<std::vector<double>> LaggedReduce::drain() {
  std::vector<std::vector<double>> out;
  while (!pending_.empty()) {
    out.push_back(finish(pending_.front()));
    pending_.pop_front();
  }
  return out;
}

}  // namespace tributary::comm
