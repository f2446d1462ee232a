// Pins the bytes of the current format (v5: a single-file delta, a full frame, and a delta to a
// sharded target; v6: the single-file delta signed with a fixed test key; v8: a delta with
// context-coded chunks, unsigned and signed), checks that version 2 to 4 deltas and version 6 and 7
// context-coded deltas still apply, and checks the malformed-input corpus.
//
// The checkpoints are generated here from a fixed integer recipe (no std distributions, no float
// math), so they are identical on every compiler. Regenerate the files, after a deliberate format
// change that also bumps kFormatVersion, with:  DCR_UPDATE_GOLDEN=1
// build/tests/golden/dcr_golden_tests
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dcr/apply.h"
#include "dcr/context.h"
#include "dcr/delta.h"
#include "dcr/signing.h"
#include "dcr/sums.h"
#include "dcr/train.h"

namespace dcr {
namespace {

namespace fs = std::filesystem;
const fs::path kGolden = fs::path("tests") / "golden";
const fs::path kErrors = fs::path("tests") / "golden-errors";

uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

struct Pair {
  std::vector<std::vector<uint8_t>> base, target;
  std::vector<TensorView> bv, tv;
};

// Eight tensors of several dtypes; ~3% of elements change (1 ulp, sign flips, NaN payloads, -0).
Pair MakePair() {
  struct Spec {
    const char* name;
    const char* dtype;
    std::vector<int64_t> shape;
  };
  const std::vector<Spec> specs = {{"model.embed_tokens.weight", "BF16", {64, 96}},
                                   {"model.layers.0.mlp.down_proj.weight", "BF16", {96, 128}},
                                   {"model.layers.0.input_layernorm.weight", "F32", {96}},
                                   {"model.layers.0.self_attn.q_proj.weight", "F16", {96, 96}},
                                   {"model.layers.0.scales", "F8_E4M3", {300}},
                                   {"model.layers.0.bias", "I32", {50}},
                                   {"model.layers.0.mask", "BOOL", {33}},
                                   {"model.norm.weight", "BF16", {96}}};
  Pair p;
  uint64_t seed = 12345;
  for (const Spec& s : specs) {
    int w = DTypeWidth(DTypeFromName(s.dtype));
    uint64_t n = 1;
    for (int64_t d : s.shape) n *= static_cast<uint64_t>(d);
    std::vector<uint8_t> b(n * w), t;
    for (uint64_t i = 0; i < n; ++i) {
      uint64_t v = Mix(seed++);
      std::memcpy(&b[i * w], &v, w);
    }
    t = b;
    for (uint64_t i = 0; i < n; ++i) {
      uint64_t r = Mix(seed++);
      if (r % 100 >= 3) continue;
      uint64_t v = 0;
      std::memcpy(&v, &t[i * w], w);
      switch ((r >> 8) % 4) {
        case 0:
          v += 1;
          break;
        case 1:
          v -= 1;
          break;
        case 2:
          v ^= uint64_t{1} << (8 * w - 1);
          break;  // sign flip (-0 <-> +0 included)
        default:
          v = ~uint64_t{0};
          break;  // all-ones: a NaN payload for floats
      }
      std::memcpy(&t[i * w], &v, w);
    }
    p.base.push_back(std::move(b));
    p.target.push_back(std::move(t));
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    p.bv.push_back(
        {specs[i].name, specs[i].dtype, specs[i].shape, p.base[i].data(), p.base[i].size()});
    p.tv.push_back(
        {specs[i].name, specs[i].dtype, specs[i].shape, p.target[i].data(), p.target[i].size()});
  }
  return p;
}

std::vector<uint8_t> Read(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

struct Tmp {
  fs::path dir = fs::temp_directory_path() / ("dcr_golden_" + std::to_string(::getpid()));
  Tmp() { fs::create_directories(dir); }
  ~Tmp() { fs::remove_all(dir); }
};

DeltaOptions GoldenOptions() {
  DeltaOptions o;
  o.chunk_elems = 4096;
  o.small_tensor_elems = 1000;
  o.threads = 1;
  o.base_version = 1;
  o.target_version = 2;
  return o;
}

class Golden : public ::testing::Test {
 protected:
  void SetUp() override {
    pair_ = MakePair();
    ASSERT_TRUE(WriteSafetensors((tmp_.dir / "base.safetensors").string(), pair_.bv).ok());
    ASSERT_TRUE(WriteSafetensors((tmp_.dir / "target.safetensors").string(), pair_.tv).ok());
  }
  std::vector<uint8_t> Build(bool full) {
    auto b = Checkpoint::Open((tmp_.dir / "base.safetensors").string());
    auto t = Checkpoint::Open((tmp_.dir / "target.safetensors").string());
    EXPECT_TRUE(b.ok() && t.ok());
    DeltaOptions o = GoldenOptions();
    o.full = full;
    DeltaMemorySink sink;
    auto st = BuildDelta(full ? nullptr : b->get(), **t, o, &sink);
    EXPECT_TRUE(st.ok()) << st.status();
    return sink.Release();
  }
  Pair pair_;
  Tmp tmp_;
};

// The sharded target: the golden pair's target in three shards (and its index).
constexpr uint64_t kShardBytes = 12000;

TEST_F(Golden, EncoderOutputIsPinned) {
  const bool update = std::getenv("DCR_UPDATE_GOLDEN") != nullptr;
  for (bool full : {false, true}) {
    const fs::path file = kGolden / (full ? "v5_full.dcr" : "v5_delta.dcr");
    std::vector<uint8_t> bytes = Build(full);
    if (update) {
      ASSERT_TRUE(WriteFileAtomic(file.string(), bytes.data(), bytes.size()).ok());
      std::vector<uint8_t> b = Read(tmp_.dir / "base.safetensors");
      std::vector<uint8_t> t = Read(tmp_.dir / "target.safetensors");
      ASSERT_TRUE(
          WriteFileAtomic((kGolden / "base.safetensors").string(), b.data(), b.size()).ok());
      ASSERT_TRUE(
          WriteFileAtomic((kGolden / "target.safetensors").string(), t.data(), t.size()).ok());
    }
    ASSERT_TRUE(fs::exists(file)) << file << " missing (run from the source root)";
    EXPECT_EQ(bytes, Read(file)) << "encoder output for " << file
                                 << " changed: bump kFormatVersion and regenerate the golden files";
  }
  // The committed checkpoints are the ones generated here.
  EXPECT_EQ(Read(tmp_.dir / "base.safetensors"), Read(kGolden / "base.safetensors"));
  EXPECT_EQ(Read(tmp_.dir / "target.safetensors"), Read(kGolden / "target.safetensors"));

  // The sharded target directory and the delta to it from the single-file base.
  const fs::path shards = tmp_.dir / "sharded_target";
  ASSERT_TRUE(WriteShardedCheckpoint(shards.string(), pair_.tv, kShardBytes).ok());
  auto b = Checkpoint::Open((tmp_.dir / "base.safetensors").string());
  auto t = Checkpoint::Open(shards.string());
  ASSERT_TRUE(b.ok() && t.ok()) << t.status();
  ASSERT_GE((*t)->files().size(), 3u);
  DeltaMemorySink sink;
  ASSERT_TRUE(BuildDelta(b->get(), **t, GoldenOptions(), &sink).ok());
  const fs::path file = kGolden / "v5_sharded.dcr";
  if (update) {
    ASSERT_TRUE(WriteFileAtomic(file.string(), sink.bytes().data(), sink.bytes().size()).ok());
    fs::remove_all(kGolden / "sharded_target");
    fs::copy(shards, kGolden / "sharded_target");
  }
  EXPECT_EQ(sink.bytes(), Read(file)) << "encoder output for " << file << " changed";
  for (const auto& e : fs::directory_iterator(shards)) {
    const std::string n = e.path().filename().string();
    EXPECT_EQ(Read(e.path()), Read(kGolden / "sharded_target" / n)) << n;
  }
  EXPECT_EQ(
      std::distance(fs::directory_iterator(shards), fs::directory_iterator()),
      std::distance(fs::directory_iterator(kGolden / "sharded_target"), fs::directory_iterator()));
}

TEST_F(Golden, GoldenDeltaAppliesToTheTarget) {
  const fs::path out = tmp_.dir / "out.safetensors";
  auto st =
      ApplyDeltaFile((kGolden / "base.safetensors").string(), (kGolden / "v5_delta.dcr").string(),
                     out.string(), ApplyOptions{1, true, true});
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(Read(out), Read(kGolden / "target.safetensors"));
  auto full = ApplyDeltaFile("", (kGolden / "v5_full.dcr").string(), out.string(),
                             ApplyOptions{1, true, true});
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(Read(out), Read(kGolden / "target.safetensors"));
  // The sharded delta rebuilds every file of the sharded target, index included.
  const fs::path dir = tmp_.dir / "out_dir";
  auto sh =
      ApplyDeltaFile((kGolden / "base.safetensors").string(), (kGolden / "v5_sharded.dcr").string(),
                     dir.string(), ApplyOptions{1, true, true});
  ASSERT_TRUE(sh.ok()) << sh.status();
  int files = 0;
  for (const auto& e : fs::directory_iterator(kGolden / "sharded_target")) {
    const std::string n = e.path().filename().string();
    EXPECT_EQ(Read(dir / n), Read(e.path())) << n;
    ++files;
  }
  EXPECT_GE(files, 4);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), files);
}

// The golden deltas of older format versions (2: older zstd parameters for value planes; 3:
// value planes with the match finder on; 4: the target's header as one inventory field) are
// still read and give the same target, with the same chunks as version 5's.
TEST_F(Golden, OlderVersionDeltasStillApply) {
  const fs::path out = tmp_.dir / "out.safetensors";
  for (uint32_t old : {2u, 3u, 4u}) {
    for (const bool full : {false, true}) {
      // Appended piecewise: g++ 12 warns (-Wrestrict, a known false positive) on "v" + string.
      std::string name = "v";
      name += std::to_string(old);
      name += full ? "_full.dcr" : "_delta.dcr";
      SCOPED_TRACE(name);
      const std::vector<uint8_t> bytes = Read(kGolden / name);
      ASSERT_GE(bytes.size(), 12u);
      uint32_t version = 0;
      std::memcpy(&version, bytes.data() + 8, 4);
      EXPECT_EQ(version, old);
      auto st =
          ApplyDeltaFile(full ? "" : (kGolden / "base.safetensors").string(),
                         (kGolden / name).string(), out.string(), ApplyOptions{1, true, true});
      ASSERT_TRUE(st.ok()) << st.status();
      EXPECT_EQ(Read(out), Read(kGolden / "target.safetensors"));
      auto dold = DeltaReader::FromBytes(bytes);
      auto dnew = DeltaReader::FromBytes(Read(kGolden / (full ? "v5_full.dcr" : "v5_delta.dcr")));
      ASSERT_TRUE(dold.ok() && dnew.ok());
      EXPECT_EQ((*dold)->header().format_version, old);
      EXPECT_EQ((*dnew)->header().format_version, 5u);
      EXPECT_TRUE((*dold)->header().SameTarget((*dnew)->header()));
      EXPECT_EQ((*dold)->trailer().target_hash, (*dnew)->trailer().target_hash);
      ASSERT_EQ((*dold)->num_chunks(), (*dnew)->num_chunks());
      for (size_t i = 0; i < (*dold)->num_chunks(); ++i) {
        auto a = (*dold)->Decode(i);
        auto b = (*dnew)->Decode(i);
        ASSERT_TRUE(a.ok() && b.ok());
        EXPECT_EQ(a->positions, b->positions);
        EXPECT_EQ(a->values, b->values);
        EXPECT_EQ(a->header.version_delta, b->header.version_delta);
      }
    }
  }
}

// The golden delta signed (format version 6) with the key of seed 0, 1, ..., 31, run 1, two chunks
// per manifest: its bytes are pinned (Ed25519 signatures are deterministic), it verifies with the
// key, it applies like the version 5 delta, and its chunk records are version 5's.
TEST_F(Golden, SignedDeltaIsPinned) {
  std::array<uint8_t, 32> seed;
  for (int i = 0; i < 32; ++i) seed[i] = static_cast<uint8_t>(i);
  auto key = SigningKey::FromSeed(seed);
  ASSERT_TRUE(key.ok()) << key.status();
  auto b = Checkpoint::Open((tmp_.dir / "base.safetensors").string());
  auto t = Checkpoint::Open((tmp_.dir / "target.safetensors").string());
  ASSERT_TRUE(b.ok() && t.ok());
  DeltaMemorySink mem;
  SignOptions so;
  so.run_id = 1;
  so.chunks_per_manifest = 2;
  SigningSink sink(key->get(), so, &mem);
  ASSERT_TRUE(BuildDelta(b->get(), **t, GoldenOptions(), &sink).ok());
  const fs::path file = kGolden / "v6_signed.dcr";
  if (std::getenv("DCR_UPDATE_GOLDEN") != nullptr) {
    ASSERT_TRUE(WriteFileAtomic(file.string(), mem.bytes().data(), mem.bytes().size()).ok());
  }
  EXPECT_EQ(mem.bytes(), Read(file)) << "encoder output for " << file << " changed";
  auto d6 = DeltaReader::FromBytes(Read(file));
  auto d5 = DeltaReader::FromBytes(Read(kGolden / "v5_delta.dcr"));
  ASSERT_TRUE(d6.ok() && d5.ok()) << d6.status();
  EXPECT_EQ((*d6)->header().format_version, 6u);
  auto trust = TrustKey::FromRaw((*key)->public_key());
  ASSERT_TRUE(trust.ok());
  Status v = VerifyDeltaFile(**d6, *trust, 1);
  EXPECT_TRUE(v.ok()) << v;
  ASSERT_EQ((*d6)->num_chunks(), (*d5)->num_chunks());
  for (size_t i = 0; i < (*d5)->num_chunks(); ++i) {
    ASSERT_EQ((*d6)->chunk_size(i), (*d5)->chunk_size(i));
    EXPECT_EQ(0, std::memcmp((*d6)->chunk_data(i), (*d5)->chunk_data(i), (*d5)->chunk_size(i)));
  }
  const fs::path out = tmp_.dir / "out6.safetensors";
  ApplyOptions o{1, true, true};
  o.check_delta = [&](const DeltaReader& d) { return VerifyDeltaFile(d, *trust, 1); };
  auto st = ApplyDeltaFile((kGolden / "base.safetensors").string(), file.string(), out.string(), o);
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(Read(out), Read(kGolden / "target.safetensors"));
}

// A float-like pair for the context-coded golden delta: BF16 weights whose small magnitudes change
// more often, by one or two ulp (integer recipe, as MakePair's).
Pair MakeFloatPair() {
  struct Spec {
    const char* name;
    std::vector<int64_t> shape;
  };
  const std::vector<Spec> specs = {{"model.layers.0.mlp.up_proj.weight", {40, 1000}},
                                   {"model.layers.0.self_attn.o_proj.weight", {30, 200}},
                                   {"model.layers.1.self_attn.k_proj.weight", {16, 200}}};
  Pair p;
  uint64_t seed = 777;
  for (const Spec& s : specs) {
    uint64_t n = 1;
    for (int64_t d : s.shape) n *= static_cast<uint64_t>(d);
    std::vector<uint8_t> b(n * 2), t;
    std::vector<int> exps(n);
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t r = Mix(seed++);
      const int e = 124 - static_cast<int>(r % 7) - static_cast<int>((r >> 3) % 7);
      exps[i] = e;
      const uint16_t v = static_cast<uint16_t>(((r >> 20) & 1) << 15 | e << 7 | ((r >> 8) & 0x7F));
      std::memcpy(&b[i * 2], &v, 2);
    }
    t = b;
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t r = Mix(seed++);
      if (r % 1024 >= (uint64_t{4} << ((124 - exps[i]) / 2))) continue;
      uint16_t v;
      std::memcpy(&v, &t[i * 2], 2);
      v = static_cast<uint16_t>(((r >> 10) & 1) ? v + 1 + ((r >> 11) & 1) : v - 1);
      std::memcpy(&t[i * 2], &v, 2);
    }
    p.base.push_back(std::move(b));
    p.target.push_back(std::move(t));
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    p.bv.push_back({specs[i].name, "BF16", specs[i].shape, p.base[i].data(), p.base[i].size()});
    p.tv.push_back({specs[i].name, "BF16", specs[i].shape, p.target[i].data(), p.target[i].size()});
  }
  return p;
}

