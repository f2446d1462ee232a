// DurableReceiver on a device (the host backend of dcr/device.h, which runs the device code over
// host memory): each commit writes the device's tensors into the storage image, a restart after
// a recorded commit reloads the device from that image, an image the journal never recorded is
// the base again, ReloadCommitted uploads the base over a device that chunks were written to, and
// committed device storage carries into the next version of the same process.
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

class DeviceDurableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("dcr-node-recovery-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
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
    plan_.state_dir = VersionStateDir((dir_ / "state").string(), 1);  // version 1's, as a long-lived node has it
    plan_.receiver_base_path = paths_[0];
    device_ = MakeHostDevice();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<DurableReceiver> Open(int starts) {
    auto r = DurableReceiver::Open(plan_, device_, starts, nullptr);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(*r) : nullptr;
  }
  std::string Storage() const { return plan_.state_dir + "/rank-3.storage"; }

  std::filesystem::path dir_;
  std::vector<std::string> paths_;
  std::unique_ptr<DeltaReader> reader_;
  Hash128 target_hash_;
  NodePlan plan_;
  std::shared_ptr<Device> device_;
};

TEST_F(DeviceDurableTest, CommitWritesTheImageAndARestartReloadsTheDeviceFromIt) {
  {
    auto r = Open(1);
    ASSERT_NE(r, nullptr);
    EXPECT_FALSE(r->target_committed());
    // At the start the image is the base, byte for byte.
    EXPECT_EQ(FileBytes(Storage()), FileBytes(paths_[0]));
    ASSERT_TRUE(ApplyDelta(*reader_, r->receiver()).ok());
    EXPECT_EQ(FileBytes(Storage()), FileBytes(paths_[1]));
  }
  // The process is gone with the device's memory; the journal records version 1 committed.
  auto r = Open(2);
  ASSERT_NE(r, nullptr);
  EXPECT_TRUE(r->target_committed());
  EXPECT_TRUE(r->restart_event().storage_lost);
  EXPECT_FALSE(r->storage_reattached());
  EXPECT_EQ(r->receiver()->held().number, 1u);
  EXPECT_EQ(r->receiver()->held().hash, target_hash_);
  Status v = VerifyFile(*r->receiver(), paths_[1]);
  EXPECT_TRUE(v.ok()) << v.ToString();
  r.reset();
  // The image becomes the committed checkpoint of version 1: the dense target's bytes.
  auto ck = CommitStorageAsCheckpoint((dir_ / "state").string(), 1, 3, paths_[0]);
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  EXPECT_EQ(FileBytes(*ck), FileBytes(paths_[1]));
}

