// Catch-up inside the rollout region: the decision (PlanCatchUp), what the in-region store holds
// of a version, full frames put by a holder and checked by the fetcher, region commit reports,
// and the sender's joint commit declaring a silent receiver dead and re-admitting it.
#include "node/catch_up.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "dcr/checkpoint.h"
#include "dcr/commitment.h"
#include "dcr/delta.h"
#include "dcr/device.h"
#include "dcr/relay_policy.h"
#include "dcr/signing.h"
#include "node/versions.h"
#include "transport/tls.h"

namespace dcr::internal {
namespace {

StoredVersion Whole(uint64_t n, uint64_t bytes) { return StoredVersion{n, true, bytes, false}; }

TEST(PlanCatchUpTest, InStepFollows) {
  // Nothing after the held version is published yet, or only the next one.
  CatchUpStep s = PlanCatchUp(3, {}, 1000, {});
  EXPECT_EQ(s.kind, CatchUpStep::kFollow);
  EXPECT_EQ(s.version, 4u);
  s = PlanCatchUp(3, {Whole(4, 10)}, 1000, {});
  EXPECT_EQ(s.kind, CatchUpStep::kFollow);
  EXPECT_EQ(s.version, 4u);
}

TEST(PlanCatchUpTest, BehindReplaysRetainedDeltas) {
  CatchUpStep s = PlanCatchUp(1, {Whole(2, 10), Whole(3, 10), Whole(4, 10)}, 1000, {});
  EXPECT_EQ(s.kind, CatchUpStep::kReplay);
  EXPECT_EQ(s.version, 2u);
  // Versions at or below the held one do not count.
  s = PlanCatchUp(3, {Whole(1, 10), Whole(2, 10), Whole(3, 10), Whole(4, 10)}, 1000, {});
  EXPECT_EQ(s.kind, CatchUpStep::kFollow);
}

TEST(PlanCatchUpTest, TooFarBehindTakesAFullFrame) {
  std::vector<StoredVersion> st;
  for (uint64_t n = 1; n <= 10; ++n) st.push_back(Whole(n, 10));
  st[8].full_frame = true;  // version 9
  CatchUpLimits lim;
  lim.max_replay = 4;
  CatchUpStep s = PlanCatchUp(0, st, 1000, lim);
  EXPECT_EQ(s.kind, CatchUpStep::kFullFrame);
  EXPECT_EQ(s.version, 9u);
  // Within the limit the chain is replayed even though a frame exists.
  lim.max_replay = 10;
  EXPECT_EQ(PlanCatchUp(0, st, 1000, lim).kind, CatchUpStep::kReplay);
}

TEST(PlanCatchUpTest, DeltasOutweighingTheFractionTakeAFullFrame) {
  std::vector<StoredVersion> st = {Whole(2, 300), Whole(3, 300)};
  st[1].full_frame = true;
  CatchUpLimits lim;
  lim.full_frame_fraction = 0.5;
  CatchUpStep s = PlanCatchUp(1, st, 1000, lim);  // 600 > 500
  EXPECT_EQ(s.kind, CatchUpStep::kFullFrame);
  EXPECT_EQ(s.version, 3u);
  EXPECT_EQ(PlanCatchUp(1, st, 2000, lim).kind, CatchUpStep::kReplay);  // 600 <= 1000
}

TEST(PlanCatchUpTest, NoFrameReplaysAWholeChainAnyway) {
  CatchUpLimits lim;
  lim.max_replay = 1;
  CatchUpStep s = PlanCatchUp(1, {Whole(2, 10), Whole(3, 10), Whole(4, 10)}, 1000, lim);
  EXPECT_EQ(s.kind, CatchUpStep::kReplay);
  EXPECT_EQ(s.version, 2u);
}

TEST(PlanCatchUpTest, AMissingDeltaNeedsAFrame) {
  // Version 2's delta was deleted (retention): replay cannot bridge it.
  std::vector<StoredVersion> st = {StoredVersion{2, false, 0, false}, Whole(3, 10), Whole(4, 10)};
  CatchUpStep s = PlanCatchUp(1, st, 1000, {});
  EXPECT_EQ(s.kind, CatchUpStep::kRequestFullFrame);
  st[2].full_frame = true;
  s = PlanCatchUp(1, st, 1000, {});
  EXPECT_EQ(s.kind, CatchUpStep::kFullFrame);
  EXPECT_EQ(s.version, 4u);
}

TEST(PlanCatchUpTest, LateJoinerTakesTheNewestFrameOrAsks) {
  EXPECT_EQ(PlanCatchUp(std::nullopt, {Whole(1, 10), Whole(2, 10)}, 0, {}).kind,
            CatchUpStep::kRequestFullFrame);
  std::vector<StoredVersion> st = {Whole(1, 10), Whole(2, 10), Whole(3, 10)};
  st[0].full_frame = st[1].full_frame = true;
  CatchUpStep s = PlanCatchUp(std::nullopt, st, 0, {});
  EXPECT_EQ(s.kind, CatchUpStep::kFullFrame);
  EXPECT_EQ(s.version, 2u);
}

// Each blob of a delta stream in order (header, chunks, trailer).
class BlobSink : public DeltaSink {
 public:
  Status OnHeader(const std::vector<uint8_t>& b) override { return Add(b); }
  Status OnChunk(const ChunkHeader&, const std::vector<uint8_t>& b) override { return Add(b); }
  Status OnManifest(const std::vector<uint8_t>& b) override { return Add(b); }
  Status OnTrailer(const std::vector<uint8_t>& b) override { return Add(b); }
  std::vector<std::vector<uint8_t>> blobs;

