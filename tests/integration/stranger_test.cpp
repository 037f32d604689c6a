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

#include <algorithm>
#include <atomic>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "launch_support.h"
#include "test_paths.h"  // generated: TRIBUTARY_CLI, TRIBUTARY_SOURCE_DIR, ...
#include "tributary/core/fs.h"
#include "tributary/core/rng.h"
#include "tributary/launch/launcher.h"

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

// The TCP ports the processes whose command line names `marker` listen on (the run's workers and its launch: the
// store, Gloo's pairs), from /proc: what a stranger on the machine, or a port scan from outside, finds.
std::vector<int> listening_ports_of(const std::string& marker) {
  std::set<std::string> inodes;
  std::error_code ec;
  for (const auto& proc : fs::directory_iterator("/proc", ec)) {
    const std::string pid = proc.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmdline;
    try {
      cmdline = read_file(proc.path() / "cmdline");
    } catch (const std::exception&) {
      continue;
    }
    if (cmdline.find(marker) == std::string::npos) continue;
    for (const auto& fd : fs::directory_iterator(proc.path() / "fd", ec)) {
      const std::string target = fs::read_symlink(fd.path(), ec).string();
      if (target.rfind("socket:[", 0) == 0) inodes.insert(target.substr(8, target.size() - 9));
    }
  }
  std::vector<int> ports;
  std::istringstream table(read_file("/proc/net/tcp"));
  std::string line;
  std::getline(table, line);  // the header
  while (std::getline(table, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
    fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >> inode;
    if (state != "0A" || !inodes.count(inode)) continue;  // 0A: listening
    ports.push_back(std::stoi(local.substr(local.find(':') + 1), nullptr, 16));
  }
  return ports;
}

// Connects to every port the run listens on, over and over, and sends what it can: random bytes of random length, a
// first 8 bytes that look like a Gloo pair's handshake (a sequence number), or nothing (an idle connection held for a
// while).
struct PortStranger {
  std::atomic<bool> stop{false};
  std::atomic<int> connections{0};
  std::set<int> ports_seen;

  void run(const std::string& marker) {
    SplitMix64 rng(4646);
    std::vector<int> held;
    while (!stop) {
      for (int port : listening_ports_of(marker)) {
        ports_seen.insert(port);
        const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_port = htons(static_cast<uint16_t>(port));
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
          if (fd >= 0) ::close(fd);
          continue;
        }
        connections += 1;
        const uint64_t kind = rng.below(3);
        std::vector<uint8_t> bytes(kind == 1 ? 8 : size_t(1 + rng.below(4096)));
        for (auto& b : bytes) b = uint8_t(rng.below(256));
        if (kind != 2) (void)!::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
        if (kind == 2 && held.size() < 16) {
          held.push_back(fd);
        } else {
          ::close(fd);
        }
      }
      if (held.size() >= 16) {
        for (int fd : held) ::close(fd);
        held.clear();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    for (int fd : held) ::close(fd);
  }
};

}  // namespace

// The stranger of issue 46 on the data plane: while a DiLoCo run trains (int8 pseudo-gradients on our own ring, each
// message under the run's MAC), a process without the secret connects to every port the run listens on — the
// store's and every Gloo pair listener of every worker — and sends random bytes, handshake-shaped bytes or nothing.
// Nothing it sends may crash a worker, stop the run or change the model: the run ends as it does without it, bit for
// bit.
TEST_F(Distributed, AStrangerOnTheRunsGlooPortsCannotCrashItOrChangeTheModel) {
  const std::string cli = TRIBUTARY_CLI;
  const std::string args =
      "--set dist.algorithm=diloco --set train.steps=24 --set train.batch_size=4 --set dist.inner_steps=4 "
      "--set dist.compression=int8 --set dist.store_timeout_s=60 --set dist.collective_timeout_s=60 "
      "--set dist.slow_workers=0:3";
  auto run = [&](const std::string& name) {
    return sh(
        fmt::format("timeout -s KILL 240 {} launch --nproc 2 --master-port 0 --grace 2 --{}", cli, tiny(name, args)));
  };
  auto [rc0, out0] = run("gloo_ref");
  ASSERT_EQ(rc0, 0) << out0;
  PortStranger stranger;
  std::thread thread([&] { stranger.run("gloo_stranger"); });
  auto [rc, out] = run("gloo_stranger");
  stranger.stop = true;
  thread.join();
  ASSERT_EQ(rc, 0) << out;
  EXPECT_GE(stranger.ports_seen.size(), 3u) << "the stranger found the store and the workers' Gloo listeners";
  EXPECT_GT(stranger.connections.load(), 50) << "the stranger reached the run's ports while it trained";
  EXPECT_TRUE(torch::equal(test_support::flat_params(work() / "gloo_ref", 24),
                           test_support::flat_params(work() / "gloo_stranger", 24)))
      << "the stranger changed the model";
}

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

TEST_F(Distributed, AMachineWithAnotherSecretGetsOneClearLineAndTheHostSaysItRefusedIt) {
  // Two launches of one worker each, the second with another secret file. The second machine's console says, in a
  // few lines and without c10d's stack frames, that the run's store refused its secret; the first machine's (which
  // hosts the store) says it refused a client for a wrong proof, and its rank gives up at the rendezvous deadline
  // naming the secret as a cause.
  write_file(work() / "secret_a", "thirty-two bytes of the run secret!");
  write_file(work() / "secret_b", "thirty-two bytes of another secret!");
  const int port = free_tcp_port();
  auto node = [&](int n, const std::string& secret) {
    return fmt::format("{} launch --nnodes 2 --node-rank {} --nproc 1 --master-port {} --secret-file {} --{} > {} 2>&1",
                       TRIBUTARY_CLI, n, port, (work() / secret).string(),
                       tiny("wrong_secret", "--set train.steps=4 --set dist.store_timeout_s=6"),
                       (work() / fmt::format("wrong_secret.{}.log", n)).string());
  };
  sh("bash -c '" + node(0, "secret_a") + " & n0=$!; sleep 1; " + node(1, "secret_b") + "; wait $n0'");
  const std::string host = read_file(work() / "wrong_secret.0.log");
  const std::string other = read_file(work() / "wrong_secret.1.log");
  EXPECT_NE(other.find("the run's store refused this process's run secret"), std::string::npos) << other;
  EXPECT_EQ(other.find("frame #"), std::string::npos) << "no stack frames: " << other;
  EXPECT_LT(std::count(other.begin(), other.end(), '\n'), 12) << other;
  size_t said = 0;
  for (size_t at = other.find("refused this process's run secret"); at != std::string::npos;
       at = other.find("refused this process's run secret", at + 1))
    said += 1;
  EXPECT_EQ(said, 1u) << "the refusal is said once, by the worker; its launch does not repeat it: " << other;
  EXPECT_NE(host.find("the run's store refused a client"), std::string::npos) << host;
  EXPECT_NE(host.find("a wrong proof of the run's secret"), std::string::npos) << host;
  EXPECT_NE(host.find("give every machine the same --secret-file"), std::string::npos) << host;
  EXPECT_FALSE(fs::exists(work() / "wrong_secret" / "checkpoints"));
}
