// Sharded checkpoints: opening directories of shards (with and without an index) under every rule
// of Checkpoint::Open, deltas between different shard layouts, and apply writing a whole directory
// whose every file is byte-identical to the target's.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "dcr/apply.h"
#include "dcr/delta.h"
#include "dcr/format.h"
#include "dcr/testing/fixtures.h"

namespace dcr {
namespace {

namespace fs = std::filesystem;

using dcr::testing::OwnedTensor;
using dcr::testing::TempDir;
using dcr::testing::Views;

std::vector<uint8_t> Read(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

void WriteText(const std::string& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary);
  f << text;
}

// Random tensors of several dtypes (special bit patterns included), and a target in which
// `rate` of the elements change.
void MakePair(std::mt19937_64& rng, double rate, std::vector<OwnedTensor>* base,
              std::vector<OwnedTensor>* target) {
  const char* dtypes[] = {"BF16", "F16", "F32", "F8_E4M3", "I32", "BOOL", "F64", "X_CUSTOM"};
  const int nt = 5 + static_cast<int>(rng() % 10);
  for (int i = 0; i < nt; ++i) {
    OwnedTensor t;
    t.name = "model.layers." + std::to_string(rng() % 1000) + "." + std::to_string(i) + ".weight";
    t.dtype = dtypes[rng() % 8];
    const int w = DTypeWidth(DTypeFromName(t.dtype));
    const int64_t rows = 1 + static_cast<int64_t>(rng() % 200);
    const int64_t cols = 1 + static_cast<int64_t>(rng() % (rng() % 3 == 0 ? 3000 : 40));
    t.shape = {rows, cols};
    t.bytes.resize(static_cast<size_t>(rows * cols * w));
    for (auto& b : t.bytes) b = static_cast<uint8_t>(rng());
    if (w >= 2 && !t.bytes.empty()) {
      const uint16_t nan = 0x7FC1, neg_zero = 0x8000;
      std::memcpy(t.bytes.data(), &nan, 2);
      if (t.bytes.size() >= 4) std::memcpy(t.bytes.data() + 2, &neg_zero, 2);
    }
    base->push_back(t);
    OwnedTensor u = t;
    const uint64_t n = u.bytes.size() / static_cast<uint64_t>(w);
    for (uint64_t e = 0; e < n; ++e) {
      if (std::uniform_real_distribution<double>(0, 1)(rng) >= rate) continue;
      u.bytes[e * static_cast<uint64_t>(w)] ^= static_cast<uint8_t>(1 + rng() % 255);
    }
    target->push_back(std::move(u));
  }
}

// Writes `ts` as a directory of safetensors files without an index, tensors dealt to `files`
// files round-robin (a layout unlike WriteShardedCheckpoint's).
void WriteUnindexed(const std::string& dir, const std::vector<OwnedTensor>& ts, int files) {
  fs::create_directories(dir);
  for (int f = 0; f < files; ++f) {
    std::vector<TensorView> part;
    for (size_t i = static_cast<size_t>(f); i < ts.size(); i += static_cast<size_t>(files)) {
      part.push_back(
          {ts[i].name, ts[i].dtype, ts[i].shape, ts[i].bytes.data(), ts[i].bytes.size()});
    }
    ASSERT_TRUE(WriteSafetensors(dir + "/part" + std::to_string(f) + ".safetensors", part).ok());
  }
}

uint64_t TotalBytes(const std::vector<OwnedTensor>& ts) {
  uint64_t n = 0;
  for (const auto& t : ts) n += t.bytes.size();
  return n;
}

std::vector<std::string> FileNames(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Every file of `a` and `b` (same names) byte for byte.
void ExpectSameDirectory(const std::string& a, const std::string& b) {
  ASSERT_EQ(FileNames(a), FileNames(b));
  for (const std::string& n : FileNames(a)) {
    EXPECT_EQ(Read(a + "/" + n), Read(b + "/" + n)) << n;
  }
}

TEST(Sharded, WrittenDirectoryOpensWithItsIndex) {
  std::mt19937_64 rng(1);
  TempDir dir;
  std::vector<OwnedTensor> base, target;
  MakePair(rng, 0.03, &base, &target);
  const uint64_t total = TotalBytes(base);
  ASSERT_TRUE(WriteShardedCheckpoint(dir / "ckpt", Views(base), total / 4 + 1).ok());
  const std::vector<std::string> names = FileNames(dir / "ckpt");
  ASSERT_GE(names.size(), 4u);  // 3+ shards and the index
  EXPECT_EQ(names.back(), "model.safetensors.index.json");
  for (const std::string& path : {dir / "ckpt", dir / "ckpt/model.safetensors.index.json"}) {
    auto c = Checkpoint::Open(path);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_TRUE((*c)->sharded());
    EXPECT_EQ((*c)->files().size(), names.size() - 1);
    EXPECT_EQ((*c)->index_name(), "model.safetensors.index.json");
    EXPECT_EQ((*c)->total_tensor_bytes(), total);
    for (const OwnedTensor& t : base) {
      const TensorInfo* ti = (*c)->Find(t.name);
      ASSERT_NE(ti, nullptr) << t.name;
      EXPECT_EQ(std::memcmp((*c)->data(*ti), t.bytes.data(), t.bytes.size()), 0) << t.name;
    }
  }
  // The same tensors in one file have the same content hash: the hash is of the tensors, not of
  // the layout.
  ASSERT_TRUE(WriteSafetensors(dir / "one.safetensors", Views(base)).ok());
  auto one = Checkpoint::Open(dir / "one.safetensors");
  auto sharded = Checkpoint::Open(dir / "ckpt");
  ASSERT_TRUE(one.ok() && sharded.ok());
  EXPECT_EQ((*one)->ContentHash(1), (*sharded)->ContentHash(2));
  // A second write to the same name replaces the checkpoint whole (now one shard); a directory
  // holding anything else is refused untouched.
  ASSERT_TRUE(WriteShardedCheckpoint(dir / "ckpt", Views(base), total).ok());
  EXPECT_EQ(FileNames(dir / "ckpt"), (std::vector<std::string>{"model-00001-of-00001.safetensors",
                                                               "model.safetensors.index.json"}));
  WriteText(dir / "ckpt/README.md", "mine");
  EXPECT_TRUE(WriteShardedCheckpoint(dir / "ckpt", Views(base), total).IsFailedPrecondition());
  EXPECT_EQ(Read(dir / "ckpt/README.md").size(), 4u);
}

// The round trip over layouts: base and target split differently (single file, indexed shards,
// unindexed files), change rates from 0% to 100%; the output directory equals the target's files
// byte for byte, index included.
TEST(Sharded, DeltaBetweenDifferentLayoutsRebuildsTheTargetDirectory) {
  int trial = 0;
  for (double rate : {0.0, 0.01, 0.03, 0.3, 1.0}) {
    for (int layout = 0; layout < 3; ++layout) {
      SCOPED_TRACE("rate " + std::to_string(rate) + " layout " + std::to_string(layout));
      std::mt19937_64 rng(100 + trial++);
      TempDir dir;
      std::vector<OwnedTensor> base, target;
      MakePair(rng, rate, &base, &target);
      std::string base_path;
      switch (layout) {
        case 0:
          base_path = dir / "base.safetensors";
          ASSERT_TRUE(WriteSafetensors(base_path, Views(base)).ok());
          break;
        case 1:
          base_path = dir / "base";
          WriteUnindexed(base_path, base, 2);
          break;
        default:
          base_path = dir / "base";
          ASSERT_TRUE(
              WriteShardedCheckpoint(base_path, Views(base), TotalBytes(base) / 2 + 1).ok());
      }
      // The target re-splits the tensors: other shard boundaries than the base's.
      ASSERT_TRUE(
          WriteShardedCheckpoint(dir / "target", Views(target), TotalBytes(target) / 5 + 1).ok());
      auto b = Checkpoint::Open(base_path);
      auto t = Checkpoint::Open(dir / "target");
      ASSERT_TRUE(b.ok() && t.ok()) << b.status() << t.status();
      DeltaOptions o;
      o.chunk_elems = 2048;
      o.small_tensor_elems = 500;
      o.threads = 2;
      DeltaFileSink sink(dir / "d.dcr");
      auto st = BuildDelta(b->get(), **t, o, &sink);
      ASSERT_TRUE(st.ok()) << st.status();
      auto reader = DeltaReader::Open(dir / "d.dcr");
      ASSERT_TRUE(reader.ok()) << reader.status();
      EXPECT_TRUE((*reader)->header().sharded());
      EXPECT_EQ((*reader)->inventory().files.size(), (*t)->files().size());
      auto ap = ApplyDeltaFile(base_path, dir / "d.dcr", dir / "out", ApplyOptions{2, true, true});
      ASSERT_TRUE(ap.ok()) << ap.status();
      ExpectSameDirectory(dir / "target", dir / "out");
      // A full frame of the sharded target needs no base.
      DeltaOptions f = o;
      f.full = true;
      DeltaFileSink fsink(dir / "f.dcr");
      ASSERT_TRUE(BuildDelta(nullptr, **t, f, &fsink).ok());
      ASSERT_TRUE(
          ApplyDeltaFile("", dir / "f.dcr", dir / "out_full", ApplyOptions{1, true, true}).ok());
      ExpectSameDirectory(dir / "target", dir / "out_full");
    }
  }
}

TEST(Sharded, SingleFileTargetFromAShardedBaseIsOneFile) {
  std::mt19937_64 rng(7);
  TempDir dir;
  std::vector<OwnedTensor> base, target;
  MakePair(rng, 0.05, &base, &target);
  ASSERT_TRUE(WriteShardedCheckpoint(dir / "base", Views(base), TotalBytes(base) / 3 + 1).ok());
  ASSERT_TRUE(WriteSafetensors(dir / "t.safetensors", Views(target)).ok());
  auto b = Checkpoint::Open(dir / "base");
  auto t = Checkpoint::Open(dir / "t.safetensors");
  ASSERT_TRUE(b.ok() && t.ok());
  DeltaFileSink sink(dir / "d.dcr");
  ASSERT_TRUE(BuildDelta(b->get(), **t, DeltaOptions{}, &sink).ok());
  ASSERT_TRUE(ApplyDeltaFile(dir / "base", dir / "d.dcr", dir / "out.safetensors", {}).ok());
  EXPECT_EQ(Read(dir / "out.safetensors"), Read(dir / "t.safetensors"));
}

class ShardedRules : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937_64 rng(3);
    std::vector<OwnedTensor> target;
    MakePair(rng, 0.0, &tensors_, &target);
    ASSERT_TRUE(
        WriteShardedCheckpoint(dir_ / "c", Views(tensors_), TotalBytes(tensors_) / 3 + 1).ok());
    index_ = Read(dir_ / "c/model.safetensors.index.json");
    shards_ = FileNames(dir_ / "c");
    shards_.pop_back();  // the index
    ASSERT_GE(shards_.size(), 3u);
  }
  std::string IndexText() const { return std::string(index_.begin(), index_.end()); }
  // Replaces the first occurrence of `from` in the index.
  void EditIndex(const std::string& from, const std::string& to) {
    std::string s = IndexText();
    size_t at = s.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    s.replace(at, from.size(), to);
    WriteText(dir_ / "c/model.safetensors.index.json", s);
  }
  Status OpenStatus() {
    auto c = Checkpoint::Open(dir_ / "c");
    return c.ok() ? Status::OK() : c.status();
  }
  TempDir dir_;
  std::vector<OwnedTensor> tensors_;
  std::vector<uint8_t> index_;
  std::vector<std::string> shards_;
};

TEST_F(ShardedRules, AShardTheIndexNamesIsMissing) {
  fs::remove(dir_ / ("c/" + shards_[1]));
  Status s = OpenStatus();
  EXPECT_TRUE(s.IsNotFound()) << s;
  EXPECT_NE(s.message().find(shards_[1]), std::string::npos) << s;
  EXPECT_NE(s.message().find("maps tensor '"), std::string::npos) << s;
}

TEST_F(ShardedRules, ATensorInTwoShards) {
  // A copy of the first shard under another name, named by no index entry: its tensors are
  // then in two files. Without the index that is the error; with it, the index disagrees.
  fs::copy_file(dir_ / ("c/" + shards_[0]), dir_ / "c/model-extra.safetensors");
  fs::remove(dir_ / "c/model.safetensors.index.json");
  Status s = OpenStatus();
  EXPECT_TRUE(s.IsDataLoss()) << s;
  EXPECT_NE(s.message().find("is in two shards"), std::string::npos) << s;
  EXPECT_NE(s.message().find("model-extra.safetensors"), std::string::npos) << s;
}

TEST_F(ShardedRules, AnIndexThatMapsATensorToTheWrongShard) {
  const auto c = Checkpoint::Open(dir_ / "c");
  ASSERT_TRUE(c.ok());
  const TensorInfo& t = (*c)->tensors().front();  // in shards_[0]
  EditIndex("\"" + t.name + "\": \"" + shards_[0] + "\"",
            "\"" + t.name + "\": \"" + shards_[1] + "\"");
  Status s = OpenStatus();
  EXPECT_TRUE(s.IsDataLoss()) << s;
  EXPECT_NE(s.message().find("'" + t.name + "' is in shard " + shards_[0] +
                             " but the index maps it to " + shards_[1]),
            std::string::npos)
      << s;
}

TEST_F(ShardedRules, AnIndexThatNamesATensorNoShardHolds) {
  EditIndex("\"weight_map\": {",
            "\"weight_map\": {\n    \"ghost.weight\": \"" + shards_[2] + "\",");
  Status s = OpenStatus();
  EXPECT_TRUE(s.IsDataLoss()) << s;
  EXPECT_NE(s.message().find("'ghost.weight' to shard " + shards_[2] + ", which does not hold it"),
            std::string::npos)
      << s;
}

TEST_F(ShardedRules, AShardTensorTheIndexDoesNotName) {
  const auto c = Checkpoint::Open(dir_ / "c");
  ASSERT_TRUE(c.ok());
  // A tensor that shares its shard with another (a shard no index entry names is not read).
  const TensorInfo* pick = nullptr;
  for (size_t i = 1; i < (*c)->tensors().size() && pick == nullptr; ++i) {
    if ((*c)->tensors()[i].file == (*c)->tensors()[i - 1].file) pick = &(*c)->tensors()[i];
  }
  ASSERT_NE(pick, nullptr);
  const TensorInfo& t = *pick;
  const std::string entry = "\"" + t.name + "\": \"" + (*c)->files()[t.file].name + "\"";
  std::string s = IndexText();
  size_t at = s.find(entry);
  ASSERT_NE(at, std::string::npos);
  // Drop the entry and the comma that joins it to a neighbour.
  size_t end = at + entry.size();
  if (s[end] == ',') {
    s.erase(at, end + 1 - at);
  } else {
    size_t comma = s.rfind(',', at);
    s.erase(comma, end - comma);
  }
  WriteText(dir_ / "c/model.safetensors.index.json", s);
  Status st = OpenStatus();
  EXPECT_TRUE(st.IsDataLoss()) << st;
  EXPECT_NE(st.message().find("'" + t.name + "' is in shard"), std::string::npos) << st;
  EXPECT_NE(st.message().find("the index does not name it"), std::string::npos) << st;
}

TEST_F(ShardedRules, AnIndexNamingAPathOutsideTheDirectoryIsRefused) {
  EditIndex(shards_[0], "../" + shards_[0]);
  Status s = OpenStatus();
  EXPECT_TRUE(s.IsInvalidArgument()) << s;
  EXPECT_NE(s.message().find("not a plain file name"), std::string::npos) << s;
}

TEST_F(ShardedRules, MalformedIndexAndEmptyDirectory) {
  WriteText(dir_ / "c/model.safetensors.index.json",
            "{\"weight_map\": {\"a\": \"x\", \"a\": \"y\"}}");
  Status s = OpenStatus();
  EXPECT_TRUE(s.IsDataLoss()) << s;
  EXPECT_NE(s.message().find("names 'a' twice"), std::string::npos) << s;
  WriteText(dir_ / "c/model.safetensors.index.json", "{\"metadata\": {}}");
  s = OpenStatus();
  EXPECT_TRUE(s.IsDataLoss()) << s;
  EXPECT_NE(s.message().find("weight_map"), std::string::npos) << s;
  fs::create_directories(dir_ / "empty");
  auto e = Checkpoint::Open(dir_ / "empty");
  ASSERT_FALSE(e.ok());
  EXPECT_TRUE(e.status().IsInvalidArgument()) << e.status();
  EXPECT_NE(e.status().message().find("without safetensors files"), std::string::npos)
      << e.status();
}

// Without an index every *.safetensors file in the directory is a shard.
TEST_F(ShardedRules, WithoutAnIndexEveryShardCounts) {
  fs::remove(dir_ / "c/model.safetensors.index.json");
  auto c = Checkpoint::Open(dir_ / "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->files().size(), shards_.size());
  EXPECT_TRUE((*c)->index_name().empty());
  EXPECT_EQ((*c)->tensors().size(), tensors_.size());
}

class ShardedApply : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937_64 rng(11);
    MakePair(rng, 0.05, &base_, &target_);
    ASSERT_TRUE(
        WriteShardedCheckpoint(dir_ / "base", Views(base_), TotalBytes(base_) / 3 + 1).ok());
    ASSERT_TRUE(
        WriteShardedCheckpoint(dir_ / "target", Views(target_), TotalBytes(target_) / 3 + 1).ok());
    auto b = Checkpoint::Open(dir_ / "base");
    auto t = Checkpoint::Open(dir_ / "target");
    ASSERT_TRUE(b.ok() && t.ok());
    DeltaFileSink sink(dir_ / "d.dcr");
    ASSERT_TRUE(BuildDelta(b->get(), **t, DeltaOptions{}, &sink).ok());
  }
  // No temporary directory is left beside the output.
  void ExpectNoTemporaries() {
    for (const auto& e : fs::directory_iterator(dir_.path)) {
      EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
    }
  }
  TempDir dir_;
  std::vector<OwnedTensor> base_, target_;
};

