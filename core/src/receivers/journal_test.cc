// ReceiverJournal: durability, replay, torn tails, state machine rules.
#include "dcr/journal.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "dcr/testing/fault_test_util.h"

namespace dcr {
namespace {

using testing::TempDir;

VersionId V(uint64_t n) { return VersionId{n, Hash128{n * 0x1111, n * 0x2222 + 7}}; }

DeltaRef D(uint64_t from, uint64_t to) {
  DeltaRef d;
  d.base = V(from);
  d.target_number = to;
  d.header_digest = 0xABCD0000 + to;
  return d;
}

JournalChunk C(uint64_t id) {
  JournalChunk c;
  c.mode = ValueMode::kUlpDelta;
  c.version_delta = Hash128{id, id + 1};
  c.target_change_hash = Hash128{id + 2, id + 3};
  c.target_range_hash = Hash128{id + 4, id + 5};
  return c;
}

std::vector<uint8_t> ReadAll(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)),
                              std::istreambuf_iterator<char>());
}
void WriteAllBytes(const std::string& p, const std::vector<uint8_t>& b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

TEST(JournalTest, FreshJournalThenCommitSurvivesReopen) {
  TempDir dir;
  std::string p = dir / "rx.journal";
  {
    auto j = ReceiverJournal::Open(p);
    ASSERT_TRUE(j.ok()) << j.status();
    EXPECT_FALSE((*j)->committed().has_value());
    ASSERT_TRUE((*j)->RecordCommitted(V(3)).ok());
  }
  auto j = ReceiverJournal::Open(p);
  ASSERT_TRUE(j.ok()) << j.status();
  ASSERT_TRUE((*j)->committed().has_value());
  EXPECT_EQ(*(*j)->committed(), V(3));
  EXPECT_EQ((*j)->state().torn_bytes, 0u);
}

TEST(JournalTest, BeginDeltaRefusesAnotherBase) {
  TempDir dir;
  auto j = ReceiverJournal::Open(dir / "j");
  ASSERT_TRUE(j.ok());
  EXPECT_TRUE((*j)->BeginDelta(D(1, 2)).IsFailedPrecondition());  // nothing committed
  ASSERT_TRUE((*j)->RecordCommitted(V(1)).ok());
  Status s = (*j)->BeginDelta(D(0, 2));
  EXPECT_TRUE(s.IsFailedPrecondition()) << s;
  EXPECT_NE(s.message().find("holds v1"), std::string::npos) << s;
  ASSERT_TRUE((*j)->BeginDelta(D(1, 2)).ok());
  EXPECT_TRUE((*j)->BeginDelta(D(1, 2)).ok());                    // resume: no-op
  EXPECT_TRUE((*j)->BeginDelta(D(1, 3)).IsFailedPrecondition());  // another delta in flight
  DeltaRef full;
  full.full_frame = true;
  full.target_number = 9;
  EXPECT_TRUE((*j)->BeginDelta(full).IsFailedPrecondition());  // still in flight
  ASSERT_TRUE((*j)->AbandonDelta().ok());
  EXPECT_TRUE((*j)->BeginDelta(full).ok());  // full frames need no base
}

TEST(JournalTest, ChunkBeginWithoutEndIsDoubtfulAfterRestart) {
  TempDir dir;
  std::string p = dir / "j";
  {
    auto j = ReceiverJournal::Open(p);
    ASSERT_TRUE(j.ok());
    ASSERT_TRUE((*j)->RecordCommitted(V(1)).ok());
    ASSERT_TRUE((*j)->BeginDelta(D(1, 2)).ok());
    for (uint64_t id : {0, 1, 2, 5}) ASSERT_TRUE((*j)->BeginChunk(id, C(id)).ok());
    ASSERT_TRUE((*j)->EndChunk(0).ok());
    ASSERT_TRUE((*j)->EndChunk(2).ok());
    ASSERT_TRUE((*j)->FailChunk(5).ok());
    // "crash": chunk 1 begun, never ended.
  }
  auto j = ReceiverJournal::Open(p);
  ASSERT_TRUE(j.ok()) << j.status();
  JournalState st = (*j)->state();
  ASSERT_TRUE(st.in_flight.has_value());
  EXPECT_EQ(*st.in_flight, D(1, 2));
  EXPECT_EQ(st.applied.size(), 2u);
  EXPECT_TRUE(st.applied.count(0) && st.applied.count(2));
  ASSERT_EQ(st.doubtful.size(), 1u);
  EXPECT_TRUE(st.doubtful.count(1));
  EXPECT_EQ(st.doubtful.at(1).version_delta, C(1).version_delta);
  EXPECT_EQ(st.failed.count(5), 1u);
  JournalChunk got;
  EXPECT_EQ((*j)->Lookup(1, &got), JournalChunkState::kDoubtful);
  EXPECT_EQ((*j)->Lookup(2, &got), JournalChunkState::kApplied);
  EXPECT_EQ((*j)->Lookup(5, &got), JournalChunkState::kNone);
}

// Group commit: ChunkBegin records are written at once and fsynced with their group; a process
// killed (SIGKILL) before any group sync loses none of them, so every begun chunk is doubtful and
// every ended one applied after the restart.
TEST(JournalTest, GroupCommitLosesNoRecordWhenTheProcessIsKilled) {
  TempDir dir;
  std::string p = dir / "j";
  JournalOptions o;
  o.group_commit = true;
  o.group_records = 1000;
  {
    auto j = ReceiverJournal::Open(p, o);
    ASSERT_TRUE(j.ok());
    ASSERT_TRUE((*j)->RecordCommitted(V(1)).ok());
    ASSERT_TRUE((*j)->BeginDelta(D(1, 2)).ok());
  }
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto j = ReceiverJournal::Open(p, o);
    if (!j.ok()) ::_exit(3);
    for (uint64_t id = 0; id < 40; ++id) {
      if (!(*j)->BeginChunk(id, C(id)).ok()) ::_exit(4);
      if (id % 2 == 0 && !(*j)->EndChunk(id).ok()) ::_exit(4);
    }
    ::raise(SIGKILL);
    ::_exit(5);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status)) << "child exited with " << WEXITSTATUS(status);
  auto j = ReceiverJournal::Open(p, o);
  ASSERT_TRUE(j.ok()) << j.status();
  JournalState st = (*j)->state();
  EXPECT_EQ(st.applied.size(), 20u);
  EXPECT_EQ(st.doubtful.size(), 20u);
  EXPECT_EQ(st.torn_bytes, 0u);
  for (uint64_t id = 0; id < 40; ++id) {
    EXPECT_EQ((*j)->Lookup(id, nullptr),
              id % 2 == 0 ? JournalChunkState::kApplied : JournalChunkState::kDoubtful);
  }
}

