// FrameWriter: a frame is accepted when it enters the delay line (the emulated link), before its
// bytes are written, and the delay line holds at most the window.
#include <gtest/gtest.h>
#include <sys/socket.h>
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

}  // namespace
}  // namespace dcr::internal