 private:
  Status Add(const std::vector<uint8_t>& b) {
    blobs.push_back(b);
    return Status();
  }
};

// A small checkpoint chain v0 -> v1 and its delta in a directory store, as the long-link relay
// mirrors it.
class RegionStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("dcr-catch-up-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_ / "store");
    std::mt19937_64 rng(3);
    std::vector<uint8_t> a(64 * 256 * 2);
    for (auto& x : a) x = static_cast<uint8_t>(rng());
    for (int k = 0; k < 2; ++k) {
      if (k == 1) {
        for (size_t i = 0; i < a.size(); i += 7) a[i] ^= 0x5a;
      }
      std::vector<TensorView> views = {{"w", "BF16", {64, 256}, a.data(), a.size()}};
      paths_.push_back((dir_ / ("v" + std::to_string(k) + ".safetensors")).string());
      ASSERT_TRUE(WriteSafetensors(paths_.back(), views).ok());
    }
    auto store = OpenObjectStore("dir:" + (dir_ / "store").string());
    ASSERT_TRUE(store.ok());
    store_ = std::move(*store);
    auto base = Checkpoint::Open(paths_[0]);
    auto target = Checkpoint::Open(paths_[1]);
    ASSERT_TRUE(base.ok() && target.ok());
    DeltaOptions o;
    o.chunk_elems = 4096;
    o.base_version = 0;
    o.target_version = 1;
    BlobSink blobs;
    ASSERT_TRUE(BuildDelta(base->get(), **target, o, &blobs).ok());
    ASSERT_GE(blobs.blobs.size(), 3u);
    // Blobs as the stream carries them: header 0, chunks 1.., trailer last.
    for (size_t id = 0; id < blobs.blobs.size(); ++id) {
      BlobInfo b;
      b.id = id;
      b.kind = id == 0                        ? BlobKind::kHeader
               : id + 1 == blobs.blobs.size() ? BlobKind::kTrailer
                                              : BlobKind::kChunk;
      ASSERT_TRUE(
          store_->Put(ObjectKey("run/v1", b), blobs.blobs[id].data(), blobs.blobs[id].size()).ok());
      delta_.insert(delta_.end(), blobs.blobs[id].begin(), blobs.blobs[id].end());
    }
    trailer_bytes_ = blobs.blobs.back().size();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path dir_;
  std::vector<std::string> paths_;
  std::unique_ptr<ObjectStore> store_;
  std::vector<uint8_t> delta_;
  size_t trailer_bytes_ = 0;
};

TEST_F(RegionStoreTest, InspectSeesAWholeDeltaAndAFrame) {
  auto sv = InspectStoredVersion(store_.get(), "run/v1", 1);
  ASSERT_TRUE(sv.ok());
  EXPECT_TRUE(sv->delta_whole);
  EXPECT_GT(sv->delta_bytes, 0u);
  EXPECT_FALSE(sv->full_frame);
  // A version nothing was put for.
  auto none = InspectStoredVersion(store_.get(), "run/v2", 2);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->delta_whole);
  // A chunk lost (e.g. to retention): no longer whole.
  ASSERT_TRUE(store_->Delete(ObjectKey("run/v1", BlobInfo{1, BlobKind::kChunk, 0})).ok());
  sv = InspectStoredVersion(store_.get(), "run/v1", 1);
  ASSERT_TRUE(sv.ok());
  EXPECT_FALSE(sv->delta_whole);
}

TEST_F(RegionStoreTest, FullFrameRoundTripIsBitExactAndChecked) {
  // A holder at version 1 (it applied the delta) puts its frame; a joiner fetches it.
  auto holder = BufferReceiver::Load(paths_[0]);
  ASSERT_TRUE(holder.ok());
  auto reader = DeltaReader::FromBytes(delta_);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  ASSERT_TRUE(ApplyDelta(**reader, holder->get()).ok());
  auto put = PutFullFrame(store_.get(), "run/v1", **holder);
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  auto sv = InspectStoredVersion(store_.get(), "run/v1", 1);
  ASSERT_TRUE(sv.ok());
  EXPECT_TRUE(sv->full_frame);
  EXPECT_TRUE(sv->delta_whole);  // the frame is not mistaken for a blob
  uint64_t bytes = 0;
  auto joiner = FetchFullFrame(store_.get(), "run/v1", 1, &bytes);
  ASSERT_TRUE(joiner.ok()) << joiner.status().ToString();
  EXPECT_EQ(bytes, *put + trailer_bytes_);
  EXPECT_EQ((*joiner)->held().number, 1u);
  EXPECT_TRUE(VerifyFile(**joiner, paths_[1]).ok());
  // A frame of other bytes (here: version 0's) is refused against the version's trailer.
  auto stale = BufferReceiver::Load(paths_[0]);
  ASSERT_TRUE(stale.ok());
  ASSERT_TRUE(PutFullFrame(store_.get(), "run/v1", **stale).ok());
  auto refused = FetchFullFrame(store_.get(), "run/v1", 1, &bytes);
  EXPECT_TRUE(refused.status().IsDataLoss()) << refused.status().ToString();
}

// A full frame is loaded only when it is the version the trainer signed: the frame and the
// trailer in the store are as trusted as whoever can write it.
TEST_F(RegionStoreTest, FullFrameIsCheckedAgainstTheSignedCommitment) {
  auto key = SigningKey::Generate();
  auto other = SigningKey::Generate();
  ASSERT_TRUE(key.ok() && other.ok());
  auto base = Checkpoint::Open(paths_[0]);
  auto target = Checkpoint::Open(paths_[1]);
  ASSERT_TRUE(base.ok() && target.ok());
  auto commitment = CheckpointCommitment(**target, 1);
  ASSERT_TRUE(commitment.ok());
  DeltaOptions o;
  o.chunk_elems = 4096;
  o.base_version = 0;
  o.target_version = 1;
  BlobSink blobs;
  SignOptions so;
  so.run_id = 77;
  so.chunks_per_manifest = 2;
  so.commitment = commitment->root;
  so.commitment_leaves = commitment->leaves;
  SigningSink signing(key->get(), so, &blobs);
  ASSERT_TRUE(BuildDelta(base->get(), **target, o, &signing).ok());
  for (size_t id = 0; id < blobs.blobs.size(); ++id) {
    BlobInfo b{id,
               id == 0                        ? BlobKind::kHeader
               : id + 1 == blobs.blobs.size() ? BlobKind::kTrailer
                                              : BlobKind::kChunk,
               0};
    ASSERT_TRUE(
        store_->Put(ObjectKey("run/s1", b), blobs.blobs[id].data(), blobs.blobs[id].size()).ok());
  }
  FrameTrust trust{TrustKey::FromRaw((*key)->public_key()).value(), 77};
  auto signed_c = StoredSignedCommitment(store_.get(), "run/s1", 1, trust);
  ASSERT_TRUE(signed_c.ok()) << signed_c.status().ToString();
  EXPECT_EQ(*signed_c->root, commitment->root);
  EXPECT_EQ(signed_c->leaves, commitment->leaves);

  // The genuine frame loads.
  ASSERT_TRUE(PutFullFrameOfCheckpoint(store_.get(), "run/s1", paths_[1]).ok());
  uint64_t bytes = 0;
  auto joiner = FetchFullFrame(store_.get(), "run/s1", 1, &bytes, &trust);
  ASSERT_TRUE(joiner.ok()) << joiner.status().ToString();
  EXPECT_TRUE(VerifyFile(**joiner, paths_[1]).ok());

  // Planted: another frame and a trailer naming its content hash. The trailer check alone takes
  // it; the signed commitment refuses it, naming the first wrong range.
  ASSERT_TRUE(PutFullFrameOfCheckpoint(store_.get(), "run/s1", paths_[0]).ok());
  const std::vector<uint8_t>& real_trailer = blobs.blobs.back();
  auto trailer = ParseTrailer(real_trailer.data(), real_trailer.size());
  ASSERT_TRUE(trailer.ok());
  trailer->target_hash = (*base)->ContentHash();
  uint64_t trailer_offset = 0;
  std::memcpy(&trailer_offset, real_trailer.data() + real_trailer.size() - 24, 8);
  const std::vector<uint8_t> planted = SerializeTrailer(*trailer, trailer_offset);
  const BlobInfo trailer_blob{blobs.blobs.size() - 1, BlobKind::kTrailer, 0};
  ASSERT_TRUE(store_->Put(ObjectKey("run/s1", trailer_blob), planted.data(), planted.size()).ok());
  EXPECT_TRUE(FetchFullFrame(store_.get(), "run/s1", 1, &bytes).ok());
  auto refused = FetchFullFrame(store_.get(), "run/s1", 1, &bytes, &trust);
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("first wrong range: tensor w bytes [0, 32768)"),
            std::string::npos)
      << refused.status().ToString();

