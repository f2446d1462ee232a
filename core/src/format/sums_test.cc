// Sums files: computed the same on any thread count, round-tripped through their text, checked
// against the checkpoint they describe and refused for any other bytes; malformed, truncated and
// forged texts are refused with kDataLoss and never crash or over-allocate.
#include "dcr/sums.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <random>

#include "dcr/apply.h"
#include "dcr/delta.h"
#include "dcr/hash.h"
#include "dcr/status_macros.h"
#include "dcr/testing/fixtures.h"

namespace dcr {
namespace {

using dcr::testing::OwnedTensor;
using dcr::testing::TempDir;
using dcr::testing::Views;

constexpr uint64_t kRegion = 4096;  // small regions: several per file

dcr::testing::Model RandomModel(uint64_t seed) {
  std::mt19937_64 rng(seed);
  dcr::testing::Model m;
  const char* dtypes[] = {"BF16", "F32", "I8", "F64"};
  for (int i = 0; i < 6; ++i) {
    OwnedTensor t;
    t.name = "layer." + std::to_string(i) + ".weight";
    t.dtype = dtypes[rng() % 4];
    t.shape = {static_cast<int64_t>(1 + rng() % 40), static_cast<int64_t>(1 + rng() % 300)};
    t.bytes.resize(static_cast<size_t>(t.shape[0] * t.shape[1] * t.width()));
    for (auto& b : t.bytes) b = static_cast<uint8_t>(rng());
    m.push_back(std::move(t));
  }
  return m;
}

// Writes `m` as dir/name and opens it.
StatusOr<std::unique_ptr<Checkpoint>> WriteAndOpen(const TempDir& dir, const std::string& name,
                                                   const dcr::testing::Model& m) {
  DCR_RETURN_IF_ERROR(WriteSafetensors(dir / name, Views(m)));
  return Checkpoint::Open(dir / name);
}

std::string Seal(std::string body) {  // a text with a correct end line, whatever its body
  return body + "end " + BytesHash128(body.data(), body.size()).ToHex() + "\n";
}

TEST(SumsTest, SameOnEveryThreadCountAndRoundTrips) {
  TempDir dir;
  const auto m = RandomModel(1);
  auto c = WriteAndOpen(dir, "a.safetensors", m);
  ASSERT_TRUE(c.ok());
  const Hash128 h = (*c)->ContentHash(1);
  const CheckpointSums one = ComputeSums(**c, h, 1, kRegion);
  const CheckpointSums four = ComputeSums(**c, h, 4, kRegion);
  ASSERT_EQ(FormatSums(one), FormatSums(four));
  ASSERT_EQ(one.files.size(), 1u);
  EXPECT_EQ(one.files[0].name, "");
  EXPECT_EQ(one.files[0].size, (*c)->file_size());
  EXPECT_EQ(one.files[0].regions.size(), ((*c)->file_size() + kRegion - 1) / kRegion);
  EXPECT_GT(one.files[0].regions.size(), 3u);
  EXPECT_EQ(one.files[0].regions[1], BytesHash128((*c)->file_data() + kRegion, kRegion));

  ASSERT_TRUE(WriteSums(dir / "a.sums", one).ok());
  auto back = ReadSums(dir / "a.sums");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(FormatSums(*back), FormatSums(one));
  EXPECT_EQ(back->content_hash, h);
  EXPECT_TRUE(CheckSums(**c, *back, 1).ok());
  EXPECT_TRUE(CheckSums(**c, *back, 3).ok());
}

TEST(SumsTest, ShardedCheckpointNamesEveryShard) {
  TempDir dir;
  const auto m = RandomModel(2);
  ASSERT_TRUE(WriteShardedCheckpoint(dir / "ck", Views(m), 20000).ok());
  auto c = Checkpoint::Open(dir / "ck");
  ASSERT_TRUE(c.ok());
  ASSERT_GT((*c)->files().size(), 1u);
  const CheckpointSums s = ComputeSums(**c, (*c)->ContentHash(1), 2, kRegion);
  auto back = ParseSums(FormatSums(s));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  for (size_t f = 0; f < s.files.size(); ++f) {
    EXPECT_EQ(back->files[f].name, (*c)->files()[f].name);
    EXPECT_FALSE(back->files[f].name.empty());
  }
  EXPECT_TRUE(CheckSums(**c, *back, 2).ok());
  // A shard's sums moved to another shard's place are another checkpoint's.
  CheckpointSums swapped = s;
  std::swap(swapped.files[0], swapped.files[1]);
  const Status st = CheckSums(**c, swapped, 1);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("another checkpoint's"), std::string::npos) << st.message();
}

TEST(SumsTest, AnyChangedByteOrSizeIsRefusedNamingItsRegion) {
  TempDir dir;
  const auto m = RandomModel(3);
  auto c = WriteAndOpen(dir, "a.safetensors", m);
  ASSERT_TRUE(c.ok());
  const CheckpointSums s = ComputeSums(**c, (*c)->ContentHash(1), 1, kRegion);
  const uint64_t size = (*c)->file_size();
  std::vector<uint8_t> bytes((*c)->file_data(), (*c)->file_data() + size);
  std::mt19937_64 rng(4);
  for (int trial = 0; trial < 20; ++trial) {
    // A byte of the data section (a header byte would make another, or no, checkpoint).
    const uint64_t off = (*c)->data_section_offset() + rng() % (size - (*c)->data_section_offset());
    std::vector<uint8_t> changed = bytes;
    changed[off] ^= static_cast<uint8_t>(1 + rng() % 255);
    auto d = Checkpoint::FromBytes(changed);
    ASSERT_TRUE(d.ok());
    const Status st = CheckSums(**d, s, 1 + trial % 3);
    ASSERT_EQ(st.code(), StatusCode::kFailedPrecondition);
    const uint64_t begin = off / kRegion * kRegion;
    const std::string range =
        "bytes " + std::to_string(begin) + ".." + std::to_string(std::min(size, begin + kRegion));
    EXPECT_NE(st.message().find(range), std::string::npos) << st.message() << " want " << range;
  }
  // Another checkpoint of the same tensors and sizes.
  auto other = RandomModel(5);
  for (size_t i = 0; i < other.size(); ++i) {
    other[i].shape = m[i].shape;
    other[i].dtype = m[i].dtype;
    other[i].bytes.resize(m[i].bytes.size());
  }
  auto b = WriteAndOpen(dir, "b.safetensors", other);
  ASSERT_TRUE(b.ok());
  ASSERT_EQ((*b)->file_size(), size);
  EXPECT_EQ(CheckSums(**b, s, 2).code(), StatusCode::kFailedPrecondition);
  // A size that differs.
  CheckpointSums longer = s;
  longer.files[0].size += 1;
  const Status st = CheckSums(**c, longer, 1);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("says " + std::to_string(size + 1)), std::string::npos)
      << st.message();
}

