// Members as threads over one in-memory store: the round decision and the re-formation without a silent member.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "support/thread_ranks.h"
#include "tributary/comm/membership.h"
#include "tributary/core/error.h"

using namespace tributary;

TEST(Store, SetOnceKeepsTheFirstValue) {
  auto store = comm::Store::in_memory();
  EXPECT_EQ(store.set_once("decision", "first"), "first");
  EXPECT_EQ(store.set_once("decision", "second"), "first");
  EXPECT_EQ(store.get("decision"), "first");
}

TEST(Membership, ARoundCommitsOnlyWhenEveryMemberSucceeded) {
  auto store = comm::Store::in_memory();
  std::vector<comm::RoundDecision> got(3);
  test_support::run_threads(3, [&](int id) {
    comm::Membership m(store, store, id, 3, /*dead_after_s=*/2.0);
    got[size_t(id)] = m.should_commit("x0", /*ok=*/true, /*stop_wish=*/id == 2);
  });
  for (const auto& d : got) {
    EXPECT_TRUE(d.commit);
    EXPECT_TRUE(d.stop) << "member 2's stop wish reaches every member";
    EXPECT_TRUE(d.silent.empty() && d.failed.empty());
  }
  test_support::run_threads(3, [&](int id) {
    comm::Membership m(store, store, id, 3, 2.0);
    const auto d =
        m.should_commit("x1", /*ok=*/id != 1, false);  // member 1's collective failed: nobody applies the round
    EXPECT_FALSE(d.commit);
    EXPECT_EQ(d.failed, std::vector<int>{1});
    EXPECT_TRUE(d.silent.empty()) << "it voted: alive";
  });
}

TEST(Membership, ASilentMemberIsDroppedAfterItsHeartbeatDeadline) {
  auto store = comm::Store::in_memory();
  const double dead_after = 0.5;
  test_support::run_threads(2, [&](int id) {  // member 2 of 3 never starts (no heartbeat, no vote)
    comm::Membership m(store, store, id, 3, dead_after);
    const auto start = std::chrono::steady_clock::now();
    const auto d = m.should_commit("x0", true, false);
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_FALSE(d.commit);
    EXPECT_EQ(d.silent, std::vector<int>{2}) << "the cause is named apart from the members that merely failed";
    EXPECT_TRUE(d.failed.empty());
    EXPECT_GE(waited, dead_after);
    EXPECT_LT(waited, dead_after + 1.0) << "detection within the heartbeat deadline + 1 s";
    EXPECT_EQ(d.dropped, std::vector<int>{2});
    EXPECT_EQ(m.epoch(), 1);
    EXPECT_EQ(m.members(), (std::vector<int>{0, 1}));
    EXPECT_EQ(m.rank(), id);
    EXPECT_NE(m.group_prefix(), "ft/group-e0");
    EXPECT_TRUE(m.should_commit("x0", true, false).commit) << "the new epoch's round needs only the survivors";
  });
}

TEST(Membership, AMemberLeftOutOfTheNewEpochStops) {
  auto store = comm::Store::in_memory();
  store.set("ft/e1/members", "[0]");  // the others went on without member 1
  comm::Membership m(store, store, 1, 2, 0.5);
  try {
    m.should_commit("x0", true, false);
    FAIL() << "a member left out must not go on as a replica";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("declared dead"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("dist.heartbeat_timeout_s"), std::string::npos) << e.what();
  }
}

TEST(Membership, ADeathReportedByLaunchIsActedOnBeforeTheHeartbeatDeadline) {
  // Member 2 never starts, and its launch has reported it dead (what launch does when a worker exits with an error or
  // a signal): the others decide without waiting the 5 s heartbeat deadline.
  auto store = comm::Store::in_memory();
  store.add("ft/lost/2", 1);
  store.add("ft/lost", 1);
  test_support::run_threads(2, [&](int id) {
    comm::Membership m(store, store, id, 3, /*dead_after_s=*/5.0);
    const auto start = std::chrono::steady_clock::now();
    const auto d = m.should_commit("x0", true, false);
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_FALSE(d.commit);
    EXPECT_EQ(d.silent, std::vector<int>{2});
    EXPECT_LT(waited, 2.5) << "not the heartbeat deadline: the report, confirmed by 1.5 s of silence";
  });
  // A restarted incarnation records the deaths so far: the old report does not count against it.
  store.set("ft/incarnation/2", "1");
  test_support::run_threads(3, [&](int id) {
    comm::Membership m(store, store, id, 3, 5.0);
    EXPECT_TRUE(m.should_commit("x1", true, false).commit);
  });
}

