// Real process kills: a child process applies a delta through JournaledReceiver into storage that
// lives in a shared file mapping (standing in for device memory of a surviving serving process)
// and is killed with SIGKILL inside a chunk or between chunks. The parent then restarts the
// receiver from the journal as its RecoveryPolicy decides (reload the committed version when the
// storage was lost; the overwrite form of every refused doubtful chunk), commits, and compares
// the storage byte for byte with the target.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "dcr/journal.h"
#include "dcr/recovery_policy.h"
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
using testing::TempDir;

// Tensors of the inventory back to back in one MAP_SHARED file mapping.
class SharedStorage {
 public:
  SharedStorage(const std::string& path, const Inventory& inv) : inv_(inv) {
    for (const TensorInfo& t : inv.tensors) {
      offsets_.push_back(size_);
      size_ += t.nbytes;
    }
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
    EXPECT_GE(fd_, 0);
    EXPECT_EQ(::ftruncate(fd_, static_cast<off_t>(size_)), 0);
    void* m = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    EXPECT_NE(m, MAP_FAILED);
    data_ = static_cast<uint8_t*>(m);
  }
  ~SharedStorage() {
    ::munmap(data_, size_);
    ::close(fd_);
  }
  void Load(const Checkpoint& c) {
    for (size_t i = 0; i < inv_.tensors.size(); ++i) {
      const TensorInfo* t = c.Find(inv_.tensors[i].name);
      std::memcpy(data_ + offsets_[i], c.data(*t), t->nbytes);
    }
  }
  bool Equals(const Checkpoint& c) const {
    for (size_t i = 0; i < inv_.tensors.size(); ++i) {
      const TensorInfo* t = c.Find(inv_.tensors[i].name);
      if (std::memcmp(data_ + offsets_[i], c.data(*t), t->nbytes) != 0) return false;
    }
    return true;
  }
  std::vector<ReceiverTensor> Tensors() const {
    std::vector<ReceiverTensor> out;
    for (size_t i = 0; i < inv_.tensors.size(); ++i)
      out.push_back({inv_.tensors[i], data_ + offsets_[i]});
    return out;
  }
  std::vector<TensorBuffer> Buffers() const {
    std::vector<TensorBuffer> out;
    for (size_t i = 0; i < inv_.tensors.size(); ++i) {
      out.push_back({data_ + offsets_[i], inv_.tensors[i].num_elements(), inv_.tensors[i].width(),
                     inv_.salts[i]});
    }
    return out;
  }

 private:
  Inventory inv_;
  std::vector<uint64_t> offsets_;
  uint64_t size_ = 0;
  int fd_ = -1;
  uint8_t* data_ = nullptr;
};

// A BufferReceiver whose process dies inside the record of chunk `die_in`, half of its changes
// written.
class DyingReceiver : public BufferReceiver {
 public:
  DyingReceiver(std::vector<TensorBuffer> bufs, std::vector<ReceiverTensor> tensors, VersionId held,
                uint64_t die_in)
      : BufferReceiver(std::move(tensors), held), bufs_(std::move(bufs)), die_in_(die_in) {}
  Status ApplyRecord(const uint8_t* record, size_t size) override {
    auto dc = DecodeChunk(record, size);
    if (!dc.ok() || dc->header.chunk_id != die_in_)
      return BufferReceiver::ApplyRecord(record, size);
    const DecodedChunk& c = *dc;
    const ChunkHeader& h = c.header;
    SegmentCursor cur(h.segments);
    for (uint64_t k = 0; k < c.values.size() / 2; ++k) {
      uint32_t seg;
      uint64_t e;
      cur.Locate(h.position_mode == PositionMode::kDense ? k : c.positions[k], &seg, &e);
      const TensorBuffer& tb = bufs_[h.segments[seg].tensor_index];
      uint64_t v =
          ApplyValue(h.value_mode, h.elem_width, LoadBits(tb.data, h.elem_width, e), c.values[k]);
      std::memcpy(tb.data + e * h.elem_width, &v, h.elem_width);
    }
    ::raise(SIGKILL);
    return InternalError("unreachable");
  }

 private:
  std::vector<TensorBuffer> bufs_;
  uint64_t die_in_;
};

struct Case {
  const char* name;
  bool inside;       // killed inside chunk `at` (else right after chunk `at` is applied)
  double at_frac;    // position of `at` among the chunks
  bool lose_memory;  // the storage is lost with the process (reload + abandon)
};

class ProcessKill : public ::testing::TestWithParam<Case> {};

