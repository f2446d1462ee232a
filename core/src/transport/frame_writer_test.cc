// FrameWriter: a frame is accepted when it enters the delay line (the emulated link), before its
// bytes are written, and the delay line holds at most the window. TokenBucket: the emulated link
// keeps its own clock, so callers that run late do not slow it.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "transport/net.h"

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

FrameHeader Piece(uint64_t blob, uint64_t length) {
  FrameHeader h;
  h.type = static_cast<uint8_t>(FrameType::kPiece);
  h.blob = blob;
  h.blob_size = length;
  h.length = length;
  return h;
}

TEST(FrameWriter, AcceptsBeforeTheLatencyAndKeepsThePayloadUntilWritten) {
  Pair p;
  const double latency = 0.5;
  FrameWriter w(p.fds[0], nullptr, latency, 0);
  auto payload = std::make_shared<std::vector<uint8_t>>(1000);
  for (size_t i = 0; i < payload->size(); ++i) (*payload)[i] = static_cast<uint8_t>(i * 7);
  const std::vector<uint8_t> expect = *payload;
  const double t0 = SteadyNow();
  std::atomic<double> accepted_at{-1};
  w.Send(Piece(3, 1000), payload->data(), payload, [&](Status s) {
    EXPECT_TRUE(s.ok()) << s.ToString();
    accepted_at = SteadyNow();
  });
  payload.reset();  // the writer holds the bytes now
  FrameHeader h;
  ASSERT_TRUE(ReadFull(p.fds[1], &h, sizeof(h)).ok());
  std::vector<uint8_t> got(h.length);
  ASSERT_TRUE(ReadFull(p.fds[1], got.data(), got.size()).ok());
  const double read_at = SteadyNow();
  EXPECT_EQ(h.blob, 3u);
  EXPECT_EQ(got, expect);
  ASSERT_GE(accepted_at.load(), 0) << "accepted only after the bytes arrived";
  EXPECT_LT(accepted_at.load() - t0, 0.8 * latency);
  EXPECT_GE(read_at - t0, latency);
}

TEST(FrameWriter, DelayLineHoldsAtMostTheWindow) {
  Pair p;
  const double latency = 0.3;
  const uint64_t piece = 60 << 10;  // one 64 KiB segment with its header
  FrameWriter w(p.fds[0], nullptr, latency, piece + sizeof(FrameHeader));
  std::vector<uint8_t> payload(piece, 1);
  std::mutex mu;
  std::vector<double> accepted;
  const double t0 = SteadyNow();
  for (uint64_t b = 0; b < 2; ++b) {
    w.Send(Piece(b, piece), payload.data(), nullptr, [&](Status s) {
      EXPECT_TRUE(s.ok());
      std::lock_guard<std::mutex> lock(mu);
      accepted.push_back(SteadyNow() - t0);
    });
  }
  std::vector<uint8_t> sink(sizeof(FrameHeader) + piece);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(ReadFull(p.fds[1], sink.data(), sink.size()).ok());
  w.Close();
  ASSERT_EQ(accepted.size(), 2u);
  EXPECT_LT(accepted[0], 0.8 * latency);
  // The second frame enters the line only once the first left it (written after the latency).
  EXPECT_GE(accepted[1], latency);
}

TEST(TokenBucket, BookingsFollowTheLinksClockNotTheCallers) {
  const double rate = 1e6;  // 1 MB/s: 1000 bytes take 1 ms
  TokenBucket link(rate, 0);
  const double t0 = SteadyNow();
  EXPECT_DOUBLE_EQ(link.Reserve(1000, t0), t0 + 0.001);
  // A caller that comes back 20 ms late with bytes ready since t0 books right behind the first
  // ones: the link did not idle for the caller's lateness.
  timespec late{0, 20 * 1000 * 1000};
  nanosleep(&late, nullptr);
  EXPECT_DOUBLE_EQ(link.Reserve(1000, t0), t0 + 0.002);
  // Bytes ready only later start then (the link idled, as a real one would).
  EXPECT_DOUBLE_EQ(link.Reserve(500, t0 + 1.0), t0 + 1.0005);
  TokenBucket unlimited(0, 0);
  EXPECT_EQ(unlimited.Reserve(1 << 20, t0), t0);
}

TEST(FrameWriter, ShapedStreamTakesTheLinksTimeAndLatency) {
  Pair p;
  const double rate = 4e6, latency = 0.05;
  auto link = std::make_shared<TokenBucket>(rate, 64 << 10);
  FrameWriter w(p.fds[0], link, latency, 0);
  const uint64_t piece = 200 << 10;
  const int frames = 4;
  std::vector<uint8_t> payload(piece, 5);
  const double t0 = SteadyNow();
  for (int b = 0; b < frames; ++b) {
    w.Send(Piece(static_cast<uint64_t>(b), piece), payload.data(), nullptr, nullptr);
  }
  std::vector<uint8_t> sink(sizeof(FrameHeader) + piece);
  for (int i = 0; i < frames; ++i) ASSERT_TRUE(ReadFull(p.fds[1], sink.data(), sink.size()).ok());
  const double took = SteadyNow() - t0;
  w.Close();
  const double on_link = frames * static_cast<double>(sink.size()) / rate;  // 0.205 s
  EXPECT_GE(took, on_link + latency - 1e-3);
  EXPECT_LT(took, on_link + latency + 0.05);
}

}  // namespace
}  // namespace dcr::internal
