// The durable state of a long-lived node across versions: the version a rank started last, its
// finished versions, a receiver's storage turned into the committed checkpoint of its version
// (single file and sharded), and the sender's joint commit state (a damaged file refused).
#include "node/version_state.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>

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

// The committed file is the target checkpoint byte for byte, header and metadata included, when
// the receiver recorded the target's header: in place for a header of the base's length, by a
// rewrite in the target's layout for a longer one; the record is gone after.
TEST(VersionState, CommittedStorageTakesTheRecordedTargetHeader) {
  const auto a0 = Bytes(512, 1), b0 = Bytes(64, 9), a1 = Bytes(512, 3), b1 = Bytes(64, 5);
  for (const std::string note : {"", "a note long enough to move the data section by far"}) {
    const std::string dir = TempDir();
    const std::string base = dir + "/base.safetensors", target = dir + "/target.safetensors";
    ASSERT_TRUE(WriteSafetensors(base,
                                 {{"a", "BF16", {256}, a0.data(), a0.size()},
                                  {"b", "F32", {16}, b0.data(), b0.size()}},
                                 {{"step", "0"}})
                    .ok());
    std::map<std::string, std::string> meta{{"step", "1"}};
    if (!note.empty()) meta["note"] = note;
    ASSERT_TRUE(WriteSafetensors(target,
                                 {{"a", "BF16", {256}, a1.data(), a1.size()},
                                  {"b", "F32", {16}, b1.data(), b1.size()}},
                                 meta)
                    .ok());
    auto base_cp = Checkpoint::Open(base);
    auto target_cp = Checkpoint::Open(target);
    ASSERT_TRUE(base_cp.ok() && target_cp.ok());
    // The storage: the base's image with the target's tensor bytes at the base's offsets.
    auto image = ReadFile(base);
    ASSERT_TRUE(image.ok());
    for (const TensorInfo& t : (*base_cp)->tensors()) {
      const TensorInfo* u = (*target_cp)->Find(t.name);
      ASSERT_NE(u, nullptr);
      std::memcpy(image->data() + (*base_cp)->files()[0].data_section_offset + t.offset,
                  (*target_cp)->data(*u), u->nbytes);
    }
    ASSERT_EQ(::mkdir(VersionStateDir(dir, 2).c_str(), 0700), 0);
    const std::string storage = VersionStateDir(dir, 2) + "/rank-1.storage";
    ASSERT_TRUE(WriteFileAtomic(storage, image->data(), image->size()).ok());
    const std::string header = (*target_cp)->files()[0].header_json();
    WriteText(StorageHeaderPath(storage), header);
    EXPECT_EQ(note.empty(), header.size() == (*base_cp)->files()[0].header_json().size());
    auto out = CommitStorageAsCheckpoint(dir, 2, 1, base);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    auto got = ReadFile(*out);
    auto want = ReadFile(target);
    ASSERT_TRUE(got.ok() && want.ok());
    EXPECT_EQ(*got, *want) << "note '" << note << "'";
    EXPECT_NE(::access(storage.c_str(), F_OK), 0);
    EXPECT_NE(::access(StorageHeaderPath(storage).c_str(), F_OK), 0);
    std::filesystem::remove_all(dir);
  }
}

// A recorded header naming a tensor the storage lacks is refused, naming it; the storage stays.
TEST(VersionState, RecordedHeaderOfAnotherLayoutIsRefused) {
  const std::string dir = TempDir();
  const auto a = Bytes(512, 1);
  const std::string base = dir + "/base.safetensors";
  ASSERT_TRUE(WriteSafetensors(base, {{"a", "BF16", {256}, a.data(), a.size()}}).ok());
  auto image = ReadFile(base);
  ASSERT_TRUE(image.ok());
  ASSERT_EQ(::mkdir(VersionStateDir(dir, 1).c_str(), 0700), 0);
  const std::string storage = VersionStateDir(dir, 1) + "/rank-1.storage";
  ASSERT_TRUE(WriteFileAtomic(storage, image->data(), image->size()).ok());
  WriteText(StorageHeaderPath(storage),
            "{\"z\":{\"dtype\":\"BF16\",\"shape\":[256],\"data_offsets\":[0,512]}}");
  auto out = CommitStorageAsCheckpoint(dir, 1, 1, base);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(out.status().message().find("tensor 'z'"), std::string::npos)
      << out.status().ToString();
  EXPECT_EQ(::access(storage.c_str(), F_OK), 0);
  std::filesystem::remove_all(dir);
}

