#include "tributary/comm/membership.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <thread>

#include "tributary/core/error.h"

namespace tributary::comm {
namespace {

const std::string kPrefix = "ft/";
constexpr auto kPoll = std::chrono::milliseconds(20);

}  // namespace

Membership::Membership(Store store, Store heartbeat_store, int id, int world_size, double dead_after_s)
    : store_(std::move(store)),
      heartbeat_(std::move(heartbeat_store), kPrefix, id),
      liveness_(store_, kPrefix, id, dead_after_s),
      id_(id) {
  for (int m = 0; m < world_size; ++m) members_.push_back(m);
}

int Membership::rank() const {
  return static_cast<int>(std::find(members_.begin(), members_.end(), id_) - members_.begin());
}

std::string Membership::key(const std::string& round, const std::string& what) const {
  return fmt::format("{}e{}/{}/{}", kPrefix, epoch_, round, what);
}

bool Membership::should_abandon(const std::string& round) {
  if (store_.add(key(round, "failures"), 0) > 0) return true;
  return !liveness_.dead_among(members_).empty();
}

RoundDecision Membership::decide(const std::string& round, bool ok, bool stop_wish) {
  store_.set(key(round, "vote/" + std::to_string(id_)), fmt::format("{}{}", ok ? 1 : 0, stop_wish ? 1 : 0));
  if (!ok) store_.add(key(round, "failures"), 1);
  const std::string decision_key = key(round, "decision");
  for (;;) {
    if (store_.check({decision_key})) break;  // another member decided already
    RoundDecision d{.commit = true};
    bool waiting = false;
    for (int m : members_) {
      const std::string vote_key = key(round, "vote/" + std::to_string(m));
      if (store_.check({vote_key})) {
        const std::string v = store_.get(vote_key);
        if (v[0] != '1') d.missing.push_back(m);
        d.stop |= v[1] == '1';
      } else if (liveness_.dead(m)) {
        d.missing.push_back(m);
      } else {
        waiting = true;
      }
    }
    if (!waiting) {
      d.commit = d.missing.empty();
      store_.set_once(decision_key,
                      nlohmann::json{{"commit", d.commit}, {"stop", d.stop}, {"missing", d.missing}}.dump());
      break;
    }
    std::this_thread::sleep_for(kPoll);
  }
  const auto j = nlohmann::json::parse(store_.get(decision_key));
  return {.commit = j.at("commit").get<bool>(), .stop = j.at("stop").get<bool>(),
          .missing = j.at("missing").get<std::vector<int>>()};
}

std::vector<int> Membership::reform() {
  const int next = epoch_ + 1;
  const std::string base = fmt::format("{}e{}/", kPrefix, next);
  store_.set(base + "join/" + std::to_string(id_), "1");
  const std::string members_key = base + "members";
  while (!store_.check({members_key})) {
    std::vector<int> joined;
    bool waiting = false;
    for (int m : members_) {
      if (store_.check({base + "join/" + std::to_string(m)})) joined.push_back(m);
      else if (!liveness_.dead(m)) waiting = true;
    }
    if (!waiting) {
      store_.set_once(members_key, nlohmann::json(joined).dump());
      break;
    }
    std::this_thread::sleep_for(kPoll);
  }
  const auto now = nlohmann::json::parse(store_.get(members_key)).get<std::vector<int>>();
  if (std::find(now.begin(), now.end(), id_) == now.end())
    fail("worker {} was declared dead by the others (its heartbeat was silent for more than "
         "dist.heartbeat_timeout_s = {} s, e.g. while it was stopped) and the group went on without it; it stops "
         "here. Raise dist.heartbeat_timeout_s if workers stall that long",
         id_, liveness_.dead_after_s());
  std::vector<int> dropped;
  for (int m : members_)
    if (std::find(now.begin(), now.end(), m) == now.end()) dropped.push_back(m);
  members_ = now;
  epoch_ = next;
  return dropped;
}

}  // namespace tributary::comm