TEST(SumsTest, SumsBuiltInMemoryAreHeldToTheParsersRules) {
  TempDir dir;
  auto c = WriteAndOpen(dir, "a.safetensors", RandomModel(8));
  ASSERT_TRUE(c.ok());
  const CheckpointSums s = ComputeSums(**c, (*c)->ContentHash(1), 1, kRegion);
  ASSERT_TRUE(CheckSums(**c, s, 1).ok());
  CheckpointSums short_list = s;
  short_list.files[0].regions.pop_back();
  EXPECT_EQ(CheckSums(**c, short_list, 2).code(), StatusCode::kInvalidArgument);
  CheckpointSums zero = s;
  zero.region_bytes = 0;
  EXPECT_EQ(CheckSums(**c, zero, 1).code(), StatusCode::kInvalidArgument);
}

TEST(SumsTest, EveryTruncationAndByteFlipIsDataLoss) {
  TempDir dir;
  const auto m = RandomModel(6);
  auto c = WriteAndOpen(dir, "a.safetensors", m);
  ASSERT_TRUE(c.ok());
  const std::string text = FormatSums(ComputeSums(**c, (*c)->ContentHash(1), 1, kRegion));
  ASSERT_TRUE(ParseSums(text).ok());
  for (size_t n = 0; n < text.size(); ++n) {
    EXPECT_EQ(ParseSums(std::string_view(text).substr(0, n)).status().code(), StatusCode::kDataLoss)
        << n;
  }
  for (size_t i = 0; i < text.size(); ++i) {
    for (uint8_t x : {0x01, 0x20, 0x80}) {
      std::string t = text;
      t[i] = static_cast<char>(t[i] ^ x);
      EXPECT_EQ(ParseSums(t).status().code(), StatusCode::kDataLoss) << i << " ^ " << int{x};
    }
  }
  EXPECT_EQ(ParseSums(text + "x").status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(ParseSums(text + text).status().code(), StatusCode::kDataLoss);
}

TEST(SumsTest, ForgedStructureIsRefusedWithoutAllocatingWhatItClaims) {
  const std::string h(32, 'a');
  const std::string head = "dcr-sums 1\ncontent " + h + "\nregion-bytes 4096\n";
  const std::vector<std::string> bodies = {
      // Counts far beyond the lines there are.
      head + "files 1152921504606846976\nfile 10 \"a\"\n" + h + "\n",
      head + "files 1\nfile 18446744073709551615 \"\"\n" + h + "\n",
      // A region list that disagrees with the size: one missing, one too many.
      head + "files 1\nfile 8193 \"\"\n" + h + "\n" + h + "\n",
      head + "files 1\nfile 4096 \"\"\n" + h + "\n" + h + "\n",
      // Names: repeated, empty beside others, not JSON.
      head + "files 2\nfile 1 \"a\"\n" + h + "\nfile 1 \"a\"\n" + h + "\n",
      head + "files 2\nfile 1 \"\"\n" + h + "\nfile 1 \"b\"\n" + h + "\n",
      head + "files 1\nfile 1 a\n" + h + "\n",
      head + "files 1\nfile 1 [\"a\"]\n" + h + "\n",
      // Numbers: signs, leading zeros, overflow, a region size out of range.
      head + "files 01\nfile 1 \"\"\n" + h + "\n",
      head + "files 1\nfile -1 \"\"\n" + h + "\n",
      head + "files 1\nfile 99999999999999999999 \"\"\n" + h + "\n",
      "dcr-sums 1\ncontent " + h + "\nregion-bytes 1\nfiles 1\nfile 1 \"\"\n" + h + "\n",
      "dcr-sums 1\ncontent " + h + "\nregion-bytes 0\nfiles 1\nfile 1 \"\"\n" + h + "\n",
      // Hashes: upper case, short.
      "dcr-sums 1\ncontent " + std::string(32, 'A') +
          "\nregion-bytes 4096\nfiles 1\nfile 1 \"\"\n" + h + "\n",
      head + "files 1\nfile 1 \"\"\n" + h.substr(1) + "\n",
      head + "files 0\n",
      "dcr-sums 2\ncontent " + h + "\nregion-bytes 4096\nfiles 1\nfile 1 \"\"\n" + h + "\n",
  };
  for (const std::string& b : bodies) {
    const auto s = ParseSums(Seal(b));
    EXPECT_EQ(s.status().code(), StatusCode::kDataLoss) << b;
  }
  // The same layout, well formed, parses: the cases above fail for what they change.
  const auto ok =
      ParseSums(Seal(head + "files 2\nfile 4097 \"a\"\n" + h + "\n" + h + "\nfile 0 \"b\"\n"));
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->files[0].regions.size(), 2u);
  EXPECT_EQ(ok->files[1].regions.size(), 0u);
}

