// Admissions to a fault-tolerant group (comm/membership.h): after a committed round (admit), or — DiLoCo's
// mid-round heal — before a round's collective, with the joiners the lead healed meanwhile (offerable, offer,
// open_round).
#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <thread>

#include "tributary/comm/membership.h"
#include "tributary/core/error.h"

namespace tributary::comm {
void Membership::admit(const std::vector<int>& joiners) {
  std::vector<int> next = members_;
  next.insert(next.end(), joiners.begin(), joiners.end());
  const int epoch = epoch_ + 1;
  enter_with_joiners(epoch, propose_members(epoch, next), joiners);
}

std::vector<JoinRequest> Membership::offerable() {
  std::vector<JoinRequest> out;
  bool waiting = false;
  for (int w = 0; w < world_size_; ++w) {
    const int64_t asked = store_.add(kPrefix + "join/" + std::to_string(w), 0);
    if (asked == 0 || present(fmt::format("{}admitted/{}/{}", kPrefix, w, asked), members_) ||
        present(fmt::format("{}offer/{}/{}", kPrefix, w, asked), members_))
      continue;
    // The request counter is anyone's to move; the worker's own signed marker says it asked.
    if (!present(kPrefix + "joining/" + std::to_string(w), {w})) continue;
    const bool member = std::find(members_.begin(), members_.end(), w) != members_.end();
    if (member && !known_dead(w)) {
      waiting = true;  // its old self is still a member: ask again later
      continue;
    }
    out.push_back({w, asked});
  }
  if (waiting) asked_ = true;
  return out;
}

void Membership::offer(const JoinRequest& request, const std::string& text) {
  const std::string key = fmt::format("{}offer/{}/{}", kPrefix, request.id, request.number);
  store_.set(key, signed_value(key, text));
}

// `joiners` (among `members`; a healed one may replace its old self) count their deaths from here, and are admitted.
void Membership::enter_with_joiners(int epoch, const std::vector<int>& members, const std::vector<int>& joiners) {
  for (int j : joiners) {
    if (const auto deaths = read(store_, kPrefix + "joining/" + std::to_string(j), {j})) {
      const std::string incarnation = kPrefix + "incarnation/" + std::to_string(j);
      store_.set(incarnation, signed_value(incarnation, *deaths));
    }
    const std::string admitted =
        fmt::format("{}admitted/{}/{}", kPrefix, j, store_.add(kPrefix + "join/" + std::to_string(j), 0));
    store_.set(admitted, signed_value(admitted, std::to_string(epoch)));
  }
  propose_members(epoch, members);
  enter(epoch, members, joiners);
}

bool Membership::start_round(const std::string& round, const std::vector<int>& healed) {
  const std::string key = kPrefix + "pre/" + round;
  const auto start = std::chrono::steady_clock::now();
  auto overdue = [&] { return std::chrono::steady_clock::now() - start > round_timeout_; };
  // What a member proposes: no change, or the members it does not know dead (a healed joiner replaces its old
  // self) and then the joiners it healed, as the next epoch.
  auto proposal = [&](const std::vector<int>& healed_now) {
    std::vector<int> joiners;  // once each: an id is one worker
    for (int j : healed_now)
      if (std::find(joiners.begin(), joiners.end(), j) == joiners.end()) joiners.push_back(j);
    if (joiners.empty())
      return nlohmann::json{{"epoch", epoch_}, {"members", members_}, {"joiners", std::vector<int>{}}}.dump();
    std::vector<int> next;
    for (int m : members_)
      if ((m == id_ || !known_dead(m)) && std::find(joiners.begin(), joiners.end(), m) == joiners.end())
        next.push_back(m);
    next.insert(next.end(), joiners.begin(), joiners.end());
    return nlohmann::json{{"epoch", epoch_ + 1}, {"members", next}, {"joiners", joiners}}.dump();
  };
  // Every reader (a healed joiner knows no member yet) takes a proposal from one of the members it lists.
  const auto by_listed = [](const std::string& value, int author) {
    try {  // a value that is no proposal is skipped like a forged one
      const auto j = nlohmann::json::parse(value);
      j.at("epoch").get<int>();
      j.at("joiners").get<std::vector<int>>();
      const auto listed = j.at("members").get<std::vector<int>>();
      return author < 0 || std::find(listed.begin(), listed.end(), author) != listed.end();
    } catch (const std::exception&) {
      return false;
    }
  };
  std::string text;
  const std::string ready = kPrefix + "ready/" + round + "/";
  if (members_.empty()) {  // a healed joiner: it becomes a member here, or never
    const std::string mine = ready + std::to_string(id_);
    store_.set(mine, signed_value(mine, "1"));
    for (;;) {
      if (auto agreement = agreed(key, {}, by_listed)) {
        text = std::move(*agreement);
        break;
      }
      if (overdue() || present(kPrefix + "finished", {}))
        fail(
            "{} {} was healed by the lead but no member opened round {} (the run ended or the members "
            "stopped); it stops here",
            noun_, id_, round);
      std::this_thread::sleep_for(kPoll);
    }
  } else if (members_.front() == id_) {
    // Only joiners already at this round are proposed: the group is formed at once by everyone in it (a late one
    // would keep the others in the formation, where a death is costlier than in a round). A joiner not ready within
    // a heartbeat deadline is left out and stops (its launch may restart it).
    std::vector<int> arrived;
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(static_cast<int64_t>(liveness_.dead_after_s() * 1000));
    for (int j : healed) {
      const std::string theirs = ready + std::to_string(j);
      while (!present(theirs, {j}) && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(kPoll);
      if (present(theirs, {j})) arrived.push_back(j);
    }
    text = propose(key, proposal(arrived), {}, by_listed);
  } else {
    const int lead = members_.front();
    for (;;) {
      if (auto agreement = agreed(key, {}, by_listed)) {
        text = std::move(*agreement);
        break;
      }
      if (known_dead(lead) || liveness_.dead(lead) || overdue()) {  // the lead's joiners cannot be admitted
        text = propose(key, proposal({}), {}, by_listed);
        break;
      }
      std::this_thread::sleep_for(kPoll);
    }
  }
  const auto j = nlohmann::json::parse(text);
  const int epoch = j.at("epoch").get<int>();
  const auto members = j.at("members").get<std::vector<int>>();
  const auto joiners = j.at("joiners").get<std::vector<int>>();
  if (epoch == epoch_ && !members_.empty()) return false;
  // A healed joiner is admitted only as a joiner: its id in the members of a proposal without it (a member's
  // "no change" when the lead looked dead) is its dead predecessor, whose group it cannot form.
  const bool listed = members_.empty() ? std::find(joiners.begin(), joiners.end(), id_) != joiners.end()
                                       : std::find(members.begin(), members.end(), id_) != members.end();
  if (!listed) {
    if (members_.empty())
      fail(
          "{} {} was healed by the lead but not admitted at round {} (the lead died, or it reached the round more "
          "than dist.heartbeat_timeout_s after it); it stops here and its launch may restart it",
          noun_, id_, round);
    fail(
        "{} {} was declared dead by the lead (its heartbeat was silent for more than dist.heartbeat_timeout_s "
        "= {} s) and the group went on without it; it stops here",
        noun_, id_, liveness_.dead_after_s());
  }
  enter_with_joiners(epoch, members, joiners);
  return true;
}

}  // namespace tributary::comm