// The context-coded delta (format version 8) of the float-like pair is pinned, applies to its
// target, and each of its context-coded chunks (compact records, "DCRX") converts back to the plain
// delta's record (full header, "DCRC"). It is smaller than the version-7 delta of the same pair by
// what the compact header sections, records and trailer save.
TEST(GoldenContext, ContextDeltaIsPinnedAndConvertsToPlain) {
  const bool update = std::getenv("DCR_UPDATE_GOLDEN") != nullptr;
  Tmp tmp;
  const Pair pair = MakeFloatPair();
  const fs::path bp = tmp.dir / "float_base.safetensors", tp = tmp.dir / "float_target.safetensors";
  ASSERT_TRUE(WriteSafetensors(bp.string(), pair.bv).ok());
  ASSERT_TRUE(WriteSafetensors(tp.string(), pair.tv).ok());
  auto b = Checkpoint::Open(bp.string());
  auto t = Checkpoint::Open(tp.string());
  ASSERT_TRUE(b.ok() && t.ok());
  DeltaOptions o = GoldenOptions();
  DeltaMemorySink plain;
  ASSERT_TRUE(BuildDelta(b->get(), **t, o, &plain).ok());
  o.context_coding = true;
  DeltaMemorySink ctx;
  ASSERT_TRUE(BuildDelta(b->get(), **t, o, &ctx).ok());
  const fs::path file = kGolden / "v8_context.dcr";
  if (update) {
    ASSERT_TRUE(WriteFileAtomic(file.string(), ctx.bytes().data(), ctx.bytes().size()).ok());
    for (const fs::path& f : {bp, tp}) {
      const std::vector<uint8_t> bytes = Read(f);
      const fs::path to = kGolden / f.filename();
      ASSERT_TRUE(WriteFileAtomic(to.string(), bytes.data(), bytes.size()).ok());
    }
  }
  // The committed float-like checkpoints (the error corpus's ctxdelta base) are the ones generated
  // here.
  EXPECT_EQ(Read(bp), Read(kGolden / "float_base.safetensors"));
  EXPECT_EQ(Read(tp), Read(kGolden / "float_target.safetensors"));
  ASSERT_TRUE(fs::exists(file)) << file << " missing (run from the source root)";
  EXPECT_EQ(ctx.bytes(), Read(file)) << "encoder output for " << file << " changed";
  const fs::path out = tmp.dir / "out.safetensors";
  auto st = ApplyDeltaFile(bp.string(), file.string(), out.string(), ApplyOptions{1, true, true});
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(Read(out), Read(tp));
  auto d = DeltaReader::FromBytes(Read(file));
  auto pd = DeltaReader::FromBytes(plain.bytes());
  ASSERT_TRUE(d.ok() && pd.ok());
  EXPECT_EQ((*d)->header().format_version, 8u);
  EXPECT_EQ((*pd)->header().format_version, 5u);
  EXPECT_TRUE((*d)->trailer().compact);
  const std::vector<uint8_t> v7 = Read(kGolden / "v7_context.dcr");
  EXPECT_LT(ctx.bytes().size(), v7.size());
  ASSERT_EQ((*d)->num_chunks(), (*pd)->num_chunks());
  int context_chunks = 0;
  for (size_t i = 0; i < (*d)->num_chunks(); ++i) {
    const std::vector<uint8_t> want((*pd)->chunk_data(i),
                                    (*pd)->chunk_data(i) + (*pd)->chunk_size(i));
    auto h = ParseChunkHeader((*d)->chunk_data(i), (*d)->chunk_size(i), nullptr, nullptr);
    ASSERT_TRUE(h.ok());
    if (!IsContextCoded(*h)) {
      EXPECT_EQ(
          std::vector<uint8_t>((*d)->chunk_data(i), (*d)->chunk_data(i) + (*d)->chunk_size(i)),
          want);
      continue;
    }
    ++context_chunks;
    EXPECT_TRUE(h->compact);
    EXPECT_EQ(0, std::memcmp((*d)->chunk_data(i), kContextChunkMagic, 4));
    std::vector<TensorBuffer> tbs;
    for (size_t k = 0; k < pair.bv.size(); ++k) {
      tbs.push_back(
          TensorBuffer{const_cast<uint8_t*>(pair.base[k].data()), pair.base[k].size() / 2, 2, 0});
    }
    std::vector<uint8_t> covered;
    ASSERT_TRUE(GatherCoveredBits(*h, tbs, &covered).ok());
    auto p = ContextChunkToPlain((*d)->chunk_data(i), (*d)->chunk_size(i), covered.data(),
                                 covered.size());
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(*p, want);
  }
  EXPECT_GE(context_chunks, 5);
}

