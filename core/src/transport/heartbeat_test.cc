// Heartbeats and the read deadline of a tree edge: a watched writer that is given nothing sends
// heartbeats that keep a reader with an idle timeout alive; a peer that sends nothing (and does
// not close) makes Read fail, naming the silence; a peer that takes nothing makes Write fail.
#include "transport/heartbeat.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

namespace dcr::internal {
namespace {

struct Pair {
  int fds[2] = {-1, -1};
  Pair() { EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0); }
  ~Pair() {
    for (int fd : fds) {
      if (fd >= 0) close(fd);
    }
  }
};

TEST(Liveness, ChecksTheIntervalAndTheDeadline) {
  EXPECT_TRUE(CheckLiveness(LivenessOptions{}, "plan").ok());
  EXPECT_TRUE(CheckLiveness(LivenessOptions{0.5, 1.0}, "plan").ok());
  Status s = CheckLiveness(LivenessOptions{0, 10}, "plan");
  EXPECT_TRUE(s.IsInvalidArgument());
  EXPECT_NE(s.message().find("plan: the heartbeat interval must be > 0"), std::string::npos);
  s = CheckLiveness(LivenessOptions{1.0, 1.5}, "plan");
  EXPECT_TRUE(s.IsInvalidArgument());
  EXPECT_NE(s.message().find("at least twice the heartbeat interval"), std::string::npos) << s;
}

TEST(ReadDeadline, ASilentPeerFailsTheReadNamingTheSilence) {
  Pair p;
  Conn reader(p.fds[1], /*owns=*/false);
  reader.SetIdleTimeout(0.2);
  FrameHeader h;
  Status s = reader.Read(&h, sizeof(h));  // the other end stays open and sends nothing
  EXPECT_TRUE(s.IsUnavailable()) << s;
  EXPECT_EQ(s.message(), "no bytes from the peer for 0.2 s (read deadline)");
}

TEST(ReadDeadline, APeerThatTakesNothingFailsTheWrite) {
  Pair p;
  Conn writer(p.fds[0], /*owns=*/false);
  writer.SetIdleTimeout(0.2);
  std::vector<uint8_t> big(64 << 20);  // more than the socket buffers hold
  Status s = writer.Write(big.data(), big.size());
  EXPECT_TRUE(s.IsUnavailable()) << s;
  EXPECT_EQ(s.message(), "the peer took no bytes for 0.2 s (read deadline)");
}

TEST(ReadDeadline, AByteAtATimeKeepsTheReadAlive) {
  Pair p;
  Conn reader(p.fds[1], /*owns=*/false);
  reader.SetIdleTimeout(0.3);
  std::thread dribble([&] {
    for (int i = 0; i < 8; ++i) {
      usleep(100000);
      const uint8_t b = static_cast<uint8_t>(i);
      ASSERT_TRUE(WriteFull(p.fds[0], &b, 1).ok());
    }
  });
  uint8_t got[8];
  Status s = reader.Read(got, sizeof(got));  // 0.8 s in all, never 0.3 s without a byte
  dribble.join();
  ASSERT_TRUE(s.ok()) << s;
  for (int i = 0; i < 8; ++i) EXPECT_EQ(got[i], i);
}

TEST(Heartbeats, AnIdleWriterKeepsItsReaderAlive) {
  Pair p;
  Conn out(p.fds[0], /*owns=*/false);
  FrameWriter w(&out, nullptr, 0.0);
  std::atomic<int> accepted{0};
  Heartbeats beats(0.05);
  FrameHeader tmpl;
  tmpl.from_rank = 3;
  tmpl.stream = 2;
  tmpl.run = 0xabc;
  tmpl.version = 7;
  beats.Add(&w, tmpl, [&](Status s) {
    EXPECT_TRUE(s.ok()) << s;
    ++accepted;
  });
  beats.Start();
  Conn in(p.fds[1], /*owns=*/false);
  in.SetIdleTimeout(0.5);
  for (int i = 0; i < 10; ++i) {  // ~0.5 s of heartbeats: the deadline never passes
    FrameHeader h;
    Status s = in.Read(&h, sizeof(h));
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(h.magic, kFrameMagic);
    EXPECT_EQ(h.type, static_cast<uint8_t>(FrameType::kHeartbeat));
    EXPECT_EQ(h.protocol, kWireProtocol);
    EXPECT_EQ(h.from_rank, 3u);
    EXPECT_EQ(h.stream, 2u);
    EXPECT_EQ(h.run, 0xabcu);
    EXPECT_EQ(h.version, 7u);
    EXPECT_EQ(h.length, 0u);
  }
  beats.Stop();
  const uint64_t sent = beats.sent();
  EXPECT_GE(sent, 10u);
  w.Close();
  EXPECT_EQ(static_cast<uint64_t>(accepted.load()), sent);
  // Stopped: no heartbeat follows, and the reader's deadline passes.
  FrameHeader h;
  Status s;
  do {
    s = in.Read(&h, sizeof(h));
  } while (s.ok());
  EXPECT_NE(s.message().find("read deadline"), std::string::npos) << s;
}

TEST(Heartbeats, ABusyWriterSendsNone) {
  Pair p;
  Conn out(p.fds[0], /*owns=*/false);
  FrameWriter w(&out, nullptr, 0.0);
  Heartbeats beats(0.2);
  beats.Add(&w, FrameHeader{});
  beats.Start();
  // A frame every 20 ms for 0.6 s: the writer is never idle for the interval.
  std::thread reader([&] {
    Conn in(p.fds[1], /*owns=*/false);
    for (int i = 0; i < 30; ++i) {
      FrameHeader h;
      ASSERT_TRUE(in.Read(&h, sizeof(h)).ok());
      EXPECT_EQ(h.type, static_cast<uint8_t>(FrameType::kAck));
    }
  });
  for (int i = 0; i < 30; ++i) {
    FrameHeader h;
    h.type = static_cast<uint8_t>(FrameType::kAck);
    w.Send(h, nullptr, nullptr, nullptr);
    usleep(20000);
  }
  reader.join();
  beats.Stop();
  EXPECT_EQ(beats.sent(), 0u);
}

}  // namespace
}  // namespace dcr::internal
