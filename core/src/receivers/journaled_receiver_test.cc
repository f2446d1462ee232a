// JournaledReceiver + overwrite forms: interrupted chunks are repaired by overwrites only, every
// restart ends bit-exact, the ledger proves the version, the serving gate sees whole versions only.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "dcr/journal.h"
#include "dcr/testing/fault_test_util.h"
#include "dcr/versioning.h"

namespace dcr {
namespace {

using testing::DeltaBytes;
using testing::MakeCheckpoint;
using testing::Model;
using testing::NextVersion;
using testing::RandomModel;
using testing::SmallGrid;
using testing::Storage;
using testing::TempDir;

struct RecordingGate : ServingGate {
  std::vector<std::string> events;
  void ApplyStarted(const DeltaRef& d) override {
    events.push_back("start v" + std::to_string(d.target_number));
  }
  void VersionWhole(const VersionId& v) override {
    events.push_back("whole v" + std::to_string(v.number));
  }
};

struct Fixture {
  Model m0, m1;
  std::unique_ptr<Checkpoint> c0, c1;
  std::unique_ptr<DeltaReader> delta;
  DeltaOptions opts;
  Fixture(uint64_t seed, double rate, ValuePolicy policy = ValuePolicy::kAuto) {
    m0 = RandomModel(seed);
    m1 = NextVersion(m0, seed + 1, rate);
    c0 = MakeCheckpoint(m0);
    c1 = MakeCheckpoint(m1);
    opts = SmallGrid(0, 1);
    opts.value_policy = policy;
    auto r = DeltaReader::FromBytes(DeltaBytes(c0.get(), *c1, opts));
    EXPECT_TRUE(r.ok()) << r.status();
    delta = std::move(r).value();
  }
  VersionId v0() const { return VersionId{0, c0->ContentHash(1)}; }
};

TEST(JournaledReceiverTest, AppliesInAnyOrderWithDuplicatesAndCommits) {
  Fixture f(11, 0.03);
  ASSERT_GT(f.delta->num_chunks(), 10u);
  TempDir dir;
  auto j = ReceiverJournal::Open(dir / "j");
  ASSERT_TRUE(j.ok());
  ASSERT_TRUE((*j)->RecordCommitted(f.v0()).ok());
  Storage s = Storage::Load(*f.c0);
  BufferReceiver inner(s.Tensors(), f.v0());
  RecordingGate gate;
  JournaledReceiver ja(&inner, j->get(), &gate);
  ASSERT_TRUE(BeginDelta(*f.delta, &ja).ok());
  std::vector<size_t> order;
  for (size_t i = 0; i < f.delta->num_chunks(); ++i) order.push_back(i);
  for (size_t i = 0; i < f.delta->num_chunks(); i += 3) order.push_back(i);  // duplicates
  std::shuffle(order.begin(), order.end(), std::mt19937_64(5));
  for (size_t i : order) {
    ASSERT_TRUE(ja.ApplyRecord(f.delta->chunk_data(i), f.delta->chunk_size(i)).ok());
  }
  EXPECT_EQ(ja.stats().duplicates_skipped, (f.delta->num_chunks() + 2) / 3);
  EXPECT_EQ(ja.Ledger(), f.delta->trailer().target_hash);
  Status cs = CommitDelta(*f.delta, &ja);
  ASSERT_TRUE(cs.ok()) << cs;
  const VersionId v = ja.held();
  EXPECT_EQ(v.number, 1u);
  EXPECT_EQ(v.hash, f.c1->ContentHash(1));
  EXPECT_TRUE(s.Equals(*f.c1));
  EXPECT_EQ(s.ContentHash(), v.hash);
  EXPECT_EQ(gate.events, (std::vector<std::string>{"start v1", "whole v1"}));
  EXPECT_EQ(*(*j)->committed(), v);
  EXPECT_TRUE(ja.Verify(*f.c1).ok());
}

TEST(JournaledReceiverTest, RefusesAPayloadForAnotherBase) {
  Fixture f(12, 0.02);
  TempDir dir;
  auto j = ReceiverJournal::Open(dir / "j");
  ASSERT_TRUE(j.ok());
  VersionId other = f.v0();
  other.hash.lo += 1;
  ASSERT_TRUE((*j)->RecordCommitted(other).ok());
  Storage s = Storage::Load(*f.c0);
  BufferReceiver inner(s.Tensors(), other);
  JournaledReceiver ja(&inner, j->get());
  Status st = BeginDelta(*f.delta, &ja);
  EXPECT_TRUE(st.IsFailedPrecondition()) << st;
  EXPECT_NE(st.message().find("refused"), std::string::npos);
  EXPECT_TRUE(
      ja.ApplyRecord(f.delta->chunk_data(0), f.delta->chunk_size(0)).IsFailedPrecondition());
  EXPECT_TRUE(s.Equals(*f.c0));
}

TEST(JournaledReceiverTest, CommitNeedsEveryChunk) {
  Fixture f(13, 0.02);
  TempDir dir;
  auto j = ReceiverJournal::Open(dir / "j");
  ASSERT_TRUE(j.ok());
  ASSERT_TRUE((*j)->RecordCommitted(f.v0()).ok());
  Storage s = Storage::Load(*f.c0);
  BufferReceiver inner(s.Tensors(), f.v0());
  RecordingGate gate;
  JournaledReceiver ja(&inner, j->get(), &gate);
  ASSERT_TRUE(BeginDelta(*f.delta, &ja).ok());
  for (size_t i = 1; i < f.delta->num_chunks(); ++i) {
    ASSERT_TRUE(ja.ApplyRecord(f.delta->chunk_data(i), f.delta->chunk_size(i)).ok());
  }
  Status v = CommitDelta(*f.delta, &ja);
  EXPECT_TRUE(v.IsFailedPrecondition()) << v;
  EXPECT_EQ(ja.MissingChunks(f.delta->trailer()),
            std::vector<uint64_t>{f.delta->trailer().chunks[0].chunk_id});
  EXPECT_EQ(gate.events, (std::vector<std::string>{"start v1"}));  // never whole
  ASSERT_TRUE(ja.ApplyRecord(f.delta->chunk_data(0), f.delta->chunk_size(0)).ok());
  EXPECT_TRUE(CommitDelta(*f.delta, &ja).ok());
}

// The core repair scenario: the process dies inside chunk k (half of its changes written, the
// journal holds its Begin). After a restart, the XOR/ulp form of chunk k is refused; its overwrite
// form repairs it; the result is bit-exact and proven.
void InterruptAndRepair(ValuePolicy policy, bool overwrite_from_relative) {
  Fixture f(21, 0.05, policy);
  TempDir dir;
  std::string jp = dir / "j";
  Storage s = Storage::Load(*f.c0);
  const size_t n = f.delta->num_chunks();
  const size_t victim = n / 2;
  {
    auto j = ReceiverJournal::Open(jp);
    ASSERT_TRUE(j.ok());
    ASSERT_TRUE((*j)->RecordCommitted(f.v0()).ok());
    BufferReceiver inner(s.Tensors(), f.v0());
    JournaledReceiver ja(&inner, j->get());
    ASSERT_TRUE(BeginDelta(*f.delta, &ja).ok());
    for (size_t i = 0; i < victim; ++i)
      ASSERT_TRUE(ja.ApplyRecord(f.delta->chunk_data(i), f.delta->chunk_size(i)).ok());
    // What JournaledReceiver does before the inner apply, then the process dies mid-write.
    auto dc = f.delta->Decode(victim);
    ASSERT_TRUE(dc.ok());
    ASSERT_GT(dc->values.size(), 2u);
    JournalChunk jc;
    jc.mode = dc->header.value_mode;
    jc.version_delta = dc->header.version_delta;
    jc.target_change_hash = dc->header.target_change_hash;
    jc.target_range_hash = dc->header.target_range_hash;
    ASSERT_TRUE((*j)->BeginChunk(dc->header.chunk_id, jc).ok());
    testing::ApplyPartially(*dc, &s, dc->values.size() / 2);
  }
  // Restart: the storage survived (e.g. device memory), the journal is replayed.
  auto j = ReceiverJournal::Open(jp);
  ASSERT_TRUE(j.ok()) << j.status();
  BufferReceiver inner(s.Tensors(), f.v0());
  JournaledReceiver ja(&inner, j->get());
  ASSERT_TRUE(BeginDelta(*f.delta, &ja).ok());
  const uint64_t victim_id = f.delta->trailer().chunks[victim].chunk_id;
  EXPECT_EQ(ja.DoubtfulChunks(), std::vector<uint64_t>{victim_id});
  // Replaying the relative form is refused and writes nothing.
  Status replay = ja.ApplyRecord(f.delta->chunk_data(victim), f.delta->chunk_size(victim));
  EXPECT_TRUE(replay.IsFailedPrecondition()) << replay;
  EXPECT_NE(replay.message().find("overwrite"), std::string::npos);
  // Even without the journal, the inner applier refuses it (its base check fails).
  EXPECT_TRUE(inner.ApplyRecord(f.delta->chunk_data(victim), f.delta->chunk_size(victim))
                  .IsFailedPrecondition());
  // Duplicates of applied chunks are skipped.
  ASSERT_TRUE(ja.ApplyRecord(f.delta->chunk_data(0), f.delta->chunk_size(0)).ok());
  EXPECT_EQ(ja.stats().duplicates_skipped, 1u);
  // The overwrite form, built by the sender either way, gives the same bytes.
  auto ow_ck = OverwriteChunkFromCheckpoints(*f.c0, *f.c1, f.opts, victim_id);
  ASSERT_TRUE(ow_ck.ok()) << ow_ck.status();
  auto ow_rel = OverwriteChunkFromRelative(f.delta->chunk_data(victim), f.delta->chunk_size(victim),
                                           f.delta->inventory(), *f.c0, f.opts.zstd_level);
  ASSERT_TRUE(ow_rel.ok()) << ow_rel.status();
  EXPECT_EQ(*ow_ck, *ow_rel);
  const std::vector<uint8_t>& ow = overwrite_from_relative ? *ow_rel : *ow_ck;
  auto odc = DecodeChunk(ow.data(), ow.size());
  ASSERT_TRUE(odc.ok()) << odc.status();
  EXPECT_EQ(odc->header.value_mode, ValueMode::kAbsolute);
  ASSERT_TRUE(ja.ApplyRecord(ow.data(), ow.size()).ok());
  EXPECT_EQ(ja.stats().repaired, 1u);
  // Applying the overwrite twice is harmless (already applied: skipped).
  ASSERT_TRUE(ja.ApplyRecord(ow.data(), ow.size()).ok());
  for (size_t i = victim + 1; i < n; ++i)
    ASSERT_TRUE(ja.ApplyRecord(f.delta->chunk_data(i), f.delta->chunk_size(i)).ok());
  Status v = CommitDelta(*f.delta, &ja);
  ASSERT_TRUE(v.ok()) << v;
  EXPECT_TRUE(s.Equals(*f.c1));
  EXPECT_EQ(s.ContentHash(), f.c1->ContentHash(1));
}

TEST(JournaledReceiverTest, InterruptedUlpChunkRepairedByOverwriteFromCheckpoints) {
  InterruptAndRepair(ValuePolicy::kAuto, false);
}
TEST(JournaledReceiverTest, InterruptedXorChunkRepairedByOverwriteFromRelative) {
  InterruptAndRepair(ValuePolicy::kXor, true);
}

TEST(JournaledReceiverTest, OverwriteOfAnotherChunkIsRefused) {
  Fixture f(22, 0.05);
  TempDir dir;
  auto j = ReceiverJournal::Open(dir / "j");
  ASSERT_TRUE(j.ok());
  ASSERT_TRUE((*j)->RecordCommitted(f.v0()).ok());
  Storage s = Storage::Load(*f.c0);
  BufferReceiver inner(s.Tensors(), f.v0());
  JournaledReceiver ja(&inner, j->get());
  ASSERT_TRUE(BeginDelta(*f.delta, &ja).ok());
  auto dc = f.delta->Decode(1);
  JournalChunk jc;
  jc.mode = dc->header.value_mode;
  jc.target_change_hash = dc->header.target_change_hash;
  jc.target_range_hash = dc->header.target_range_hash;
  ASSERT_TRUE((*j)->BeginChunk(dc->header.chunk_id, jc).ok());
  // An overwrite built from a different target for the same chunk id.
  Model m2 = NextVersion(f.m0, 999, 0.05);
  auto c2 = MakeCheckpoint(m2);
  auto ow = OverwriteChunkFromCheckpoints(*f.c0, *c2, f.opts, dc->header.chunk_id);
  ASSERT_TRUE(ow.ok());
  auto odc = DecodeChunk(ow->data(), ow->size());
  ASSERT_TRUE(odc.ok());
  Status st = ja.ApplyRecord(ow->data(), ow->size());
  EXPECT_TRUE(st.IsFailedPrecondition()) << st;
  EXPECT_EQ(ja.stats().refused, 1u);
}

TEST(JournaledReceiverTest, OverwriteFromRelativeRefusesTheWrongBase) {
  Fixture f(23, 0.05);
  auto cw = MakeCheckpoint(NextVersion(f.m0, 5, 0.2));
  auto ow = OverwriteChunkFromRelative(f.delta->chunk_data(0), f.delta->chunk_size(0),
                                       f.delta->inventory(), *cw);
  EXPECT_TRUE(ow.status().IsFailedPrecondition()) << ow.status();
}

TEST(JournaledReceiverTest, StorageLostMeansAbandonAndRestartFromCommitted) {
  Fixture f(24, 0.03);
  TempDir dir;
  std::string jp = dir / "j";
  {
    auto j = ReceiverJournal::Open(jp);
    ASSERT_TRUE(j.ok());
    ASSERT_TRUE((*j)->RecordCommitted(f.v0()).ok());
    Storage s = Storage::Load(*f.c0);
    BufferReceiver inner(s.Tensors(), f.v0());
    JournaledReceiver ja(&inner, j->get());
    ASSERT_TRUE(BeginDelta(*f.delta, &ja).ok());
    for (size_t i = 0; i < 3; ++i)
      ASSERT_TRUE(ja.ApplyRecord(f.delta->chunk_data(i), f.delta->chunk_size(i)).ok());
  }  // process memory lost
  auto j = ReceiverJournal::Open(jp);
  ASSERT_TRUE(j.ok());
  ASSERT_TRUE((*j)->AbandonDelta().ok());  // storage reloaded from the committed version
  Storage s = Storage::Load(*f.c0);
  BufferReceiver inner(s.Tensors(), f.v0());
  JournaledReceiver ja(&inner, j->get());
  ASSERT_TRUE(BeginDelta(*f.delta, &ja).ok());
  for (size_t i = 0; i < f.delta->num_chunks(); ++i) {
    ASSERT_TRUE(ja.ApplyRecord(f.delta->chunk_data(i), f.delta->chunk_size(i)).ok());
  }
  ASSERT_TRUE(CommitDelta(*f.delta, &ja).ok());
  EXPECT_TRUE(s.Equals(*f.c1));
}

TEST(JournaledReceiverTest, NewReceiverJoinsWithAFullFrame) {
  Fixture f(25, 0.03);
  DeltaOptions o = f.opts;
  o.full = true;
  auto full = DeltaReader::FromBytes(DeltaBytes(nullptr, *f.c1, o));
  ASSERT_TRUE(full.ok()) << full.status();
  TempDir dir;
  auto j = ReceiverJournal::Open(dir / "j");
  ASSERT_TRUE(j.ok());
  Storage s = Storage::Load(*f.c0);
  for (auto& b : s.bufs) std::fill(b.begin(), b.end(), 0xEE);  // garbage, no version
  BufferReceiver inner(s.Tensors(), VersionId{});
  RecordingGate gate;
  JournaledReceiver ja(&inner, j->get(), &gate);
  ASSERT_TRUE(BeginDelta(**full, &ja).ok());
  for (size_t i = (*full)->num_chunks(); i-- > 0;) {
    ASSERT_TRUE(ja.ApplyRecord((*full)->chunk_data(i), (*full)->chunk_size(i)).ok());
  }
  Status cs = CommitDelta(**full, &ja);
  ASSERT_TRUE(cs.ok()) << cs;
  EXPECT_EQ(ja.held().hash, f.c1->ContentHash(1));
  EXPECT_TRUE(s.Equals(*f.c1));
  EXPECT_EQ(gate.events.back(), "whole v1");
}

}  // namespace
}  // namespace dcr
