// The run's store server (comm::Store::host) under a client that stops in the middle of a request.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>

#include "tributary/comm/store.h"
#include "tributary/runtime/launcher.h"

using namespace tributary;

TEST(StoreHost, AClientStalledInTheMiddleOfARequestDoesNotHoldTheOthers) {
  // The first byte of a request, then nothing (a cut link; a process frozen between two sends). c10d's server then
  // waits in a blocking read, and every other client's request with it: a cut-link test hung that way. With the
  // stall limit the server drops the stalled client and serves the others.
  const int port = free_tcp_port();
  auto host = comm::Store::host(port, std::chrono::seconds(5), std::chrono::milliseconds(500));
  const int stalled = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{.sin_family = AF_INET, .sin_port = htons(static_cast<uint16_t>(port)),
                      .sin_addr = {htonl(INADDR_LOOPBACK)}, .sin_zero = {}};
  ASSERT_EQ(::connect(stalled, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  const char first = 0;
  ASSERT_EQ(::send(stalled, &first, 1, 0), 1);
  auto client = comm::Store::connect("127.0.0.1", port, 0, 1, /*server_exists=*/true, "t", std::chrono::seconds(5));
  const auto start = std::chrono::steady_clock::now();
  client.set("key", "value");
  EXPECT_EQ(client.get("key"), "value");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(4));
  // The stalled client's connection was closed by the server.
  const timeval wait{.tv_sec = 3, .tv_usec = 0};
  ::setsockopt(stalled, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof(wait));
  char byte = 0;
  EXPECT_EQ(::recv(stalled, &byte, 1, 0), 0) << "the server should have closed the stalled connection";
  ::close(stalled);
}
