// Hostile peers against the real node driver: stray, garbage and silent connections to a
// receiver, a parent that claims an enormous blob, and a store object far larger than any blob
// of the plan. Each receiver is a real RunNode on 127.0.0.1 sockets or a directory store.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <random>
#include <thread>

#include "dcr/checkpoint.h"
#include "dcr/node.h"
#include "transport/net.h"

namespace dcr {
namespace {

using internal::FrameHeader;
using internal::FrameType;

struct Files {
  std::string dir, base, target;
};

const Files& Checkpoints() {
  static Files* f = [] {
    auto* fx = new Files;
    char tmpl[] = "/tmp/dcr_hostile_XXXXXX";
    fx->dir = mkdtemp(tmpl);
    std::mt19937_64 rng(7);
    std::vector<uint8_t> b(64 * 1024), t;
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    t = b;
    for (size_t i = 0; i < t.size(); i += 97) t[i] ^= 0x5a;
    fx->base = fx->dir + "/base.safetensors";
    fx->target = fx->dir + "/target.safetensors";
    EXPECT_TRUE(WriteSafetensors(fx->base, {{"w", "BF16", {32, 1024}, b.data(), b.size()}}).ok());
    EXPECT_TRUE(WriteSafetensors(fx->target, {{"w", "BF16", {32, 1024}, t.data(), t.size()}}).ok());
    return fx;
  }();
  return *f;
}

std::vector<NodePlan> Plans(const std::string& transport, const std::string& tag) {
  const Files& f = Checkpoints();
  std::vector<std::string> addresses;
  for (int r = 0; r < 2; ++r) {
    addresses.push_back("127.0.0.1:" + std::to_string(internal::FreePort().value()));
  }
  std::vector<NodePlan> plans;
  for (int r = 0; r < 2; ++r) {
    NodePlan p;
    p.rank = r;
    p.transport = transport;
    p.parents = {-1, 0};
    p.addresses = addresses;
    p.relay.piece_bytes = 8 << 10;
    p.relay.prefix = "h/" + tag;
    p.relay.poll_interval_s = 0.01;
    p.relay.max_retries = 0;
    p.emulate_wan = false;
    p.store = "dir:" + f.dir + "/store";
    p.base_path = f.base;
    p.target_path = f.target;
    p.chunk_elems = 4096;
    p.receiver_base_path = f.base;
    p.verify_path = f.target;
    p.timeout_s = 20;
    plans.push_back(p);
  }
  return plans;
}

int ConnectTo(const std::string& address) {
  auto fd = internal::Connect(address, internal::SteadyNow() + 10);
  EXPECT_TRUE(fd.ok()) << fd.status();
  return fd.ok() ? *fd : -1;
}

TEST(HostilePeer, StrayGarbageAndSilentConnectionsAreDroppedAndTheParentServed) {
  auto plans = Plans("relay_tree", "stray");
  NodeResult receiver;
  Status receiver_status;
  std::thread rx([&] { receiver_status = RunNode(plans[1], &receiver); });
  // Before the real parent: a silent connection (held open all along), garbage, a connection
  // that closes at once, a hello from the wrong rank and half a hello.
  int silent = ConnectTo(plans[1].addresses[1]);
  int garbage = ConnectTo(plans[1].addresses[1]);
  std::vector<uint8_t> junk(sizeof(FrameHeader), 0xab);
  ASSERT_TRUE(internal::WriteFull(garbage, junk.data(), junk.size()).ok());
  close(ConnectTo(plans[1].addresses[1]));
  int wrong = ConnectTo(plans[1].addresses[1]);
  FrameHeader hello;
  hello.type = static_cast<uint8_t>(FrameType::kHello);
  hello.from_rank = 5;
  hello.blob = 1;
  ASSERT_TRUE(internal::WriteFull(wrong, &hello, sizeof(hello)).ok());
  int half = ConnectTo(plans[1].addresses[1]);
  hello.from_rank = 0;
  ASSERT_TRUE(internal::WriteFull(half, &hello, 20).ok());
  NodeResult sender;
  Status sender_status = RunNode(plans[0], &sender);
  rx.join();
  EXPECT_TRUE(sender_status.ok()) << sender_status;
  ASSERT_TRUE(receiver_status.ok()) << receiver_status;
  EXPECT_TRUE(receiver.verified) << receiver.verify_message;
  for (int fd : {silent, garbage, wrong, half}) close(fd);
}

// Hellos from the parent's rank of another wire protocol, another run and another version are
// refused; the receiver keeps listening and is served by its real parent.
TEST(HostilePeer, HellosOfAnotherProtocolRunOrVersionAreDroppedAndTheParentServed) {
  auto plans = Plans("relay_tree", "wire");
  for (NodePlan& p : plans) {
    p.run_id = 0x5eed;
    p.version = 3;
  }
  NodeResult receiver;
  Status receiver_status;
  std::thread rx([&] { receiver_status = RunNode(plans[1], &receiver); });
  std::vector<int> fds;
  for (int variant = 0; variant < 3; ++variant) {
    FrameHeader hello;
    hello.type = static_cast<uint8_t>(FrameType::kHello);
    hello.from_rank = 0;
    hello.blob = 1;
    hello.run = 0x5eed;
    hello.version = 3;
    if (variant == 0) hello.protocol = internal::kWireProtocol + 1;
    if (variant == 1) hello.run = 0x5eee;
    if (variant == 2) hello.version = 2;
    fds.push_back(ConnectTo(plans[1].addresses[1]));
    ASSERT_TRUE(internal::WriteFull(fds.back(), &hello, sizeof(hello)).ok());
  }
  // Each refused connection is closed by the receiver.
  for (int fd : fds) {
    char c;
    EXPECT_EQ(read(fd, &c, 1), 0);
  }
  NodeResult sender;
  Status sender_status = RunNode(plans[0], &sender);
  rx.join();
  EXPECT_TRUE(sender_status.ok()) << sender_status;
  ASSERT_TRUE(receiver_status.ok()) << receiver_status;
  EXPECT_TRUE(receiver.verified) << receiver.verify_message;
  for (int fd : fds) close(fd);
}

// A parent whose hello matches but whose piece is of another run stops the receiver with the
// mismatch named.
TEST(HostilePeer, PieceOfAnotherRunIsRefused) {
  auto plans = Plans("relay_tree", "run");
  plans[1].run_id = 7;
  NodeResult receiver;
  Status receiver_status;
  std::thread rx([&] { receiver_status = RunNode(plans[1], &receiver); });
  int fd = ConnectTo(plans[1].addresses[1]);
  FrameHeader hello;
  hello.type = static_cast<uint8_t>(FrameType::kHello);
  hello.blob = 1;
  hello.run = 7;
  ASSERT_TRUE(internal::WriteFull(fd, &hello, sizeof(hello)).ok());
  FrameHeader piece;
  piece.type = static_cast<uint8_t>(FrameType::kPiece);
  piece.run = 8;
  piece.blob_size = 16;
  piece.length = 16;
  ASSERT_TRUE(internal::WriteFull(fd, &piece, sizeof(piece)).ok());
  rx.join();
  close(fd);
  ASSERT_FALSE(receiver_status.ok());
  EXPECT_NE(receiver_status.message().find("peer rank 0 is of run 0x0000000000000008, this "
                                           "node's run 0x0000000000000007"),
            std::string::npos)
      << receiver_status;
}

TEST(HostilePeer, OnlySilentPeersEndInADeadlineNamingTheDrops) {
  auto plans = Plans("relay_tree", "silent");
  plans[1].timeout_s = 1.5;
  NodeResult receiver;
  Status receiver_status;
  std::thread rx([&] { receiver_status = RunNode(plans[1], &receiver); });
  int garbage = ConnectTo(plans[1].addresses[1]);
  std::vector<uint8_t> junk(100, 0x11);
  ASSERT_TRUE(internal::WriteFull(garbage, junk.data(), junk.size()).ok());
  int silent = ConnectTo(plans[1].addresses[1]);
  rx.join();
  ASSERT_FALSE(receiver_status.ok());
  EXPECT_TRUE(receiver_status.IsUnavailable()) << receiver_status;
  EXPECT_NE(receiver_status.message().find("dropped"), std::string::npos) << receiver_status;
  close(garbage);
  close(silent);
}

// A parent with a valid hello whose first piece claims a blob of `claimed` bytes.
Status ClaimBlob(uint64_t claimed, BlobKind kind) {
  auto plans = Plans("relay_tree", "claim");
  NodeResult receiver;
  Status receiver_status;
  std::thread rx([&] { receiver_status = RunNode(plans[1], &receiver); });
  int fd = ConnectTo(plans[1].addresses[1]);
  FrameHeader hello;
  hello.type = static_cast<uint8_t>(FrameType::kHello);
  hello.from_rank = 0;
  hello.blob = 1;
  EXPECT_TRUE(internal::WriteFull(fd, &hello, sizeof(hello)).ok());
  FrameHeader piece;
  piece.type = static_cast<uint8_t>(FrameType::kPiece);
  piece.blob_kind = static_cast<uint8_t>(kind);
  piece.blob = 1;
  piece.blob_size = claimed;
  piece.offset = 0;
  piece.length = 16;
  EXPECT_TRUE(internal::WriteFull(fd, &piece, sizeof(piece)).ok());
  rx.join();
  close(fd);
  EXPECT_FALSE(receiver.ok);
  return receiver_status;
}

TEST(HostilePeer, PieceClaimingAHugeBlobIsRefusedBeforeAllocating) {
  for (uint64_t claimed : {uint64_t{1} << 62, uint64_t{4} << 30}) {
    for (BlobKind kind : {BlobKind::kHeader, BlobKind::kChunk, BlobKind::kTrailer}) {
      Status s = ClaimBlob(claimed, kind);
      ASSERT_FALSE(s.ok());
      EXPECT_TRUE(s.IsDataLoss()) << s;
      EXPECT_NE(s.message().find("claiming " + std::to_string(claimed) + " bytes"),
                std::string::npos)
          << s;
    }
  }
}

TEST(HostilePeer, StoreObjectLargerThanThePlanAllowsIsRefused) {
  auto plans = Plans("object_store", "sparse");
  plans[1].relay.poll_timeout_s = 5;
  const std::string root = Checkpoints().dir + "/store";
  const std::string key = ObjectKey(plans[1].relay.prefix, BlobInfo{0, BlobKind::kHeader, 0});
  std::string path = root + "/" + key;
  ASSERT_EQ(std::system(("mkdir -p " + path.substr(0, path.rfind('/'))).c_str()), 0);
  int fd = open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, off_t{1} << 40), 0);  // 1 TB, sparse
  close(fd);
  NodeResult r;
  Status s = RunNode(plans[1], &r);
  unlink(path.c_str());
  ASSERT_FALSE(s.ok());
  // Refused from its listed size, before any read.
  EXPECT_NE(s.message().find("is 1099511627776 bytes, larger than"), std::string::npos) << s;
  EXPECT_FALSE(r.ok);
}

}  // namespace
}  // namespace dcr
