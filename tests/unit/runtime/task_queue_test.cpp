// DiPaCo's task queue (runtime/dipaco/task_queue.h) on one in-memory store shared by two workers: a worker may claim
// the paths it trained last round first (their AdamW state is on its own disk); the others' turn in the queue skips
// what it took, and every task of a round is claimed exactly once. Once the quorum dropped a worker, the tasks it
// claimed or finished are lost, and so are those nobody claimed.
#include <gtest/gtest.h>

#include "tributary/comm/store.h"
#include "tributary/runtime/dipaco/task_queue.h"

using namespace tributary;

TEST(TaskQueue, APathTakenByPreferenceIsSkippedByTheOthersTurnAndEveryPathIsClaimedOnce) {
  auto store = comm::Store::in_memory();
  TaskQueue a(store, 0), b(store, 1);
  const std::vector<int64_t> tasks = {0, 1, 2, 3};
  EXPECT_EQ(b.claim(0, 0, tasks, {2, 3}), std::optional<int64_t>(2));  // b trained 2 and 3 last round
  EXPECT_EQ(a.claim(0, 0, tasks), std::optional<int64_t>(0));
  EXPECT_EQ(a.claim(0, 0, tasks), std::optional<int64_t>(1));
  EXPECT_EQ(a.claim(0, 0, tasks), std::optional<int64_t>(3));  // 2 is b's: skipped
  EXPECT_EQ(b.claim(0, 0, tasks, {2, 3}), std::nullopt);       // 3 went to a meanwhile; nothing is left
  EXPECT_EQ(a.claim(0, 0, tasks), std::nullopt);
  // A path a worker took by preference is not handed to it again when its own turn in the queue reaches it.
  EXPECT_EQ(b.claim(2, 0, tasks, {0}), std::optional<int64_t>(0));
  EXPECT_EQ(b.claim(2, 0, tasks, {0}), std::optional<int64_t>(1));  // index 0 is path 0, already b's: the next
  EXPECT_EQ(a.claim(2, 0, tasks), std::optional<int64_t>(2));
  EXPECT_EQ(b.claim(2, 0, tasks, {0}), std::optional<int64_t>(3));
  EXPECT_EQ(a.claim(2, 0, tasks), std::nullopt);
  // A preference for a path that is not a task of this generation is ignored.
  EXPECT_EQ(b.claim(1, 0, {1}, {3}), std::optional<int64_t>(1));
  // A re-queued generation (a dead worker's tasks) claims paths already claimed in generation 0.
  EXPECT_EQ(b.claim(0, 1, {3}, {2}), std::optional<int64_t>(3));
  EXPECT_EQ(a.claim(0, 1, {3}), std::nullopt);
}

TEST(TaskQueue, TheTasksOfAWorkerOutsideTheMembersAreLost) {
  auto store = comm::Store::in_memory();
  TaskQueue a(store, 0), b(store, 1), c(store, 2);
  const std::vector<int64_t> tasks = {0, 1, 2, 3, 4};
  ASSERT_EQ(a.claim(0, 0, tasks), std::optional<int64_t>(0));
  ASSERT_EQ(b.claim(0, 0, tasks), std::optional<int64_t>(1));
  ASSERT_EQ(c.claim(0, 0, tasks), std::optional<int64_t>(2));
  ASSERT_EQ(b.claim(0, 0, tasks), std::optional<int64_t>(3));
  a.done(0, 0);
  b.done(0, 1);  // b finished path 1 and holds path 3 claimed; nobody claimed path 4
  c.done(0, 2);
  EXPECT_EQ(a.lost(0, tasks, {0, 1, 2}), (std::vector<int64_t>{4}));
  EXPECT_EQ(a.lost(0, tasks, {0, 2}), (std::vector<int64_t>{1, 3, 4}));  // b left the run
  // The next generation re-claims path 3; once c finishes it, it is c's.
  ASSERT_EQ(c.claim(0, 1, {1, 3, 4}), std::optional<int64_t>(1));
  ASSERT_EQ(c.claim(0, 1, {1, 3, 4}), std::optional<int64_t>(3));
  c.done(0, 1);
  c.done(0, 3);
  EXPECT_EQ(a.lost(0, tasks, {0, 2}), (std::vector<int64_t>{4}));
  EXPECT_EQ(a.lost(1, tasks, {0, 2}), tasks);  // another round: nothing claimed yet
}