// The context-coded golden delta signed (key of seed 0..31, run 1, two chunks per manifest) is
// pinned; every manifest entry of a context-coded chunk lists both forms (forms = 2): the SHA-256
// of the context record and of its plain record as ContextChunkToPlain rebuilds it from the base,
// which is the plain golden delta's record. The delta verifies and applies as built and with every
// context chunk replaced by its plain form (what a relay that decodes for its subtree forwards).
TEST(GoldenContext, SignedContextDeltaIsPinnedAndListsBothForms) {
  Tmp tmp;
  const Pair pair = MakeFloatPair();
  const fs::path bp = tmp.dir / "float_base.safetensors", tp = tmp.dir / "float_target.safetensors";
  ASSERT_TRUE(WriteSafetensors(bp.string(), pair.bv).ok());
  ASSERT_TRUE(WriteSafetensors(tp.string(), pair.tv).ok());
  auto b = Checkpoint::Open(bp.string());
  auto t = Checkpoint::Open(tp.string());
  ASSERT_TRUE(b.ok() && t.ok());
  std::array<uint8_t, 32> seed;
  for (int i = 0; i < 32; ++i) seed[i] = static_cast<uint8_t>(i);
  auto key = SigningKey::FromSeed(seed);
  ASSERT_TRUE(key.ok()) << key.status();
  DeltaOptions o = GoldenOptions();
  o.context_coding = true;
  DeltaMemorySink mem;
  SignOptions so;
  so.run_id = 1;
  so.chunks_per_manifest = 2;
  SigningSink sink(key->get(), so, &mem);
  ASSERT_TRUE(BuildDelta(b->get(), **t, o, &sink).ok());
  const fs::path file = kGolden / "v8_signed_context.dcr";
  if (std::getenv("DCR_UPDATE_GOLDEN") != nullptr) {
    ASSERT_TRUE(WriteFileAtomic(file.string(), mem.bytes().data(), mem.bytes().size()).ok());
  }
  ASSERT_TRUE(fs::exists(file)) << file << " missing (run from the source root)";
  EXPECT_EQ(mem.bytes(), Read(file)) << "encoder output for " << file << " changed";
  const std::vector<uint8_t> bytes = Read(file);
  auto d = DeltaReader::FromBytes(bytes);
  auto c = DeltaReader::FromBytes(Read(kGolden / "v8_context.dcr"));
  ASSERT_TRUE(d.ok() && c.ok()) << d.status();
  EXPECT_EQ((*d)->header().flags & (kFlagSigned | kFlagContext), kFlagSigned | kFlagContext);
  auto trust = TrustKey::FromRaw((*key)->public_key());
  ASSERT_TRUE(trust.ok());
  Status v = VerifyDeltaFile(**d, *trust, 1);
  EXPECT_TRUE(v.ok()) << v;
  // The chunk records are the unsigned context delta's, moved to make room for the manifests.
  ASSERT_EQ((*d)->num_chunks(), (*c)->num_chunks());
  for (size_t i = 0; i < (*c)->num_chunks(); ++i) {
    ASSERT_EQ((*d)->chunk_size(i), (*c)->chunk_size(i));
    EXPECT_EQ(0, std::memcmp((*d)->chunk_data(i), (*c)->chunk_data(i), (*c)->chunk_size(i)));
  }
  std::vector<TensorBuffer> tbs;
  for (size_t k = 0; k < pair.bv.size(); ++k) {
    tbs.push_back(
        TensorBuffer{const_cast<uint8_t*>(pair.base[k].data()), pair.base[k].size() / 2, 2, 0});
  }
  // Walk the stream: manifests, then their chunks; build the decoded stream beside it.
  size_t hsize = 0;
  ASSERT_TRUE(ParseFileHeader(bytes.data(), bytes.size(), &hsize).ok());
  uint64_t trailer_offset = 0;
  std::memcpy(&trailer_offset, bytes.data() + bytes.size() - 24, 8);
  std::map<uint64_t, ManifestEntry> listed;
  std::vector<std::vector<uint8_t>> built, decoded;  // records as built / as a decoding relay sends
  int both = 0, manifests = 0;
  for (size_t off = hsize; off < trailer_offset;) {
    const uint8_t* p = bytes.data() + off;
    size_t rs = 0, hs = 0;
    if (IsManifestRecord(p, trailer_offset - off)) {
      auto m = ParseManifest(p, trailer_offset - off, &rs);
      ASSERT_TRUE(m.ok()) << m.status();
      for (const ManifestEntry& e : m->entries) listed[e.chunk_id] = e;
      ++manifests;
      built.emplace_back(p, p + rs);
      decoded.emplace_back(p, p + rs);
      off += rs;
      continue;
    }
    auto h = ParseChunkHeader(p, trailer_offset - off, &hs, &rs);
    ASSERT_TRUE(h.ok()) << h.status();
    ASSERT_TRUE(listed.count(h->chunk_id)) << "chunk " << h->chunk_id << " before its manifest";
    const ManifestEntry& e = listed[h->chunk_id];
    built.emplace_back(p, p + rs);
    EXPECT_EQ(e.has_context, IsContextCoded(*h)) << "chunk " << h->chunk_id;
    if (IsContextCoded(*h)) {
      ++both;
      EXPECT_EQ(e.context, Sha256(p, rs));
      std::vector<uint8_t> covered;
      ASSERT_TRUE(GatherCoveredBits(*h, tbs, &covered).ok());
      auto plain = ContextChunkToPlain(p, rs, covered.data(), covered.size());
      ASSERT_TRUE(plain.ok()) << plain.status();
      EXPECT_EQ(e.plain, Sha256(plain->data(), plain->size())) << "chunk " << h->chunk_id;
      decoded.push_back(*plain);
    } else {
      EXPECT_EQ(e.plain, Sha256(p, rs));
      decoded.emplace_back(p, p + rs);
    }
    off += rs;
  }
  EXPECT_GE(both, 5);
  EXPECT_GE(manifests, 2);
  // Both streams through a TrustedReceiver over the base's bytes.
  for (int form = 0; form < 2; ++form) {
    std::vector<std::vector<uint8_t>> store = pair.base;
    std::vector<ReceiverTensor> tensors;
    const Inventory& inv = (*d)->inventory();
    for (size_t i = 0; i < inv.tensors.size(); ++i)
      tensors.push_back({inv.tensors[i], store[i].data()});
    TrustOptions to;
    to.key = *trust;
    to.run_id = 1;
    to.check_commitment = false;  // pinned without a commitment: the chain is what is tested
    TrustedReceiver rx(
        std::make_unique<BufferReceiver>(
            std::move(tensors), VersionId{(*d)->header().base_version, (*b)->ContentHash(1)}),
        to);
    ASSERT_TRUE(rx.Begin(bytes.data(), hsize).ok());
    for (const std::vector<uint8_t>& rec : form == 0 ? built : decoded) {
      Status s = rx.ApplyRecord(rec.data(), rec.size());
      ASSERT_TRUE(s.ok()) << "form " << form << ": " << s;
    }
    Status s = rx.Commit(bytes.data() + trailer_offset, bytes.size() - trailer_offset);
    ASSERT_TRUE(s.ok()) << "form " << form << ": " << s;
    EXPECT_EQ(store, pair.target) << "form " << form;
  }
}

