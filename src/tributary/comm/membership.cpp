#include "tributary/comm/membership.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "tributary/core/error.h"
#include "tributary/core/log.h"

namespace tributary::comm {
Membership::Membership(Store store, Store heartbeat_store, int id, int world_size, double dead_after_s, bool joining,
                       std::chrono::milliseconds round_timeout, std::string noun, std::shared_ptr<MessageSigner> signer)
    : store_(std::move(store)),
      heartbeat_store_(std::move(heartbeat_store)),
      signer_(std::move(signer)),
      liveness_(store_, kPrefix, id, dead_after_s),
      id_(id),
      noun_(std::move(noun)),
      world_size_(world_size),
      round_timeout_(round_timeout) {
  if (!joining) {
    heartbeat_ = std::make_unique<Heartbeat>(heartbeat_store_, kPrefix, id);
    for (int m = 0; m < world_size; ++m) members_.push_back(m);
  }
  watcher_ = std::thread([this] { watch(); });
}

Membership::~Membership() {
  stop_ = true;
  watcher_.join();
}

std::string Membership::signed_value(const std::string& key, const std::string& value) const {
  return signed_text(signer_.get(), key, value);
}

std::optional<std::string> Membership::read(Store& store, const std::string& key, const std::vector<int>& authors) {
  return read_signed(store, signer_.get(), key, authors);
}

std::optional<std::string> Membership::agreed(const std::string& key, const std::vector<int>& authors,
                                              const Accept& accept) {
  auto agreement = agreed_value(store_, signer_.get(), key, authors, accept);
  if (!agreement) return std::nullopt;
  return std::move(agreement->value);
}

std::string Membership::propose(const std::string& key, const std::string& value, const std::vector<int>& authors,
                                const Accept& accept) {
  return propose_value(store_, signer_.get(), key, value, authors, accept).value;
}

namespace {

// A list of members is written by one of them (a value that is no list of ids is skipped like a forged one).
bool written_by_one_listed(const std::string& value, int author) {
  try {
    const auto members = nlohmann::json::parse(value).get<std::vector<int>>();
    return author < 0 || std::find(members.begin(), members.end(), author) != members.end();
  } catch (const std::exception&) {
    return false;
  }
}

// A round's decision as decide() writes it.
bool well_formed_decision(const std::string& value, int) {
  try {
    const auto j = nlohmann::json::parse(value);
    j.at("commit").get<bool>();
    j.at("stop").get<bool>();
    for (const char* list : {"silent", "failed", "joiners"}) j.at(list).get<std::vector<int>>();
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

std::optional<std::vector<int>> Membership::read_members(int epoch) {
  const auto agreement = agreed(fmt::format("{}e{}/members", kPrefix, epoch), {}, written_by_one_listed);
  if (!agreement) return std::nullopt;
  return nlohmann::json::parse(*agreement).get<std::vector<int>>();
}

std::vector<int> Membership::propose_members(int epoch, const std::vector<int>& members) {
  return nlohmann::json::parse(propose(fmt::format("{}e{}/members", kPrefix, epoch), nlohmann::json(members).dump(), {},
                                       written_by_one_listed))
      .get<std::vector<int>>();
}

// Workers whose launch reported their death (launch --max-failures/--max-restarts add to "lost/<id>" and to
// "lost" when a worker exits with an error or a signal) since their current incarnation started ("incarnation/<id>":
// the count a restarted worker found when it began, written by the members that admitted it).
bool Membership::death_reported(Store& store, int id) {
  const int64_t deaths = store.add(kPrefix + "lost/" + std::to_string(id), 0);
  if (deaths == 0) return false;
  const auto incarnation = read(store, kPrefix + "incarnation/" + std::to_string(id), {});
  return deaths > (incarnation ? std::stoll(*incarnation) : 0);
}

// "joining/<id>" holds the deaths the restarted incarnation found when it asked; only that incarnation writes it.
bool Membership::successor_asked(Store& store, int id) {
  const auto joining = read(store, kPrefix + "joining/" + std::to_string(id), {id});
  return joining && std::stoll(*joining) >= store.add(kPrefix + "lost/" + std::to_string(id), 0);
}

// One store read per call unless the total of reported deaths moved.
std::vector<int> Membership::reported_lost(Store& store, const std::vector<int>& members, uint64_t generation) {
  const int64_t total = store.add(kPrefix + "lost", 0);
  // A new membership may hold a new incarnation under an old id (same list): read the counts again.
  if (total == lost_total_seen_ && generation == lost_generation_seen_) return lost_;
  lost_total_seen_ = total;
  lost_generation_seen_ = generation;
  lost_.clear();
  for (int m : members)
    if (death_reported(store, m)) lost_.push_back(m);
  return lost_;
}

void Membership::watch() {
  Liveness liveness(heartbeat_store_, kPrefix, id_, liveness_.dead_after_s());
  std::vector<int> reported, lost_logged, ignored_logged;
  std::map<int, std::chrono::steady_clock::time_point> report_seen;  // when a member's death report was first read
  // A reported death is acted on once the member's heartbeat has been silent this long (a few of its 250 ms beats).
  const double confirm_s = std::min(1.5, liveness_.dead_after_s() / 2);
  int64_t asks_seen = 0;
  while (!stop_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::vector<int> members;
    uint64_t generation = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      members = members_;
      generation = generation_;
    }
    try {
      if (const int64_t asks = heartbeat_store_.add(kPrefix + "join", 0); asks != asks_seen) {
        asks_seen = asks;
        asked_ = true;
      }
      std::vector<int> alive, newly_dead, newly_lost;
      const std::vector<int> lost = reported_lost(heartbeat_store_, members, generation);
      for (int m : members) {
        const auto known = std::find(reported.begin(), reported.end(), m);
        // Its launch saw it die: no need to wait the heartbeat deadline, only for a confirmation — a short silence
        // of its heartbeat, or its restarted incarnation asking to join after that death (which then beats on the
        // same key). A report is a store write any holder of the run's secret can make: alone it must not drop a
        // live worker.
        bool report_confirmed = false;
        if (std::find(lost.begin(), lost.end(), m) != lost.end()) {
          const auto now = std::chrono::steady_clock::now();
          const auto [seen, first] = report_seen.try_emplace(m, now);
          report_confirmed = liveness.silence_s(m) >= confirm_s || successor_asked(heartbeat_store_, m);
          if (!report_confirmed && !first &&
              std::chrono::duration<double>(now - seen->second).count() > 4 * confirm_s &&
              std::find(ignored_logged.begin(), ignored_logged.end(), m) == ignored_logged.end()) {
            ignored_logged.push_back(m);
            log::warn(
                "{} {}: a death of {} {} was reported in the store, but its heartbeat goes on: the report is "
                "ignored (written by a participant that is not its launch, or a launch that lost track of it)",
                noun_, id_, noun_, m);
          }
        } else {
          report_seen.erase(m);
        }
        if (report_confirmed) {
          if (known == reported.end()) reported.push_back(m);
          if (std::find(lost_logged.begin(), lost_logged.end(), m) == lost_logged.end()) {
            lost_logged.push_back(m);
            newly_lost.push_back(m);
          }
        } else if (!liveness.dead(m)) {
          alive.push_back(m);
          if (known != reported.end()) reported.erase(known);
          lost_logged.erase(std::remove(lost_logged.begin(), lost_logged.end(), m), lost_logged.end());
        } else if (known == reported.end()) {
          reported.push_back(m);
          newly_dead.push_back(m);
        }
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        // The membership changed meanwhile: this pass's view is not the rounds' (the next pass looks again), but
        // what it saw of the old members is still worth saying below.
        if (generation == generation_) stale_ = reported;
      }
      // A confirmed report is said once, by the first member to confirm it (the others may already have re-formed
      // without the worker, and no longer look at it).
      for (int m : newly_lost) {
        const std::string said = fmt::format("{}lost-said/{}/{}", kPrefix, m,
                                             heartbeat_store_.add(kPrefix + "lost/" + std::to_string(m), 0));
        if (heartbeat_store_.set_once(said, std::to_string(id_)) == std::to_string(id_))
          log::warn(
              "{} {}: {} {} exited (its launch reported the death); the group re-forms without it at the next round",
              noun_, id_, noun_, m);
      }
      if (alive.empty() || alive.front() != id_) continue;  // the first live member speaks for all
      for (int m : newly_dead)
        log::warn(
            "{} {}: {} {} has sent no heartbeat for {} s (dist.heartbeat_timeout_s): it is dead; the group re-forms "
            "without it at the next outer step",
            noun_, id_, noun_, m, liveness.dead_after_s());
    } catch (const std::exception&) {
      return;  // the store is gone: the main thread will find out
    }
  }
}

void Membership::finish() { store_.set(kPrefix + "finished", "1"); }

void Membership::report_lost(Store& store, int id) {
  store.add(kPrefix + "lost/" + std::to_string(id), 1);
  store.add(kPrefix + "lost", 1);  // last: the watchers read the per-worker counts when the total moved
}

bool Membership::known_dead(int id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::find(stale_.begin(), stale_.end(), id) != stale_.end();
}

void Membership::enter(int epoch, std::vector<int> members, const std::vector<int>& joiners) {
  epoch_ = epoch;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // A member admitted now is a new incarnation: what the watcher said of its predecessor no longer holds.
    for (int m : members)
      if (std::find(members_.begin(), members_.end(), m) == members_.end() ||
          std::find(joiners.begin(), joiners.end(), m) != joiners.end())
        stale_.erase(std::remove(stale_.begin(), stale_.end(), m), stale_.end());
    members_ = std::move(members);
    generation_ += 1;
  }
  const std::string epoch_key = kPrefix + "epoch";
  store_.set(epoch_key, signed_value(epoch_key, std::to_string(epoch)));  // every member writes the same
}

// Workers whose join requests outnumber their admissions, ascending.
std::vector<int> Membership::waiting_joiners() {
  std::vector<int> out;
  for (int w = 0; w < world_size_; ++w) {
    if (std::find(members_.begin(), members_.end(), w) != members_.end()) continue;
    const int64_t asked = store_.add(kPrefix + "join/" + std::to_string(w), 0);
    if (asked > 0 && !present(fmt::format("{}admitted/{}/{}", kPrefix, w, asked), members_) &&
        !present(fmt::format("{}offer/{}/{}", kPrefix, w, asked), members_) &&
        present(kPrefix + "joining/" + std::to_string(w), {w}))
      out.push_back(w);
  }
  return out;
}

JoinResult Membership::join(std::chrono::milliseconds timeout) {
  const auto start = std::chrono::steady_clock::now();
  auto check_deadline = [&](const char* what) {
    if (std::chrono::steady_clock::now() - start > timeout)
      throw NetworkError(
          fmt::format("{} {}: {} within {} s (dist.store_timeout_s); are the other workers still running?", noun_, id_,
                      what, timeout.count() / 1000.0));
  };
  // Its old self must be out first: a heartbeat on its id would keep the dead incarnation a member.
  auto current_members = [&] {
    std::vector<int> all;
    const auto epoch = read(store_, kPrefix + "epoch", {});
    if (!epoch) {  // epoch 0: everyone
      for (int m = 0; m < world_size_; ++m) all.push_back(m);
      return all;
    }
    return read_members(std::stoi(*epoch)).value_or(all);  // refused: nobody to wait for or heal from yet
  };
  // Or its launch reported the death: the members drop it at their next round whatever its heartbeat says, so this
  // one may ask now and be admitted right after that round (the incarnation count moves only at the admission).
  const std::string lost_key = kPrefix + "lost/" + std::to_string(id_);
  auto predecessor_reported = [&] { return death_reported(store_, id_); };
  const std::string finished = kPrefix + "finished";
  for (auto m = current_members(); std::find(m.begin(), m.end(), id_) != m.end() && !predecessor_reported();
       m = current_members()) {
    if (present(finished, {})) return {};
    check_deadline("its previous incarnation was not dropped from the group");
    std::this_thread::sleep_for(kPoll * 5);
  }
  // This incarnation's deaths so far: a death its launch reports later is this one's (reported_lost); the members
  // make it the incarnation's count when they admit it.
  const std::string joining = kPrefix + "joining/" + std::to_string(id_);
  store_.set(joining, signed_value(joining, std::to_string(store_.add(lost_key, 0))));
  const int64_t request = store_.add(kPrefix + "join/" + std::to_string(id_), 1);
  store_.add(kPrefix + "join", 1);  // last: the lead's watcher looks when this count moves
  heartbeat_ = std::make_unique<Heartbeat>(heartbeat_store_, kPrefix, id_);
  const std::string admitted = fmt::format("{}admitted/{}/{}", kPrefix, id_, request);
  const std::string offered = fmt::format("{}offer/{}/{}", kPrefix, id_, request);
  std::optional<std::string> epoch;
  for (;;) {
    if ((epoch = read(store_, admitted, {}))) break;
    if (auto offer = read(store_, offered, {})) return {JoinResult::kOffered, std::move(*offer)};
    if (present(finished, {})) return {};
    if (const auto members = current_members(); none_alive(members))
      throw RunLost(fmt::format(
          "{} {}: no member of the run is left to heal from (epoch {}'s members {} are all dead or reported "
          "lost by their launch): the run's state died with them. Restarting workers cannot help; resume from the "
          "last checkpoint (train --resume) to go on",
          noun_, id_, store_.check({kPrefix + "epoch"}) ? store_.get(kPrefix + "epoch") : "0",
          fmt::join(members, ", ")));
    check_deadline("it was not admitted to the group");
    std::this_thread::sleep_for(kPoll * 5);
  }
  const auto members = read_members(std::stoi(*epoch));
  if (!members) fail("{} {}: admitted at epoch {}, whose members no member wrote; it stops here", noun_, id_, *epoch);
  enter(std::stoi(*epoch), *members);
  return {JoinResult::kAdmitted, ""};
}

// A joiner's view of `members` (its own id stands for its dead predecessor: the joiner itself is not one of them).
bool Membership::none_alive(const std::vector<int>& members) {
  for (int m : members) {
    if (m == id_ || death_reported(store_, m)) continue;  // its predecessor, or its launch saw it die
    if (!liveness_.dead(m)) return false;
  }
  return true;
}

int Membership::rank() const {
  return static_cast<int>(std::find(members_.begin(), members_.end(), id_) - members_.begin());
}

std::string Membership::key(const std::string& round, const std::string& what) const {
  return fmt::format("{}e{}/{}/{}", kPrefix, epoch_, round, what);
}

bool Membership::should_abandon(const std::string& round) {
  return store_.add(key(round, "failures"), 0) > 0 || member_dead();
}

bool Membership::member_dead() {
  for (int m : members_)
    if (known_dead(m)) return true;
  return !liveness_.dead_among(members_).empty();
}

RoundDecision Membership::decide(const std::string& round, bool ok, bool stop_wish) {
  const std::string my_vote = key(round, "vote/" + std::to_string(id_));
  store_.set(my_vote, signed_value(my_vote, fmt::format("{}{}", ok ? 1 : 0, stop_wish ? 1 : 0)));
  if (!ok) store_.add(key(round, "failures"), 1);
  const std::string decision_key = key(round, "decision");
  const auto start = std::chrono::steady_clock::now();
  std::string decided;
  for (;;) {
    const bool overdue = std::chrono::steady_clock::now() - start > round_timeout_;
    if (auto agreement = agreed(decision_key, members_, well_formed_decision)) {  // another member decided already
      decided = std::move(*agreement);
      break;
    }
    RoundDecision d{.commit = true};
    bool waiting = false;
    for (int m : members_) {
      if (const auto vote = read(store_, key(round, "vote/" + std::to_string(m)), {m}); vote && vote->size() == 2) {
        const std::string& v = *vote;
        if (v[0] != '1') d.failed.push_back(m);
        d.stop |= v[1] == '1';
      } else if (known_dead(m) || liveness_.dead(m) || overdue) {
        d.silent.push_back(m);
      } else {
        waiting = true;
      }
    }
    if (!waiting) {
      d.commit = d.silent.empty() && d.failed.empty();
      if (d.commit) d.joiners = waiting_joiners();
      decided = propose(decision_key,
                        nlohmann::json{{"commit", d.commit},
                                       {"stop", d.stop},
                                       {"silent", d.silent},
                                       {"failed", d.failed},
                                       {"joiners", d.joiners}}
                            .dump(),
                        members_, well_formed_decision);
      break;
    }
    std::this_thread::sleep_for(kPoll);
  }
  const auto j = nlohmann::json::parse(decided);
  return {.commit = j.at("commit").get<bool>(),
          .stop = j.at("stop").get<bool>(),
          .silent = j.at("silent").get<std::vector<int>>(),
          .failed = j.at("failed").get<std::vector<int>>(),
          .joiners = j.at("joiners").get<std::vector<int>>()};
}

RoundDecision Membership::should_commit(const std::string& round, bool ok, bool stop_wish) {
  RoundDecision decision = decide(round, ok, stop_wish);
  if (decision.commit) return decision;
  if (rank() == 0 || !ok)
    log::warn("{} {}: round {} discarded: {}; re-forming the group", noun_, id_, round,
              decision.silent.empty()
                  ? fmt::format("the collective failed on {}(s) {} and every member is alive", noun_,
                                fmt::join(decision.failed, ", "))
                  : fmt::format("{}(s) {} fell silent (dead, frozen or cut off: no vote, no heartbeat){}", noun_,
                                fmt::join(decision.silent, ", "),
                                decision.failed.empty() ? std::string()
                                                        : fmt::format(" and the collective failed with it on {}(s) {}",
                                                                      noun_, fmt::join(decision.failed, ", "))));
  decision.dropped = reform();
  return decision;
}

std::vector<int> Membership::reform() {
  const int next = epoch_ + 1;
  const std::string base = fmt::format("{}e{}/", kPrefix, next);
  const std::string registered = base + "join/" + std::to_string(id_);
  store_.set(registered, signed_value(registered, "1"));
  const auto start = std::chrono::steady_clock::now();
  std::optional<std::vector<int>> agreement;
  while (!(agreement = read_members(next))) {
    const bool overdue = std::chrono::steady_clock::now() - start > round_timeout_;
    std::vector<int> joined;
    bool waiting = false;
    for (int m : members_) {
      if (read(store_, base + "join/" + std::to_string(m), {m}))
        joined.push_back(m);
      else if (!known_dead(m) && !liveness_.dead(m) && !overdue)
        waiting = true;
    }
    if (!waiting) {
      agreement = propose_members(next, joined);
      break;
    }
    std::this_thread::sleep_for(kPoll);
  }
  const std::vector<int> now = std::move(*agreement);
  if (std::find(now.begin(), now.end(), id_) == now.end())
    fail(
        "{} {} was declared dead by the others (its heartbeat was silent for more than "
        "dist.heartbeat_timeout_s = {} s, e.g. while it was stopped) and the group went on without it; it stops "
        "here. Raise dist.heartbeat_timeout_s if workers stall that long",
        noun_, id_, liveness_.dead_after_s());
  std::vector<int> dropped;
  for (int m : members_)
    if (std::find(now.begin(), now.end(), m) == now.end()) dropped.push_back(m);
  enter(next, now);
  return dropped;
}

}  // namespace tributary::comm