  // Another signer, another run, and an unsigned stream are no proof.
  ASSERT_TRUE(PutFullFrameOfCheckpoint(store_.get(), "run/s1", paths_[1]).ok());
  ASSERT_TRUE(
      store_->Put(ObjectKey("run/s1", trailer_blob), real_trailer.data(), real_trailer.size())
          .ok());
  ASSERT_TRUE(FetchFullFrame(store_.get(), "run/s1", 1, &bytes, &trust).ok());
  FrameTrust stranger{TrustKey::FromRaw((*other)->public_key()).value(), 77};
  EXPECT_EQ(FetchFullFrame(store_.get(), "run/s1", 1, &bytes, &stranger).status().code(),
            StatusCode::kFailedPrecondition);
  FrameTrust other_run{trust.key, 78};
  EXPECT_EQ(FetchFullFrame(store_.get(), "run/s1", 1, &bytes, &other_run).status().code(),
            StatusCode::kFailedPrecondition);
  ASSERT_TRUE(PutFullFrameOfCheckpoint(store_.get(), "run/v1", paths_[1]).ok());
  EXPECT_EQ(FetchFullFrame(store_.get(), "run/v1", 1, &bytes, &trust).status().code(),
            StatusCode::kFailedPrecondition);
}

TEST_F(RegionStoreTest, FullFrameOfDeviceStorageIsTheDenseTarget) {
  // A holder on a device (the host backend): its tensors are downloaded into the frame.
  auto holder = MakeDeviceReceiver(MakeHostDevice(), paths_[0]);
  ASSERT_TRUE(holder.ok()) << holder.status().ToString();
  auto reader = DeltaReader::FromBytes(delta_);
  ASSERT_TRUE(reader.ok());
  ASSERT_TRUE(ApplyDelta(**reader, holder->get()).ok());
  auto put = PutFullFrame(store_.get(), "run/v1", **holder);
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  uint64_t bytes = 0;
  auto joiner = FetchFullFrame(store_.get(), "run/v1", 1, &bytes);
  ASSERT_TRUE(joiner.ok()) << joiner.status().ToString();
  Status v = VerifyFile(**joiner, paths_[1]);
  EXPECT_TRUE(v.ok()) << v.ToString();
  // The frame is the bytes a host holder puts: the same safetensors image.
  auto frame = store_->Get(FullFrameKey("run/v1"));
  ASSERT_TRUE(frame.ok());
  auto host = BufferReceiver::Load(paths_[1], 1);
  ASSERT_TRUE(host.ok());
  ASSERT_TRUE(PutFullFrame(store_.get(), "run/v1", **host).ok());
  EXPECT_EQ(*frame, *store_->Get(FullFrameKey("run/v1")));
}

