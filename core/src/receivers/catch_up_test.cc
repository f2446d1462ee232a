// Catch-up: composition of consecutive deltas and the full-frame fallback.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "dcr/journal.h"
#include "dcr/testing/fault_test_util.h"
#include "dcr/versioning.h"
#include "receivers/value_ops.h"

namespace dcr {
namespace {

using testing::DeltaBytes;
using testing::MakeCheckpoint;
using testing::Model;
using testing::NextVersion;
using testing::RandomModel;
using testing::SmallGrid;
using testing::Storage;

TEST(ValueOpsTest, InverseUndoesEveryRelativeOp) {
  std::mt19937_64 rng(3);
  for (int w : {1, 2, 4, 8}) {
    const uint64_t m = internal::WidthMask(w);
    for (int i = 0; i < 20000; ++i) {
      uint64_t x = rng() & m;
      uint64_t v = (i % 3 == 0) ? (rng() & 7) : (rng() & m);
      for (ValueMode mode : {ValueMode::kXor, ValueMode::kUlpDelta}) {
        uint64_t y = ApplyValue(mode, w, x, v);
        ASSERT_EQ(internal::InverseValue(mode, w, y, v), x) << "w" << w << " mode " << int(mode);
      }
    }
  }
}

struct Chain {
  std::vector<Model> models;
  std::vector<std::unique_ptr<Checkpoint>> ckpts;
  std::vector<std::unique_ptr<DeltaReader>> deltas;  // deltas[i]: v_i -> v_{i+1}
  Chain(int k, ValuePolicy policy, bool with_revert) {
    models.push_back(RandomModel(77));
    for (int i = 1; i <= k; ++i) {
      if (with_revert && i == 3) {
        models.push_back(models[1]);  // v3 == v1 bitwise: every change of d1, d2 cancels
      } else {
        models.push_back(NextVersion(models.back(), 100 + i, 0.02));
      }
    }
    for (auto& m : models) ckpts.push_back(MakeCheckpoint(m));
    for (int i = 0; i < k; ++i) {
      DeltaOptions o = SmallGrid(i, i + 1);
      o.value_policy = policy;
      auto r = DeltaReader::FromBytes(DeltaBytes(ckpts[i].get(), *ckpts[i + 1], o));
      EXPECT_TRUE(r.ok()) << r.status();
      deltas.push_back(std::move(r).value());
    }
  }
  std::vector<const DeltaReader*> Range(int from, int to) const {
    std::vector<const DeltaReader*> v;
    for (int i = from; i < to; ++i) v.push_back(deltas[i].get());
    return v;
  }
};

// Applies a delta to storage loaded from `base` through a journaled receiver and commits.
void ApplyAndCommit(const DeltaReader& d, const Checkpoint& base, const Checkpoint& want) {
  testing::TempDir dir;
  auto j = ReceiverJournal::Open(dir / "j");
  ASSERT_TRUE(j.ok());
  ASSERT_TRUE((*j)->RecordCommitted({d.header().base_version, base.ContentHash(1)}).ok());
  Storage s = Storage::Load(base);
  BufferReceiver inner(s.Tensors(), {d.header().base_version, base.ContentHash(1)});
  JournaledReceiver ja(&inner, j->get());
  ASSERT_TRUE(BeginDelta(d, &ja).ok());
  for (size_t i = 0; i < d.num_chunks(); ++i) {
    ASSERT_TRUE(ja.ApplyRecord(d.chunk_data(i), d.chunk_size(i)).ok());
  }
  Status v = CommitDelta(d, &ja);
  ASSERT_TRUE(v.ok()) << v;
  EXPECT_TRUE(s.Equals(want));
}

void ComposeCase(ValuePolicy policy) {
  Chain c(5, policy, /*with_revert=*/false);
  for (int from = 0; from < 4; ++from) {
    DeltaMemorySink sink;
    auto st = ComposeDeltas(c.Range(from, 5), *c.ckpts[5], SmallGrid(0, 0), &sink);
    ASSERT_TRUE(st.ok()) << st.status();
    EXPECT_FALSE(st->full_frame);
    EXPECT_EQ(st->composed, 5 - from);
    auto r = DeltaReader::FromBytes(sink.Release());
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ((*r)->header().base_version, static_cast<uint64_t>(from));
    EXPECT_EQ((*r)->header().target_version, 5u);
    EXPECT_EQ((*r)->trailer().target_hash, c.ckpts[5]->ContentHash(1));
    ApplyAndCommit(**r, *c.ckpts[from], *c.ckpts[5]);
    // The composition is exactly the direct delta's change set (same positions and bits).
    DeltaOptions o = SmallGrid(from, 5);
    o.value_policy = policy;
    auto direct = DeltaReader::FromBytes(DeltaBytes(c.ckpts[from].get(), *c.ckpts[5], o));
    ASSERT_TRUE(direct.ok());
    uint64_t direct_changes = 0;
    for (size_t i = 0; i < (*direct)->num_chunks(); ++i) {
      direct_changes += (*direct)->Decode(i)->header.num_changes;
    }
    EXPECT_EQ(st->changes, direct_changes);
    EXPECT_TRUE((*r)->size() == (*direct)->size() &&
                std::equal((*r)->data(), (*r)->data() + (*r)->size(), (*direct)->data()))
        << "the composed delta should be byte-identical to the direct one";
  }
}

TEST(CatchUpTest, ComposedUlpDeltasApplyBitExact) { ComposeCase(ValuePolicy::kAuto); }
TEST(CatchUpTest, ComposedXorDeltasApplyBitExact) { ComposeCase(ValuePolicy::kXor); }

TEST(CatchUpTest, ChangesThatRevertCancel) {
  Chain c(4, ValuePolicy::kAuto, /*with_revert=*/true);
  DeltaMemorySink sink;
  auto st = ComposeDeltas(c.Range(1, 3), *c.ckpts[3], SmallGrid(0, 0), &sink);
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->changes, 0u);
  EXPECT_GT(st->cancelled, 0u);
  auto r = DeltaReader::FromBytes(sink.Release());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->num_chunks(), 0u);
  ApplyAndCommit(**r, *c.ckpts[1], *c.ckpts[3]);
}

