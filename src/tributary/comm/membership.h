// Who is in a fault-tolerant group, round by round (torchft's quorum, PCCL's re-formed group, on the run's store).
//
// Members have stable ids (their launch ranks); an epoch is one membership, and the process group of an epoch lives
// under its own store prefix (group_prefix()), so survivors re-form without the dead. Every member runs a heartbeat
// (comm/heartbeat.h); a member whose heartbeat is stale for dead_after_s is dead to the others.
//
// This is the one decider of who is in a round for every fault-tolerant run (a trainer's replicas, islands, DiPaCo's
// workers); its steps carry torchft Manager's names. A round (an outer step's reduction, a data-parallel step, a
// DiPaCo round's tasks) is committed or discarded as a whole:
//   start_round  (DiLoCo rounds) before the round's first collective the members agree on its quorum: a joiner need
//            not wait for a round boundary: the lead offers it its state between two steps (offer), the joiner
//            trains on from there, and the lead proposes the members it does not know dead, then the joiners it
//            healed (first proposal written wins), so its pseudo-gradient counts in that round already.
//   should_commit  every member votes whether its collective succeeded (and whether it wants to stop); once every
//            member voted or is dead, the first proposal written wins (Store::set_once), so all members act on one
//            decision: commit iff every member of the epoch voted ok. After a discarded round each survivor
//            registers for the next epoch and waits until every member of the old one registered or is dead; the
//            first list written is the new membership. A process left out (it was frozen past the deadline) gets an
//            Error: it must not go on as a replica. The survivors redo the round; nothing of it is applied.
//   join     a restarted (or new) worker waits until its old self is out of the membership (or its launch reported
//            the old self's death: the members drop it at their next round anyway), then asks to join and
//            starts its heartbeat; the decision of the next committed round lists it, and after that round every
//            member admits it (admit: the next epoch is the members, then the joiners — the lead stays first).
// Every wait ends: a member either answers or its heartbeat goes stale (or the round deadline passes). A watcher
// thread logs a member's death when its heartbeat goes stale, not only when the next round finds out — or at once
// when the worker's launch reports that it exited (a kill is then known in milliseconds, not a heartbeat deadline;
// a frozen or cut-off worker is still found by its silence).
//
// Keys (under "ft/"): hb/{id}, join (requests of all workers), offer/{id}/{n}, pre/{round}, e{E}/{round}/vote/{id},
// e{E}/{round}/failures, e{E}/{round}/decision, e{E}/join/{id}, e{E}/members, epoch (the latest), join/{id} (requests
// so far), admitted/{id}/{n}, lost and lost/{id} (deaths launch reported), joining/{id} (a joiner's count of them at
// its start), incarnation/{id} (that count, set by the members when they admit it), lost-said/{id}/{n} (who logged
// death n of worker id). A launch's death report is acted on once confirmed: the worker's heartbeat silent a short
// while, or its restarted incarnation asking to join (a report alone, a store write, never drops a live worker).
//
// With identities (comm/signed_messages.h) every value above is signed by its writer, and read only from the member it
// must come from: a vote, a registration, a readiness or a join marker from the member it names, a decision from a
// member of the epoch, a proposal or an epoch's members from one of the members they list. A value written in another's
// name counts as not written (a warning names the key and the claimed member). A value agreed through set_once (a
// decision, a proposal, an epoch's members) that a forger wrote first only moves the agreement to the key's next slot
// ("<key>/1", ...), which every member reads alike. The counters (hb, join, failures, lost) are not signed: moving one
// can keep a dead member's seat until the round deadline, or fail a round's collective (the round is redone); a death
// report still needs the member's silence or its successor's signed request. What signatures do not stop: a member
// saying something false in its own name.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tributary/comm/heartbeat.h"
#include "tributary/comm/signed_messages.h"
#include "tributary/comm/store.h"