TEST(JournalTest, FailedRepairOfDoubtfulChunkStaysDoubtful) {
  TempDir dir;
  auto j = ReceiverJournal::Open(dir / "j");
  ASSERT_TRUE(j.ok());
  ASSERT_TRUE((*j)->RecordCommitted(V(1)).ok());
  ASSERT_TRUE((*j)->BeginDelta(D(1, 2)).ok());
  ASSERT_TRUE((*j)->BeginChunk(4, C(4)).ok());  // interrupted
  JournalChunk repair = C(4);
  repair.mode = ValueMode::kAbsolute;
  repair.absolute_repair = true;
  ASSERT_TRUE((*j)->BeginChunk(4, repair).ok());
  ASSERT_TRUE((*j)->FailChunk(4).ok());
  EXPECT_EQ((*j)->Lookup(4, nullptr), JournalChunkState::kDoubtful);
  ASSERT_TRUE((*j)->BeginChunk(4, repair).ok());
  ASSERT_TRUE((*j)->EndChunk(4).ok());
  EXPECT_EQ((*j)->Lookup(4, nullptr), JournalChunkState::kApplied);
}

TEST(JournalTest, EveryTornTailLengthReplaysToAPrefixState) {
  TempDir dir;
  std::string p = dir / "j";
  std::vector<size_t> record_ends;
  {
    auto j = ReceiverJournal::Open(p);
    ASSERT_TRUE(j.ok());
    record_ends.push_back(ReadAll(p).size());
    ASSERT_TRUE((*j)->RecordCommitted(V(1)).ok());
    record_ends.push_back(ReadAll(p).size());
    ASSERT_TRUE((*j)->BeginDelta(D(1, 2)).ok());
    record_ends.push_back(ReadAll(p).size());
    for (uint64_t id = 0; id < 3; ++id) {
      ASSERT_TRUE((*j)->BeginChunk(id, C(id)).ok());
      record_ends.push_back(ReadAll(p).size());
      ASSERT_TRUE((*j)->EndChunk(id).ok());
      record_ends.push_back(ReadAll(p).size());
    }
    ASSERT_TRUE((*j)->RecordCommitted(V(2)).ok());
    record_ends.push_back(ReadAll(p).size());
  }
  const std::vector<uint8_t> full = ReadAll(p);
  ASSERT_EQ(full.size(), record_ends.back());
  for (size_t cut = 0; cut <= full.size(); ++cut) {
    std::vector<uint8_t> prefix(full.begin(), full.begin() + cut);
    WriteAllBytes(p, prefix);
    auto j = ReceiverJournal::Open(p);
    ASSERT_TRUE(j.ok()) << "cut " << cut << ": " << j.status();
    JournalState st = (*j)->state();
    // Number of whole records in the prefix.
    size_t whole = 0;
    for (size_t i = 1; i < record_ends.size(); ++i) {
      if (record_ends[i] <= cut) whole = i;
    }
    EXPECT_EQ(st.records, whole) << "cut " << cut;
    size_t good = cut < record_ends[0] ? 0 : record_ends[whole];
    EXPECT_EQ(st.torn_bytes, cut - std::min(cut, good)) << "cut " << cut;
    // The file is usable again: append and reopen (every few cuts: each costs fsyncs).
    if (cut % 5 != 0 && cut != full.size()) continue;
    if (st.in_flight) {
      ASSERT_TRUE((*j)->AbandonDelta().ok());
    }
    ASSERT_TRUE((*j)->RecordCommitted(V(7)).ok()) << "cut " << cut;
    j->reset();
    auto j2 = ReceiverJournal::Open(p);
    ASSERT_TRUE(j2.ok()) << "cut " << cut << ": " << j2.status();
    EXPECT_EQ(*(*j2)->committed(), V(7));
    EXPECT_EQ((*j2)->state().torn_bytes, 0u);
  }
}