// An existing output directory of checkpoint files is swapped for the new one whole.
TEST_F(ShardedApply, AnExistingCheckpointDirectoryIsReplacedWhole) {
  fs::create_directories(dir_ / "out");
  WriteText(dir_ / "out/old-00001-of-00001.safetensors", "stale");
  WriteText(dir_ / "out/model.safetensors.index.json", "{}");
  auto ap = ApplyDeltaFile(dir_ / "base", dir_ / "d.dcr", dir_ / "out", {});
  ASSERT_TRUE(ap.ok()) << ap.status();
  ExpectSameDirectory(dir_ / "target", dir_ / "out");
  ExpectNoTemporaries();
}

// A directory holding anything else is never replaced, and nothing is written.
TEST_F(ShardedApply, ADirectoryWithOtherFilesIsRefusedUntouched) {
  fs::create_directories(dir_ / "out");
  WriteText(dir_ / "out/config.json", "{\"keep\": true}");
  auto ap = ApplyDeltaFile(dir_ / "base", dir_ / "d.dcr", dir_ / "out", {});
  ASSERT_FALSE(ap.ok());
  EXPECT_TRUE(ap.status().IsFailedPrecondition()) << ap.status();
  EXPECT_NE(ap.status().message().find("config.json"), std::string::npos) << ap.status();
  EXPECT_EQ(FileNames(dir_ / "out"), std::vector<std::string>{"config.json"});
  ExpectNoTemporaries();
}