TEST(CatchUpTest, RefusesBrokenChains) {
  Chain c(4, ValuePolicy::kAuto, false);
  DeltaMemorySink sink;
  std::vector<const DeltaReader*> gap = {c.deltas[0].get(), c.deltas[2].get()};
  EXPECT_TRUE(ComposeDeltas(gap, *c.ckpts[3], SmallGrid(0, 0), &sink).status().IsInvalidArgument());
  DeltaMemorySink sink2;
  EXPECT_TRUE(ComposeDeltas(c.Range(0, 2), *c.ckpts[3], SmallGrid(0, 0), &sink2)
                  .status()
                  .IsFailedPrecondition());  // wrong target checkpoint
  DeltaMemorySink sink3;
  EXPECT_TRUE(ComposeDeltas({}, *c.ckpts[3], SmallGrid(0, 0), &sink3).status().IsInvalidArgument());
}

TEST(CatchUpTest, FallsBackToAFullFramePastTheThreshold) {
  Chain c(4, ValuePolicy::kAuto, false);
  CatchUpOptions o;
  o.delta_options = SmallGrid(0, 0);
  o.max_compose = 2;
  DeltaMemorySink sink;
  auto st = BuildCatchUp(c.Range(0, 4), *c.ckpts[4], o, &sink);
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_TRUE(st->full_frame);
  auto r = DeltaReader::FromBytes(sink.Release());
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE((*r)->header().flags & kFlagNoBase);
  EXPECT_EQ((*r)->header().target_version, 4u);
  // Within the threshold: composed.
  o.max_compose = 8;
  DeltaMemorySink sink2;
  auto st2 = BuildCatchUp(c.Range(1, 4), *c.ckpts[4], o, &sink2);
  ASSERT_TRUE(st2.ok());
  EXPECT_FALSE(st2->full_frame);
  // Byte threshold.
  o.full_frame_fraction = 0.0001;
  DeltaMemorySink sink3;
  auto st3 = BuildCatchUp(c.Range(1, 4), *c.ckpts[4], o, &sink3);
  ASSERT_TRUE(st3.ok());
  EXPECT_TRUE(st3->full_frame);
}

}  // namespace
}  // namespace dcr