TEST_F(RegionStoreTest, RequestsAreServedOnceAndReportsRoundTrip) {
  NodePlan plan;
  NodeVersion v;
  v.version = 1;
  v.prefix = "run/v1";
  plan.versions.push_back(v);
  EXPECT_EQ(CatchUpRoot(plan), "run");
  auto holder = BufferReceiver::Load(paths_[1], 1);
  ASSERT_TRUE(holder.ok());
  auto none = ServeFullFrameRequests(store_.get(), plan, "run/v1", **holder);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, 0);
  ASSERT_TRUE(store_->Put(FullFrameRequestKey("run", 9), "x", 1).ok());
  auto served = ServeFullFrameRequests(store_.get(), plan, "run/v1", **holder);
  ASSERT_TRUE(served.ok());
  EXPECT_EQ(*served, 1);
  EXPECT_TRUE(InspectStoredVersion(store_.get(), "run/v1", 1)->full_frame);
  EXPECT_EQ(*ServeFullFrameRequests(store_.get(), plan, "run/v1", **holder), 0);

  const Hash128 h = (*holder)->held().hash;
  ASSERT_TRUE(PutRegionReport(store_.get(), "run/v1", 9, 77, 1, h, std::nullopt).ok());
  auto got = GetRegionReport(store_.get(), "run/v1", 9, 77, 1);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->target_hash, h);
  EXPECT_FALSE(GetRegionReport(store_.get(), "run/v1", 9, 78, 1).has_value());  // other run
  EXPECT_FALSE(GetRegionReport(store_.get(), "run/v1", 9, 77, 2).has_value());  // other version
  // Collection takes ranks outside the tree only, and does not wait past its deadline.
  ASSERT_TRUE(PutRegionReport(store_.get(), "run/v1", 3, 77, 1, h, std::nullopt).ok());
  auto reports = CollectRegionReports(store_.get(), "run/v1", 77, 1, 7, {9, 10}, 0.05);
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].rank, 9);
}

