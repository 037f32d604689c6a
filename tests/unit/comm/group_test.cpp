// Ranks as threads over one in-memory HashStore.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <thread>

#include "tributary/comm/group.h"
#include "tributary/core/error.h"

using namespace tributary;

namespace {

void run_ranks(int n, const std::function<void(comm::Group&)>& body, comm::GroupOptions options = {}) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        comm::Group g(store, r, n, options);
        body(g);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace

TEST(Group, CollectivesAndReform) {
  run_ranks(3, [](comm::Group& g) {
    std::vector<torch::Tensor> t = {torch::full({5}, double(g.rank() + 1)), torch::ones({2, 2})};
    g.all_reduce_sum(t);
    EXPECT_TRUE(t[0].equal(torch::full({5}, 6.0)));
    EXPECT_TRUE(t[1].equal(torch::full({2, 2}, 3.0)));
    std::vector<torch::Tensor> b = {torch::full({3}, double(g.rank()))};
    g.broadcast(b, 2);
    EXPECT_TRUE(b[0].equal(torch::full({3}, 2.0)));
    auto all = g.all_gather(torch::full({2}, int64_t(g.rank() * 10), torch::kInt64));
    ASSERT_EQ(all.size(), 3u);
    EXPECT_EQ(all[2][1].item<int64_t>(), 20);
    g.barrier();
    g.reform("group1");  // a new process group under a new prefix still works
    std::vector<torch::Tensor> again = {torch::ones({1})};
    g.all_reduce_sum(again);
    EXPECT_EQ(again[0].item<float>(), 3.0f);
  });
}

TEST(Group, MissingPeerIsANetworkErrorNotAHang) {
  // Rank 1 of 2 never shows up: forming the group must fail within the deadline.
  auto store = c10::make_intrusive<c10d::HashStore>();
  store->setTimeout(std::chrono::milliseconds(500));
  auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(comm::Group(store, 0, 2, {.collective_timeout = std::chrono::milliseconds(500)}), NetworkError);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}
