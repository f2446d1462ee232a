// Leaves hashed while a delta applies (TrustOptions::hash_leaves_early,
// internal/commitment_tracker.h): the same root, errors and first wrong range as hashing at Commit,
// whatever the chunk order and thread count, with only the leaves no chunk completed left to
// Commit; a write that reaches a leaf after its early hash makes Commit hash it again.
#include "internal/commitment_tracker.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "dcr/commitment.h"
#include "dcr/delta.h"
#include "dcr/device.h"
#include "dcr/manifest.h"
#include "dcr/receiver.h"
#include "dcr/signing.h"
#include "dcr/status_macros.h"

namespace dcr {
namespace {

struct Owned {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

std::vector<TensorView> Views(const std::vector<Owned>& ts) {
  std::vector<TensorView> v;
  for (const Owned& t : ts) {
    v.push_back(TensorView{t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size()});
  }
  return v;
}

Owned Bf16(const std::string& name, size_t bytes, std::mt19937_64* rng) {
  Owned t{name, "BF16", {static_cast<int64_t>(bytes / 2)}, std::vector<uint8_t>(bytes)};
  for (auto& x : t.bytes) x = static_cast<uint8_t>((*rng)() & 0x3f);
  return t;
}

// A signed delta's records: header, manifests and chunks in stream order, trailer.
struct Records {
  std::vector<uint8_t> bytes;
  size_t header = 0;
  std::vector<std::pair<size_t, size_t>> manifests, chunks;  // (offset, size)
  size_t trailer = 0;
};

Records Split(std::vector<uint8_t> d) {
  Records r;
  r.bytes = std::move(d);
  const std::vector<uint8_t>& b = r.bytes;
  EXPECT_TRUE(ParseFileHeader(b.data(), b.size(), &r.header).ok());
  uint64_t trailer = 0;
  std::memcpy(&trailer, b.data() + b.size() - 24, 8);
  r.trailer = trailer;
  for (size_t off = r.header; off < trailer;) {
    size_t rs = 0, hs = 0;
    if (IsManifestRecord(b.data() + off, trailer - off)) {
      EXPECT_TRUE(ParseManifest(b.data() + off, trailer - off, &rs).ok());
      r.manifests.push_back({off, rs});
    } else {
      EXPECT_TRUE(ParseChunkHeader(b.data() + off, trailer - off, &hs, &rs).ok());
      r.chunks.push_back({off, rs});
    }
    off += rs;
  }
  return r;
}

// Begin, every manifest, the chunks in an order drawn from `seed` (stream order for 0) on
// `threads` concurrent callers, Commit.
Status Deliver(const Records& r, Receiver* rx, uint64_t seed, int threads) {
  const uint8_t* b = r.bytes.data();
  DCR_RETURN_IF_ERROR(rx->Begin(b, r.header));
  for (const auto& [off, size] : r.manifests) DCR_RETURN_IF_ERROR(rx->ApplyRecord(b + off, size));
  std::vector<std::pair<size_t, size_t>> chunks = r.chunks;
  if (seed != 0) std::shuffle(chunks.begin(), chunks.end(), std::mt19937_64(seed));
  std::vector<Status> got(chunks.size());
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (size_t i = t; i < chunks.size(); i += threads) {
        got[i] = rx->ApplyRecord(b + chunks[i].first, chunks[i].second);
      }
    });
  }
  for (std::thread& t : pool) t.join();
  for (const Status& s : got) DCR_RETURN_IF_ERROR(s);
  return rx->Commit(b + r.trailer, r.bytes.size() - r.trailer);
}

class EarlyLeavesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937_64 rng(11);
    // "a": 6.5 leaves, changed throughout; "b": 2 leaves, unchanged (no chunk); "c": 1 leaf.
    base_model_ = {Bf16("a", 13 * kCommitmentLeafBytes / 2, &rng),
                   Bf16("b", 2 * kCommitmentLeafBytes, &rng),
                   Bf16("c", kCommitmentLeafBytes, &rng)};
    target_model_ = base_model_;
    for (size_t i = 0; i < target_model_[0].bytes.size(); i += 4093) target_model_[0].bytes[i] ^= 1;
    for (size_t i = 0; i < target_model_[2].bytes.size(); i += 40961) {
      target_model_[2].bytes[i] ^= 2;
    }
    base_ = std::move(*Checkpoint::FromBytes(SafetensorsImage(Views(base_model_))));
    target_ = std::move(*Checkpoint::FromBytes(SafetensorsImage(Views(target_model_))));
    key_ = std::move(*SigningKey::Generate());
    commitment_ = *CheckpointCommitment(*target_, 2);
    trust_.key = *TrustKey::FromRaw(key_->public_key());
    trust_.commitment_threads = 2;
  }

  // A signed delta from the base to `target`, whose final manifest signs the genuine target's
  // commitment; chunks of one leaf (2^21 BF16 elements), one manifest per 3 chunks.
  Records Signed(const Checkpoint& target) {
    DeltaOptions o;
    o.chunk_elems = 1 << 21;
    o.base_version = 1;
    o.target_version = 2;
    DeltaMemorySink mem;
    SignOptions so;
    so.chunks_per_manifest = 3;
    so.commitment = commitment_.root;
    so.commitment_leaves = commitment_.leaves;
    SigningSink sink(key_.get(), so, &mem);
    EXPECT_TRUE(BuildDelta(base_.get(), target, o, &sink).ok());
    return Split(mem.Release());
  }

  std::vector<Owned> base_model_, target_model_;
  std::unique_ptr<Checkpoint> base_, target_;
  std::unique_ptr<SigningKey> key_;
  Commitment commitment_;
  TrustOptions trust_;
};

// Every leaf that a chunk covers is hashed before Commit; Commit hashes the leaves of "b", which
// no chunk touches, and the root is the signed one in any chunk order on any number of threads.
TEST_F(EarlyLeavesTest, CommitHashesOnlyLeavesNoChunkCompleted) {
  const Records r = Signed(*target_);
  ASSERT_EQ(r.chunks.size(), 8u);  // 7 chunks of "a", 1 of "c"
  for (const auto& [seed, threads] :
       std::vector<std::pair<uint64_t, int>>{{0, 1}, {7, 4}, {9, 3}}) {
    for (int hash_threads : {1, 3}) {
      TrustOptions to = trust_;
      to.commitment_threads = hash_threads;
      TrustedReceiver rx(BufferReceiver::Copy(*base_, 1), to);
      Status s = Deliver(r, &rx, seed, threads);
      ASSERT_TRUE(s.ok()) << s.ToString();
      ASSERT_TRUE(rx.committed_commitment().has_value());
      EXPECT_EQ(*rx.committed_commitment(), commitment_.root);
      EXPECT_TRUE(rx.Verify(*target_).ok());
      const CommitmentPassStats p = rx.last_commitment_pass();
      EXPECT_EQ(p.leaves, 10u);
      EXPECT_EQ(p.commit_hashed_leaves, 2u) << "seed " << seed;
      EXPECT_GE(p.tail_leaves, 2u);  // and any the pool had not reached
      EXPECT_EQ(p.early_leaves + p.tail_leaves, 10u);
      EXPECT_EQ(p.rehashed_leaves, 0u);
    }
  }
  // A device receiver (the host backend: leaves downloaded as from a GPU): the same.
  {
    std::shared_ptr<Device> device = MakeHostDevice();
    auto dev = MakeDeviceReceiver(device, *base_, 1);
    ASSERT_TRUE(dev.ok()) << dev.status().ToString();
    TrustedReceiver rx(std::move(*dev), trust_);
    Status s = Deliver(r, &rx, 3, 2);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(*rx.committed_commitment(), commitment_.root);
    EXPECT_EQ(rx.last_commitment_pass().commit_hashed_leaves, 2u);
  }
  // Without early hashing: the same root, every leaf at Commit.
  TrustOptions to = trust_;
  to.hash_leaves_early = false;
  TrustedReceiver rx(BufferReceiver::Copy(*base_, 1), to);
  ASSERT_TRUE(Deliver(r, &rx, 0, 1).ok());
  EXPECT_EQ(*rx.committed_commitment(), commitment_.root);
  EXPECT_EQ(rx.last_commitment_pass().tail_leaves, 10u);
  EXPECT_EQ(rx.last_commitment_pass().commit_hashed_leaves, 10u);
  EXPECT_EQ(rx.last_commitment_pass().early_leaves, 0u);
}