TEST(Membership, AForgedDeathReportDoesNotDropALiveMember) {
  // Two store writes (what a participant holding the run's secret can make) report member 2 dead while it beats:
  // the members wait for its heartbeat to confirm, it never does, and the round commits with all three.
  auto store = comm::Store::in_memory();
  store.add("ft/lost/2", 1);
  store.add("ft/lost", 1);
  test_support::run_threads(3, [&](int id) {
    comm::Membership m(store, store, id, 3, /*dead_after_s=*/2.0);
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // past the confirmation and the ignored-log wait
    EXPECT_FALSE(m.member_dead()) << "member " << id << " believed the report";
    EXPECT_FALSE(m.should_abandon("x0")) << "a collective would be abandoned for a live member";
    const auto d = m.should_commit("x0", true, false);
    EXPECT_TRUE(d.commit) << "member " << id;
    EXPECT_TRUE(d.silent.empty());
  });
}

TEST(Membership, ARestartedWorkerWhosePredecessorWasReportedAsksAtOnceAndJoinsAtTheRoundThatDropsIt) {
  // Worker 2 died and its launch reported it; its restarted incarnation need not wait until the members drop the old
  // one: it asks at once, so the round that drops its predecessor (discarded, re-formed, redone) already admits it.
  auto store = comm::Store::in_memory();
  store.add("ft/lost/2", 1);
  store.add("ft/lost", 1);
  std::atomic<bool> asked_early{true};
  test_support::run_threads(3, [&](int id) {
    if (id == 2) {
      comm::Membership joiner(store, store, 2, 3, /*dead_after_s=*/5.0, /*joining=*/true);
      ASSERT_EQ(joiner.join(std::chrono::seconds(10)).kind, comm::JoinResult::kAdmitted);
      EXPECT_EQ(joiner.epoch(), 2);
      EXPECT_EQ(joiner.members(), (std::vector<int>{0, 1, 2}));
      EXPECT_TRUE(joiner.should_commit("x1", true, false).commit) << "the old report does not count against it";
      return;
    }
    comm::Membership m(store, store, id, 3, 5.0);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (store.add("ft/join/2", 0) == 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (store.add("ft/join/2", 0) == 0) asked_early = false;
    const auto lost = m.should_commit("x0", true, false);
    EXPECT_FALSE(lost.commit) << "its predecessor is silent";
    EXPECT_EQ(lost.dropped, std::vector<int>{2});
    const auto redone = m.should_commit("x0", true, false);
    ASSERT_TRUE(redone.commit);
    EXPECT_EQ(redone.joiners, std::vector<int>{2}) << "admitted right after the round that dropped its predecessor";
    m.admit(redone.joiners);
    EXPECT_EQ(m.members(), (std::vector<int>{0, 1, 2}));
    EXPECT_TRUE(m.should_commit("x1", true, false).commit);
  });
  EXPECT_TRUE(asked_early) << "the joiner waited for its predecessor to be dropped";
  EXPECT_EQ(store.get("ft/incarnation/2"), "1") << "the members recorded the deaths before this incarnation";
}

TEST(Membership, BeforeARoundTheLeadSwapsADeadWorkerForItsHealedReplacementOnce) {
  // Worker 2 died; the lead healed its replacement twice (the first replacement died too): the round's members list
  // worker 2 once, in the place after the others; every member and the replacement agree on the new epoch.
  auto store = comm::Store::in_memory();
  std::vector<std::vector<int>> seen(3);
  test_support::run_threads(3, [&](int id) {
    comm::Membership m(store, store, id, 3, /*dead_after_s=*/5.0, /*joining=*/id == 2);
    EXPECT_TRUE(m.start_round("x0", id == 0 ? std::vector<int>{2, 2} : std::vector<int>{}));
    EXPECT_EQ(m.epoch(), 1);
    seen[size_t(id)] = m.members();
  });
  for (const auto& members : seen) EXPECT_EQ(members, (std::vector<int>{0, 1, 2}));
  // A round without healed joiners changes nothing.
  test_support::run_threads(2, [&](int id) {
    comm::Membership m(store, store, id, 3, 5.0);
    EXPECT_FALSE(m.start_round("x1", {}));
  });
}

TEST(Membership, AJoinerWithNoLiveMemberLeftFailsAsRunLostWithinTheHeartbeatDeadline) {
  // The lone member (worker 0; worker 1 was dropped) dies while worker 1's replacement waits to be admitted: nobody
  // holds the run's state any more. The joiner says so within the heartbeat deadline instead of waiting out its own.
  auto store = comm::Store::in_memory();
  const double dead_after = 0.5;
  auto lead = std::make_unique<comm::Membership>(store, store, 0, 2, dead_after);
  const auto lost = lead->should_commit("x0", true, false);
  ASSERT_FALSE(lost.commit) << "worker 1 never started";
  ASSERT_EQ(lost.dropped, std::vector<int>{1});
  std::string error;
  std::thread joiner([&] {
    comm::Membership m(store, store, 1, 2, dead_after, /*joining=*/true);
    try {
      m.join(std::chrono::seconds(30));
    } catch (const RunLost& e) {
      error = e.what();
    }
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (store.add("ft/join/1", 0) == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(store.add("ft/join/1", 0), 1) << "the joiner asked";
  std::this_thread::sleep_for(std::chrono::milliseconds(2 * 500));
  EXPECT_TRUE(error.empty()) << "a live lead keeps it waiting: " << error;
  const auto died = std::chrono::steady_clock::now();
  lead.reset();  // its heartbeat stops
  joiner.join();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - died).count();
  EXPECT_NE(error.find("no member of the run is left to heal from"), std::string::npos) << error;
  EXPECT_NE(error.find("members 0 are all dead"), std::string::npos) << error;
  EXPECT_NE(error.find("train --resume"), std::string::npos) << error;
  EXPECT_LT(waited, dead_after + 1.5) << "within the heartbeat deadline, not the joiner's 30 s";
}

TEST(Membership, AHealedJoinerRefusesAProposalThatListsOnlyItsDeadPredecessor) {
  // A member that took the lead for dead proposes "no change": the members as they were, worker 2's dead predecessor
  // among them, no joiners. The healed replacement must not take that as its admission (it would try to form the old
  // epoch's group with a dead peer); it stops, and its launch may restart it.
  auto store = comm::Store::in_memory();
  store.set("ft/pre/x0", R"({"epoch": 0, "members": [0, 1, 2], "joiners": []})");
  comm::Membership joiner(store, store, 2, 3, /*dead_after_s=*/5.0, /*joining=*/true);
  try {
    joiner.start_round("x0", {});
    ADD_FAILURE() << "admitted by a proposal without it";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not admitted at round x0"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(joiner.members().empty());
}

TEST(Membership, AMalformedAgreedValueIsSkippedAndTheAgreementMovesToTheNextSlot) {
  // Bytes that are no decision won the decision key (a holder of the run's secret wrote them first; the values are
  // sealed, not signed, here): every member skips them alike and decides in the key's next slot, nobody throws.
  auto store = comm::Store::in_memory();
  store.set_once("ft/e0/x0/decision", "{not json");
  store.set_once("ft/e1/members", R"({"members": "none"})");
  test_support::run_threads(2, [&](int id) {
    comm::Membership m(store, store, id, 3, /*dead_after_s=*/0.5);
    const auto d = m.should_commit("x0", true, false);  // member 2 never starts: the round is discarded
    EXPECT_FALSE(d.commit);
    EXPECT_EQ(d.dropped, std::vector<int>{2});
    EXPECT_EQ(m.members(), (std::vector<int>{0, 1})) << "the members agreed in e1/members' next slot";
  });
  EXPECT_TRUE(store.check({"ft/e0/x0/decision/1"}) && store.check({"ft/e1/members/1"}));
}
