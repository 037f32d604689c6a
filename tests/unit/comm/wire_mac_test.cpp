// Every message of our own collectives carries the run's MAC (comm/wire_mac.h), on the real engine: ranks as threads,
// Gloo groups over one store. With the key the averages are the very values they are without it; a byte changed in
// flight after the sender sealed it — what a stranger on the path would do — fails the exchange on the ranks that
// receive it, naming the message, before anything is decoded; a rank with another key is refused the same way.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <string>

#include "support/thread_ranks.h"
#include "tributary/comm/exchange.h"
#include "tributary/comm/group.h"
#include "tributary/core/error.h"

using namespace tributary;

namespace {

std::vector<torch::Tensor> update_of(int rank) {  // a private generator: the ranks are threads of one process
  auto generator = at::detail::createCPUGenerator(uint64_t(200 + rank));
  return {at::randn({3000}, generator), at::randn({7, 13}, generator)};
}

// Averages update_of(rank) twice (a second round checks the message numbers go on) with `options` on `n` ranks;
// `tamper(rank, exchange)` may install a change of the wire. Returns each rank's result, or its error's text.
std::vector<std::string> run(int n, const comm::ExchangeOptions& options, std::vector<std::vector<torch::Tensor>>& out,
                             const std::function<void(int, comm::Exchange&)>& tamper = {},
                             const std::function<comm::ExchangeOptions(int)>& options_of = {}) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::string> errors(static_cast<size_t>(n));
  out.assign(static_cast<size_t>(n), {});
  test_support::run_threads(n, [&](int r) {
    comm::Group group(store, r, n, comm::GroupOptions{.collective_timeout = std::chrono::seconds(20)});
    comm::Exchange exchange(group, options_of ? options_of(r) : options);
    try {
      auto t = update_of(r);
      exchange.average(t);
      if (tamper) tamper(r, exchange);
      t = update_of(r);
      exchange.average(t);
      out[static_cast<size_t>(r)] = t;
    } catch (const NetworkError& e) {
      errors[static_cast<size_t>(r)] = e.what();
    }
  });
  return errors;
}

}  // namespace

TEST(WireMac, SealedAveragesAreTheUnsealedOnesAndAChangedByteIsRefusedBeforeItIsDecoded) {
  const auto key = comm::random_run_key();
  for (const std::string codec : {"int8", "fp16", "topk", "sparseloco", "powersgd"}) {
    SCOPED_TRACE(codec);
    comm::ExchangeOptions plain{.codec = codec, .bucket_mb = 0.004, .topk_ratio = 0.1, .sparse = {.chunk = 64, .k = 8}};
    comm::ExchangeOptions sealed = plain;
    sealed.mac_key = key;
    std::vector<std::vector<torch::Tensor>> want, got;
    const auto plain_errors = run(3, plain, want);
    const auto sealed_errors = run(3, sealed, got);
    for (int r = 0; r < 3; ++r) {
      ASSERT_EQ(plain_errors[r], "");
      ASSERT_EQ(sealed_errors[r], "");
      // PowerSGD's factors take the sealed ring instead of Gloo's all-reduce: the same sum, added in another order.
      for (size_t i = 0; i < want[r].size(); ++i)
        EXPECT_TRUE(codec == "powersgd" ? torch::allclose(want[r][i], got[r][i], 1e-5, 1e-6)
                                        : torch::equal(want[r][i], got[r][i]))
            << "rank " << r;
    }
    // Every rank changes one byte of what it sends (a ring's receivers then all fail at the same hop; an all-gather's
    // payloads reach everyone).
    const auto changed = run(3, sealed, got, [](int, comm::Exchange& ex) {
      ex.set_wire_tamper([](torch::Tensor& wire) { wire.data_ptr<uint8_t>()[wire.numel() / 2] ^= 1; });
    });
    for (int r = 0; r < 3; ++r) {
      EXPECT_NE(changed[r].find("does not carry the run's MAC"), std::string::npos)
          << "rank " << r << ": " << changed[r];
      EXPECT_NE(changed[r].find("from rank"), std::string::npos) << changed[r];
    }
  }
}

TEST(WireMac, ARankWithAnotherKeyIsRefused) {
  const auto ours = comm::random_run_key(), theirs = comm::random_run_key();
  std::vector<std::vector<torch::Tensor>> got;
  const auto errors = run(
      2, {}, got, {}, [&](int r) { return comm::ExchangeOptions{.codec = "int8", .mac_key = r == 1 ? theirs : ours}; });
  for (int r = 0; r < 2; ++r) EXPECT_NE(errors[r].find("does not carry the run's MAC"), std::string::npos) << errors[r];
}

// A message recorded in one invocation of a run (before a --resume, or before launch started the run again on a
// fresh store) does not verify in the next: the ranks' MACs are keyed by the run's key and the invocation's nonce.
TEST(WireMac, AMessageOfAnEarlierInvocationOfTheRunDoesNotVerify) {
  const auto run_key = comm::random_run_key();
  auto first = comm::Store::in_memory(), second = comm::Store::in_memory();
  const auto key = comm::invocation_key(first, run_key);
  EXPECT_EQ(comm::invocation_key(first, run_key), key);  // every rank of an invocation draws the same
  const auto next = comm::invocation_key(second, run_key);
  EXPECT_NE(next, key);
  EXPECT_NE(key, run_key);
  const auto message = torch::arange(64, torch::kUInt8);
  const auto recorded = comm::WireMac(key).seal(message, "islands.shard0|7|0>1");
  EXPECT_TRUE(torch::equal(comm::WireMac(key).open(recorded, "islands.shard0|7|0>1", "replay"), message));
  EXPECT_THROW(comm::WireMac(next).open(recorded, "islands.shard0|7|0>1", "replay"), NetworkError);
}

// A heal's state travels over Gloo with its tag through the sealed store: any changed byte, or the same bytes at
// another place, gives another tag.
TEST(WireMac, AStatesTagCoversEveryTensorAndItsPlace) {
  const comm::WireMac mac(comm::random_run_key());
  std::vector<torch::Tensor> state = {torch::randn({5, 3}), torch::randn({7})};
  const std::string tag = mac.tag_hex(state, "ft/heal/e2");
  EXPECT_EQ(tag.size(), 64u);
  EXPECT_EQ(mac.tag_hex({state[0].clone(), state[1].clone()}, "ft/heal/e2"), tag);
  EXPECT_NE(mac.tag_hex(state, "ft/heal/e3"), tag);
  state[1].data_ptr<float>()[6] += 1e-6f;
  EXPECT_NE(mac.tag_hex(state, "ft/heal/e2"), tag);
}