TEST_P(ProcessKill, RecoversBitExact) {
  const Case& kc = GetParam();
  Model m0 = RandomModel(31);
  auto c0 = MakeCheckpoint(m0);
  auto c1 = MakeCheckpoint(NextVersion(m0, 32, 0.05));
  DeltaOptions opts = SmallGrid(0, 1);
  auto delta = DeltaReader::FromBytes(DeltaBytes(c0.get(), *c1, opts));
  ASSERT_TRUE(delta.ok());
  const DeltaReader& d = **delta;
  const size_t n = d.num_chunks();
  const size_t at = std::min(n - 1, static_cast<size_t>(kc.at_frac * n));
  const uint64_t at_id = d.trailer().chunks[at].chunk_id;
  TempDir dir;
  const std::string jp = dir / "rx.journal";
  SharedStorage storage(dir / "device-memory", d.inventory());
  storage.Load(*c0);
  {
    auto j = ReceiverJournal::Open(jp);
    ASSERT_TRUE(j.ok());
    ASSERT_TRUE((*j)->RecordCommitted({0, c0->ContentHash(1)}).ok());
  }
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The receiver process. Exit codes: 3 = setup error, 4 = apply error, 5 = not killed.
    auto j = ReceiverJournal::Open(jp);
    if (!j.ok()) ::_exit(3);
    DyingReceiver inner(storage.Buffers(), storage.Tensors(), {0, c0->ContentHash(1)},
                        kc.inside ? at_id : ~uint64_t{0});
    JournaledReceiver ja(&inner, j->get());
    if (!BeginDelta(d, &ja).ok()) ::_exit(3);
    for (size_t i = 0; i < n; ++i) {
      if (!ja.ApplyRecord(d.chunk_data(i), d.chunk_size(i)).ok()) ::_exit(4);
      if (!kc.inside && i == at) ::raise(SIGKILL);
    }
    ::_exit(5);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status)) << "child exited with " << WEXITSTATUS(status);
  ASSERT_EQ(WTERMSIG(status), SIGKILL);
  EXPECT_FALSE(storage.Equals(*c1));

  // Restart.
  auto j = ReceiverJournal::Open(jp);
  ASSERT_TRUE(j.ok()) << j.status();
  JournalState st = (*j)->state();
  ASSERT_TRUE(st.in_flight.has_value());
  if (kc.inside) {
    EXPECT_EQ(st.doubtful.size(), 1u);
    EXPECT_EQ(st.doubtful.count(at_id), 1u);
    EXPECT_EQ(st.applied.size(), at);
  } else {
    EXPECT_EQ(st.applied.size() + st.doubtful.size(), at + 1);
  }
  RecoveryPolicy recovery(RecoveryRole::kReceiver, RecoveryOptions{});
  std::vector<recovery::Action> acts;
  const bool target_committed = st.committed && st.committed->hash == c1->ContentHash(1);
  recovery.Handle(
      0,
      recovery::Restarted{kc.lose_memory, target_committed, st.applied.size(), st.doubtful.size()},
      &acts);
  ASSERT_EQ(acts.size(), kc.lose_memory ? 2u : 1u);
  if (kc.lose_memory) {
    ASSERT_TRUE(std::holds_alternative<recovery::ReloadCommitted>(acts[0]));
    storage.Load(*c0);
    ASSERT_TRUE((*j)->AbandonDelta().ok());
  }
  ASSERT_TRUE(std::holds_alternative<recovery::SetTimer>(acts.back()));
  BufferReceiver inner(storage.Tensors(), {0, c0->ContentHash(1)});
  JournaledReceiver ja(&inner, j->get());
  ASSERT_TRUE(BeginDelta(d, &ja).ok());
  int repaired = 0;
  for (size_t i = 0; i < n; ++i) {
    Status s = ja.ApplyRecord(d.chunk_data(i), d.chunk_size(i));
    if (s.IsFailedPrecondition()) {
      const uint64_t id = d.trailer().chunks[i].chunk_id;
      ASSERT_EQ((*j)->Lookup(id, nullptr), JournalChunkState::kDoubtful);
      acts.clear();
      recovery.Handle(1, recovery::ChunkDoubtful{id}, &acts);
      ASSERT_EQ(acts.size(), 1u);
      const auto* req = std::get_if<recovery::RequestOverwrite>(&acts[0]);
      ASSERT_NE(req, nullptr);
      EXPECT_EQ(req->key, OverwriteKey(RecoveryOptions{}.prefix, id));
      auto ow = OverwriteChunkFromCheckpoints(*c0, *c1, opts, req->chunk_id);
      ASSERT_TRUE(ow.ok()) << ow.status();
      auto odc = DecodeChunk(ow->data(), ow->size());
      ASSERT_TRUE(odc.ok());
      s = ja.ApplyRecord(ow->data(), ow->size());
      ++repaired;
    }
    ASSERT_TRUE(s.ok()) << s;
  }
  EXPECT_EQ(repaired, kc.lose_memory ? 0 : static_cast<int>(st.doubtful.size()));
  Status v = CommitDelta(d, &ja);
  ASSERT_TRUE(v.ok()) << v;
  EXPECT_EQ(ja.held().hash, c1->ContentHash(1));
  EXPECT_TRUE(storage.Equals(*c1));
}

INSTANTIATE_TEST_SUITE_P(Kills, ProcessKill,
                         ::testing::Values(Case{"InsideFirstChunk", true, 0.0, false},
                                           Case{"InsideMiddleChunk", true, 0.5, false},
                                           Case{"InsideLastChunk", true, 0.99, false},
                                           Case{"AfterFirstChunk", false, 0.0, false},
                                           Case{"AfterMiddleChunk", false, 0.5, false},
                                           Case{"InsideChunkMemoryLost", true, 0.3, true},
                                           Case{"BetweenChunksMemoryLost", false, 0.6, true}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return std::string(i.param.name);
                         });

}  // namespace
}  // namespace dcr
