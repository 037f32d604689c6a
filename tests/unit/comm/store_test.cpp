// The run's store server (comm::Store::host) under a client that stops in the middle of a request.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>

#include "tributary/comm/store.h"
#include "tributary/launch/launcher.h"

using namespace tributary;

TEST(StoreHost, AClientStalledInTheMiddleOfARequestDoesNotHoldTheOthers) {
  // The first byte of a request, then nothing (a cut link; a process frozen between two sends). A server that read a
  // request with blocking reads would wait there, and every other client's request with it: a cut-link test hung
  // that way on LibTorch 1.13. The server (comm/store_server.h) reads each client without blocking.
  const int port = free_tcp_port();
  auto host = comm::Store::host(port, std::chrono::seconds(5));
  const int stalled = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{.sin_family = AF_INET,
                      .sin_port = htons(static_cast<uint16_t>(port)),
                      .sin_addr = {htonl(INADDR_LOOPBACK)},
                      .sin_zero = {}};
  ASSERT_EQ(::connect(stalled, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  const char first = 0;
  ASSERT_EQ(::send(stalled, &first, 1, 0), 1);
  auto client = comm::Store::connect("127.0.0.1", port, 0, 1, /*server_exists=*/true, "t", std::chrono::seconds(5));
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) {
    client.set("key" + std::to_string(i), "value");
    EXPECT_EQ(client.get("key" + std::to_string(i)), "value");
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  // The stalled client goes away mid-request; the server serves on.
  ::close(stalled);
  client.set("after", "close");
  EXPECT_EQ(client.get("after"), "close");
}

TEST(StoreHost, AHostTakesEveryFileDescriptorItMay) {
  // Issue 46, item 2: ~1,100 idle connections ran a host with the usual soft limit of 1,024 files out of them, and
  // the store's host aborted. The host raises its soft limit to the hard one.
  rlimit before{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &before), 0);
  if (before.rlim_max <= 256) GTEST_SKIP() << "the hard limit leaves nothing to raise";
  rlimit lowered = before;
  lowered.rlim_cur = 256;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &lowered), 0);
  { auto host = comm::Store::host(free_tcp_port(), std::chrono::seconds(5)); }
  rlimit after{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &after), 0);
  EXPECT_EQ(after.rlim_cur, before.rlim_max);
  ::setrlimit(RLIMIT_NOFILE, &before);
}