namespace tributary::comm {

struct RoundDecision {
  bool commit = false;
  bool stop = false;         // some member asked to stop (the run stops after this round, on every member)
  std::vector<int> silent;   // never voted: dead, frozen or cut off (their heartbeat stopped) — the cause
  std::vector<int> failed;   // voted that their collective failed (usually with a silent member)
  std::vector<int> joiners;  // workers asking to join, admitted after this round when it commits
  std::vector<int> dropped;  // not committed: the members the next epoch left out (the dead)
};

// What a joiner's wait ended with: admitted after a round (a member now), offered a heal by the lead (`offer`: the
// lead's text; a member from the next round on, see start_round), or the run finished first.
struct JoinResult {
  enum Kind { kAdmitted, kOffered, kFinished } kind = kFinished;
  std::string offer;
};

// A worker's request to join: its id and the count of its requests so far.
struct JoinRequest {
  int id = 0;
  int64_t number = 0;
};

// Size: one public method per step of the protocol above (start_round, should_commit, admit, join, offer, finish)
// plus an epoch's accessors; the epoch, the members, the watcher's stale set and its generation are one state machine
// under one mutex, which a split would spread over objects that lock each other.
class Membership {
 public:
  // The prefix of every store key above.
  inline static const std::string kPrefix = "ft/";

  // `heartbeat_store`: a second connection for the heartbeat thread. Every one of `world_size` ids starts a member;
  // `joining`: this process restarts id and becomes a member only through join().
  // `round_timeout`: a member that is alive but has not voted (or registered) after this long counts as missing, so
  // no wait is unbounded even when a live member is stuck elsewhere.
  // `noun`: what a member is, in the messages ("worker"; "island" when the members are islands).
  // `signer`: this member's identity, and the others' keys (ids are the signer's participants); null: unsigned.
  Membership(Store store, Store heartbeat_store, int id, int world_size, double dead_after_s, bool joining = false,
             std::chrono::milliseconds round_timeout = std::chrono::minutes(30), std::string noun = "worker",
             std::shared_ptr<MessageSigner> signer = nullptr);

  int id() const { return id_; }
  const std::string& noun() const { return noun_; }  // what a member is, in messages: "worker" or "island"
  int epoch() const { return epoch_; }
  const std::vector<int>& members() const { return members_; }
  int rank() const;  // this process's index in members()
  int size() const { return static_cast<int>(members_.size()); }
  std::string group_prefix() const { return "ft/group-e" + std::to_string(epoch_); }
  double dead_after_s() const { return liveness_.dead_after_s(); }

  // While a collective of `round` is in flight: true once it cannot succeed (a member is dead, or one already voted
  // that its collective failed), so the caller abandons it instead of waiting for the collective deadline.
  bool should_abandon(const std::string& round);
  // True once a member of the current epoch is known dead (its heartbeat is stale or its launch reported it): a
  // group being formed for this epoch cannot form.
  bool member_dead();
  // torchft's should_commit: every member votes on `round` (`ok`: its collective succeeded; `stop_wish`: it wants the
  // run to stop) and the round commits iff every member of the epoch voted ok. A discarded round moves the members to
  // the next epoch, the living ones (`dropped`: who was left out, logged with the cause); the caller re-forms its group
  // under group_prefix() and redoes the round, or settles what the dead held.
  RoundDecision should_commit(const std::string& round, bool ok, bool stop_wish);
  // The next epoch: the members and then `joiners` (from a committed round's decision).
  void admit(const std::vector<int>& joiners);
  // A joiner: waits (up to `timeout`, naming it) until admitted (then a member of that epoch) or offered a heal.
  // RunLost once every member is dead or reported lost (nobody holds the run's state any more).
  JoinResult join(std::chrono::milliseconds timeout);
  // The lead: true when a worker asked to join since the last call (the watcher counts requests: no store read here).
  bool asked() { return asked_.exchange(false); }
  // The lead: the requests that were neither admitted nor offered, of workers whose old self is out or known dead.
  std::vector<JoinRequest> offerable();
  void offer(const JoinRequest& request, const std::string& text);
  // Before a DiLoCo round's collective, on every member and on every joiner healed for it (whose members() is still
  // empty). `healed`: the lead's joiners whose heal arrived. True when the members changed (the caller re-forms).
  // A member left out stops with an Error (as in should_commit); so does a healed joiner when the lead died before it
  // was admitted (its launch restarts it).
  bool start_round(const std::string& round, const std::vector<int>& healed);
  // The lead at the end of the run: joiners still waiting give up.
  void finish();
  // For a supervisor (tributary launch) that saw worker `id` exit with an error or a signal: the members drop it at
  // once instead of at its heartbeat deadline. `store` is the run's (the workers' key prefix).
  static void report_lost(Store& store, int id);
  ~Membership();