// A region receiver restarted after it recorded version 1 done, with no report of it in the
// store (killed before the put): the report of the checkpoint it holds is put again, once; a
// report there already is kept, and a version whose stream is gone gets none.
TEST_F(RegionStoreTest, RestartPutsAMissingReportOfTheHeldVersionOnce) {
  auto target = Checkpoint::Open(paths_[1]);
  ASSERT_TRUE(target.ok());
  const Hash128 h = (*target)->ContentHash();
  EXPECT_FALSE(GetRegionReport(store_.get(), "run/v1", 9, 77, 1).has_value());
  auto put = RestoreRegionReport(store_.get(), "run/v1", 9, 77, 1, paths_[1]);
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  EXPECT_TRUE(*put);
  auto got = GetRegionReport(store_.get(), "run/v1", 9, 77, 1);
  ASSERT_TRUE(got.has_value());
  EXPECT_TRUE(got->ok);
  EXPECT_EQ(got->target_hash, h);
  auto bytes = store_->Get(RegionReportKey("run/v1", 9));
  ASSERT_TRUE(bytes.ok());
  // Again (a second restart): the report stands as it is.
  put = RestoreRegionReport(store_.get(), "run/v1", 9, 77, 1, paths_[1]);
  ASSERT_TRUE(put.ok());
  EXPECT_FALSE(*put);
  EXPECT_EQ(*store_->Get(RegionReportKey("run/v1", 9)), *bytes);
  // A report of an earlier version under the key is not this version's: replaced.
  ASSERT_TRUE(PutRegionReport(store_.get(), "run/v1", 9, 77, 0, Hash128{}, std::nullopt).ok());
  put = RestoreRegionReport(store_.get(), "run/v1", 9, 77, 1, paths_[1]);
  ASSERT_TRUE(put.ok());
  EXPECT_TRUE(*put);
  EXPECT_EQ(GetRegionReport(store_.get(), "run/v1", 9, 77, 1)->target_hash, h);
  // A version nothing is stored for (collected by retention): no report is left behind.
  put = RestoreRegionReport(store_.get(), "run/v2", 9, 77, 2, paths_[1]);
  ASSERT_TRUE(put.ok());
  EXPECT_FALSE(*put);
  EXPECT_FALSE(store_->Get(RegionReportKey("run/v2", 9)).ok());
  // A held checkpoint that cannot be read is an error, not a report.
  ASSERT_TRUE(store_->Delete(RegionReportKey("run/v1", 9)).ok());
  EXPECT_FALSE(
      RestoreRegionReport(store_.get(), "run/v1", 9, 77, 1, (dir_ / "missing.safetensors").string())
          .ok());
  EXPECT_FALSE(GetRegionReport(store_.get(), "run/v1", 9, 77, 1).has_value());
}

