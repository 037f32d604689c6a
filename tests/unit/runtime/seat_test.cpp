// A rank's seat at the rendezvous (runtime/rendezvous.h, claim_seat): the first process takes it; a second process
// started with the same rank is refused by name and the first keeps its seat; a joiner (launch --max-restarts) takes
// its dead predecessor's.
#include <gtest/gtest.h>

#include <string>

#include "tributary/comm/store.h"
#include "tributary/core/error.h"
#include "tributary/runtime/rendezvous.h"

using namespace tributary;

TEST(Seat, ASecondProcessWithATakenRankIsRefusedNamingTheRank) {
  auto store = comm::Store::in_memory();
  DistEnv env;
  env.rank = 2;
  env.world_size = 4;
  claim_seat(store, env);
  const std::string holder = store.get("seat/2");
  try {
    claim_seat(store, env);
    ADD_FAILURE() << "a second process took rank 2's seat";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rank 2 of this run is already held by pid"), std::string::npos) << what;
    EXPECT_NE(what.find("launch --max-restarts"), std::string::npos) << what;
  }
  EXPECT_EQ(store.get("seat/2"), holder) << "the first keeps its seat";
  env.rank = 3;
  EXPECT_NO_THROW(claim_seat(store, env)) << "another rank's seat is free";
  env.rank = 2;
  env.joining = true;
  EXPECT_NO_THROW(claim_seat(store, env)) << "a restarted worker takes its predecessor's seat";
  EXPECT_NE(store.get("seat/2"), holder);
}