// A wrong base (the target itself) fails before anything appears under the output name.
TEST_F(ShardedApply, AWrongBaseLeavesNoOutput) {
  auto ap =
      ApplyDeltaFile(dir_ / "target", dir_ / "d.dcr", dir_ / "out", ApplyOptions{1, true, false});
  ASSERT_FALSE(ap.ok());
  EXPECT_TRUE(ap.status().IsFailedPrecondition()) << ap.status();
  EXPECT_FALSE(fs::exists(dir_ / "out"));
  ExpectNoTemporaries();
}

// A corrupted chunk fails the apply after the shards were being written: still nothing visible.
TEST_F(ShardedApply, ACorruptChunkLeavesNoOutput) {
  std::vector<uint8_t> d = Read(dir_ / "d.dcr");
  auto r = DeltaReader::FromBytes(d);
  ASSERT_TRUE(r.ok());
  ASSERT_GT((*r)->num_chunks(), 0u);
  const uint64_t at = (*r)->trailer().chunks[0].offset + (*r)->trailer().chunks[0].size - 1;
  d[at] ^= 0x40;
  ASSERT_TRUE(WriteFileAtomic(dir_ / "bad.dcr", d.data(), d.size()).ok());
  auto ap = ApplyDeltaFile(dir_ / "base", dir_ / "bad.dcr", dir_ / "out", {});
  ASSERT_FALSE(ap.ok());
  EXPECT_TRUE(ap.status().IsDataLoss()) << ap.status();
  EXPECT_FALSE(fs::exists(dir_ / "out"));
  ExpectNoTemporaries();
}