// With the run's credentials the sender counts a region report only when its rank signed it: an
// unsigned one (what a stranger with write access to the store can plant), one signed by another
// rank (a tree node speaking for a region receiver) and an altered one are refused, with why.
TEST_F(RegionStoreTest, SignedRegionReportsCountOnlyForTheirOwnRank) {
  const std::string keys = (dir_ / "keys").string();
  auto id = NewRunId();
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(WriteRunCredentials(keys, *id, TreeRoles({-1, 0}), 1, false).ok());
  ASSERT_TRUE(WriteExtraCredential(keys, "receiver", 9, "node-9", 1).ok());
  auto load = [&](int rank) {
    auto c = TlsContext::Load(keys + "/ca.crt", keys + "/node-" + std::to_string(rank) + ".crt",
                              keys + "/node-" + std::to_string(rank) + ".key");
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? *c : nullptr;
  };
  auto sender = load(0), tree = load(1), region = load(9);
  ASSERT_TRUE(sender && tree && region);
  const Hash128 h{5, 6};
  std::string why;
  // Unsigned: refused.
  ASSERT_TRUE(PutRegionReport(store_.get(), "run/v1", 9, 77, 1, h, std::nullopt).ok());
  EXPECT_FALSE(GetRegionReport(store_.get(), "run/v1", 9, 77, 1, sender.get(), &why).has_value());
  EXPECT_NE(why.find("not signed"), std::string::npos) << why;
  // Signed by rank 1 for rank 9: refused.
  ASSERT_TRUE(PutRegionReport(store_.get(), "run/v1", 9, 77, 1, h, std::nullopt, tree.get()).ok());
  why.clear();
  EXPECT_FALSE(GetRegionReport(store_.get(), "run/v1", 9, 77, 1, sender.get(), &why).has_value());
  EXPECT_NE(why.find("rank 9"), std::string::npos) << why;
  std::vector<std::string> refused;
  EXPECT_TRUE(
      CollectRegionReports(store_.get(), "run/v1", 77, 1, 2, {9}, 0.05, sender.get(), &refused)
          .empty());
  ASSERT_EQ(refused.size(), 1u);  // once per rank, however often it polled
  EXPECT_EQ(refused[0].rfind("9: ", 0), 0u) << refused[0];
  // Signed by rank 9 itself: taken.
  ASSERT_TRUE(
      PutRegionReport(store_.get(), "run/v1", 9, 77, 1, h, std::nullopt, region.get()).ok());
  auto got = GetRegionReport(store_.get(), "run/v1", 9, 77, 1, sender.get(), &why);
  ASSERT_TRUE(got.has_value()) << why;
  EXPECT_EQ(got->target_hash, h);
  EXPECT_EQ(CollectRegionReports(store_.get(), "run/v1", 77, 1, 2, {9}, 0.05, sender.get()).size(),
            1u);
  // The same record with one byte of its body changed (the hash it claims): refused.
  auto bytes = store_->Get(RegionReportKey("run/v1", 9));
  ASSERT_TRUE(bytes.ok());
  (*bytes)[4 + 24] ^= 1;  // body: rank, code, run, version, then the hash
  ASSERT_TRUE(store_->Put(RegionReportKey("run/v1", 9), bytes->data(), bytes->size()).ok());
  EXPECT_FALSE(GetRegionReport(store_.get(), "run/v1", 9, 77, 1, sender.get(), &why).has_value());
}