TEST(JournalTest, BitFlipInLastRecordTruncatesIt) {
  TempDir dir;
  std::string p = dir / "j";
  {
    auto j = ReceiverJournal::Open(p);
    ASSERT_TRUE(j.ok());
    ASSERT_TRUE((*j)->RecordCommitted(V(1)).ok());
    ASSERT_TRUE((*j)->RecordCommitted(V(2)).ok());
  }
  std::vector<uint8_t> b = ReadAll(p);
  b[b.size() - 12] ^= 0x10;  // inside the last record's payload
  WriteAllBytes(p, b);
  auto j = ReceiverJournal::Open(p);
  ASSERT_TRUE(j.ok());
  EXPECT_EQ(*(*j)->committed(), V(1));
  EXPECT_GT((*j)->state().torn_bytes, 0u);
}

TEST(JournalTest, NotAJournalIsDataLoss) {
  TempDir dir;
  std::string p = dir / "j";
  WriteAllBytes(p, std::vector<uint8_t>(64, 'x'));
  auto j = ReceiverJournal::Open(p);
  EXPECT_TRUE(j.status().IsDataLoss()) << j.status();
  EXPECT_NE(j.status().message().find(p), std::string::npos);
}

TEST(JournalTest, ContradictoryRecordsAreDataLoss) {
  TempDir dir;
  std::string p = dir / "j";
  {
    auto j = ReceiverJournal::Open(p);
    ASSERT_TRUE(j.ok());
    ASSERT_TRUE((*j)->RecordCommitted(V(1)).ok());
  }
  // Splice in a BeginChunk record with no delta in flight, with a valid checksum.
  std::vector<uint8_t> b = ReadAll(p);
  std::vector<uint8_t> other;
  {
    std::string q = dir / "k";
    auto k = ReceiverJournal::Open(q);
    ASSERT_TRUE(k.ok());
    ASSERT_TRUE((*k)->RecordCommitted(V(1)).ok());
    ASSERT_TRUE((*k)->BeginDelta(D(1, 2)).ok());
    size_t before = ReadAll(q).size();
    ASSERT_TRUE((*k)->BeginChunk(3, C(3)).ok());
    std::vector<uint8_t> kb = ReadAll(q);
    other.assign(kb.begin() + before, kb.end());
  }
  b.insert(b.end(), other.begin(), other.end());
  auto st = ReceiverJournal::Replay(b.data(), b.size());
  EXPECT_TRUE(st.status().IsDataLoss()) << st.status();
}

TEST(JournalTest, CompactKeepsTheState) {
  TempDir dir;
  std::string p = dir / "j";
  JournalOptions o;
  o.compact_bytes = 400;  // compacts on most commits
  {
    auto j = ReceiverJournal::Open(p, o);
    ASSERT_TRUE(j.ok());
    ASSERT_TRUE((*j)->RecordCommitted(V(1)).ok());
    for (uint64_t v = 1; v < 20; ++v) {
      ASSERT_TRUE((*j)->BeginDelta(D(v, v + 1)).ok());
      for (uint64_t id = 0; id < 4; ++id) {
        ASSERT_TRUE((*j)->BeginChunk(id, C(id)).ok());
        ASSERT_TRUE((*j)->EndChunk(id).ok());
      }
      ASSERT_TRUE((*j)->RecordCommitted(V(v + 1)).ok());
    }
    ASSERT_TRUE((*j)->BeginDelta(D(20, 21)).ok());
    ASSERT_TRUE((*j)->BeginChunk(0, C(0)).ok());
    ASSERT_TRUE((*j)->EndChunk(0).ok());
    ASSERT_TRUE((*j)->BeginChunk(1, C(1)).ok());
    JournalState before = (*j)->state();
    ASSERT_TRUE((*j)->Compact().ok());
    EXPECT_LT(ReadAll(p).size(), 400u);
    (void)before;
  }
  auto j = ReceiverJournal::Open(p, o);
  ASSERT_TRUE(j.ok()) << j.status();
  JournalState st = (*j)->state();
  EXPECT_EQ(*st.committed, V(20));
  EXPECT_EQ(*st.in_flight, D(20, 21));
  EXPECT_EQ(st.applied.size(), 1u);
  EXPECT_EQ(st.doubtful.size(), 1u);
  EXPECT_EQ(st.doubtful.at(1).target_change_hash, C(1).target_change_hash);
  EXPECT_FALSE(std::filesystem::exists(p + ".compact.tmp"));
}

}  // namespace
}  // namespace dcr