// A signed chunk in the middle of the stream that writes other bytes than the committed target
// (the trainer's chain and hashes agree with it): its leaf, hashed early, is named as the first
// wrong range, in any order, and the receiver stays at its version.
TEST_F(EarlyLeavesTest, ForgedChunkInTheMiddleNamesTheFirstWrongRange) {
  std::vector<Owned> forged_model = target_model_;
  forged_model[0].bytes[3 * kCommitmentLeafBytes + 1000] ^= 0x10;
  auto forged = Checkpoint::FromBytes(SafetensorsImage(Views(forged_model)));
  ASSERT_TRUE(forged.ok());
  const Records r = Signed(**forged);
  for (const auto& [seed, threads] : std::vector<std::pair<uint64_t, int>>{{0, 1}, {5, 4}}) {
    TrustedReceiver rx(BufferReceiver::Copy(*base_, 1), trust_);
    Status s = Deliver(r, &rx, seed, threads);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
    EXPECT_NE(s.message().find("commit of version 2 refused"), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find("first wrong range: tensor a bytes [12582912, 16777216) (leaf 3)"),
              std::string::npos)
        << s.ToString();
    EXPECT_EQ(rx.held().number, 1u);
    EXPECT_FALSE(rx.committed_commitment().has_value());
    EXPECT_EQ(rx.last_commitment_pass().commit_hashed_leaves, 2u);
  }
}

// The tracker alone over host storage: a write announced after a leaf's early hash (a later
// chunk overlapping it) drops that digest, and Finish hashes the leaf as it is then.
TEST(CommitmentTracker, WriteAfterAnEarlyHashIsHashedAgain) {
  std::mt19937_64 rng(3);
  std::vector<Owned> model = {Bf16("w", 2 * kCommitmentLeafBytes, &rng)};
  auto ckpt = Checkpoint::FromBytes(SafetensorsImage(Views(model)));
  ASSERT_TRUE(ckpt.ok());
  auto rx = BufferReceiver::Copy(**ckpt, 0);
  auto tracker = internal::CommitmentTracker::Start(*rx, Inventory::FromCheckpoint(**ckpt), 2);
  ASSERT_NE(tracker, nullptr);
  uint8_t* bytes = rx->tensors()[0].data;
  const uint64_t leaf_elems = kCommitmentLeafBytes / 2;
  ChunkHeader first;
  first.elem_width = 2;
  first.segments = {Segment::Range(0, 0, leaf_elems)};
  auto touch = tracker->Before(first);
  bytes[10] ^= 1;
  tracker->After(touch, true);  // leaf 0 final: hashed here
  // A strided box over both leaves (every 1024th element): announced by its runs, credits the
  // single elements it covers, and reaches leaf 0 after its hash.
  ChunkHeader strided;
  strided.elem_width = 2;
  Segment box;
  box.ndim = 2;
  box.count = {2, 1024};
  box.stride = {static_cast<int64_t>(leaf_elems), 1024};
  strided.segments = {box};
  touch = tracker->Before(strided);
  EXPECT_EQ(touch.leaves, (std::vector<uint64_t>{0, 1}));
  bytes[2 * 1024 * 5] ^= 4;
  bytes[kCommitmentLeafBytes + 2 * 1024 * 7] ^= 4;
  tracker->After(touch, true);
  auto c = tracker->Finish(2);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto want = HeldCommitment(*rx, 1);
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(c->root, want->root);
  EXPECT_EQ(c->leaves, want->leaves);
  const CommitmentPassStats p = tracker->stats();
  EXPECT_EQ(p.rehashed_leaves, 1u);
  EXPECT_EQ(p.commit_hashed_leaves, 2u);  // leaf 0 again, leaf 1 never covered
  EXPECT_EQ(p.tail_leaves, 2u);
  EXPECT_EQ(p.early_leaves, 0u);
}

}  // namespace
}  // namespace dcr
