#include "transport/net.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <set>

#include <gtest/gtest.h>

namespace dcr {
namespace {

int EphemeralLowForTest() {
  int low = 32768, high = 60999;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d %d", &low, &high) != 2) low = 32768;
    std::fclose(f);
  }
  return low;
}

// The port FreePort names must be listenable, and outside the range the kernel draws outgoing
// connections' source ports from (where another process could take it before the node listens).
TEST(FreePort, BelowTheEphemeralRangeAndListenable) {
  const int low = EphemeralLowForTest();
  std::set<int> seen;
  for (int i = 0; i < 32; ++i) {
    auto port = internal::FreePort();
    ASSERT_TRUE(port.ok()) << port.status();
    if (low - 10000 >= 1024) {
      EXPECT_GE(*port, 10000);
      EXPECT_LT(*port, low);
    }
    seen.insert(*port);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(*port));
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << "port " << *port;
    EXPECT_EQ(listen(fd, 1), 0);
    close(fd);
  }
  // Drawn at random: 32 draws from thousands of ports are not all one port.
  EXPECT_GT(seen.size(), 1u);
}

}  // namespace
}  // namespace dcr
