#include "tributary/runtime/dipaco/task_queue.h"

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "tributary/core/error.h"
#include "tributary/core/log.h"

namespace tributary {
namespace {

constexpr auto kClaimPoll = std::chrono::milliseconds(50);
const std::string kPrefix = "dipaco/";

}  // namespace

TaskQueue::TaskQueue(comm::Store store, comm::Store heartbeat_store, int worker, double dead_after_s)
    : store_(std::move(store)),
      worker_(worker),
      dead_after_s_(dead_after_s),
      heartbeat_(std::move(heartbeat_store), kPrefix, worker, std::chrono::milliseconds(500)) {}

TaskQueue::~TaskQueue() = default;

std::string TaskQueue::get(const std::string& key) { return store_.get(kPrefix + key); }
void TaskQueue::set(const std::string& key, const std::string& value) { store_.set(kPrefix + key, value); }
bool TaskQueue::has(const std::string& key) { return store_.check({kPrefix + key}); }

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
  set(fmt::format("r{}/done/{}", round, path), std::to_string(worker_));
}

Verdict TaskQueue::settle(int64_t round, int64_t gen, const std::vector<int>& members,
                          const std::vector<int64_t>& round_tasks, bool requeue) {
  set(fmt::format("r{}/g{}/idle/{}", round, gen, worker_), "1");
  const std::string verdict_key = fmt::format("r{}/g{}/verdict", round, gen);
  // The decider is the first member still alive: when the leader dies while the others wait for its verdict, the
  // next one decides (its liveness read says so after dist.heartbeat_timeout_s). The first verdict written wins,
  // so a leader taken for dead that still decides cannot split the workers.
  comm::Liveness liveness(store_, kPrefix, worker_, dead_after_s_);
  while (!has(verdict_key)) {
    int decider = worker_;
    for (int w : members)
      if (w == worker_ || !liveness.dead(w)) {
        decider = w;
        break;
      }
    if (decider == worker_) {
      Verdict mine = decide(round, gen, members, round_tasks, requeue);
      nlohmann::json j = {
          {"again", mine.again}, {"tasks", mine.tasks}, {"members", mine.members}, {"dropped", mine.dropped}};
      store_.set_once(kPrefix + verdict_key, j.dump());
      break;
    }
    std::this_thread::sleep_for(kClaimPoll);
  }
  auto j = nlohmann::json::parse(get(verdict_key));
  Verdict v;
  v.again = j.at("again").get<bool>();
  v.tasks = j.at("tasks").get<std::vector<int64_t>>();
  v.members = j.at("members").get<std::vector<int>>();
  v.dropped = j.at("dropped").get<std::vector<int64_t>>();
  if (std::find(v.members.begin(), v.members.end(), worker_) == v.members.end())
    fail(
        "worker {} was declared dead in round {} (its heartbeat was silent for more than dist.heartbeat_timeout_s "
        "= {} s); raise the timeout if workers stall that long",
        worker_, round + 1, dead_after_s_);
  return v;
}

Verdict TaskQueue::decide(int64_t round, int64_t gen, const std::vector<int>& members,
                          const std::vector<int64_t>& round_tasks, bool requeue) {
  comm::Liveness liveness(store_, kPrefix, worker_, dead_after_s_);
  for (;;) {
    std::vector<int> alive, dead;
    bool all_idle = true;
    for (int w : members) {
      const bool is_dead = liveness.dead(w);
      (is_dead ? dead : alive).push_back(w);
      if (!is_dead && !has(fmt::format("r{}/g{}/idle/{}", round, gen, w))) all_idle = false;
    }
    if (all_idle) {
      Verdict v;
      v.members = alive;
      std::vector<int64_t> lost;
      for (int64_t path : round_tasks) {
        const std::string done_key = fmt::format("r{}/done/{}", round, path);
        const std::string claim_key = fmt::format("r{}/claim/{}", round, path);
        int by = -1;
        if (has(done_key))
          by = std::stoi(get(done_key));
        else if (has(claim_key))
          by = std::stoi(get(claim_key));
        if (by < 0 || std::find(alive.begin(), alive.end(), by) == alive.end()) lost.push_back(path);
      }
      if (!dead.empty())
        log::warn("DiPaCo round {}: worker(s) {} stopped sending heartbeats; {} task(s) lost: {}", round + 1,
                  fmt::join(dead, ", "), lost.size(), fmt::join(lost, ", "));
      if (!lost.empty() && requeue) {
        v.again = true;
        v.tasks = lost;
      } else {
        v.dropped = lost;
      }
      return v;
    }
    std::this_thread::sleep_for(kClaimPoll);
  }
}

}  // namespace tributary
