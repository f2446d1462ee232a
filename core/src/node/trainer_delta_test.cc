// The sender's check of a trainer-built delta and its stream: a delta goes out only for the base
// (number and hash) and version its header names, and the stream is the file's bytes.
#include "node/trainer_delta.h"

#include <gtest/gtest.h>

#include <random>

#include "dcr/checkpoint.h"
#include "dcr/delta.h"
#include "dcr/testing/fixtures.h"

namespace dcr::internal {
namespace {

const testing::ChangedCheckpoints& Checkpoints() {
  static const testing::ChangedCheckpoints* f = new testing::ChangedCheckpoints(
      testing::WriteChangedCheckpoints(
          "dcr_trainer_delta_", {{"a.weight", "BF16", {256, 128}}, {"b.norm", "BF16", {640}}}, 11,
          3,
          [](std::mt19937_64& rng, uint8_t* e, int) {
            const uint16_t v = static_cast<uint16_t>(0x3C00 + rng() % 0x0800);
            e[0] = static_cast<uint8_t>(v);
            e[1] = static_cast<uint8_t>(v >> 8);
          },
          [](std::mt19937_64& rng, uint8_t* e, int) {
            e[0] = static_cast<uint8_t>(e[0] + 1 + rng() % 3);
          })
          .value());
  return *f;
}

// The delta base -> target written as version 2 -> 5; *base_hash gets the base's hash.
std::string WriteDelta(Hash128* base_hash) {
  const auto& ck = Checkpoints();
  auto base = Checkpoint::Open(ck.base);
  auto target = Checkpoint::Open(ck.target);
  EXPECT_TRUE(base.ok() && target.ok());
  DeltaOptions o;
  o.chunk_elems = 4096;
  o.base_version = 2;
  o.target_version = 5;
  const std::string path = ck.dir + "/trainer.dcr";
  DeltaFileSink sink(path);
  EXPECT_TRUE(BuildDelta(base->get(), **target, o, &sink).ok());
  *base_hash = (*base)->ContentHash(1);
  return path;
}

TEST(TrainerDelta, FitsOnlyTheBaseAndVersionItsHeaderNames) {
  Hash128 h;
  const std::string path = WriteDelta(&h);
  std::string why;
  EXPECT_TRUE(TrainerDeltaFits(path, VersionId{2, h}, 5, false, &why)) << why;
  EXPECT_FALSE(TrainerDeltaFits(path, VersionId{3, h}, 5, false, &why));
  EXPECT_NE(why.find("version 2 -> 5"), std::string::npos) << why;
  EXPECT_NE(why.find("must be built from version 3"), std::string::npos) << why;
  Hash128 other = h;
  other.lo ^= 1;
  EXPECT_FALSE(TrainerDeltaFits(path, VersionId{2, other}, 5, false, &why));
  EXPECT_FALSE(TrainerDeltaFits(path, VersionId{2, h}, 4, false, &why));
  // A run that context-codes its long link builds the context form instead.
  EXPECT_FALSE(TrainerDeltaFits(path, VersionId{2, h}, 5, true, &why));
  EXPECT_NE(why.find("context-codes"), std::string::npos) << why;
  EXPECT_FALSE(TrainerDeltaFits(Checkpoints().dir + "/none.dcr", VersionId{2, h}, 5, false, &why));
  EXPECT_NE(why.find("does not open"), std::string::npos) << why;
}

TEST(TrainerDelta, StreamsTheFileByteForByte) {
  Hash128 h;
  const std::string path = WriteDelta(&h);
  DeltaMemorySink mem;
  ASSERT_TRUE(StreamDeltaFile(path, &mem).ok());
  auto file = ReadFile(path);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(mem.bytes(), *file);
  // A truncated file is refused before anything reaches the sink.
  const std::string cut = Checkpoints().dir + "/cut.dcr";
  ASSERT_TRUE(WriteFileAtomic(cut, file->data(), file->size() - 9).ok());
  DeltaMemorySink none;
  EXPECT_FALSE(StreamDeltaFile(cut, &none).ok());
  EXPECT_TRUE(none.bytes().empty());
}

}  // namespace
}  // namespace dcr::internal
