// DurableReceiver on "cpu" (host memory) and on a device (the host backend of dcr/device.h,
// which runs the device code over host memory): a commit writes the version log's records and
// marker (O(delta), no image), a restart after the commit recovers the target from the log,
// entries without their marker are the base again, ReloadCommitted restores the base over
// chunks written, the storage and its log carry into the next version of the same process, and
// the committed checkpoint made from the log is the dense target byte for byte.
#include "node/node_recovery.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <random>

#include "dcr/checkpoint.h"
#include "dcr/delta.h"
#include "dcr/device.h"
#include "node/version_state.h"

namespace dcr::internal {
namespace {

// The delta stream's blobs, concatenated (a whole delta as DeltaReader reads it).
class ConcatSink : public DeltaSink {
 public:
  Status OnHeader(const std::vector<uint8_t>& b) override { return Add(b); }
  Status OnChunk(const ChunkHeader&, const std::vector<uint8_t>& b) override { return Add(b); }
  Status OnTrailer(const std::vector<uint8_t>& b) override { return Add(b); }
  std::vector<uint8_t> bytes;

 private:
  Status Add(const std::vector<uint8_t>& b) {
    bytes.insert(bytes.end(), b.begin(), b.end());
    return Status();
  }
};

std::vector<uint8_t> FileBytes(const std::string& path) {
  auto b = ReadFile(path);
  EXPECT_TRUE(b.ok()) << path;
  return b.ok() ? *b : std::vector<uint8_t>();
}

class DurableTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("dcr-node-recovery-" + std::to_string(getpid()) + "-" +
            std::to_string(std::hash<std::string>()(
                ::testing::UnitTest::GetInstance()->current_test_info()->name())));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_ / "state" / "v1");
    std::mt19937_64 rng(5);
    std::vector<uint8_t> a(64 * 256 * 2), b(32 * 128 * 2);
    for (auto& x : a) x = static_cast<uint8_t>(rng());
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    for (int k = 0; k < 2; ++k) {
      if (k == 1) {
        for (size_t i = 0; i < a.size(); i += 9) a[i] ^= 0x21;
        for (size_t i = 0; i < b.size(); i += 13) b[i] ^= 0x44;
      }
      std::vector<TensorView> views = {{"a", "BF16", {64, 256}, a.data(), a.size()},
                                       {"b", "BF16", {32, 128}, b.data(), b.size()}};
      paths_.push_back((dir_ / ("v" + std::to_string(k) + ".safetensors")).string());
      ASSERT_TRUE(WriteSafetensors(paths_.back(), views).ok());
    }
    auto base = Checkpoint::Open(paths_[0]);
    auto target = Checkpoint::Open(paths_[1]);
    ASSERT_TRUE(base.ok() && target.ok());
    target_hash_ = (*target)->ContentHash(0);
    DeltaOptions o;
    o.chunk_elems = 2048;
    o.base_version = 0;
    o.target_version = 1;
    ConcatSink sink;
    ASSERT_TRUE(BuildDelta(base->get(), **target, o, &sink).ok());
    auto reader = DeltaReader::FromBytes(std::move(sink.bytes));
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    reader_ = std::move(*reader);
    ASSERT_GT(reader_->num_chunks(), 2u);
    plan_.rank = 3;
    plan_.method = "delta";
    plan_.state_dir =
        VersionStateDir((dir_ / "state").string(), 1);  // version 1's, as a long-lived node has it
    plan_.receiver_base_path = paths_[0];
    plan_.version = 1;
    if (GetParam()) device_ = MakeHostDevice();  // else "cpu": host memory
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<DurableReceiver> Open(int starts) {
    auto r = DurableReceiver::Open(plan_, device_, starts, nullptr);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(*r) : nullptr;
  }
  std::string LogDir() const { return plan_.state_dir + "/rank-3.vlog"; }

  std::filesystem::path dir_;
  std::vector<std::string> paths_;
  std::unique_ptr<DeltaReader> reader_;
  Hash128 target_hash_;
  NodePlan plan_;
  std::shared_ptr<Device> device_;
};