// Version 6 deltas with context-coded chunks (position mode 3: every model an explicit table) and
// version 7 ones (position mode 4, full "DCRC" headers, the full trailer) are still read: the
// pinned unsigned ones apply to their target and each of their context chunks converts back to the
// plain delta's record; the signed ones verify.
TEST(GoldenContext, OlderContextDeltasStillApply) {
  Tmp tmp;
  const Pair pair = MakeFloatPair();
  DeltaMemorySink plain;
  {
    const fs::path bp = tmp.dir / "b.safetensors", tp = tmp.dir / "t.safetensors";
    ASSERT_TRUE(WriteSafetensors(bp.string(), pair.bv).ok());
    ASSERT_TRUE(WriteSafetensors(tp.string(), pair.tv).ok());
    auto b = Checkpoint::Open(bp.string());
    auto t = Checkpoint::Open(tp.string());
    ASSERT_TRUE(b.ok() && t.ok());
    ASSERT_TRUE(BuildDelta(b->get(), **t, GoldenOptions(), &plain).ok());
  }
  auto pd = DeltaReader::FromBytes(plain.bytes());
  ASSERT_TRUE(pd.ok());
  std::vector<TensorBuffer> tbs;
  for (size_t k = 0; k < pair.bv.size(); ++k) {
    tbs.push_back(
        TensorBuffer{const_cast<uint8_t*>(pair.base[k].data()), pair.base[k].size() / 2, 2, 0});
  }
  for (const char* name :
       {"v6_context.dcr", "v6_signed_context.dcr", "v7_context.dcr", "v7_signed_context.dcr"}) {
    SCOPED_TRACE(name);
    const uint32_t version = name[1] == '6' ? 6 : 7;
    const fs::path file = kGolden / name;
    const fs::path out = tmp.dir / "out.safetensors";
    auto st = ApplyDeltaFile((kGolden / "float_base.safetensors").string(), file.string(),
                             out.string(), ApplyOptions{1, true, true});
    ASSERT_TRUE(st.ok()) << st.status();
    EXPECT_EQ(Read(out), Read(kGolden / "float_target.safetensors"));
    auto d = DeltaReader::FromBytes(Read(file));
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ((*d)->header().format_version, version);
    EXPECT_FALSE((*d)->trailer().compact);
    ASSERT_EQ((*d)->num_chunks(), (*pd)->num_chunks());
    int context_chunks = 0;
    for (size_t i = 0; i < (*d)->num_chunks(); ++i) {
      auto h = ParseChunkHeader((*d)->chunk_data(i), (*d)->chunk_size(i), nullptr, nullptr);
      ASSERT_TRUE(h.ok());
      if (!IsContextCoded(*h)) continue;
      ++context_chunks;
      EXPECT_EQ(h->position_mode, version == 6 ? PositionMode::kContext : PositionMode::kContextV7);
      EXPECT_FALSE(h->compact);
      std::vector<uint8_t> covered;
      ASSERT_TRUE(GatherCoveredBits(*h, tbs, &covered).ok());
      auto p = ContextChunkToPlain((*d)->chunk_data(i), (*d)->chunk_size(i), covered.data(),
                                   covered.size());
      ASSERT_TRUE(p.ok()) << p.status();
      EXPECT_EQ(*p, std::vector<uint8_t>((*pd)->chunk_data(i),
                                         (*pd)->chunk_data(i) + (*pd)->chunk_size(i)));
    }
    EXPECT_GE(context_chunks, 5);
  }
  std::array<uint8_t, 32> seed;
  for (int i = 0; i < 32; ++i) seed[i] = static_cast<uint8_t>(i);
  auto key = SigningKey::FromSeed(seed);
  ASSERT_TRUE(key.ok());
  auto trust = TrustKey::FromRaw((*key)->public_key());
  ASSERT_TRUE(trust.ok());
  for (const char* name : {"v6_signed_context.dcr", "v7_signed_context.dcr"}) {
    auto sd = DeltaReader::FromBytes(Read(kGolden / name));
    ASSERT_TRUE(sd.ok()) << name;
    Status v = VerifyDeltaFile(**sd, *trust, 1);
    EXPECT_TRUE(v.ok()) << name << ": " << v;
  }
}

