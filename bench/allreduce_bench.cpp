// All-reduce through our layers vs raw c10d Gloo, 2 processes on loopback, 1-64 MB; the WAN emulation's achieved vs
// modelled time; and the outer exchange's collective per codec on one pseudo-gradient-sized vector (the default
// model's 3,279,360 values): fp32 ring all-reduce, fp4 quantised ring, SparseLoCo's all-gather of compact payloads —
// bytes sent, loopback time, and the modelled time on 100 Mbit/s, 100 ms links for 2 and 4 workers; and what a
// fault-tolerant round's abandon watch and the run's MAC on every message cost a codec's ring.
// Prints one JSON object per line. Measures only.
#include <sys/wait.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <fmt/format.h>
#include <chrono>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>

#include "tributary/comm/exchange.h"
#include "tributary/comm/group.h"
#include "tributary/launch/launcher.h"
#include "tributary/runtime/wan.h"

using namespace tributary;
using Clock = std::chrono::steady_clock;

template <typename F>
double best_of(int repeats, F&& f) {
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

// An int8 ring round on the same vector (the default model's size) without and with `variant` (`with(true)` sets it up
// before a round, `with(false)` takes it down); interleaved, best of 7 each. Rank 0 prints `name`'s line.
void int8_ring_pair(comm::Group& group, int rank, const std::string& name, comm::Exchange& plain_ex,
                    comm::Exchange& variant_ex, const std::function<void(bool)>& with) {
  const int64_t n = 3279360;
  torch::manual_seed(uint64_t(rank) + 1);
  const auto x = torch::randn({n});
  double plain = 1e30, variant = 1e30;
  for (int round = 0; round < 7; ++round)
    for (const bool on : {false, true}) {
      with(on);
      std::vector<torch::Tensor> v = {x.clone()};
      (on ? variant : plain) =
          std::min(on ? variant : plain, best_of(1, [&] { (on ? variant_ex : plain_ex).average(v); }));
    }
  with(false);
  if (rank != 0) return;
  std::printf("%s\n", nlohmann::json{{"bench", name + "_ring"},
                                     {"codec", "int8"},
                                     {"values", n},
                                     {"loopback_s_plain", plain},
                                     {"loopback_s_" + name, variant},
                                     {name + "_over_plain", variant / plain}}
                          .dump()
                          .c_str());
}

// The outer exchange's collectives on the same data (a Gaussian vector of the default model's size; the payload sizes
// do not depend on the values, the times hardly). Interleaved rounds, best of 5 each.
void sparse_vs_dense(comm::Group& group, int rank) {
  const int64_t n = 3279360;
  torch::manual_seed(uint64_t(rank) + 1);
  const auto x = torch::randn({n});
  const char* codecs[] = {"fp32", "fp4", "sparseloco"};
  double best[3] = {1e30, 1e30, 1e30}, sent[3] = {0, 0, 0};
  std::vector<std::unique_ptr<comm::Exchange>> ex;
  for (const char* c : codecs)
    ex.push_back(std::make_unique<comm::Exchange>(group, comm::ExchangeOptions{.codec = c, .bucket_mb = 64}));
  for (int round = 0; round < 5; ++round)
    for (size_t c = 0; c < 3; ++c) {
      std::vector<torch::Tensor> v = {x.clone()};
      best[c] = std::min(best[c], best_of(1, [&] { ex[c]->average(v); }));
      sent[c] = ex[c]->take_stats().bytes_sent;  // one exchange's
    }
  if (rank != 0) return;
  for (size_t c = 0; c < 3; ++c) {
    // What the same collective would take on the emulated links: a ring all-reduce of the encoded bytes, or an
    // all-gather of one payload per rank (sent = (N - 1) x payload on 2 ranks).
    const double encoded = c == 2 ? sent[c] : sent[c] / (2.0 * (2 - 1) / 2);
    nlohmann::json j{{"bench", "outer_collective"},
                     {"codec", codecs[c]},
                     {"values", n},
                     {"collective", c == 2 ? "all-gather of payloads" : "ring all-reduce"},
                     {"bytes_sent_2_workers", sent[c]},
                     {"loopback_s_2_workers", best[c]}};
    for (int workers : {2, 4}) {
      const auto link = comm::LinkModel::uniform(100e6 / 8, 0.1, workers);
      j[fmt::format("modelled_s_{}_workers_100Mbit_100ms", workers)] =
          c == 2 ? link.ring_allgather_s(encoded) : link.ring_allreduce_s(encoded);
      j[fmt::format("bytes_sent_{}_workers", workers)] =
          c == 2 ? (workers - 1) * encoded : 2.0 * (workers - 1) / workers * encoded;
    }
    std::printf("%s\n", j.dump().c_str());
  }
}

// A codec's ring (its hops are Gloo send/recv) with and without the abandon watch a fault-tolerant round sets
// (Group::set_abandon: each hop is waited for in a helper thread that asks, every slice, whether to give up), on the
// same vector; interleaved, best of 7 each. What the watch costs a round when nobody dies.
void watched_ring(comm::Group& group, int rank) {
  comm::Exchange exchange(group, comm::ExchangeOptions{.codec = "int8", .bucket_mb = 64});
  int8_ring_pair(group, rank, "watched", exchange, exchange, [&](bool watch) {
    group.set_abandon(watch ? std::function<bool()>([] { return false; }) : std::function<bool()>());
  });
}

// The int8 ring with and without the run's MAC on every hop (comm/wire_mac.h: an HMAC-SHA256 of each message, sealed
// by the sender, checked by the receiver), on the same vector; interleaved, best of 7 each. What the MACs cost a round.
void sealed_ring(comm::Group& group, int rank) {
  comm::RunKey key{};
  key.fill(7);
  comm::Exchange plain_ex(group, comm::ExchangeOptions{.codec = "int8", .bucket_mb = 64});
  comm::Exchange sealed_ex(group, comm::ExchangeOptions{.codec = "int8", .bucket_mb = 64, .mac_key = key});
  int8_ring_pair(group, rank, "sealed", plain_ex, sealed_ex, [](bool) {});
}

// What sealing and opening one message costs, by its size: a pipeline stage's activation of the default model is
// 1 MiB per micro-batch of 4 (4 x 256 tokens x 256 x fp32), a heal's state tens of MB. Best of 20, one thread.
void mac_per_message(int rank) {
  if (rank != 0) return;
  comm::RunKey key{};
  key.fill(7);
  const comm::WireMac mac(key);
  for (const int64_t bytes : {int64_t(1) << 16, int64_t(1) << 20, int64_t(16) << 20}) {
    const auto message = torch::randint(0, 256, {bytes}, torch::kUInt8);
    torch::Tensor sealed;
    const double seal_s = best_of(20, [&] { sealed = mac.seal(message, "pipe.0|0|1|0|0>1"); });
    const double open_s = best_of(20, [&] { mac.open(sealed, "pipe.0|0|1|0|0>1", "bench"); });
    std::printf("%s\n", nlohmann::json{{"bench", "mac_per_message"},
                                       {"bytes", bytes},
                                       {"seal_s", seal_s},
                                       {"open_s", open_s},
                                       {"gb_per_s", double(bytes) / open_s / 1e9}}
                            .dump()
                            .c_str());
  }
}

int worker(int rank, int port) {
  at::set_num_threads(1);
  auto store = comm::connect_store("127.0.0.1", port, rank, 2, false, "bench");
  auto opts = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(300));
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  opts->threads = 2;
  auto raw =
      c10::make_intrusive<c10d::ProcessGroupGloo>(c10::make_intrusive<c10d::PrefixStore>("raw", store), rank, 2, opts);
  comm::Group group(store, rank, 2);
  for (double mb : {1.0, 4.0, 16.0, 64.0}) {
    auto t = torch::ones({static_cast<int64_t>(mb * (1 << 20) / 4)});
    std::vector<torch::Tensor> v = {t};
    comm::Exchange ex(group, {.codec = "fp32", .bucket_mb = 64});
    std::vector<torch::Tensor> w = {t};
    // Interleaved rounds, best of each: the three paths see the same machine state.
    double raw_s = 1e30, group_s = 1e30, exchange_s = 1e30;
    for (int round = 0; round < 10; ++round) {
      raw_s = std::min(raw_s, best_of(1, [&] { raw->allreduce(v)->wait(); }));
      group_s = std::min(group_s, best_of(1, [&] { group.all_reduce_sum(v); }));
      exchange_s = std::min(exchange_s, best_of(1, [&] { ex.average(w); }));
    }
    if (rank == 0)
      std::printf("%s\n", nlohmann::json{{"bench", "allreduce"},
                                         {"mb", mb},
                                         {"raw_gloo_s", raw_s},
                                         {"group_s", group_s},
                                         {"exchange_s", exchange_s},
                                         {"group_vs_raw", group_s / raw_s},
                                         {"exchange_vs_raw", exchange_s / raw_s}}
                              .dump()
                              .c_str());
  }
  for (const char* wan : {"100Mbit,20ms", "10Mbit,100ms"}) {
    comm::Exchange ex(group, {.codec = "fp32", .link = wan_link_model(wan, group.size())});
    auto t = torch::ones({static_cast<int64_t>(1 << 18)});  // 1 MB
    std::vector<torch::Tensor> v = {t};
    auto t0 = Clock::now();
    ex.average(v);
    double achieved = std::chrono::duration<double>(Clock::now() - t0).count();
    if (rank == 0)
      std::printf("%s\n", nlohmann::json{{"bench", "wan"},
                                         {"link", wan},
                                         {"mb", 1},
                                         {"modelled_s", ex.stats().modelled_s},
                                         {"achieved_s", achieved}}
                              .dump()
                              .c_str());
  }
  sparse_vs_dense(group, rank);
  watched_ring(group, rank);
  sealed_ring(group, rank);
  mac_per_message(rank);
  group.barrier();
  return 0;
}

int main() {
  const int port = free_tcp_port();
  pid_t child = ::fork();
  if (child == 0) ::_exit(worker(1, port));
  int rc = worker(0, port);
  int status = 0;
  ::waitpid(child, &status, 0);
  return rc | (WIFEXITED(status) ? WEXITSTATUS(status) : 1);
}
