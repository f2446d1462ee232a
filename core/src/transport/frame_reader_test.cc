// ParentFrameReader over a real socket pair: what a parent's stream may carry, and what it may
// not.
#include "transport/frame_reader.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace dcr::internal {
namespace {

constexpr uint64_t kRun = 0x51;
constexpr uint64_t kVersion = 4;

class FrameReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds_), 0);
    conn_ = std::make_unique<Conn>(fds_[1]);
    reader_ = std::make_unique<ParentFrameReader>(
        conn_.get(), 2, kRun, kVersion,
        [](BlobKind kind) -> uint64_t { return kind == BlobKind::kChunk ? 1000 : 100; });
  }
  void TearDown() override {
    if (fds_[0] >= 0) close(fds_[0]);
    fds_[0] = -1;
  }
  FrameHeader Frame(FrameType type) const {
    FrameHeader h;
    h.type = static_cast<uint8_t>(type);
    h.from_rank = 2;
    h.run = kRun;
    h.version = kVersion;
    return h;
  }
  void Write(const FrameHeader& h, const std::string& payload = "") {
    ASSERT_TRUE(WriteFull(fds_[0], &h, sizeof(h)).ok());
    if (!payload.empty()) {
      ASSERT_TRUE(WriteFull(fds_[0], payload.data(), payload.size()).ok());
    }
  }
  FrameHeader Piece(uint64_t blob, BlobKind kind, uint64_t size, uint64_t offset,
                    uint64_t length) const {
    FrameHeader h = Frame(FrameType::kPiece);
    h.blob = blob;
    h.blob_kind = static_cast<uint8_t>(kind);
    h.blob_size = size;
    h.offset = offset;
    h.length = length;
    return h;
  }

  int fds_[2] = {-1, -1};
  std::unique_ptr<Conn> conn_;
  std::unique_ptr<ParentFrameReader> reader_;
};

TEST_F(FrameReaderTest, SkipsHeartbeatsAndReturnsAPieceWithItsPayloadLeftToRead) {
  Write(Frame(FrameType::kHeartbeat));
  Write(Frame(FrameType::kHeartbeat));
  Write(Piece(7, BlobKind::kChunk, 1000, 200, 3), "abc");
  ParentFrame f;
  Status s;
  ASSERT_EQ(reader_->Next(&f, &s), ParentFrameReader::Outcome::kFrame) << s;
  EXPECT_EQ(f.type, ParentFrame::Type::kPiece);
  EXPECT_EQ(f.info.id, 7u);
  EXPECT_EQ(f.info.kind, BlobKind::kChunk);
  EXPECT_EQ(f.info.size, 1000u);
  EXPECT_EQ(f.offset, 200u);
  EXPECT_EQ(f.length, 3u);
  std::string payload(3, '\0');
  ASSERT_TRUE(conn_->Read(payload.data(), payload.size()).ok());
  EXPECT_EQ(payload, "abc");
}

TEST_F(FrameReaderTest, ReadsAnAbortWithItsReason) {
  FrameHeader h = Frame(FrameType::kAbort);
  h.length = 6;
  Write(h, "no way");
  ParentFrame f;
  Status s;
  ASSERT_EQ(reader_->Next(&f, &s), ParentFrameReader::Outcome::kFrame) << s;
  EXPECT_EQ(f.type, ParentFrame::Type::kAbort);
  EXPECT_EQ(f.reason, "no way");
  EXPECT_EQ(f.from_rank, 2u);
}

TEST_F(FrameReaderTest, RefusesAFrameOfAnotherRunOrVersion) {
  FrameHeader h = Piece(1, BlobKind::kHeader, 10, 0, 0);
  h.version = kVersion + 1;
  Write(h);
  ParentFrame f;
  Status s;
  EXPECT_EQ(reader_->Next(&f, &s), ParentFrameReader::Outcome::kRefused);
  EXPECT_TRUE(s.IsDataLoss()) << s;
  EXPECT_NE(s.message().find("frame from parent node 2 refused: "), std::string::npos) << s;
  EXPECT_NE(s.message().find("version 5"), std::string::npos) << s;
}

TEST_F(FrameReaderTest, RefusesMalformedFrames) {
  std::vector<FrameHeader> bad;
  bad.push_back(Piece(1, BlobKind::kChunk, 10, 11, 0));  // offset past the blob
  bad.push_back(Piece(1, BlobKind::kChunk, 10, 5, 6));   // range past the blob
  FrameHeader kind = Piece(1, BlobKind::kChunk, 10, 0, 1);
  kind.blob_kind = 3;
  bad.push_back(kind);
  bad.push_back(Frame(FrameType::kAck));  // not what a parent sends
  FrameHeader magic = Piece(1, BlobKind::kChunk, 10, 0, 1);
  magic.magic = 0x12345678;
  bad.push_back(magic);
  FrameHeader abort = Frame(FrameType::kAbort);
  abort.length = kMaxAbortMessageBytes + 1;
  bad.push_back(abort);
  for (const FrameHeader& h : bad) {
    SetUp();
    Write(h);
    ParentFrame f;
    Status s;
    EXPECT_EQ(reader_->Next(&f, &s), ParentFrameReader::Outcome::kRefused);
    EXPECT_TRUE(s.IsDataLoss()) << s;
    EXPECT_EQ(s.message(), "malformed frame from parent node 2");
    TearDown();
  }
}

TEST_F(FrameReaderTest, RefusesABlobLargerThanItsKindAllows) {
  Write(Piece(9, BlobKind::kTrailer, 101, 0, 1));
  ParentFrame f;
  Status s;
  EXPECT_EQ(reader_->Next(&f, &s), ParentFrameReader::Outcome::kOversized);
  EXPECT_TRUE(s.IsDataLoss()) << s;
  EXPECT_NE(s.message().find("blob 9 claiming 101 bytes, more than the 100 bytes"),
            std::string::npos)
      << s;
}

TEST_F(FrameReaderTest, AClosedConnectionIsLost) {
  Write(Frame(FrameType::kHeartbeat));
  close(fds_[0]);
  fds_[0] = -1;
  ParentFrame f;
  Status s;
  EXPECT_EQ(reader_->Next(&f, &s), ParentFrameReader::Outcome::kLost);
  EXPECT_TRUE(s.IsUnavailable()) << s;
}

}  // namespace
}  // namespace dcr::internal