TEST_F(DeviceDurableTest, ShardedBaseRestartReloadsTheDeviceFromItsImage) {
  // Base and target as shard directories, one tensor per shard.
  std::vector<std::string> dirs;
  for (int k = 0; k < 2; ++k) {
    auto c = Checkpoint::Open(paths_[k]);
    ASSERT_TRUE(c.ok());
    std::vector<TensorView> views;
    for (const TensorInfo& t : (*c)->tensors()) {
      views.push_back({t.name, t.dtype_name, t.shape, (*c)->data(t), t.nbytes});
    }
    dirs.push_back((dir_ / ("sharded" + std::to_string(k))).string());
    ASSERT_TRUE(WriteShardedCheckpoint(dirs.back(), views, views[0].nbytes).ok());
  }
  auto base = Checkpoint::Open(dirs[0]);
  auto target = Checkpoint::Open(dirs[1]);
  ASSERT_TRUE(base.ok() && target.ok());
  ASSERT_TRUE((*base)->sharded());
  DeltaOptions o;
  o.chunk_elems = 2048;
  o.base_version = 0;
  o.target_version = 1;
  ConcatSink sink;
  ASSERT_TRUE(BuildDelta(base->get(), **target, o, &sink).ok());
  auto reader = DeltaReader::FromBytes(std::move(sink.bytes));
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  plan_.receiver_base_path = dirs[0];
  {
    auto r = Open(1);
    ASSERT_NE(r, nullptr);
    ASSERT_TRUE(ApplyDelta(**reader, r->receiver()).ok());
  }
  // The device's memory died with the process; the image holds the committed target, laid out
  // as the base's shards: the device is loaded from it, not from the base.
  auto r = Open(2);
  ASSERT_NE(r, nullptr);
  EXPECT_TRUE(r->target_committed());
  EXPECT_TRUE(r->restart_event().target_committed);
  EXPECT_EQ(r->receiver()->held().number, 1u);
  EXPECT_EQ(r->receiver()->held().hash, (*target)->ContentHash(0));
  Status v = VerifyFile(*r->receiver(), dirs[1]);
  EXPECT_TRUE(v.ok()) << v.ToString();
  r.reset();
  // An image that is not the recorded version (damaged on disk) is not loaded: the base again.
  {
    auto f = std::fopen(Storage().c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fseek(f, -100, SEEK_END);
    const int c = std::fgetc(f);
    std::fseek(f, -100, SEEK_END);
    std::fputc(c ^ 0x5a, f);
    std::fclose(f);
  }
  r = Open(3);
  ASSERT_NE(r, nullptr);
  EXPECT_FALSE(r->target_committed());
  EXPECT_EQ(r->receiver()->held().hash, (*base)->ContentHash(0));
}

TEST_F(DeviceDurableTest, AnImageTheJournalNeverRecordedIsTheBaseAgain) {
  {
    auto r = Open(1);
    ASSERT_NE(r, nullptr);
    ASSERT_TRUE(BeginDelta(*reader_, r->receiver()).ok());
    for (size_t i = 0; i < reader_->num_chunks(); ++i) {
      ASSERT_TRUE(r->receiver()->ApplyRecord(reader_->chunk_data(i), reader_->chunk_size(i)).ok());
    }
  }
  // Killed after the commit's download, before the journal recorded the version.
  const std::vector<uint8_t> target = FileBytes(paths_[1]);
  ASSERT_TRUE(WriteFileAtomic(Storage(), target.data(), target.size()).ok());
  auto r = Open(2);
  ASSERT_NE(r, nullptr);
  EXPECT_FALSE(r->target_committed());
  EXPECT_EQ(r->receiver()->held().number, 0u);
  EXPECT_EQ(FileBytes(Storage()), FileBytes(paths_[0]));
  Status v = VerifyFile(*r->receiver(), paths_[0]);
  EXPECT_TRUE(v.ok()) << v.ToString();
  // The delta applies again from the start and commits the target.
  r->receiver()->Abort();
  ASSERT_TRUE(r->ReloadCommitted().ok());
  Status a = ApplyDelta(*reader_, r->receiver());
  ASSERT_TRUE(a.ok()) << a.ToString();
  EXPECT_EQ(FileBytes(Storage()), target);
}

TEST_F(DeviceDurableTest, ReloadCommittedUploadsTheBaseOverWrittenChunks) {
  auto r = Open(1);
  ASSERT_NE(r, nullptr);
  ASSERT_TRUE(BeginDelta(*reader_, r->receiver()).ok());
  for (size_t i = 0; i < reader_->num_chunks(); i += 2) {
    ASSERT_TRUE(r->receiver()->ApplyRecord(reader_->chunk_data(i), reader_->chunk_size(i)).ok());
  }
  EXPECT_FALSE(VerifyFile(*r->receiver(), paths_[0]).ok());  // the device holds a mix
  r->receiver()->Abort();
  ASSERT_TRUE(r->ReloadCommitted().ok());
  Status v = VerifyFile(*r->receiver(), paths_[0]);
  EXPECT_TRUE(v.ok()) << v.ToString();
  Status a = ApplyDelta(*reader_, r->receiver());
  ASSERT_TRUE(a.ok()) << a.ToString();
  v = VerifyFile(*r->receiver(), paths_[1]);
  EXPECT_TRUE(v.ok()) << v.ToString();
  EXPECT_EQ(FileBytes(Storage()), FileBytes(paths_[1]));
}

TEST_F(DeviceDurableTest, CommittedDeviceStorageCarriesIntoTheNextVersion) {
  std::unique_ptr<Receiver> carried;
  {
    auto r = Open(1);
    ASSERT_NE(r, nullptr);
    ASSERT_TRUE(ApplyDelta(*reader_, r->receiver()).ok());
    carried = r->TakeDevice();
    ASSERT_NE(carried, nullptr);
  }
  auto ck = CommitStorageAsCheckpoint((dir_ / "state").string(), 1, 3, paths_[0]);
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  // Version 2's receiver: its base is the committed checkpoint of version 1, which the carried
  // device storage holds, so the device is not loaded again.
  std::filesystem::create_directories(dir_ / "state" / "v2");
  plan_.state_dir = VersionStateDir((dir_ / "state").string(), 2);
  plan_.receiver_base_path = *ck;
  plan_.base_version = 1;
  auto r = DurableReceiver::Open(plan_, device_, 1, nullptr, std::move(carried));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE((*r)->device_carried());
  EXPECT_EQ((*r)->receiver()->held().number, 1u);
  EXPECT_EQ((*r)->receiver()->held().hash, target_hash_);
  Status v = VerifyFile(*(*r)->receiver(), paths_[1]);
  EXPECT_TRUE(v.ok()) << v.ToString();
  EXPECT_EQ(FileBytes(plan_.state_dir + "/rank-3.storage"), FileBytes(paths_[1]));
}

TEST_F(DeviceDurableTest, DeviceStorageWithUncommittedChunksIsNotCarried) {
  auto r = Open(1);
  ASSERT_NE(r, nullptr);
  ASSERT_TRUE(BeginDelta(*reader_, r->receiver()).ok());
  ASSERT_TRUE(r->receiver()->ApplyRecord(reader_->chunk_data(0), reader_->chunk_size(0)).ok());
  r->receiver()->Abort();
  EXPECT_EQ(r->TakeDevice(), nullptr);  // it holds neither the base nor a committed version
  // Storage that does not hold the next version's base is freed, and the device loaded anew.
  auto held = MakeDeviceReceiver(device_, paths_[1], 1);
  ASSERT_TRUE(held.ok());
  auto again = DurableReceiver::Open(plan_, device_, 1, nullptr,
                                     std::unique_ptr<Receiver>(std::move(*held)));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_FALSE((*again)->device_carried());
  Status v = VerifyFile(*(*again)->receiver(), paths_[0]);
  EXPECT_TRUE(v.ok()) << v.ToString();
}

}  // namespace
}  // namespace dcr::internal
