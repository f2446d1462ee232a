#include "transport/net.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <set>

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

// A plan draws every node's port before any node listens: the ports of one process never
// repeat, although each is free again as soon as it was checked (the birthday bound makes a
// repeat among 3,000 random draws from ~22,000 ports all but certain without the memory).
TEST(FreePort, NeverRepeatsAPortItHandedOut) {
  std::set<int> seen;
  for (int i = 0; i < 3000; ++i) {
    auto port = internal::FreePort();
    ASSERT_TRUE(port.ok()) << port.status();
    EXPECT_TRUE(seen.insert(*port).second) << "port " << *port << " handed out twice";
  }
}

// The header's bytes are the wire layout of transports.md (little-endian, no padding), the
// protocol, run and version in every frame.
TEST(FrameHeader, WireLayoutOfSixtyFourBytes) {
  internal::FrameHeader h;
  h.type = 2;
  h.blob_kind = 1;
  h.from_rank = 0x01020304;
  h.stream = 0x05060708;
  h.run = 0x1112131415161718;
  h.version = 0x2122232425262728;
  h.blob = 0x3132333435363738;
  h.blob_size = 0x4142434445464748;
  h.offset = 0x5152535455565758;
  h.length = 0x6162636465666768;
  ASSERT_EQ(sizeof(h), 64u);
  uint8_t b[64];
  std::memcpy(b, &h, sizeof(b));
  const uint8_t want[64] = {'D',  'C',  'R',  'F',  2,    1,    internal::kWireProtocol,
                            0,    0x04, 0x03, 0x02, 0x01, 0x08, 0x07,
                            0x06, 0x05, 0x18, 0x17, 0x16, 0x15, 0x14,
                            0x13, 0x12, 0x11, 0x28, 0x27, 0x26, 0x25,
                            0x24, 0x23, 0x22, 0x21, 0x38, 0x37, 0x36,
                            0x35, 0x34, 0x33, 0x32, 0x31, 0x48, 0x47,
                            0x46, 0x45, 0x44, 0x43, 0x42, 0x41, 0x58,
                            0x57, 0x56, 0x55, 0x54, 0x53, 0x52, 0x51,
                            0x68, 0x67, 0x66, 0x65, 0x64, 0x63, 0x62,
                            0x61};
  for (int i = 0; i < 64; ++i) EXPECT_EQ(b[i], want[i]) << "byte " << i;
  EXPECT_EQ(internal::kWireProtocol, 2);
}

TEST(WireMismatch, NamesTheProtocolRunOrVersionThatDiffers) {
  internal::FrameHeader h;
  h.from_rank = 3;
  h.run = 0xabc;
  h.version = 4;
  EXPECT_EQ(internal::WireMismatch(h, 0xabc, 4), "");
  h.protocol = internal::kWireProtocol + 1;
  EXPECT_EQ(internal::WireMismatch(h, 0xabc, 4),
            "peer rank 3 speaks dcr wire protocol " + std::to_string(internal::kWireProtocol + 1) +
                ", this node " + std::to_string(internal::kWireProtocol));
  h.protocol = internal::kWireProtocol;
  EXPECT_EQ(internal::WireMismatch(h, 0xdef, 4),
            "peer rank 3 is of run 0x0000000000000abc, this node's run 0x0000000000000def");
  EXPECT_EQ(internal::WireMismatch(h, 0xabc, 5),
            "peer rank 3 sends version 4, this node waits for version 5");
}

}  // namespace
}  // namespace dcr
