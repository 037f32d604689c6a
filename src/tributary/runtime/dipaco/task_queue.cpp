#include "tributary/runtime/dipaco/task_queue.h"

#include <fmt/format.h>
#include <algorithm>

namespace tributary {
namespace {

const std::string kPrefix = "dipaco/";

}  // namespace

TaskQueue::TaskQueue(comm::Store store, int worker) : store_(std::move(store)), worker_(worker) {}

std::optional<int64_t> TaskQueue::claim(int64_t round, int64_t gen, const std::vector<int64_t>& tasks,
                                        const std::vector<int64_t>& prefer) {
  const std::string me = std::to_string(worker_);
  const auto claim_key = [&](int64_t path) { return kPrefix + fmt::format("r{}/claim/{}", round, path); };
  // Generation 0: the first claim of a path wins, and a path this worker claimed before (by preference) is not
  // handed to it again when its turn in the queue comes to it (set_once returns its own earlier value). A re-queued
  // generation re-claims paths a dead worker claimed.
  if (round != mine_round_) {
    mine_.clear();
    mine_round_ = round;
  }
  const auto take = [&](int64_t path) {
    if (gen != 0) {
      store_.set(claim_key(path), me);
      return true;
    }
    if (mine_.count(path) || store_.set_once(claim_key(path), me) != me) return false;
    mine_.insert(path);
    return true;
  };
  if (gen == 0)
    for (int64_t path : prefer)
      if (std::find(tasks.begin(), tasks.end(), path) != tasks.end() && take(path)) return path;
  for (;;) {
    const int64_t index = store_.add(kPrefix + fmt::format("r{}/g{}/next", round, gen), 1) - 1;
    if (index >= static_cast<int64_t>(tasks.size())) return std::nullopt;
    const int64_t path = tasks[static_cast<size_t>(index)];
    if (take(path)) return path;  // else another worker took it by preference: the next one
  }
}

void TaskQueue::done(int64_t round, int64_t path) {
  store_.set(kPrefix + fmt::format("r{}/done/{}", round, path), std::to_string(worker_));
}

std::vector<int64_t> TaskQueue::lost(int64_t round, const std::vector<int64_t>& round_tasks,
                                     const std::vector<int>& members) {
  std::vector<int64_t> lost;
  for (int64_t path : round_tasks) {
    const std::string done_key = kPrefix + fmt::format("r{}/done/{}", round, path);
    const std::string claim_key = kPrefix + fmt::format("r{}/claim/{}", round, path);
    int by = -1;
    if (store_.check({done_key}))
      by = std::stoi(store_.get(done_key));
    else if (store_.check({claim_key}))
      by = std::stoi(store_.get(claim_key));
    if (by < 0 || std::find(members.begin(), members.end(), by) == members.end()) lost.push_back(path);
  }
  return lost;
}

}  // namespace tributary