 private:
  // Waits on the store poll at this period.
  static constexpr auto kPoll = std::chrono::milliseconds(20);
  std::string key(const std::string& round, const std::string& what) const;
  RoundDecision decide(const std::string& round, bool ok, bool stop_wish);  // the vote
  std::vector<int> reform();  // the next epoch: the members alive now; returns the members dropped
  void watch();               // the watcher thread: says when a member's heartbeat goes stale, as soon as it does
  std::vector<int> reported_lost(Store& store, const std::vector<int>& members,
                                 uint64_t generation);  // watcher thread only
  std::vector<int> waiting_joiners();
  bool none_alive(const std::vector<int>& members);  // a joiner: nobody to heal from (every other member is dead)
  void enter(int epoch, std::vector<int> members, const std::vector<int>& joiners = {});
  // The store's values as members write and read them: signed by this member, and opened only when one of `authors`
  // (empty: any participant) signed them (without a signer, as they are).
  std::string signed_value(const std::string& key, const std::string& value) const;
  std::optional<std::string> read(Store& store, const std::string& key, const std::vector<int>& authors);
  bool present(const std::string& key, const std::vector<int>& authors) {
    return read(store_, key, authors).has_value();
  }
  // An agreement at `key` among the members' signed values (comm/signed_messages.h, agreed_value), and a proposal
  // to it: what was agreed, this value or another member's.
  std::optional<std::string> agreed(const std::string& key, const std::vector<int>& authors,
                                    const Accept& accept = nullptr);
  std::string propose(const std::string& key, const std::string& value, const std::vector<int>& authors,
                      const Accept& accept = nullptr);
  // Epoch `epoch`'s members, as one of them wrote them (every writer is one of the members it lists).
  std::optional<std::vector<int>> read_members(int epoch);
  std::vector<int> propose_members(int epoch, const std::vector<int>& members);
  // Whether member `id`'s launch reported a death of its current incarnation (deaths counted past the count that
  // incarnation started with).
  bool death_reported(Store& store, int id);
  // Whether a restarted incarnation of member `id` asked to join after its last reported death.
  bool successor_asked(Store& store, int id);

  Store store_, heartbeat_store_;
  std::shared_ptr<MessageSigner> signer_;
  std::unique_ptr<Heartbeat> heartbeat_;  // started at once, or by join()
  Liveness liveness_;
  int id_;
  std::string noun_;
  int world_size_;
  std::chrono::milliseconds round_timeout_;
  int epoch_ = 0;
  std::vector<int> members_;
  mutable std::mutex mutex_;  // members_ for the watcher, stale_ for the rounds
  uint64_t generation_ = 0;   // bumped by every change of members_: a watcher pass over an older one is void
  std::vector<int> stale_;    // members the watcher found silent (it samples all the time; a round's own
                              // observer would need a whole heartbeat deadline of its own)
  bool known_dead(int id) const;
  int64_t lost_total_seen_ = -1;  // reported_lost's cache (the watcher's)
  uint64_t lost_generation_seen_ = ~uint64_t{0};
  std::vector<int> lost_;
  std::atomic<bool> stop_{false}, asked_{false};
  void enter_with_joiners(int epoch, const std::vector<int>& members, const std::vector<int>& joiners);
  std::thread watcher_;
};

}  // namespace tributary::comm