// A long-lived receiver over four versions: after each commit only the version it holds keeps
// files (its done record and committed checkpoint; the earlier versions' journals, start counts
// and records are collected), another rank's files are left alone, and a restarted process still
// finds every version finished and holds the last one.
TEST(VersionState, EarlierVersionsFilesAreCollectedAndARestartStillSkipsThem) {
  const std::string dir = TempDir();
  const auto a = Bytes(512, 1);
  const std::string base = dir + "/base.safetensors";
  ASSERT_TRUE(WriteSafetensors(base, {{"a", "BF16", {256}, a.data(), a.size()}}).ok());
  auto image = ReadFile(base);
  ASSERT_TRUE(image.ok());
  NodePlan plan;
  plan.rank = 3;
  plan.method = "delta";
  plan.device = "cpu";
  plan.state_dir = dir + "/state";
  plan.receiver_base_path = base;
  for (uint64_t k = 1; k <= 4; ++k) {
    NodeVersion v;
    v.version = k;
    plan.versions.push_back(v);
  }
  auto rec = VersionRecovery::Open(plan);
  ASSERT_TRUE(rec.ok()) << rec.status().ToString();
  for (size_t i = 0; i < plan.versions.size(); ++i) {
    const NodeVersion& v = plan.versions[i];
    ASSERT_FALSE((*rec)->Finished(v));
    NodePlan p = plan;
    p.versions.clear();
    p.version = v.version;
    (*rec)->Prepare(v, i, &p);
    // What the version's one-version node leaves: its start count and journal; and another
    // rank's journal in the same directory.
    WriteText(p.state_dir + "/rank-3.starts", "1\n");
    WriteText(p.state_dir + "/rank-3.journal", std::string(1000, 'j'));
    WriteText(p.state_dir + "/rank-4.journal", "other rank");
    EXPECT_EQ(p.version_log_dir, plan.state_dir + "/rank-3.vlog");
    ASSERT_TRUE((*rec)->Done(p).ok());
    for (uint64_t k = 1; k <= v.version; ++k) {
      const std::string vd = VersionStateDir(plan.state_dir, k);
      const bool held = k == v.version;
      EXPECT_EQ(::access((vd + "/rank-3.journal").c_str(), F_OK) == 0, held) << k;
      EXPECT_EQ(ReadVersionDone(plan.state_dir, k, 3).has_value(), held) << k;
      EXPECT_EQ(::access((vd + "/rank-4.journal").c_str(), F_OK), 0) << k;
    }
    EXPECT_EQ((*rec)->held_number(), v.version);
  }
  // At least the three earlier journals and start counts (the done records besides).
  EXPECT_GT((*rec)->collected_bytes(), 3u * (1000 + 2));
  // A restart: versions 1-3 (files gone) and 4 (held) are finished; it holds version 4.
  auto again = VersionRecovery::Open(plan);
  ASSERT_TRUE(again.ok());
  for (const NodeVersion& v : plan.versions) EXPECT_TRUE((*again)->Finished(v)) << v.version;
  EXPECT_EQ((*again)->held_number(), 4u);
  // The versions are held in the receiver's version log, not in a file per version.
  auto done = ReadVersionDone(plan.state_dir, 4, 3);
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->checkpoint, plan.state_dir + "/rank-3.vlog");
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
  ASSERT_TRUE(WriteShardedCheckpoint(base,
                                     {{"a", "BF16", {2048}, a.data(), a.size()},
                                      {"b", "BF16", {2048}, b.data(), b.size()}},
                                     4096)
                  .ok());
  auto ck = Checkpoint::Open(base);
  ASSERT_TRUE(ck.ok());
  ASSERT_TRUE((*ck)->sharded());
  std::vector<uint8_t> storage;
  for (const CheckpointFile& f : (*ck)->files())
    storage.insert(storage.end(), f.data, f.data + f.size);
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
  JointCommitState s{4,
                     VersionId{2, Hash128{0x1234, 0xabcd}},
                     {1, 3, 4},
                     {{2, "/t/v2.safetensors"}, {3, "/t/v3.safetensors"}, {4, "/t/v4"}}};
  ASSERT_TRUE(WriteJointCommitState(dir, s).ok());
  auto got = ReadJointCommitState(dir);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->done, 4u);
  EXPECT_EQ((*got)->baseline, s.baseline);
  EXPECT_EQ((*got)->live, s.live);
  EXPECT_EQ((*got)->checkpoints, s.checkpoints);
  WriteText(dir + "/rank-0.commit",
            "{\"done\": 2, \"baseline\": {\"number\": 1, \"hash_lo\": 0, \"hash_hi\": 0}, "
            "\"live\": [1], \"checkpoints\": {\"x\": \"/t\"}}");
  EXPECT_TRUE(ReadJointCommitState(dir).status().IsDataLoss());
  WriteText(dir + "/rank-0.commit", "{\"done\": 2, \"baseline\": {\"number\": \"x\"}}");
  EXPECT_TRUE(ReadJointCommitState(dir).status().IsDataLoss());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dcr::internal
