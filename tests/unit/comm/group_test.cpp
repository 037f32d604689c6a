// Ranks as threads over one in-memory HashStore.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <atomic>
#include <thread>

#include "support/thread_ranks.h"
#include "tributary/comm/group.h"
#include "tributary/comm/sparse_chunks.h"
#include "tributary/core/error.h"

using namespace tributary;

namespace {

void run_ranks(int n, const std::function<void(comm::Group&)>& body, comm::GroupOptions options = {}) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  test_support::run_threads(n, [&](int r) {
    comm::Group g(store, r, n, options);
    body(g);
  });
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

// Several tensors travel as one message per run of one dtype (group.cpp); every tensor, of any shape, dtype or layout,
// lands whole and in place.
TEST(Group, BroadcastOfManyTensorsDeliversEachInPlace) {
  run_ranks(3, [](comm::Group& g) {
    const double r = g.rank();
    auto transposed = torch::arange(6, torch::kFloat).reshape({2, 3}).add(r).t();  // not contiguous
    std::vector<torch::Tensor> b = {torch::full({2, 3}, r), torch::full({4}, r + 10), transposed,
                                    torch::full({2}, int64_t(g.rank()), torch::kInt64), torch::full({1}, r + 20)};
    auto first = b[0];
    g.broadcast(b, 1);
    EXPECT_TRUE(first.is_same(b[0]));
    EXPECT_TRUE(b[0].equal(torch::full({2, 3}, 1.0)));
    EXPECT_TRUE(b[1].equal(torch::full({4}, 11.0)));
    EXPECT_TRUE(b[2].equal(torch::arange(6, torch::kFloat).reshape({2, 3}).add(1).t()));
    EXPECT_TRUE(b[3].equal(torch::full({2}, int64_t(1), torch::kInt64)));
    EXPECT_TRUE(b[4].equal(torch::full({1}, 21.0)));
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

TEST(Group, AFormationWaitingForADeadMemberIsAbandonedNotHeldToTheDeadline) {
  // Fault tolerance (set_abandon): rank 1 of the new group died before it arrived. Gloo's rendezvous alone would wait
  // for it until the collective deadline (20 s here, 30 min by default); the abandon check ends the wait.
  auto store = c10::make_intrusive<c10d::HashStore>();
  comm::Group g(store, 0, 1, {.collective_timeout = std::chrono::seconds(20)});
  const auto start = std::chrono::steady_clock::now();
  g.set_abandon([&] { return std::chrono::steady_clock::now() - start > std::chrono::milliseconds(300); });
  try {
    g.reform("epoch2", 0, 2);
    ADD_FAILURE() << "a group of two formed without its second rank";
  } catch (const NetworkError& e) {
    EXPECT_NE(std::string(e.what()).find("died before it arrived"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

#include "tributary/runtime/wan.h"

TEST(Group, EmulatedLinksDeliverEachMessageAtItsModelledTimeBehindTheOneBefore) {
  // 8 Mbit/s = 1 MB/s and 50 ms: a 100 kB message leaves in 0.1 s and arrives 0.05 s later; a second one posted at
  // the same moment waits for the first to leave (link as a queue): it leaves at 0.2 s and arrives at 0.25 s.
  std::atomic<int64_t> posted_ns{0};
  comm::GroupOptions options{.link = wan_link_model("8Mbit,50ms", 2)};
  auto since_post = [&] {
    return double(std::chrono::steady_clock::now().time_since_epoch().count() - posted_ns.load()) / 1e9;
  };
  run_ranks(
      2,
      [&](comm::Group& g) {
        g.barrier();
        if (g.rank() == 0) {
          auto a = torch::full({25000}, 1.0f), b = torch::full({25000}, 2.0f);
          posted_ns = std::chrono::steady_clock::now().time_since_epoch().count();
          auto first = g.send(a, 1, 7, "first"), second = g.send(b, 1, 8, "second");
          a.fill_(-1);  // the emulated send copied it: the caller's buffer is free at once
          first.wait();
          EXPECT_GE(since_post(), 0.1 - 1e-3) << "the sender waits until its bytes have left";
          second.wait();
          EXPECT_GE(since_post(), 0.2 - 1e-3);
          EXPECT_LT(since_post(), 0.5);
        } else {
          auto a = torch::empty({25000}), b = torch::empty({25000});
          g.recv(a, 0, 7, "first").wait();
          const double first = since_post();
          g.recv(b, 0, 8, "second").wait();
          const double second = since_post();
          EXPECT_TRUE(a.equal(torch::full({25000}, 1.0f)));
          EXPECT_TRUE(b.equal(torch::full({25000}, 2.0f)));
          EXPECT_GE(first, 0.15 - 1e-3);
          EXPECT_GE(second, 0.25 - 1e-3);
          EXPECT_LT(second, 0.6) << "the emulation must not add much beyond the model";
        }
        // A collective takes the modelled ring time: 2 steps of (50 ms + 50 kB / 1 MB/s) = 0.2 s.
        std::vector<torch::Tensor> t = {torch::ones({25000})};
        const auto start = std::chrono::steady_clock::now();
        g.all_reduce_sum(t);
        EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 0.2);
        EXPECT_TRUE(t[0].equal(torch::full({25000}, 2.0f)));
      },
      options);
}

TEST(LinkModel, ASubsetKeepsThePairsOfItsMembersInTheirOrder) {
  comm::LinkModel world = comm::LinkModel::uniform(1.0, 0.0, 3);
  for (int a = 0; a < 3; ++a)
    for (int b = 0; b < 3; ++b) world.latency_s[size_t(a * 3 + b)] = 10 * a + b;
  auto sub = world.subset({2, 0});
  ASSERT_EQ(sub.num_ranks, 2);
  EXPECT_EQ(sub.latency(0, 1), 20);
  EXPECT_EQ(sub.latency(1, 0), 2);
}

#include "tributary/comm/exchange.h"
#include "tributary/runtime/wan.h"

TEST(Exchange, AveragesWithEveryCodecAndAccountsBytes) {
  for (const std::string codec : {"fp32", "fp16", "int8", "fp4"}) {
    run_ranks(3, [&](comm::Group& g) {
      comm::Exchange ex(g, {.codec = codec, .bucket_mb = 0.0001});  // tiny buckets: several collectives
      std::vector<torch::Tensor> t = {torch::full({100}, double(g.rank())), torch::full({3, 7}, 1.0 + g.rank())};
      ex.average(t);
      double tol = codec == "fp32" || codec == "fp16" ? 1e-6 : 0.1;
      EXPECT_TRUE(torch::allclose(t[0], torch::full({100}, 1.0), 0, tol)) << codec;
      EXPECT_TRUE(torch::allclose(t[1], torch::full({3, 7}, 2.0), 0, tol)) << codec;
      auto c = comm::make_codec(codec);
      EXPECT_GT(ex.stats().exchanges, 1) << "bucketing split the tensors";
      if (codec == "fp32") {
        EXPECT_DOUBLE_EQ(ex.stats().bytes_sent, 2.0 * 2 / 3 * 121 * 4);
      } else {
        // quantised ring: 2 (N-1) encoded chunks of floor or ceil(m / N) values per bucket (buckets of 100 and 21)
        double lo = 0, hi = 0;
        for (int64_t m : {100, 21}) {
          lo += 4.0 * c->encoded_bytes(m / 3);
          hi += 4.0 * c->encoded_bytes((m + 2) / 3);
        }
        EXPECT_GE(ex.stats().bytes_sent, lo) << codec;
        EXPECT_LE(ex.stats().bytes_sent, hi) << codec;
      }
    });
  }
}

TEST(Exchange, EmulatedLinkTakesTheModelledTime) {
  run_ranks(2, [](comm::Group& g) {
    comm::Exchange ex(g, {.codec = "fp32", .link = wan_link_model("8Mbit,50ms", 2)});
    std::vector<torch::Tensor> t = {torch::ones({25000})};  // 100 kB
    auto start = std::chrono::steady_clock::now();
    ex.average(t);
    double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // ring all-reduce of 2 ranks: 2 steps of (50 ms + 50 kB / 1 MB/s) = 0.2 s
    EXPECT_NEAR(ex.stats().modelled_s, 0.2, 1e-9);
    EXPECT_GE(took, 0.2);
    EXPECT_LT(took, 1.0) << "the emulation must not add much beyond the model";
  });
  EXPECT_THROW(wan_link_model("fast,slow", 2), Error);
}

TEST(Exchange, TopKErrorFeedbackSendsEverythingEventually) {
  run_ranks(2, [](comm::Group& g) {
    comm::Exchange ex(g, {.codec = "topk", .topk_ratio = 0.1});
    auto x = torch::arange(1, 41, torch::kFloat32) * (g.rank() == 0 ? 1.0 : -0.5);  // 40 values
    auto total = torch::zeros({40});
    const int rounds = 200;
    for (int round = 0; round < rounds; ++round) {
      std::vector<torch::Tensor> t = {x.clone()};
      ex.average(t);
      total += t[0];
    }
    // The true average over the rounds is rounds * 0.25 * x0. Without error feedback each rank would send the same 4
    // coordinates forever; with it every coordinate gets through and only what sits in the residuals is missing.
    auto expected = torch::arange(1, 41, torch::kFloat32) * 0.25 * rounds;
    EXPECT_TRUE((total != 0).all().item<bool>()) << total;
    EXPECT_LT((total - expected).abs().sum().item<double>() / expected.abs().sum().item<double>(), 0.1) << total;
    // 4 values (10%) x 8 bytes per round, sent to the one other rank
    EXPECT_DOUBLE_EQ(ex.stats().bytes_sent, rounds * 4 * 8);
  });
}

TEST(SparseChunks, RoundTripAndExactWireSizeForOddShapesAndRemainders) {
  // 10,000 values in chunks of 4,096: two full chunks (buckets of 64) and a remainder of 1,808 (buckets of 16); 64
  // kept per chunk at 2 bits; a chunk shorter than k keeps all of its values.
  for (const auto& [numel, chunk, k, bits] : std::vector<std::tuple<int64_t, int64_t, int64_t, int>>{
           {10000, 4096, 64, 2}, {37, 16, 5, 3}, {5, 16, 8, 4}, {1, 1, 1, 2}, {4096, 4096, 4096, 8}}) {
    comm::SparseChunks codec({.chunk = chunk, .k = k, .bits = bits});
    const int64_t chunks = (numel + chunk - 1) / chunk;
    int64_t payload_bits = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t len = std::min(chunk, numel - c * chunk);
      const int64_t kept = std::min(k, len);
      int offset_bits = 0;  // buckets of the largest power of two <= len / kept values, a unary count each
      while ((int64_t{2} << offset_bits) <= len / kept) ++offset_bits;
      const int64_t buckets = (len + (int64_t{1} << offset_bits) - 1) >> offset_bits;
      payload_bits += kept + buckets + kept * (offset_bits + bits);
    }
    EXPECT_EQ(codec.payload_bytes(numel), 8 * chunks + (payload_bits + 7) / 8) << numel;
    auto gen = at::detail::createCPUGenerator(5);
    auto x = at::randn({numel}, gen, torch::kFloat32);
    torch::Tensor sent;
    auto payload = codec.encode(x, sent);
    ASSERT_EQ(payload.numel(), codec.payload_bytes(numel));
    auto decoded = torch::zeros({numel});
    codec.decode_add(payload, decoded);
    EXPECT_TRUE(torch::equal(decoded, sent)) << "a replica decodes exactly what the sender subtracts";
    for (int64_t c = 0; c < chunks; ++c) {  // per chunk: k values kept, the largest magnitudes, signs right
      const int64_t begin = c * chunk, len = std::min(chunk, numel - begin);
      auto xs = x.narrow(0, begin, len), ds = decoded.narrow(0, begin, len);
      const auto kept = ds.ne(0);
      EXPECT_EQ(kept.sum().item<int64_t>(), std::min(k, len)) << numel << " chunk " << c;
      EXPECT_GE(xs.abs().masked_select(kept).min().item<float>(),
                len > k ? xs.abs().masked_select(kept.logical_not()).max().item<float>() : 0.f);
      EXPECT_TRUE((ds.masked_select(kept).sign() == xs.masked_select(kept).sign()).all().item<bool>());
      const float hi = xs.abs().masked_select(kept).max().item<float>();
      // sign + (bits - 1) magnitude bits between the kept values' smallest and largest magnitude
      const float step = (hi - xs.abs().masked_select(kept).min().item<float>()) / float((1 << (bits - 1)) - 1);
      EXPECT_LE((ds - xs).masked_select(kept).abs().max().item<float>(), step / 2 * 1.0001f + 1e-6f);
    }
  }
  EXPECT_THROW(comm::SparseChunks({.chunk = 16, .k = 17}), Error);
  EXPECT_THROW(comm::SparseChunks({.chunk = 16, .k = 4, .bits = 1}), Error);
  // A payload whose bucket counts do not add up to k is refused, not read past its end.
  comm::SparseChunks codec({.chunk = 4096, .k = 64, .bits = 2});
  auto out = torch::zeros({10000});
  for (const int fill : {0x00, 0xff}) {
    auto bad = torch::full({codec.payload_bytes(10000)}, fill, torch::kUInt8);
    EXPECT_THROW(codec.decode_add(bad, out), Error) << fill;
  }
}

TEST(Exchange, SparseLoCoErrorFeedbackCarriesTheResidualAndReplicasStayBitIdentical) {
  // Without decay, what the ranks applied plus what sits in their error feedback is exactly what they put in: the
  // sum of the averages over the rounds + the mean residual == the mean of the pseudo-gradients' sum. Two streams
  // (two fragments of different sizes) keep their own feedback.
  std::vector<torch::Tensor> applied(3);
  run_ranks(3, [&](comm::Group& g) {
    comm::Exchange ex(g, {.codec = "sparseloco", .sparse = {.chunk = 64, .k = 4, .bits = 2}, .sparse_decay = 1.0});
    auto gen = at::detail::createCPUGenerator(100 + g.rank());
    auto total_in = torch::zeros({300}, torch::kFloat64), total_out = torch::zeros({300}, torch::kFloat64);
    auto other = torch::zeros({70});
    for (int round = 0; round < 30; ++round) {
      auto x = at::randn({300}, gen, torch::kFloat32);
      std::vector<torch::Tensor> t = {x.narrow(0, 0, 100).clone(), x.narrow(0, 100, 200).clone()};
      ex.average(t, /*stream=*/0);
      std::vector<torch::Tensor> o = {torch::ones({70}) * (g.rank() + 1)};
      ex.average(o, /*stream=*/1);
      other += o[0];
      total_in += x.to(torch::kFloat64);
      total_out += torch::cat(t).to(torch::kFloat64);
    }
    // Everyone's input summed over the rounds, averaged over the ranks == what was applied + the ranks' mean residual.
    auto in = total_in.to(torch::kFloat32);
    auto residual = ex.error_feedback().at({0, 0}).clone();
    ASSERT_EQ(residual.numel(), 300) << "one bucket for both tensors";
    std::vector<torch::Tensor> sums = {in, residual};
    g.all_reduce_sum(sums);
    EXPECT_TRUE(torch::allclose(total_out.to(torch::kFloat32) + residual / 3, in / 3, 1e-4, 1e-4));
    EXPECT_GT(residual.abs().sum().item<double>(), 1.0) << "most values are still waiting: a real residual";
    applied[size_t(g.rank())] = total_out;
    EXPECT_DOUBLE_EQ(ex.stats().bytes_sent, 30.0 * 2 *
                                                (comm::SparseChunks({.chunk = 64, .k = 4}).payload_bytes(300) +
                                                 comm::SparseChunks({.chunk = 64, .k = 4}).payload_bytes(70)));
    EXPECT_GT(other.sum().item<double>(), 0) << "stream 1's averages went through";
    EXPECT_EQ(ex.error_feedback().count({1, 0}), 1u) << "stream 1 keeps its own feedback";
  });
  EXPECT_TRUE(torch::equal(applied[0], applied[1]) && torch::equal(applied[0], applied[2]))
      << "every replica applied bit-identical updates";
}

TEST(Exchange, PowerSgdRecoversLowRankAveragesExactly) {
  run_ranks(2, [](comm::Group& g) {
    comm::Exchange ex(g, {.codec = "powersgd", .powersgd_rank = 2, .seed = 3});
    auto gen = at::detail::createCPUGenerator(11);
    auto a = at::randn({30, 2}, gen, torch::kFloat32), b = at::randn({20, 2}, gen, torch::kFloat32);
    auto m = torch::mm(a, b.t()) * (g.rank() + 1);  // rank-2 matrices whose average is 1.5 a b^T
    std::vector<torch::Tensor> t = {m, torch::full({5}, double(g.rank()))};
    ex.average(t);
    EXPECT_TRUE(torch::allclose(t[0], torch::mm(a, b.t()) * 1.5, 1e-4, 1e-4));
    EXPECT_TRUE(torch::allclose(t[1], torch::full({5}, 0.5)));
    // P (30 x 2) and Q (20 x 2) ring all-reduced, plus the 5 uncompressed values
    EXPECT_DOUBLE_EQ(ex.stats().bytes_sent, (30 * 2 + 20 * 2 + 5) * 4.0);
  });
}

TEST(Exchange, CodecStateResumesBitForBit) {
  // A checkpoint's codec state (PowerSGD: residual and Q) restored into a fresh exchange goes on exactly as the
  // original does; a name that is not codec state is refused naming the file.
  run_ranks(2, [](comm::Group& g) {
    const comm::ExchangeOptions options{.codec = "powersgd", .powersgd_rank = 2, .seed = 3};
    comm::Exchange original(g, options);
    auto gen = at::detail::createCPUGenerator(20 + g.rank());
    auto round = [&](comm::Exchange& ex, const torch::Tensor& x) {
      std::vector<torch::Tensor> t = {x.clone()};
      ex.average(t);
      return t[0];
    };
    for (int r = 0; r < 2; ++r) round(original, at::randn({16, 12}, gen, torch::kFloat32));
    const auto state = original.codec_state();
    ASSERT_EQ(state.size(), 2u);  // residual.0.0 and q.0.0
    comm::Exchange resumed(g, options);
    resumed.load_codec_state(state, "rank.codec.safetensors");
    const auto next = at::randn({16, 12}, gen, torch::kFloat32);
    EXPECT_TRUE(torch::equal(round(original, next), round(resumed, next)));
    std::string msg;
    try {
      resumed.load_codec_state({{"momentum.0.0", torch::zeros({2})}}, "rank.codec.safetensors");
    } catch (const Error& e) {
      msg = e.what();
    }
    EXPECT_NE(msg.find("'rank.codec.safetensors': 'momentum.0.0' is not an error-feedback tensor"), std::string::npos)
        << msg;
  });
}

TEST(Exchange, OwnerUpdateInsideTheRingSeesFullSumsAndReachesEveryRank) {
  // 3 ranks, uneven chunks; rank r's input is r + 1 everywhere, so every reduced value is 6. The owner of chunk c
  // (rank (c + 2) mod 3) replaces its sums by sum * 10 + owner; every rank must end with the same result, and the
  // bytes are an all-reduce's.
  run_ranks(3, [](comm::Group& g) {
    comm::Exchange ex(g, {.codec = "fp32"});
    auto flat = torch::full({10}, double(g.rank() + 1), torch::kFloat32);
    const std::vector<int64_t> begin{0, 2, 7, 10};
    int calls = 0;
    ex.reduce_update_gather(flat, begin, [&](torch::Tensor& chunk) {
      ++calls;
      EXPECT_TRUE(chunk.equal(torch::full({chunk.numel()}, 6.0f)));
      chunk.mul_(10).add_(g.rank());
    });
    EXPECT_EQ(calls, 1);
    auto expected = torch::empty({10});
    for (int c = 0; c < 3; ++c) expected.narrow(0, begin[c], begin[c + 1] - begin[c]).fill_(60.0 + double((c + 2) % 3));
    EXPECT_TRUE(flat.equal(expected)) << flat;
    auto stats = ex.take_stats();
    // Rank r sends chunks r and r-1 while reducing, r+1 (its own) and r while gathering: all 10 values + chunk r.
    EXPECT_DOUBLE_EQ(stats.bytes_sent, 4.0 * double(10 + begin[g.rank() + 1] - begin[g.rank()]));
  });
}
