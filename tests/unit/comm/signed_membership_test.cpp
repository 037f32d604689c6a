// Membership messages signed by their writers (comm/signed_messages.h): members as threads over one in-memory store,
// and a participant that holds the run's secret (it writes to the store) and an identity of its own, writing in
// others' names.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>

#include "support/participants.h"
#include "support/thread_ranks.h"
#include "tributary/comm/membership.h"
#include "tributary/comm/signed_messages.h"

using namespace tributary;

namespace {

using test_support::Participants;

constexpr double kDeadAfter = 3.0;

comm::Membership member(comm::Store& store, const Participants& p, int id) {
  return comm::Membership(store, store, id, 3, kDeadAfter, false, std::chrono::minutes(1), "worker", p.signer(id));
}

}  // namespace

TEST(SignedMembership, AVoteWrittenInAnotherMembersNameIsRefused) {
  // Participant 3 (not a member) writes member 2's vote before member 2 votes: "ok, and stop the run". Refused, it
  // counts as not written; the members wait for member 2's own vote and nobody stops.
  auto store = comm::Store::in_memory();
  const Participants p(4);
  const std::string key = "ft/e0/x0/vote/2";
  store.set(key, p.as(3, 2)->sign(key, "11"));
  test_support::run_threads(3, [&](int id) {
    auto m = member(store, p, id);
    if (id == 2) std::this_thread::sleep_for(std::chrono::milliseconds(400));
    const auto d = m.should_commit("x0", true, false);
    EXPECT_TRUE(d.commit) << "member " << id;
    EXPECT_FALSE(d.stop) << "member " << id << " acted on a forged stop wish";
  });
}

TEST(SignedMembership, ADecisionForgedFirstMovesTheAgreementToTheNextSlot) {
  // Participant 3 holds a published identity but is no member: its decision "discard, stop" won the decision key.
  // Every member skips it alike and agrees on the next slot, from the members' votes.
  auto store = comm::Store::in_memory();
  const Participants p(4);
  const std::string key = "ft/e0/x0/decision";
  store.set_once(key, p.signer(3)->sign(key, R"({"commit": false, "stop": true, "silent": [1], "failed": [],
                                                 "joiners": []})"));
  test_support::run_threads(3, [&](int id) {
    auto m = member(store, p, id);
    const auto d = m.should_commit("x0", true, false);
    EXPECT_TRUE(d.commit) << "member " << id;
    EXPECT_FALSE(d.stop);
    EXPECT_TRUE(d.silent.empty());
    EXPECT_EQ(m.epoch(), 0);
  });
  EXPECT_TRUE(store.check({key + "/1"})) << "agreed in the next slot";
}

TEST(SignedMembership, ADeathReportIsNotConfirmedByASuccessorRequestInTheWorkersName) {
  // Two store writes report member 2 dead, and a third says its restarted incarnation asked to join after that death
  // (which would confirm the report at once): the request is not member 2's, so nothing confirms the report while
  // member 2 beats, and the round commits with all three.
  auto store = comm::Store::in_memory();
  const Participants p(4);
  store.add("ft/lost/2", 1);
  store.add("ft/lost", 1);
  store.set("ft/joining/2", p.as(3, 2)->sign("ft/joining/2", "1"));
  test_support::run_threads(3, [&](int id) {
    auto m = member(store, p, id);
    std::this_thread::sleep_for(std::chrono::milliseconds(600));  // several passes of the watcher
    EXPECT_FALSE(m.member_dead()) << "member " << id << " believed the report";
    const auto d = m.should_commit("x0", true, false);
    EXPECT_TRUE(d.commit) << "member " << id;
    EXPECT_TRUE(d.dropped.empty());
  });
}

TEST(SignedMembership, AHealedJoinerWithANewIdentityIsAdmittedAndHeardFromThen) {
  // A round with worker 2 shows the others its key. Worker 2 dies; its replacement comes with a new identity
  // (published as a joiner does). The lead heals it: its readiness, the lead's proposal and the new epoch's members
  // are signed, and the members check worker 2 with its new key (its vote counts).
  auto store = comm::Store::in_memory();
  Participants p(3);
  const std::vector<std::shared_ptr<comm::MessageSigner>> signers = {p.signer(0), p.signer(1)};
  test_support::run_threads(2, [&](int id) {
    comm::Membership m(store, store, id, 3, kDeadAfter, false, std::chrono::minutes(1), "worker", signers[size_t(id)]);
    const std::string key = "ft/e0/x0/vote/2";  // worker 2's vote, before its death
    if (id == 0) store.set(key, p.signer(2)->sign(key, "10"));
    EXPECT_TRUE(m.should_commit("x0", true, false).commit);
  });
  p.identities[2] = std::make_shared<comm::Identity>(comm::Identity::generate());
  std::vector<std::vector<int>> seen(3);
  test_support::run_threads(3, [&](int id) {
    comm::Membership m(store, store, id, 3, kDeadAfter, /*joining=*/id == 2, std::chrono::seconds(8), "worker",
                       id == 2 ? p.signer(2) : signers[size_t(id)]);
    EXPECT_TRUE(m.start_round("x1", id == 0 ? std::vector<int>{2} : std::vector<int>{}));
    seen[size_t(id)] = m.members();
    const auto d = m.should_commit("x1", true, false);
    EXPECT_TRUE(d.commit) << "member " << id << ": worker 2's vote was not heard";
  });
  for (const auto& members : seen) EXPECT_EQ(members, (std::vector<int>{0, 1, 2}));
}