// A recovering holder serves a frame from its committed checkpoint file: bit-exact against the
// version, checked against its trailer as any frame.
TEST_F(RegionStoreTest, FrameFromACommittedCheckpointFile) {
  NodePlan plan;
  NodeVersion v;
  v.version = 1;
  v.prefix = "run/v1";
  plan.versions.push_back(v);
  ASSERT_TRUE(store_->Put(FullFrameRequestKey("run", 9), "x", 1).ok());
  auto served = ServeFullFrameRequestsFromCheckpoint(store_.get(), plan, "run/v1", paths_[1]);
  ASSERT_TRUE(served.ok()) << served.status().ToString();
  EXPECT_EQ(*served, 1);
  uint64_t bytes = 0;
  auto joiner = FetchFullFrame(store_.get(), "run/v1", 1, &bytes);
  ASSERT_TRUE(joiner.ok()) << joiner.status().ToString();
  EXPECT_TRUE(VerifyFile(**joiner, paths_[1]).ok());
  // The base's file is not version 1: refused by the fetcher.
  ASSERT_TRUE(PutFullFrameOfCheckpoint(store_.get(), "run/v1", paths_[0]).ok());
  EXPECT_TRUE(FetchFullFrame(store_.get(), "run/v1", 1, &bytes).status().IsDataLoss());
}

TEST(SenderJointCommitTest, SilentReceiverIsDeclaredDeadAndReadmittedByAReport) {
  const VersionId v0{0, Hash128{1, 1}};
  const VersionId v1{1, Hash128{2, 2}};
  const VersionId v2{2, Hash128{3, 3}};
  SenderJointCommit jc({1, 2, 8}, v0);
  auto report = [](int rank, const VersionId& v) {
    CommitReport r;
    r.rank = rank;
    r.version = v.number;
    r.target_hash = v.hash;
    r.ok = true;
    return r;
  };
  // Rank 8 is silent at version 1: declared dead, the baseline moves on without it.
  std::vector<int> back;
  auto dead = jc.Published(v0, v1, {report(1, v1), report(2, v1)}, std::nullopt, &back);
  ASSERT_TRUE(dead.ok());
  ASSERT_EQ(dead->size(), 1u);
  EXPECT_EQ((*dead)[0].first, 8);
  EXPECT_TRUE(back.empty());
  EXPECT_EQ(jc.baseline().number, 1u);
  // It caught up and reports version 2 (and a late joiner, rank 9, too): both count again.
  dead = jc.Published(v1, v2, {report(1, v2), report(2, v2), report(8, v2), report(9, v2)},
                      std::nullopt, &back);
  ASSERT_TRUE(dead.ok());
  EXPECT_TRUE(dead->empty());
  EXPECT_EQ(back, (std::vector<int>{8, 9}));
  EXPECT_EQ(jc.live(), (std::vector<int>{1, 2, 8, 9}));
  // A report of the wrong hash does not readmit.
  SenderJointCommit other({1}, v0);
  CommitReport bad = report(5, v1);
  bad.target_hash = Hash128{9, 9};
  back.clear();
  ASSERT_TRUE(other.Published(v0, v1, {report(1, v1), bad}, std::nullopt, &back).ok());
  EXPECT_TRUE(back.empty());
}

}  // namespace
}  // namespace dcr::internal