TEST_P(DurableTest, CommitLogsTheDeltaAndARestartRecoversTheTargetFromTheLog) {
  {
    auto r = Open(1);
    ASSERT_NE(r, nullptr);
    EXPECT_FALSE(r->target_committed());
    const uint64_t first_image = r->image_bytes();
    ASSERT_TRUE(ApplyDelta(*reader_, r->receiver()).ok());
    // The commit wrote the version's records and marker, and no image (none is due).
    EXPECT_GT(r->log_bytes(), 0u);
    EXPECT_LT(r->log_bytes(), reader_->size() + reader_->num_chunks() * 64 + 1024);
    EXPECT_EQ(r->image_bytes(), first_image);
  }
  // The process is gone with its storage; the log holds version 1 committed.
  auto r = Open(2);
  ASSERT_NE(r, nullptr);
  EXPECT_TRUE(r->target_committed());
  EXPECT_TRUE(r->restart_event().storage_lost);
  EXPECT_FALSE(r->storage_reattached());
  EXPECT_GT(r->restore_s(), 0.0);
  EXPECT_EQ(r->receiver()->held().number, 1u);
  EXPECT_EQ(r->receiver()->held().hash, target_hash_);
  Status v = VerifyFile(*r->receiver(), paths_[1]);
  EXPECT_TRUE(v.ok()) << v.ToString();
}

TEST_P(DurableTest, EntriesWithoutTheirMarkerAreTheBaseAgain) {
  {
    auto r = Open(1);
    ASSERT_NE(r, nullptr);
    ASSERT_TRUE(BeginDelta(*reader_, r->receiver()).ok());
    for (size_t i = 0; i < reader_->num_chunks(); ++i) {
      ASSERT_TRUE(r->receiver()->ApplyRecord(reader_->chunk_data(i), reader_->chunk_size(i)).ok());
    }
  }
  // Killed with every chunk logged and no commit: the base again.
  auto r = Open(2);
  ASSERT_NE(r, nullptr);
  EXPECT_FALSE(r->target_committed());
  EXPECT_EQ(r->receiver()->held().number, 0u);
  Status v = VerifyFile(*r->receiver(), paths_[0]);
  EXPECT_TRUE(v.ok()) << v.ToString();
  // The delta applies again from the start and commits the target.
  ASSERT_TRUE(r->ReloadCommitted().ok());
  Status a = ApplyDelta(*reader_, r->receiver());
  ASSERT_TRUE(a.ok()) << a.ToString();
  r.reset();
  r = Open(3);
  ASSERT_NE(r, nullptr);
  EXPECT_TRUE(r->target_committed());
  v = VerifyFile(*r->receiver(), paths_[1]);
  EXPECT_TRUE(v.ok()) << v.ToString();
}

TEST_P(DurableTest, ReloadCommittedRestoresTheBaseOverWrittenChunks) {
  auto r = Open(1);
  ASSERT_NE(r, nullptr);
  ASSERT_TRUE(BeginDelta(*reader_, r->receiver()).ok());
  for (size_t i = 0; i < reader_->num_chunks(); i += 2) {
    ASSERT_TRUE(r->receiver()->ApplyRecord(reader_->chunk_data(i), reader_->chunk_size(i)).ok());
  }
  EXPECT_FALSE(VerifyFile(*r->receiver(), paths_[0]).ok());  // the storage holds a mix
  r->receiver()->Abort();
  ASSERT_TRUE(r->ReloadCommitted().ok());
  Status v = VerifyFile(*r->receiver(), paths_[0]);
  EXPECT_TRUE(v.ok()) << v.ToString();
  Status a = ApplyDelta(*reader_, r->receiver());
  ASSERT_TRUE(a.ok()) << a.ToString();
  v = VerifyFile(*r->receiver(), paths_[1]);
  EXPECT_TRUE(v.ok()) << v.ToString();
}

