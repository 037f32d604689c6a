// DiPaCo's task queue (runtime/dipaco/task_queue.h) on one in-memory store shared by two workers: a worker may claim
// the paths it trained last round first (their AdamW state is on its own disk); the others' turn in the queue skips
// what it took, and every task of a round is claimed exactly once.
#include <gtest/gtest.h>

#include "tributary/comm/store.h"
#include "tributary/runtime/dipaco/task_queue.h"

using namespace tributary;

TEST(TaskQueue, APathTakenByPreferenceIsSkippedByTheOthersTurnAndEveryPathIsClaimedOnce) {
  auto store = comm::Store::in_memory();
  TaskQueue a(store, store, 0, 5.0), b(store, store, 1, 5.0);
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
