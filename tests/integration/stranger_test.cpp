// A stranger on the network (issue 46, item 1): a process without the run's secret connects to the run's store while
// a fault-tolerant run trains, over and over, and tries what a hostile peer would — read the configuration, send the
// death reports that evicted a live worker before, a forged exit report and keys of its own. The store serves only
// connections that prove the secret (comm/store_server.h), so every attempt is refused at its first request and the
// host logs it; the run ends as it does without the stranger: the same members, the same model bit for bit. (Raw
// bytes and floods: StoreServer.* tests.)
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <atomic>
#include <nlohmann/json.hpp>
#include <thread>

#include "launch_support.h"
#include "test_paths.h"  // generated: TRIBUTARY_CLI, TRIBUTARY_SOURCE_DIR, ...
#include "tributary/core/fs.h"
#include "tributary/core/rng.h"
#include "tributary/runtime/launcher.h"

using namespace tributary;

using test_support::Distributed;
using test_support::sh;
using test_support::tiny;
using test_support::work;

namespace {

bool port_open(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool open = fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  if (fd >= 0) ::close(fd);
  return open;
}

struct Stranger {
  std::atomic<bool> stop{false};
  std::atomic<int> reads{0}, writes{0}, refused{0};
  std::string config_seen;

  void run(int port) {
    SplitMix64 rng(46);
    std::optional<c10d::TCPStore> store;
    while (!stop) {
      try {
        if (!store) {
          if (!port_open(port)) {  // c10d's client logs every refused connection: wait for the store quietly
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            continue;
          }
          c10d::TCPStoreOptions opts;
          opts.port = static_cast<uint16_t>(port);
          opts.isServer = false;
          opts.waitWorkers = false;
          opts.timeout = std::chrono::milliseconds(2000);
          store.emplace("127.0.0.1", opts);
        }
        if (config_seen.empty() && store->check({"/tributary/config/0"})) {
          const auto value = store->get("/tributary/config/0");
          config_seen.assign(value.begin(), value.end());
          reads += 1;
        }
        // The eviction of issue 46: what launch writes when a worker dies, for the live rank 1.
        store->add("/tributary/ft/lost/1", 1);
        store->add("/tributary/ft/lost", 1);
        store->add("/tributary/ft/exits", 1);
        store->set("/tributary/ft/exit/0", std::vector<uint8_t>{'r', 'a', 'n', 'k', ' ', '1', ' ', 'd', 'i', 'e', 'd'});
        store->set(fmt::format("/tributary/stranger/{}", rng.below(1000)), std::vector<uint8_t>(16, 0x41));
        writes += 5;
      } catch (const std::exception&) {  // the server closes a connection whose request it refuses
        refused += 1;
        store.reset();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
};

}  // namespace

TEST_F(Distributed, AStrangerWithoutTheSecretCannotReadTheRunOrChangeIt) {
  const std::string cli = TRIBUTARY_CLI;
  const std::string args =
      "--set dist.algorithm=diloco --set train.steps=40 --set train.batch_size=4 --set dist.inner_steps=10 "
      "--set dist.fault_tolerant=true --set dist.heartbeat_timeout_s=6 --set dist.slow_workers=0:3";
  auto run = [&](const std::string& name, int port) {
    return sh(fmt::format("timeout -s KILL 240 {} launch --nproc 2 --master-port {} --grace 2 --max-failures 1 --{}",
                          cli, port, tiny(name, args)));
  };
  auto [rc0, out0] = run("stranger_ref", free_tcp_port());
  ASSERT_EQ(rc0, 0) << out0;

  const int port = free_tcp_port();
  Stranger stranger;
  std::thread thread([&] { stranger.run(port); });
  auto [rc, out] = run("stranger_run", port);
  stranger.stop = true;
  thread.join();
  ASSERT_EQ(rc, 0) << out;
  EXPECT_GT(stranger.refused.load(), 20) << "the stranger reached the store while the run trained";
  EXPECT_EQ(stranger.writes.load(), 0) << "a stranger's request was served";
  EXPECT_TRUE(stranger.config_seen.empty()) << "the stranger read the configuration's key";
  EXPECT_NE(out.find("refused a client"), std::string::npos) << "the host logged the stranger\n" << out;
  EXPECT_EQ(out.find("tolerated"), std::string::npos) << "a worker was counted as lost\n" << out;
  const auto summary = nlohmann::json::parse(read_file(work() / "stranger_run" / "summary.json"));
  EXPECT_EQ(summary["world_size"].get<int>(), 2) << out;
  EXPECT_EQ(summary["reformations"].get<int>(), 0) << out;
  const auto a = test_support::flat_params(work() / "stranger_ref", 40);
  const auto b = test_support::flat_params(work() / "stranger_run", 40);
  EXPECT_TRUE(torch::equal(a, b)) << "the stranger changed the model";
}