TEST_P(DurableTest, OverwriteFormIsBuiltFromTheBaseTheLogHolds) {
  auto r = Open(1);
  ASSERT_NE(r, nullptr);
  ASSERT_TRUE(BeginDelta(*reader_, r->receiver()).ok());
  auto ow = r->OverwriteForm(reader_->chunk_data(0), reader_->chunk_size(0));
  ASSERT_TRUE(ow.ok()) << ow.status().ToString();
  ASSERT_TRUE(r->receiver()->ApplyRecord(ow->data(), ow->size()).ok());
  for (size_t i = 1; i < reader_->num_chunks(); ++i) {
    ASSERT_TRUE(r->receiver()->ApplyRecord(reader_->chunk_data(i), reader_->chunk_size(i)).ok());
  }
  ASSERT_TRUE(CommitDelta(*reader_, r->receiver()).ok());
  r.reset();
  r = Open(2);  // the overwrite form replays from the log as applied
  ASSERT_NE(r, nullptr);
  Status v = VerifyFile(*r->receiver(), paths_[1]);
  EXPECT_TRUE(v.ok()) << v.ToString();
}

TEST_P(DurableTest, CommittedStorageCarriesIntoTheNextVersionAndMaterializesTheTarget) {
  // A long-lived node's state: versions 1 and 2, the receiver's log in the node's state_dir.
  NodePlan lp = plan_;
  lp.state_dir = (dir_ / "state").string();
  std::filesystem::permissions(lp.state_dir, std::filesystem::perms::owner_all,
                               std::filesystem::perm_options::replace);
  lp.versions = {NodeVersion{}, NodeVersion{}};
  lp.versions[0].version = 1;
  lp.versions[1].version = 2;
  auto rec = VersionRecovery::Open(lp);
  ASSERT_TRUE(rec.ok()) << rec.status().ToString();
  NodePlan p1 = plan_;
  (*rec)->Prepare(lp.versions[0], 0, &p1);
  std::unique_ptr<HeldStorage> carried;
  {
    auto r = DurableReceiver::Open(p1, device_, 1, nullptr);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_TRUE(ApplyDelta(*reader_, (*r)->receiver()).ok());
    carried = (*r)->TakeStorage();
    ASSERT_NE(carried, nullptr);
  }
  ASSERT_TRUE((*rec)->Done(p1).ok());
  // Version 2's receiver holds version 1 from the carried storage (nothing loaded), its base
  // path the layout.
  NodePlan p2 = plan_;
  (*rec)->Prepare(lp.versions[1], 1, &p2);
  EXPECT_EQ(p2.receiver_base_path, paths_[0]);
  EXPECT_EQ(p2.base_version, 1);
  auto r = DurableReceiver::Open(p2, device_, 1, nullptr, std::move(carried));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE((*r)->device_carried());
  EXPECT_EQ((*r)->restore_s(), 0.0);
  EXPECT_EQ((*r)->receiver()->held().hash, target_hash_);
  Status v = VerifyFile(*(*r)->receiver(), paths_[1]);
  EXPECT_TRUE(v.ok()) << v.ToString();
  // The committed checkpoint of version 1, made from the log: the dense target byte for byte.
  auto path = (*rec)->MaterializeHeld(1);
  ASSERT_TRUE(path.ok()) << path.status().ToString();
  EXPECT_EQ(FileBytes(*path), FileBytes(paths_[1]));
  auto held = (*rec)->HeldPath();
  ASSERT_TRUE(held.ok());
  EXPECT_EQ(*held, *path);
  // A version the log does not hold is refused.
  EXPECT_EQ((*rec)->MaterializeHeld(2).status().code(), StatusCode::kFailedPrecondition);
}