// Version 5 header sections: an unknown critical kind is refused, an unknown other kind is kept.
TEST(ShardedFormat, HeaderSectionsOfUnknownKinds) {
  FileHeader h;
  h.SetSingleFile("{}");
  h.other_sections.push_back(HeaderSection{77, "opaque"});
  std::vector<uint8_t> bytes = SerializeFileHeader(h);
  auto p = ParseFileHeader(bytes.data(), bytes.size(), nullptr);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->other_sections.size(), 1u);
  EXPECT_EQ(p->other_sections[0].kind, 77u);
  EXPECT_EQ(p->other_sections[0].bytes, "opaque");
  EXPECT_EQ(SerializeFileHeader(*p), bytes);
  h.other_sections[0].kind = kSectionCritical | 77;
  bytes = SerializeFileHeader(h);
  p = ParseFileHeader(bytes.data(), bytes.size(), nullptr);
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(p.status().IsFailedPrecondition()) << p.status();
  EXPECT_NE(p.status().message().find("newer dcr"), std::string::npos) << p.status();
}

// Target file names in a delta header must be plain and unique; a tensor may be in one file only.
TEST(ShardedFormat, InventoryRulesOnTheHeader) {
  const std::string a = R"({"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})";
  const std::string b = R"({"y":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  FileHeader h;
  h.files = {{"a.safetensors", a}, {"b.safetensors", b}};
  EXPECT_TRUE(Inventory::FromHeader(h).ok());
  h.files = {{"a.safetensors", a}, {"../b.safetensors", b}};
  EXPECT_TRUE(Inventory::FromHeader(h).status().IsDataLoss());
  h.files = {{"a.safetensors", a}, {"a.safetensors", b}};
  EXPECT_TRUE(Inventory::FromHeader(h).status().IsDataLoss());
  h.files = {{"a.safetensors", a}, {"b.safetensors", a}};
  auto two = Inventory::FromHeader(h);
  ASSERT_FALSE(two.ok());
  EXPECT_NE(two.status().message().find("is in two target files"), std::string::npos)
      << two.status();
  h.files = {{"a.safetensors", a}, {"b.safetensors", b}};
  h.index_name = "model.safetensors.index.json";
  h.index = R"({"weight_map": {"x": "a.safetensors", "y": "a.safetensors"}})";
  EXPECT_TRUE(Inventory::FromHeader(h).status().IsDataLoss());
  h.index = R"({"weight_map": {"x": "a.safetensors", "y": "b.safetensors"}})";
  auto ok = Inventory::FromHeader(h);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->data_size(), 3u);
  EXPECT_EQ(ok->tensors[1].file, 1u);
}

}  // namespace
}  // namespace dcr
