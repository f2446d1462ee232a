// The durable state of a long-lived node across versions: the version a rank started last, its
// finished versions, a receiver's storage turned into the committed checkpoint of its version
// (single file and sharded), and the sender's joint commit state (a damaged file refused).
#include "node/version_state.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "dcr/checkpoint.h"

namespace dcr::internal {
namespace {

std::string TempDir() {
  char tmpl[] = "/tmp/dcr-version-state-XXXXXX";
  const char* d = ::mkdtemp(tmpl);
  EXPECT_NE(d, nullptr);
  return d;
}

std::vector<uint8_t> Bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

void WriteText(const std::string& path, const std::string& text) {
  ASSERT_TRUE(WriteFileAtomic(path, text.data(), text.size()).ok());
}

TEST(VersionState, StartedIsTheHighestVersionWithTheRanksStartCount) {
  const std::string dir = TempDir();
  EXPECT_EQ(VersionStarted(dir, 3), 0u);
  for (uint64_t k : {1, 2, 10}) ASSERT_EQ(::mkdir(VersionStateDir(dir, k).c_str(), 0700), 0);
  WriteText(VersionStateDir(dir, 1) + "/rank-3.starts", "1\n");
  WriteText(VersionStateDir(dir, 2) + "/rank-3.starts", "2\n");
  WriteText(VersionStateDir(dir, 10) + "/rank-4.starts", "1\n");
  EXPECT_EQ(VersionStarted(dir, 3), 2u);
  EXPECT_EQ(VersionStarted(dir, 4), 10u);
  EXPECT_EQ(VersionStarted(dir, 5), 0u);
  std::filesystem::remove_all(dir);
}

TEST(VersionState, DoneRoundTripsAndNamesItsVersion) {
  const std::string dir = TempDir();
  ASSERT_EQ(::mkdir(VersionStateDir(dir, 2).c_str(), 0700), 0);
  EXPECT_FALSE(ReadVersionDone(dir, 2, 1).has_value());
  ASSERT_TRUE(WriteVersionDone(dir, 1, VersionDone{2, "/x/ckpt.safetensors"}).ok());
  auto d = ReadVersionDone(dir, 2, 1);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->checkpoint, "/x/ckpt.safetensors");
  // A record of another version under this version's name is not taken.
  WriteText(VersionStateDir(dir, 2) + "/rank-5.done", "{\"version\": 3}\n");
  EXPECT_FALSE(ReadVersionDone(dir, 2, 5).has_value());
  WriteText(VersionStateDir(dir, 2) + "/rank-6.done", "not json");
  EXPECT_FALSE(ReadVersionDone(dir, 2, 6).has_value());
  std::filesystem::remove_all(dir);
}

TEST(VersionState, SingleFileStorageBecomesTheCheckpointByRename) {
  const std::string dir = TempDir();
  const auto a = Bytes(512, 1), b = Bytes(64, 9);
  const std::string base = dir + "/base.safetensors";
  ASSERT_TRUE(WriteSafetensors(base, {{"a", "BF16", {256}, a.data(), a.size()},
                                      {"b", "F32", {16}, b.data(), b.size()}})
                  .ok());
  // The storage of version 4: the base's image with tensor bytes written in place.
  auto image = ReadFile(base);
  ASSERT_TRUE(image.ok());
  (*image)[image->size() - 1] ^= 0x5a;
  ASSERT_EQ(::mkdir(VersionStateDir(dir, 4).c_str(), 0700), 0);
  const std::string storage = VersionStateDir(dir, 4) + "/rank-2.storage";
  ASSERT_TRUE(WriteFileAtomic(storage, image->data(), image->size()).ok());
  auto out = CommitStorageAsCheckpoint(dir, 4, 2, base);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_NE(::access(storage.c_str(), F_OK), 0);
  auto got = ReadFile(*out);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, *image);
  auto opened = Checkpoint::Open(*out);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  // Again after a restart: the checkpoint already made.
  auto again = CommitStorageAsCheckpoint(dir, 4, 2, base);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *out);
  std::filesystem::remove_all(dir);
}

TEST(VersionState, StorageOfAnotherSizeIsRefused) {
  const std::string dir = TempDir();
  const auto a = Bytes(512, 1);
  const std::string base = dir + "/base.safetensors";
  ASSERT_TRUE(WriteSafetensors(base, {{"a", "BF16", {256}, a.data(), a.size()}}).ok());
  ASSERT_EQ(::mkdir(VersionStateDir(dir, 1).c_str(), 0700), 0);
  WriteText(VersionStateDir(dir, 1) + "/rank-1.storage", "short");
  auto out = CommitStorageAsCheckpoint(dir, 1, 1, base);
  EXPECT_TRUE(out.status().IsFailedPrecondition()) << out.status().ToString();
  std::filesystem::remove_all(dir);
}

TEST(VersionState, ShardedStorageIsWrittenOutFileByFile) {
  const std::string dir = TempDir();
  const auto a = Bytes(4096, 3), b = Bytes(4096, 5);
  const std::string base = dir + "/base";
  ASSERT_TRUE(WriteShardedCheckpoint(base, {{"a", "BF16", {2048}, a.data(), a.size()},
                                            {"b", "BF16", {2048}, b.data(), b.size()}},
                                     4096)
                  .ok());
  auto ck = Checkpoint::Open(base);
  ASSERT_TRUE(ck.ok());
  ASSERT_TRUE((*ck)->sharded());
  std::vector<uint8_t> storage;
  for (const CheckpointFile& f : (*ck)->files()) storage.insert(storage.end(), f.data, f.data + f.size);
  ASSERT_EQ(::mkdir(VersionStateDir(dir, 1).c_str(), 0700), 0);
  ASSERT_TRUE(
      WriteFileAtomic(VersionStateDir(dir, 1) + "/rank-1.storage", storage.data(), storage.size())
          .ok());
  auto out = CommitStorageAsCheckpoint(dir, 1, 1, base);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  auto got = Checkpoint::Open(*out);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ((*got)->ContentHash(1), (*ck)->ContentHash(1));
  std::filesystem::remove_all(dir);
}

TEST(VersionState, JointCommitStateRoundTripsAndADamagedOneIsRefused) {
  const std::string dir = TempDir();
  auto none = ReadJointCommitState(dir);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  JointCommitState s{2, VersionId{2, Hash128{0x1234, 0xabcd}}, {1, 3, 4}};
  ASSERT_TRUE(WriteJointCommitState(dir, s).ok());
  auto got = ReadJointCommitState(dir);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->done, 2u);
  EXPECT_EQ((*got)->baseline, s.baseline);
  EXPECT_EQ((*got)->live, s.live);
  WriteText(dir + "/rank-0.commit", "{\"done\": 2, \"baseline\": {\"number\": \"x\"}}");
  EXPECT_TRUE(ReadJointCommitState(dir).status().IsDataLoss());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dcr::internal