TEST(SumsTest, ReadRefusesMissingOversizedAndNonRegularFiles) {
  TempDir dir;
  EXPECT_EQ(ReadSums(dir / "absent.sums").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(ReadSums(dir.path.string()).status().code(), StatusCode::kDataLoss);
  { std::ofstream f(dir / "big.sums"); }
  ASSERT_EQ(::truncate((dir / "big.sums").c_str(), static_cast<off_t>(kSumsMaxFileBytes + 1)), 0);
  const auto big = ReadSums(dir / "big.sums");
  EXPECT_EQ(big.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(big.status().message().find("more than any sums file"), std::string::npos);
  {
    std::ofstream f(dir / "text.sums");
    f << "not a sums file\n";
  }
  const auto text = ReadSums(dir / "text.sums");
  EXPECT_EQ(text.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(text.status().message().find(dir / "text.sums"), std::string::npos);
}

// A sums file with the right regions and a wrong content hash (one written by a party that could
// also write the checkpoint) makes a delta whose base hash no holder of the true base accepts.
TEST(SumsTest, AForgedContentHashMakesADeltaTheTrueBaseRefuses) {
  TempDir dir;
  const auto base = RandomModel(7);
  auto target = base;
  for (auto& t : target) t.bytes[0] ^= 1;
  auto b = WriteAndOpen(dir, "base.safetensors", base);
  auto t = WriteAndOpen(dir, "target.safetensors", target);
  ASSERT_TRUE(b.ok() && t.ok());
  Hash128 forged = (*b)->ContentHash(1);
  forged.lo ^= 1;
  const CheckpointSums sums = ComputeSums(**b, forged, 1);
  ASSERT_TRUE(CheckSums(**b, sums, 1).ok());  // the regions are the base's
  DeltaOptions o;
  o.known_base_hash = sums.content_hash;
  DeltaFileSink sink(dir / "d.dcr");
  ASSERT_TRUE(BuildDelta(b->get(), **t, o, &sink).ok());
  const auto applied =
      ApplyDeltaFile(dir / "base.safetensors", dir / "d.dcr", dir / "out.safetensors", {});
  EXPECT_EQ(applied.status().code(), StatusCode::kFailedPrecondition)
      << applied.status().ToString();
  EXPECT_FALSE(std::filesystem::exists(dir / "out.safetensors"));
}

}  // namespace
}  // namespace dcr
