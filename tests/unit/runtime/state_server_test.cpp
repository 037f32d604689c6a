// Path state on request (runtime/dipaco/state_server.h) on one in-memory store: a holder's thread answers what it has
// and says so when it has not; an asker gives up on a silent holder at its deadline instead of waiting for ever.
#include <gtest/gtest.h>

#include <map>

#include "tributary/comm/store.h"
#include "tributary/core/clock.h"
#include "tributary/runtime/dipaco/state_server.h"

using namespace tributary;
using namespace std::chrono_literals;

TEST(StateServer, AHolderServesWhatItHasAndSaysWhenItHasNot) {
  auto store = comm::Store::in_memory();
  const std::map<std::string, std::string> held = {{"inner/p3/r1", std::string("\0state\xff", 7)}, {"best/p3", "x"}};
  StateServer server(store, 2, [&](const std::string& what) -> std::optional<std::string> {
    auto it = held.find(what);
    if (it == held.end()) return std::nullopt;
    return it->second;
  });
  EXPECT_EQ(ask_holder(store, 2, "inner/p3/r1", 5s), held.at("inner/p3/r1"));  // bytes as they are, NULs included
  EXPECT_EQ(ask_holder(store, 2, "inner/p4/r1", 5s), std::nullopt);            // answered at once: not held
  EXPECT_EQ(ask_holder(store, 2, "best/p3", 5s), std::optional<std::string>("x"));
  EXPECT_EQ(server.take_served_bytes(), 8.0);
  EXPECT_EQ(server.take_served_bytes(), 0.0);
  // Replies are removed once read: the store does not keep served state in memory.
  EXPECT_FALSE(store.check({"dipaco/serve/w2/reply0"}));
}

TEST(StateServer, AnAskerGivesUpOnASilentHolderAtItsDeadline) {
  auto store = comm::Store::in_memory();
  const auto start = Clock::now();
  EXPECT_EQ(ask_holder(store, 7, "inner/p0/r0", 300ms), std::nullopt);  // nobody serves worker 7
  EXPECT_GE(seconds_since(start), 0.3);
  EXPECT_LT(seconds_since(start), 5.0);
}

TEST(StateServer, ALookupThatThrowsIsAnsweredAsNotHeld) {
  auto store = comm::Store::in_memory();
  StateServer server(store, 0, [](const std::string&) -> std::optional<std::string> {
    throw std::runtime_error("the file went away");
  });
  EXPECT_EQ(ask_holder(store, 0, "inner/p0/r0", 5s), std::nullopt);
  EXPECT_EQ(ask_holder(store, 0, "inner/p0/r0", 5s), std::nullopt);  // and it keeps serving
}

TEST(StateServer, AnAskerThatDiedBeforeWritingItsRequestDoesNotHoldUpTheNext) {
  auto store = comm::Store::in_memory();
  StateServer server(store, 1, [](const std::string& what) -> std::optional<std::string> { return what; });
  store.add("dipaco/serve/w1/next", 1);  // took number 0 and died before writing ask0
  EXPECT_EQ(ask_holder(store, 1, "best/p2", 10s), std::optional<std::string>("best/p2"));  // number 1: after the gap
}