TEST_P(DurableTest, ALogThatCannotRecoverTheHeldVersionIsNeverReplacedByTheLayoutsBytes) {
  // A long-lived node holding version 1 in its log; its base path for version 2 is the layout
  // (version 0's bytes).
  NodePlan lp = plan_;
  lp.state_dir = (dir_ / "state").string();
  std::filesystem::permissions(lp.state_dir, std::filesystem::perms::owner_all,
                               std::filesystem::perm_options::replace);
  lp.versions = {NodeVersion{}, NodeVersion{}};
  lp.versions[0].version = 1;
  lp.versions[1].version = 2;
  auto rec = VersionRecovery::Open(lp);
  ASSERT_TRUE(rec.ok()) << rec.status().ToString();
  NodePlan p1 = plan_;
  (*rec)->Prepare(lp.versions[0], 0, &p1);
  {
    auto r = DurableReceiver::Open(p1, device_, 1, nullptr);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_TRUE(ApplyDelta(*reader_, (*r)->receiver()).ok());
  }
  ASSERT_TRUE((*rec)->Done(p1).ok());
  NodePlan p2 = plan_;
  (*rec)->Prepare(lp.versions[1], 1, &p2);
  ASSERT_EQ(p2.receiver_base_path, paths_[0]);
  ASSERT_EQ(p2.base_version, 1);
  // The log's image no longer fits what the log records: the log cannot recover version 1.
  const std::string image = p2.version_log_dir + "/image-0";
  {
    std::FILE* f = std::fopen(image.c_str(), "ab");
    ASSERT_NE(f, nullptr);
    std::fputc(0, f);
    std::fclose(f);
  }
  const std::vector<uint8_t> log_before = FileBytes(p2.version_log_dir + "/log");
  const std::vector<uint8_t> image_before = FileBytes(image);
  // A restart in version 2: the layout's bytes are not version 1, so nothing holds them as it.
  auto r = DurableReceiver::Open(p2, device_, 2, nullptr);
  ASSERT_FALSE(r.ok()) << "held " << (*r)->receiver()->held().ToString();
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().ToString();
  EXPECT_NE(r.status().message().find("refusing to hold other bytes as version 1"),
            std::string::npos)
      << r.status().ToString();
  EXPECT_NE(r.status().message().find(paths_[0]), std::string::npos) << r.status().ToString();
  // The log is left as it is.
  EXPECT_EQ(FileBytes(p2.version_log_dir + "/log"), log_before);
  EXPECT_EQ(FileBytes(image), image_before);
  // A file that is version 1 (its committed checkpoint) takes the log's place.
  p2.receiver_base_path = paths_[1];
  auto held = DurableReceiver::Open(p2, device_, 2, nullptr);
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  EXPECT_EQ((*held)->receiver()->held(), (VersionId{1, target_hash_}));
  Status v = VerifyFile(*(*held)->receiver(), paths_[1]);
  EXPECT_TRUE(v.ok()) << v.ToString();
}

TEST_P(DurableTest, StorageWithUncommittedChunksIsNotCarried) {
  auto r = Open(1);
  ASSERT_NE(r, nullptr);
  ASSERT_TRUE(BeginDelta(*reader_, r->receiver()).ok());
  ASSERT_TRUE(r->receiver()->ApplyRecord(reader_->chunk_data(0), reader_->chunk_size(0)).ok());
  r->receiver()->Abort();
  EXPECT_EQ(r->TakeStorage(), nullptr);  // it holds neither the base nor a committed version
  r.reset();
  // Storage that holds a version other than the base (a committed version 1, carried to a
  // receiver of version 0) is freed, and the base loaded again.
  std::unique_ptr<HeldStorage> other;
  {
    auto v1 = Open(1);
    ASSERT_NE(v1, nullptr);
    ASSERT_TRUE(ApplyDelta(*reader_, v1->receiver()).ok());
    other = v1->TakeStorage();
    ASSERT_NE(other, nullptr);
    ASSERT_EQ(other->held().hash, target_hash_);
  }
  auto again = DurableReceiver::Open(plan_, device_, 1, nullptr, std::move(other));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_FALSE((*again)->device_carried());
  Status v = VerifyFile(*(*again)->receiver(), paths_[0]);
  EXPECT_TRUE(v.ok()) << v.ToString();
}

INSTANTIATE_TEST_SUITE_P(CpuAndDevice, DurableTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? std::string("Device") : std::string("Cpu");
                         });

}  // namespace
}  // namespace dcr::internal