// The sums file of the golden base, as `dcr sums` writes it: the format is stable, and it checks.
TEST(GoldenSums, TheBaseSumsFileIsWhatDcrSumsWritesAndItChecks) {
  auto base = Checkpoint::Open((kGolden / "base.safetensors").string());
  ASSERT_TRUE(base.ok());
  auto sums = ReadSums((kGolden / "base.sums").string());
  ASSERT_TRUE(sums.ok()) << sums.status();
  EXPECT_EQ(sums->content_hash, (*base)->ContentHash(1));
  EXPECT_TRUE(CheckSums(**base, *sums, 1).ok());
  std::ifstream f(kGolden / "base.sums", std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(f)), {});
  EXPECT_EQ(FormatSums(ComputeSums(**base, (*base)->ContentHash(1), 1)), text);
}

// tests/golden-errors/MANIFEST: "<file> <kind: delta|ctxdelta|checkpoint|sums|layout> <STATUS_CODE>
// <message substring>".
TEST(GoldenErrors, EveryMalformedInputGivesItsClearError) {
  std::ifstream manifest(kErrors / "MANIFEST");
  ASSERT_TRUE(manifest.good()) << "run from the source root";
  Tmp tmp;
  std::string line;
  int cases = 0;
  while (std::getline(manifest, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream is(line);
    std::string file, kind, code;
    is >> file >> kind >> code;
    std::string substring;
    std::getline(is, substring);
    substring.erase(0, substring.find_first_not_of(' '));
    const fs::path path = kErrors / file;
    ASSERT_TRUE(fs::exists(path)) << path;
    Status s;
    const fs::path out = tmp.dir / "out.safetensors";
    if (kind == "delta" || kind == "ctxdelta") {
      // ctxdelta: context-coded deltas of the float-like golden pair, applied to its base.
      const fs::path base =
          kGolden / (kind == "delta" ? "base.safetensors" : "float_base.safetensors");
      s = ApplyDeltaFile(base.string(), path.string(), out.string(), ApplyOptions{1, true, false})
              .status();
      EXPECT_FALSE(fs::exists(out)) << file << ": output left behind";
    } else if (kind == "sums") {
      s = ReadSums(path.string()).status();
    } else if (kind == "layout") {
      // A per-rank layout spec over the golden base's tensors.
      auto ck = Checkpoint::Open((kGolden / "base.safetensors").string());
      ASSERT_TRUE(ck.ok()) << ck.status();
      std::vector<TensorSpec> tensors;
      for (const TensorInfo& t : (*ck)->tensors()) {
        tensors.push_back(TensorSpec{t.name, t.dtype_name, t.shape});
      }
      std::ifstream in(path);
      const std::string spec((std::istreambuf_iterator<char>(in)), {});
      s = TrainStructure::FromLayoutSpec(spec, tensors).status();
    } else {
      s = Checkpoint::Open(path.string()).status();
    }
    EXPECT_FALSE(s.ok()) << file;
    EXPECT_EQ(std::string(StatusCodeName(s.code())), code) << file << ": " << s;
    EXPECT_NE(s.message().find(substring), std::string::npos)
        << file << ": " << s << " lacks '" << substring << "'";
    ++cases;
  }
  EXPECT_GE(cases, 12);
}

}  // namespace
}  // namespace dcr
