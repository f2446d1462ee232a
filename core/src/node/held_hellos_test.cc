// The per-version start barrier: AcceptHellos hands a later version's hello to `hold` instead of
// dropping it, HeldHellos keeps it for its node and version, and the kept connection still
// carries what the parent sent meanwhile.
#include "node/held_hellos.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>

#include "transport/net.h"

namespace dcr::internal {
namespace {

constexpr uint64_t kRun = 0x1234;

FrameHeader HelloOf(uint64_t version, int from, uint32_t stream = 0, uint64_t streams = 1) {
  FrameHeader h;
  h.type = static_cast<uint8_t>(FrameType::kHello);
  h.from_rank = static_cast<uint32_t>(from);
  h.run = kRun;
  h.version = version;
  h.stream = stream;
  h.blob = streams;
  return h;
}

// A listening socket on a free loopback port.
void ListenOnFreePort(std::string* address, int* fd) {
  auto port = FreePort();
  ASSERT_TRUE(port.ok()) << port.status().ToString();
  *address = "127.0.0.1:" + std::to_string(*port);
  auto listen_fd = Listen(*address);
  ASSERT_TRUE(listen_fd.ok()) << listen_fd.status().ToString();
  *fd = *listen_fd;
}

TEST(HeldHellos, IsLaterOnlyForTheParentsLaterVersionOfThisRun) {
  EXPECT_TRUE(HeldHellos::IsLater(HelloOf(3, 1), nullptr, kRun, 2, 1, 1));
  EXPECT_TRUE(HeldHellos::IsLater(HelloOf(5, 1, 1, 2), nullptr, kRun, 2, 1, 2));
  EXPECT_FALSE(HeldHellos::IsLater(HelloOf(2, 1), nullptr, kRun, 2, 1, 1));        // this version
  EXPECT_FALSE(HeldHellos::IsLater(HelloOf(1, 1), nullptr, kRun, 2, 1, 1));        // an earlier one
  EXPECT_FALSE(HeldHellos::IsLater(HelloOf(3, 4), nullptr, kRun, 2, 1, 1));        // not the parent
  EXPECT_FALSE(HeldHellos::IsLater(HelloOf(3, 1, 1, 1), nullptr, kRun, 2, 1, 1));  // stream
  EXPECT_FALSE(HeldHellos::IsLater(HelloOf(3, 1, 0, 2), nullptr, kRun, 2, 1, 1));  // count
  FrameHeader other_run = HelloOf(3, 1);
  other_run.run = kRun + 1;
  EXPECT_FALSE(HeldHellos::IsLater(other_run, nullptr, kRun, 2, 1, 1));
  FrameHeader other_protocol = HelloOf(3, 1);
  other_protocol.protocol = kWireProtocol + 1;
  EXPECT_FALSE(HeldHellos::IsLater(other_protocol, nullptr, kRun, 2, 1, 1));
  FrameHeader piece = HelloOf(3, 1);
  piece.type = static_cast<uint8_t>(FrameType::kPiece);
  EXPECT_FALSE(HeldHellos::IsLater(piece, nullptr, kRun, 2, 1, 1));
  TlsIdentity peer;
  peer.rank = 1;
  EXPECT_TRUE(HeldHellos::IsLater(HelloOf(3, 1), &peer, kRun, 2, 1, 1));
  peer.rank = 4;  // a certificate of another rank claiming the parent's
  EXPECT_FALSE(HeldHellos::IsLater(HelloOf(3, 1), &peer, kRun, 2, 1, 1));
}

// A child waiting for version 2 gets its parent's version-3 hello first, then version 2's: the
// wait takes version 2's, `hold` keeps version 3's, and version 3's wait finds it kept with the
// bytes the parent wrote after it.
TEST(HeldHellos, ALaterVersionsConnectionIsKeptNotDropped) {
  std::string address;
  int listen_fd = -1;
  ASSERT_NO_FATAL_FAILURE(ListenOnFreePort(&address, &listen_fd));
  HeldHellos& held = HeldHellos::Process();
  const int me = 7;  // a rank no other test of this binary keeps for
  StatusOr<std::vector<Hello>> hellos = UnavailableError("not run");
  std::vector<std::string> refusals;
  std::thread child([&] {
    hellos = AcceptHellos(
        listen_fd, 1, SteadyNow() + 20, 5, nullptr,
        [](const FrameHeader& h, const TlsIdentity*) { return h.version == 2 && h.from_rank == 1; },
        [&](const std::string& why) { refusals.push_back(why); }, nullptr,
        [&](Hello* h) {
          if (!HeldHellos::IsLater(h->header, nullptr, kRun, 2, 1, 1)) return false;
          held.Keep(me, h);
          return true;
        });
  });
  auto later = Connect(address, SteadyNow() + 20);
  ASSERT_TRUE(later.ok()) << later.status().ToString();
  const FrameHeader h3 = HelloOf(3, 1);
  ASSERT_TRUE(WriteFull(*later, &h3, sizeof(h3)).ok());
  // Version 2's connection only once version 3's is kept, so the order is the one described.
  for (int i = 0; i < 2000 && !held.MovedOn(me, kRun, 2); ++i) usleep(5000);
  ASSERT_TRUE(held.MovedOn(me, kRun, 2));
  EXPECT_FALSE(held.MovedOn(me, kRun, 3));
  EXPECT_FALSE(held.MovedOn(me + 1, kRun, 2));  // kept for rank `me` only
  auto now = Connect(address, SteadyNow() + 20);
  ASSERT_TRUE(now.ok()) << now.status().ToString();
  const FrameHeader h2 = HelloOf(2, 1);
  ASSERT_TRUE(WriteFull(*now, &h2, sizeof(h2)).ok());
  child.join();
  close(listen_fd);
  ASSERT_TRUE(hellos.ok()) << hellos.status().ToString();
  ASSERT_EQ(hellos->size(), 1u);
  EXPECT_EQ((*hellos)[0].header.version, 2u);
  EXPECT_TRUE(refusals.empty());
  // The parent goes on writing on version 3's connection while the child is in version 2.
  const char payload[] = "version three";
  ASSERT_TRUE(WriteFull(*later, payload, sizeof(payload)).ok());
  EXPECT_TRUE(held.Take(me + 1, kRun, 3).empty());
  EXPECT_TRUE(held.Take(me, kRun + 1, 3).empty());
  std::vector<Hello> kept = held.Take(me, kRun, 3);
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_EQ(kept[0].header.version, 3u);
  EXPECT_FALSE(held.MovedOn(me, kRun, 2));
  char got[sizeof(payload)] = {};
  ASSERT_TRUE(kept[0].conn->Read(got, sizeof(got)).ok());
  EXPECT_STREQ(got, payload);
  close(*later);
  close(*now);
}

// A restarted node's listener stops when its version ends, just as its parent may connect for
// the next version. The connection already made (here waiting to be accepted, its hello late)
// is still read and kept, not closed unread: its parent would count this node lost for the next
// version while the node waits for it there.
TEST(HeldHellos, AStoppingListenerFinishesTheConnectionsAlreadyMade) {
  std::string address;
  int listen_fd = -1;
  ASSERT_NO_FATAL_FAILURE(ListenOnFreePort(&address, &listen_fd));
  HeldHellos& held = HeldHellos::Process();
  const int me = 9;
  auto later = Connect(address, SteadyNow() + 20);
  ASSERT_TRUE(later.ok()) << later.status().ToString();
  std::thread parent([&] {
    usleep(800000);  // past the listener's first two looks at give_up
    const FrameHeader h3 = HelloOf(3, 1);
    (void)WriteFull(*later, &h3, sizeof(h3));
  });
  const double t0 = SteadyNow();
  auto hellos = AcceptHellos(
      listen_fd, 1, SteadyNow() + 20, 5, nullptr,
      [](const FrameHeader&, const TlsIdentity*) { return false; }, nullptr,
      [] { return true; },  // stopping from the start
      [&](Hello* h) {
        if (!HeldHellos::IsLater(h->header, nullptr, kRun, 2, 1, 1)) return false;
        held.Keep(me, h);
        return true;
      });
  parent.join();
  EXPECT_EQ(hellos.status().code(), StatusCode::kAborted) << hellos.status().ToString();
  EXPECT_GE(SteadyNow() - t0, 0.7);
  EXPECT_TRUE(held.MovedOn(me, kRun, 2));
  std::vector<Hello> kept = held.Take(me, kRun, 3);
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_EQ(kept[0].header.version, 3u);
  // With nothing waiting, a stopping listener ends at once.
  const double t1 = SteadyNow();
  hellos = AcceptHellos(
      listen_fd, 1, SteadyNow() + 20, 5, nullptr,
      [](const FrameHeader&, const TlsIdentity*) { return false; }, nullptr, [] { return true; },
      nullptr);
  EXPECT_EQ(hellos.status().code(), StatusCode::kAborted);
  EXPECT_LT(SteadyNow() - t1, 0.5);
  close(listen_fd);
  close(*later);
}

// A restarted node's listener is kept from its version to the next instead of closed. A parent
// that connects for the next version after the listener's last accept, before the next version's
// wait starts, is accepted by that wait with what it wrote; on a closed listener its connection
// would have been reset.
TEST(HeldHellos, AKeptListenerHoldsConnectionsForTheNextVersionsWait) {
  std::string address;
  int listen_fd = -1;
  ASSERT_NO_FATAL_FAILURE(ListenOnFreePort(&address, &listen_fd));
  HeldHellos& held = HeldHellos::Process();
  const int me = 10;
  auto stopped = AcceptHellos(
      listen_fd, 1, SteadyNow() + 20, 5, nullptr,
      [](const FrameHeader&, const TlsIdentity*) { return false; }, nullptr, [] { return true; },
      nullptr);
  ASSERT_EQ(stopped.status().code(), StatusCode::kAborted);
  held.KeepListener(me, address, listen_fd);
  EXPECT_EQ(held.TakeListener(me + 1, address), -1);  // kept for rank `me` only
  EXPECT_EQ(held.TakeListener(me, "127.0.0.1:1"), -1);
  auto next = Connect(address, SteadyNow() + 20);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  const FrameHeader h3 = HelloOf(3, 1);
  ASSERT_TRUE(WriteFull(*next, &h3, sizeof(h3)).ok());
  const int fd = held.TakeListener(me, address);
  ASSERT_EQ(fd, listen_fd);
  EXPECT_EQ(held.TakeListener(me, address), -1);  // taken
  auto hellos = AcceptHellos(
      fd, 1, SteadyNow() + 20, 5, nullptr,
      [](const FrameHeader& h, const TlsIdentity*) { return h.version == 3 && h.from_rank == 1; },
      nullptr, nullptr, nullptr);
  ASSERT_TRUE(hellos.ok()) << hellos.status().ToString();
  ASSERT_EQ(hellos->size(), 1u);
  EXPECT_EQ((*hellos)[0].header.version, 3u);
  // Keeping a second listener for the same rank and address closes the first.
  auto other = Listen("127.0.0.1:0");
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  held.KeepListener(me, address, fd);
  held.KeepListener(me, address, *other);
  EXPECT_EQ(fcntl(fd, F_GETFD), -1);  // closed
  EXPECT_EQ(held.TakeListener(me, address), *other);
  close(*other);
  close(*next);
}

// Taking a version closes what was kept for the versions before it; the bound closes the oldest.
TEST(HeldHellos, PassedVersionsAndTheBoundCloseConnections) {
  HeldHellos& held = HeldHellos::Process();
  const int me = 8;
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  Hello h{std::make_unique<Conn>(fds[0]), HelloOf(4, 1)};
  held.Keep(me, &h);
  EXPECT_EQ(h.conn, nullptr);
  EXPECT_TRUE(held.Take(me, kRun, 5).empty());  // version 4 has passed: closed
  char c;
  EXPECT_EQ(read(fds[1], &c, 1), 0);  // the peer sees the close
  close(fds[1]);
  ASSERT_EQ(held.size(), 0u);
  for (size_t i = 0; i < HeldHellos::kMaxHeld + 3; ++i) {
    int p[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, p), 0);
    close(p[1]);
    Hello k{std::make_unique<Conn>(p[0]), HelloOf(10 + i, 1)};
    held.Keep(me, &k);
  }
  EXPECT_EQ(held.size(), HeldHellos::kMaxHeld);
  EXPECT_TRUE(held.Take(me, kRun, 10).empty());  // among the oldest: closed by the bound
  EXPECT_EQ(held.Take(me, kRun, 10 + HeldHellos::kMaxHeld + 2).size(), 1u);
  EXPECT_EQ(held.size(), 0u);  // every one below was of a passed version
}

}  // namespace
}  // namespace dcr::internal
