// Round trips of BuildDelta / ApplyDeltaFile over random tensors, dtypes, change rates and
// special values; chunk order permutations; malformed deltas.
#include "dcr/delta.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <thread>

#include "dcr/apply.h"
#include "dcr/hash.h"
#include "dcr/testing/fixtures.h"
#include "internal/chunk_scan.h"
#include "internal/context_codec.h"
#include "internal/simd.h"

namespace dcr {
namespace {

namespace fs = std::filesystem;

using dcr::testing::OwnedTensor;
using dcr::testing::TempDir;
using dcr::testing::Views;

// Special bit patterns per width: NaN payloads, +-Inf, -0, subnormals, max/min.
std::vector<uint64_t> SpecialValues(int width) {
  switch (width) {
    case 1:
      return {0x00, 0x80, 0x7F, 0xFF, 0x01, 0x81, 0x7C, 0xFC};
    case 2:
      return {0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC1, 0xFFFF, 0x0001, 0x8001, 0x7F81, 0x7C00};
    case 4:
      return {0, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00123u, 0xFFFFFFFFu, 1, 0x80000001u};
    default:
      return {0, 0x8000000000000000ull, 0x7FF0000000000000ull, 0x7FF8000000000123ull, 1, ~0ull};
  }
}

void StoreBits(std::vector<uint8_t>* b, int width, uint64_t i, uint64_t v) {
  std::memcpy(b->data() + i * width, &v, width);
}
uint64_t GetBits(const std::vector<uint8_t>& b, int width, uint64_t i) {
  uint64_t v = 0;
  std::memcpy(&v, b.data() + i * width, width);
  return v;
}

// Builds a random checkpoint pair with the given change rate.
void MakePair(std::mt19937_64& rng, double rate, std::vector<OwnedTensor>* base,
              std::vector<OwnedTensor>* target) {
  const char* dtypes[] = {"BF16", "F16", "F32", "F8_E4M3", "F8_E5M2", "I8",      "I16",
                          "I32",  "I64", "U8",  "BOOL",    "F64",     "X_CUSTOM"};
  int nt = 3 + static_cast<int>(rng() % 8);
  for (int i = 0; i < nt; ++i) {
    OwnedTensor t;
    t.name = "layer." + std::to_string(i) + ".w";
    t.dtype = dtypes[rng() % 13];
    int width = DTypeWidth(DTypeFromName(t.dtype));
    int64_t rows = 1 + static_cast<int64_t>(rng() % 300);
    int64_t cols = (rng() % 4 == 0) ? 1 + static_cast<int64_t>(rng() % 5000)
                                    : 1 + static_cast<int64_t>(rng() % 60);
    t.shape = {rows, cols};
    uint64_t n = static_cast<uint64_t>(rows * cols);
    t.bytes.resize(n * width);
    auto specials = SpecialValues(width);
    for (uint64_t e = 0; e < n; ++e) {
      uint64_t v = rng();
      if (rng() % 50 == 0) v = specials[rng() % specials.size()];
      StoreBits(&t.bytes, width, e, v);
    }
    OwnedTensor u = t;
    for (uint64_t e = 0; e < n; ++e) {
      if (std::uniform_real_distribution<double>(0, 1)(rng) < rate) {
        uint64_t old = GetBits(t.bytes, width, e);
        uint64_t nv;
        int kind = static_cast<int>(rng() % 4);
        if (kind == 0)
          nv = old + 1;
        else if (kind == 1)
          nv = old - 1;
        else if (kind == 2)
          nv = specials[rng() % specials.size()];
        else
          nv = rng();
        if ((nv & ((width == 8) ? ~0ull : ((1ull << (8 * width)) - 1))) == old) nv = old ^ 1;
        StoreBits(&u.bytes, width, e, nv);
      }
    }
    base->push_back(std::move(t));
    target->push_back(std::move(u));
  }
}

std::vector<uint8_t> ReadAll(const std::string& p) {
  auto r = ReadFile(p);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : std::vector<uint8_t>{};
}

class RoundTrip : public ::testing::TestWithParam<std::tuple<double, int>> {};

TEST_P(RoundTrip, ApplyGivesTargetBytes) {
  auto [rate, policy] = GetParam();
  std::mt19937_64 rng(static_cast<uint64_t>(rate * 1e6) * 31 + policy);
  for (int trial = 0; trial < 3; ++trial) {
    TempDir dir;
    std::vector<OwnedTensor> base, target;
    MakePair(rng, rate, &base, &target);
    ASSERT_TRUE(WriteSafetensors(dir / "base.st", Views(base)).ok());
    ASSERT_TRUE(WriteSafetensors(dir / "target.st", Views(target)).ok());
    auto b = Checkpoint::Open(dir / "base.st");
    auto t = Checkpoint::Open(dir / "target.st");
    ASSERT_TRUE(b.ok() && t.ok());
    DeltaOptions opt;
    opt.chunk_elems = 1 + rng() % 20000;
    opt.small_tensor_elems = rng() % 3000;
    opt.value_policy = static_cast<ValuePolicy>(policy);
    opt.threads = 1 + static_cast<int>(rng() % 3);
    DeltaFileSink sink(dir / "d.dcr");
    auto st = BuildDelta(b->get(), **t, opt, &sink);
    ASSERT_TRUE(st.ok()) << st.status();
    EXPECT_EQ(st->target_hash, (*t)->ContentHash());
    auto ap =
        ApplyDeltaFile(dir / "base.st", dir / "d.dcr", dir / "out.st", ApplyOptions{0, true, true});
    ASSERT_TRUE(ap.ok()) << ap.status();
    EXPECT_EQ(ReadAll(dir / "out.st"), ReadAll(dir / "target.st"));
  }
}

INSTANTIATE_TEST_SUITE_P(Rates, RoundTrip,
                         ::testing::Combine(::testing::Values(0.0, 0.00001, 0.01, 0.03, 0.05, 0.5,
                                                              1.0),
                                            ::testing::Values(0, 1, 2, 3)));

// SafetensorsImage is byte for byte the file WriteSafetensors writes, and reads back as one.
TEST(Checkpoint, ImageIsTheFileWriteSafetensorsWrites) {
  std::mt19937_64 rng(17);
  std::vector<OwnedTensor> base, target;
  MakePair(rng, 0.03, &base, &target);
  TempDir dir;
  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  ASSERT_TRUE(WriteSafetensors(dir / "b", Views(base), meta).ok());
  auto file = ReadFile(dir / "b");
  ASSERT_TRUE(file.ok()) << file.status();
  const std::vector<uint8_t> image = SafetensorsImage(Views(base), meta);
  EXPECT_EQ(image, *file);
  auto c = Checkpoint::FromBytes(image);
  ASSERT_TRUE(c.ok()) << c.status();
  for (const auto& t : base) {
    const TensorInfo* ti = (*c)->Find(t.name);
    ASSERT_NE(ti, nullptr) << t.name;
    ASSERT_EQ(ti->nbytes, t.bytes.size());
    EXPECT_EQ(0, std::memcmp((*c)->data(*ti), t.bytes.data(), t.bytes.size())) << t.name;
  }
}

TEST(Delta, DeterministicAcrossThreads) {
  std::mt19937_64 rng(7);
  TempDir dir;
  std::vector<OwnedTensor> base, target;
  MakePair(rng, 0.03, &base, &target);
  ASSERT_TRUE(WriteSafetensors(dir / "b", Views(base)).ok());
  ASSERT_TRUE(WriteSafetensors(dir / "t", Views(target)).ok());
  auto b = Checkpoint::Open(dir / "b");
  auto t = Checkpoint::Open(dir / "t");
  std::vector<uint8_t> first;
  for (int threads : {1, 2, 3, 8}) {
    DeltaOptions opt;
    opt.chunk_elems = 1000;
    opt.threads = threads;
    DeltaMemorySink sink;
    ASSERT_TRUE(BuildDelta(b->get(), **t, opt, &sink).ok());
    if (first.empty()) first = sink.bytes();
    EXPECT_EQ(sink.bytes(), first) << "threads=" << threads;
  }
}

TEST(ProductionOrder, WindowsAndGroups) {
  const ProductionOrder o = ProductionOrder::ForBuild(10, 2);
  EXPECT_EQ(o.window(), 2 * kBuildWindowCellsPerThread);
  ASSERT_EQ(o.num_windows(), 2u);
  EXPECT_EQ(o.WindowBegin(0), 0u);
  EXPECT_EQ(o.WindowEnd(0), 8u);
  EXPECT_EQ(o.WindowBegin(1), 8u);
  EXPECT_EQ(o.WindowEnd(1), 10u);
  // Blobs: 0 header, 1..10 cells, 11 trailer.
  EXPECT_EQ(o.GroupFirst(0), 0u);
  EXPECT_EQ(o.GroupLast(0), 0u);
  for (uint64_t b = 1; b <= 8; ++b) {
    EXPECT_EQ(o.GroupFirst(b), 1u) << b;
    EXPECT_EQ(o.GroupLast(b), 8u) << b;
  }
  EXPECT_EQ(o.GroupFirst(9), 9u);
  EXPECT_EQ(o.GroupLast(10), 10u);
  EXPECT_EQ(o.GroupFirst(11), 11u);
  EXPECT_EQ(o.GroupLast(11), 11u);
  EXPECT_EQ(ProductionOrder(5, 0).window(), 1u);
  EXPECT_EQ(ProductionOrder(0, 4).num_windows(), 0u);
  // Merged chunks: as many chunks per window as hold one real window of cells, at least one.
  EXPECT_EQ(ProductionOrder::ForMergedCells(5, 3.0, 2).window(), 3u);   // ceil(8 / 3)
  EXPECT_EQ(ProductionOrder::ForMergedCells(5, 2.0, 2).window(), 4u);   // 8 / 2 exactly
  EXPECT_EQ(ProductionOrder::ForMergedCells(5, 16.0, 2).window(), 1u);  // a chunk > a window
  EXPECT_EQ(ProductionOrder::ForMergedCells(5, 1.0, 3).window(), BuildWindowCells(3));
}

// BuildDelta hands blobs to its sink in ProductionOrder::ForBuild order, and scans each window
// only after the previous window's chunks went to the sink. The sink shows when each cell was
// scanned: on every chunk it receives it changes one more element in each later cell of the
// target, so a cell's record counts 1 + the chunks emitted before the cell was scanned, which is
// 1 + the first cell of its window. The delta bytes of the unchanged target do not depend on the
// thread count.
TEST(Delta, BuildDeltaEmitsInProductionOrder) {
  constexpr uint64_t kCells = 40, kCellElems = 64;
  std::mt19937_64 rng(31);
  OwnedTensor b{"w", "BF16", {static_cast<int64_t>(kCells), static_cast<int64_t>(kCellElems)}, {}};
  b.bytes.resize(kCells * kCellElems * 2);
  for (auto& x : b.bytes) x = static_cast<uint8_t>(rng());
  OwnedTensor t = b;
  for (uint64_t c = 0; c < kCells; ++c) t.bytes[c * kCellElems * 2] ^= 1;  // one change per cell
  auto base = Checkpoint::FromBytes(SafetensorsImage(Views({b}), {}));
  ASSERT_TRUE(base.ok()) << base.status();

  struct RecordingSink : DeltaSink {
    std::vector<int64_t> calls;                // -1 header, chunk ids, -2 trailer
    std::map<uint64_t, uint64_t> num_changes;  // per chunk id
    uint8_t* target = nullptr;                 // when set: mark later cells on each chunk
    DeltaMemorySink bytes;
    Status OnHeader(const std::vector<uint8_t>& h) override {
      calls.push_back(-1);
      return bytes.OnHeader(h);
    }
    Status OnChunk(const ChunkHeader& h, const std::vector<uint8_t>& c) override {
      const uint64_t emitted = num_changes.size();
      calls.push_back(static_cast<int64_t>(h.chunk_id));
      num_changes[h.chunk_id] = h.num_changes;
      if (target != nullptr) {
        for (uint64_t d = h.chunk_id + 1; d < kCells; ++d) {
          target[(d * kCellElems + 1 + emitted) * 2] ^= 1;
        }
      }
      return bytes.OnChunk(h, c);
    }
    Status OnTrailer(const std::vector<uint8_t>& tr) override {
      calls.push_back(-2);
      return bytes.OnTrailer(tr);
    }
  };

  std::vector<uint8_t> first;
  for (bool entropy : {false, true}) {  // the one-pass scan encoder and the listed-changes path
    for (int threads : {1, 2, 3, 8}) {
      SCOPED_TRACE("threads=" + std::to_string(threads) + " entropy=" + std::to_string(entropy));
      DeltaOptions opt;
      opt.chunk_elems = kCellElems;
      opt.small_tensor_elems = 1;
      opt.threads = threads;
      opt.collect_entropy = entropy;
      const ProductionOrder order = ProductionOrder::ForBuild(kCells, threads);
      std::vector<int64_t> expected = {-1};
      const Inventory inv = Inventory::FromCheckpoint(**base);
      const std::vector<GridCell> grid = BuildGrid(inv, opt);
      ASSERT_EQ(grid.size(), kCells);
      for (uint64_t w = 0; w < order.num_windows(); ++w) {
        for (uint64_t c = order.WindowBegin(w); c < order.WindowEnd(w); ++c) {
          expected.push_back(static_cast<int64_t>(grid[c].chunk_id));
        }
      }
      expected.push_back(-2);

      auto target = Checkpoint::FromBytes(SafetensorsImage(Views({t}), {}));
      ASSERT_TRUE(target.ok()) << target.status();
      RecordingSink plain;
      ASSERT_TRUE(BuildDelta(base->get(), **target, opt, &plain).ok());
      EXPECT_EQ(plain.calls, expected);
      if (!entropy) {
        if (first.empty()) first = plain.bytes.bytes();
        EXPECT_EQ(plain.bytes.bytes(), first);
      }

      // The Checkpoint owns its image as a (non-const) vector: writing through data() is defined.
      RecordingSink marking;
      marking.target = const_cast<uint8_t*>((*target)->data((*target)->tensors()[0]));
      ASSERT_TRUE(BuildDelta(base->get(), **target, opt, &marking).ok());
      EXPECT_EQ(marking.calls, expected);
      for (uint64_t c = 0; c < kCells; ++c) {
        const uint64_t window_begin = order.WindowBegin(c / order.window());
        EXPECT_EQ(marking.num_changes[grid[c].chunk_id], 1 + window_begin) << "cell " << c;
      }
    }
  }
}

// The entropy statistics change no byte of the delta, whichever encoder path a cell takes (the
// scan encoder counts 1- and 2-byte values in its pass; other cells list their changes), and
// give each tensor the order-0 bound of its own XOR values.
TEST(Delta, EntropyStatisticsMatchTheTensorsAndKeepTheBytes) {
  std::mt19937_64 rng(77);
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::vector<OwnedTensor> b, t;
    MakePair(rng, round == 0 ? 0.3 : 0.03, &b, &t);
    auto base = Checkpoint::FromBytes(SafetensorsImage(Views(b)));
    auto target = Checkpoint::FromBytes(SafetensorsImage(Views(t)));
    ASSERT_TRUE(base.ok() && target.ok());
    DeltaOptions opt;
    opt.chunk_elems = 4096;  // large tensors span several contiguous cells
    opt.small_tensor_elems = 2048;
    opt.threads = 1 + round % 3;
    DeltaMemorySink plain, counted;
    ASSERT_TRUE(BuildDelta(base->get(), **target, opt, &plain).ok());
    opt.collect_entropy = true;
    auto st = BuildDelta(base->get(), **target, opt, &counted);
    ASSERT_TRUE(st.ok()) << st.status();
    EXPECT_EQ(plain.bytes(), counted.bytes());
    ASSERT_EQ(st->tensors.size(), t.size());
    for (size_t i = 0; i < t.size(); ++i) {
      const int w = DTypeWidth(DTypeFromName(t[i].dtype));
      const uint64_t n = t[i].bytes.size() / w;
      std::map<uint64_t, uint64_t> hist;
      uint64_t k = 0;
      for (uint64_t e = 0; e < n; ++e) {
        const uint64_t x = GetBits(b[i].bytes, w, e) ^ GetBits(t[i].bytes, w, e);
        if (x != 0) ++hist[x], ++k;
      }
      double bits = 0;
      if (k > 0 && k < n) {
        const double p = static_cast<double>(k) / n;
        bits = n * -(p * std::log2(p) + (1 - p) * std::log2(1 - p));
      }
      for (const auto& [v, c] : hist) bits -= c * std::log2(static_cast<double>(c) / k);
      EXPECT_EQ(st->tensors[i].changed, k) << t[i].name;
      EXPECT_NEAR(st->tensors[i].xor_entropy_bits, bits, 1e-9 * (1 + bits)) << t[i].name;
    }
  }
}

// A chunk's bytes must not depend on what the encoding thread did before (its scratch buffers).
// A chunk with no changes, encoded first on a fresh thread, keeps its position stream.
TEST(Delta, ChunkBytesDoNotDependOnTheThreadsHistory) {
  auto encode = [](uint64_t changes) {
    ChunkChanges c;
    c.width = 2;
    c.num_elements = 9216;
    c.segments = {Segment::Range(0, 0, c.num_elements)};
    for (uint64_t i = 0; i < changes; ++i) {
      c.positions.push_back(i * 7);
      c.old_bits.push_back(0x3f80);
      c.new_bits.push_back(0x3f81 + i % 3);
    }
    return EncodeChunk(c, ValueMode::kXor, {12345}, 1);
  };
  for (uint64_t changes : {0, 1, 1000}) {
    StatusOr<std::vector<uint8_t>> fresh = InvalidArgumentError("not run");
    std::thread([&] { fresh = encode(changes); }).join();
    ASSERT_TRUE(fresh.ok()) << fresh.status();
    StatusOr<std::vector<uint8_t>> warm = InvalidArgumentError("not run");
    std::thread([&] {
      ASSERT_TRUE(encode(1000).ok());  // leaves large scratch buffers behind
      warm = encode(changes);
    }).join();
    ASSERT_TRUE(warm.ok()) << warm.status();
    EXPECT_EQ(*fresh, *warm) << changes << " changes";
    auto decoded = DecodeChunk(fresh->data(), fresh->size());
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(decoded->header.num_changes, changes);
  }
}

// The scan encoder (base and target bytes in, the builder's path for contiguous cells) writes the
// very bytes EncodeChunk writes for the same changes listed by hand, for every width, value mode
// and change density (0 to 100%, special values, tails past the last 64-byte step).
TEST(Delta, ScanEncoderMatchesTheListedChanges) {
  std::mt19937_64 rng(21);
  for (int width : {1, 2, 4, 8}) {
    for (ValueMode mode : {ValueMode::kXor, ValueMode::kUlpDelta, ValueMode::kAbsolute}) {
      for (double rate : {0.0, 0.00001, 0.03, 0.3, 0.6, 1.0}) {
        // BF16 at 30% and 60% also over 2^21 elements: the bitmap trial then starts from a sample.
        const bool big = width == 2 && (rate == 0.3 || rate == 0.6);
        const uint64_t n = big ? uint64_t{1} << 21 : 1 + rng() % 40000;
        const uint64_t offset = rng() % 1000;
        std::vector<uint8_t> base((offset + n) * width), target;
        for (auto& x : base) x = static_cast<uint8_t>(rng());
        const std::vector<uint64_t> special = SpecialValues(width);
        for (uint64_t i = 0; i < 64 && i < n; ++i)
          StoreBits(&base, width, offset + i, special[i % special.size()]);
        target = base;
        ChunkChanges c;
        c.chunk_id = 7;
        c.width = static_cast<uint8_t>(width);
        c.num_elements = n;
        c.segments = {Segment::Range(1, offset, n)};
        std::bernoulli_distribution change(rate);
        for (uint64_t i = 0; i < n; ++i) {
          if (!change(rng)) continue;
          const uint64_t old = GetBits(base, width, offset + i);
          uint64_t v = rng() % 3 == 0 ? special[rng() % special.size()] : old ^ (1 + rng() % 5);
          if (width < 8) v &= (uint64_t{1} << (8 * width)) - 1;
          if (v == old) v ^= 1;
          StoreBits(&target, width, offset + i, v);
          c.positions.push_back(i);
          c.old_bits.push_back(old);
          c.new_bits.push_back(v);
        }
        c.target_range_hash = BytesHash128(target.data() + offset * width, n * width);
        c.dense = false;
        const std::vector<uint64_t> salts = {99, 0x1234567890ABCDEFull};
        for (bool avx2 : {false, internal::CpuHasAvx2()}) {
          ChunkScanInput in;
          in.chunk_id = 7;
          in.width = static_cast<uint8_t>(width);
          in.segments = &c.segments;
          in.base = base.data() + offset * width;
          in.target = target.data() + offset * width;
          in.avx2 = avx2;
          in.emit_unchanged = true;
          ChunkScanResult res;
          auto scanned = EncodeChunkScan(in, mode, salts, 1, &res);
          ASSERT_TRUE(scanned.ok()) << scanned.status();
          auto listed = EncodeChunk(c, mode, salts, 1);
          ASSERT_TRUE(listed.ok()) << listed.status();
          EXPECT_EQ(res.num_changes, c.positions.size());
          EXPECT_EQ(res.target_range_hash, c.target_range_hash);
          EXPECT_EQ(*scanned, *listed) << "width " << width << " mode " << ValueModeName(mode)
                                       << " rate " << rate << " n " << n << " avx2 " << avx2;
          in.emit_unchanged = false;
          auto skipped = EncodeChunkScan(in, mode, salts, 1, &res);
          ASSERT_TRUE(skipped.ok());
          EXPECT_EQ(skipped->empty(), c.positions.empty());
        }
      }
    }
  }
}

// The position stream is the smaller of gaps and bitmap: random changes at 5% keep gaps (the
// bitmap is ruled out from a sample of it), at 60% take the bitmap, and changes packed into a
// few dense runs take the bitmap already at 5%. Each chunk decodes to its changes.
TEST(Delta, PositionModeFollowsTheData) {
  std::mt19937_64 rng(23);
  const uint64_t n = uint64_t{1} << 21;
  auto encode = [&](auto&& changed) {
    ChunkChanges c;
    c.width = 2;
    c.num_elements = n;
    c.segments = {Segment::Range(0, 0, n)};
    for (uint64_t i = 0; i < n; ++i) {
      if (!changed(i)) continue;
      c.positions.push_back(i);
      c.old_bits.push_back(0x3f80);
      c.new_bits.push_back(0x3f81);
    }
    auto bytes = EncodeChunk(c, ValueMode::kUlpDelta, {1}, 1);
    EXPECT_TRUE(bytes.ok());
    auto d = DecodeChunk(bytes->data(), bytes->size());
    EXPECT_TRUE(d.ok());
    EXPECT_EQ(d->positions, c.positions);
    return d->header.position_mode;
  };
  EXPECT_EQ(encode([&](uint64_t) { return rng() % 100 < 5; }), PositionMode::kGaps);
  EXPECT_EQ(encode([&](uint64_t) { return rng() % 100 < 60; }), PositionMode::kBitmap);
  // 5% of the elements, all in runs of 4096 where two of every three change.
  EXPECT_EQ(encode([&](uint64_t i) { return (i / 4096) % 13 == 0 && rng() % 3 != 0; }),
            PositionMode::kBitmap);
}

TEST(Delta, FullFrameWithoutBase) {
  std::mt19937_64 rng(9);
  TempDir dir;
  std::vector<OwnedTensor> base, target;
  MakePair(rng, 0.03, &base, &target);
  ASSERT_TRUE(WriteSafetensors(dir / "t", Views(target)).ok());
  auto t = Checkpoint::Open(dir / "t");
  DeltaOptions opt;
  opt.full = true;
  DeltaFileSink sink(dir / "f.dcr");
  ASSERT_TRUE(BuildDelta(nullptr, **t, opt, &sink).ok());
  auto ap = ApplyDeltaFile("", dir / "f.dcr", dir / "out", ApplyOptions{});
  ASSERT_TRUE(ap.ok()) << ap.status();
  EXPECT_EQ(ReadAll(dir / "out"), ReadAll(dir / "t"));
}

class ChunkOrder : public ::testing::Test {};

TEST(Delta, ChunksApplyInAnyOrderAndOnlyOnce) {
  std::mt19937_64 rng(11);
  std::vector<OwnedTensor> base, target;
  MakePair(rng, 0.05, &base, &target);
  auto bv = Views(base);
  std::vector<uint8_t> bimg, timg;
  TempDir dir;
  ASSERT_TRUE(WriteSafetensors(dir / "b", bv).ok());
  ASSERT_TRUE(WriteSafetensors(dir / "t", Views(target)).ok());
  auto b = Checkpoint::Open(dir / "b");
  auto t = Checkpoint::Open(dir / "t");
  DeltaOptions opt;
  opt.chunk_elems = 500;
  DeltaMemorySink sink;
  ASSERT_TRUE(BuildDelta(b->get(), **t, opt, &sink).ok());
  auto reader = DeltaReader::FromBytes(sink.Release());
  ASSERT_TRUE(reader.ok()) << reader.status();
  const Inventory& inv = (*reader)->inventory();
  for (int perm = 0; perm < 5; ++perm) {
    // Fresh copy of the base tensors in canonical (name) order.
    std::vector<std::vector<uint8_t>> bufs;
    std::vector<TensorBuffer> tbs;
    for (size_t i = 0; i < inv.tensors.size(); ++i) {
      const TensorInfo* bt = (*b)->Find(inv.tensors[i].name);
      bufs.emplace_back((*b)->data(*bt), (*b)->data(*bt) + bt->nbytes);
    }
    for (size_t i = 0; i < inv.tensors.size(); ++i)
      tbs.push_back(
          {bufs[i].data(), inv.tensors[i].num_elements(), inv.tensors[i].width(), inv.salts[i]});
    BufferApplier applier(tbs);
    applier.set_verify_ranges(true);
    std::vector<size_t> order((*reader)->num_chunks());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t i : order) {
      auto dc = (*reader)->Decode(i);
      ASSERT_TRUE(dc.ok()) << dc.status();
      ASSERT_TRUE(applier.ApplyChunk(*dc).ok());
      if (IsRelative(dc->header.value_mode) && dc->header.num_changes > 0) {
        // Applying a relative chunk twice is refused and changes nothing.
        Status again = applier.ApplyChunk(*dc);
        EXPECT_TRUE(again.IsFailedPrecondition()) << again;
      }
    }
    for (size_t i = 0; i < inv.tensors.size(); ++i) {
      const TensorInfo* tt = (*t)->Find(inv.tensors[i].name);
      ASSERT_EQ(0, std::memcmp(bufs[i].data(), (*t)->data(*tt), tt->nbytes)) << inv.tensors[i].name;
    }
  }
}

// The applier writes while it reads (one pass) and checks the hashes afterwards: a chunk that
// fails a check must leave the storage exactly as it found it, even when a malformed chunk's
// segments overlap.
TEST(Delta, FailedChunkLeavesStorageUntouched) {
  const uint64_t n = 4096;
  std::vector<uint16_t> base(n), target(n);
  std::mt19937_64 rng(21);
  for (uint64_t i = 0; i < n; ++i) {
    base[i] = static_cast<uint16_t>(rng());
    target[i] = (i % 3 == 0) ? static_cast<uint16_t>(base[i] ^ (1 + rng() % 255)) : base[i];
  }
  ChunkChanges c;
  c.width = 2;
  c.num_elements = n;
  c.segments = {Segment::Range(0, 0, n)};
  for (uint64_t i = 0; i < n; ++i) {
    if (base[i] == target[i]) continue;
    c.positions.push_back(i);
    c.old_bits.push_back(base[i]);
    c.new_bits.push_back(target[i]);
  }
  auto bytes = EncodeChunk(c, ValueMode::kXor, {99}, 1);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  auto good = DecodeChunk(bytes->data(), bytes->size());
  ASSERT_TRUE(good.ok()) << good.status();

  auto apply = [&](const DecodedChunk& dc, std::vector<uint16_t>* buf) {
    BufferApplier applier({TensorBuffer{reinterpret_cast<uint8_t*>(buf->data()), n, 2, 99}});
    return applier.ApplyChunk(dc);
  };
  {  // a value that does not give the target bits
    DecodedChunk bad = *good;
    bad.values[bad.values.size() / 2] ^= 0x40;
    std::vector<uint16_t> buf = base;
    Status st = apply(bad, &buf);
    EXPECT_TRUE(st.IsDataLoss()) << st;
    EXPECT_EQ(buf, base);
  }
  {  // storage that is not the base
    std::vector<uint16_t> buf = base;
    buf[3] ^= 1;
    const std::vector<uint16_t> before = buf;
    Status st = apply(*good, &buf);
    EXPECT_TRUE(st.IsFailedPrecondition()) << st;
    EXPECT_EQ(buf, before);
  }
  {  // overlapping segments: the same elements are visited twice, then restored
    DecodedChunk bad = *good;
    bad.header.segments = {Segment::Range(0, 0, n / 2), Segment::Range(0, 0, n / 2)};
    std::vector<uint16_t> buf = base;
    Status st = apply(bad, &buf);
    EXPECT_FALSE(st.ok());
    EXPECT_EQ(buf, base);
  }
  {  // and the good chunk gives the target
    std::vector<uint16_t> buf = base;
    ASSERT_TRUE(apply(*good, &buf).ok());
    EXPECT_EQ(buf, target);
  }
}

// A chunk whose (checksummed) header claims a huge change count and zstd streams that would
// expand beyond what zstd can produce is refused before anything that size is allocated.
TEST(Delta, ImpossibleStreamSizesAreRefusedBeforeAllocating) {
  ChunkChanges c;
  c.width = 2;
  c.num_elements = 100000;
  c.segments = {Segment::Range(0, 0, c.num_elements)};
  for (uint64_t i = 0; i < 5000; ++i) {  // regular positions and values: zstd streams
    c.positions.push_back(i * 20);
    c.old_bits.push_back(0x3f80);
    c.new_bits.push_back(0x3f81);
  }
  auto bytes = EncodeChunk(c, ValueMode::kXor, {7}, 1);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  std::vector<uint8_t> b = *bytes;
  auto put64 = [&](size_t off, uint64_t v) { std::memcpy(b.data() + off, &v, 8); };
  auto get64 = [&](size_t off) {
    uint64_t v;
    std::memcpy(&v, b.data() + off, 8);
    return v;
  };
  uint32_t hsize, nstreams;
  std::memcpy(&hsize, b.data() + 4, 4);
  std::memcpy(&nstreams, b.data() + 104, 4);
  ASSERT_EQ(nstreams, 3u);  // gaps + two value planes
  const size_t streams = 108;
  ASSERT_EQ(b[streams + 17], 1) << "value plane 0 should be zstd";
  const uint64_t k = uint64_t{1} << 33;
  put64(24, uint64_t{1} << 34);  // num_elements
  put64(32, k);                  // num_changes
  put64(streams + 17 + 1, k);    // value plane raw sizes
  put64(streams + 34 + 1, k);
  const size_t seg = streams + 3 * 17;
  ASSERT_EQ(get64(seg + 16), c.num_elements);  // count[0] of the only segment
  put64(seg + 16, uint64_t{1} << 34);
  put64(hsize - 8, XXH3_64bits(b.data(), hsize - 8));  // a valid header checksum again
  auto h = ParseChunkHeader(b.data(), b.size(), nullptr, nullptr);
  ASSERT_TRUE(h.ok()) << h.status();  // the forged header itself is consistent
  auto dc = DecodeChunk(b.data(), b.size());
  ASSERT_FALSE(dc.ok());
  EXPECT_TRUE(dc.status().IsDataLoss()) << dc.status();
  EXPECT_NE(dc.status().message().find("claims"), std::string::npos) << dc.status();
}

// A (checksummed) delta header whose inventory exceeds the safetensors header cap is refused
// before the inventory is copied or parsed.
TEST(Delta, InventoryOverTheHeaderCapIsRefused) {
  FileHeader h;
  h.format_version = kFormatVersion;
  h.flags = kFlagNoBase;
  std::string json(150u << 20, ' ');  // 150 MB of JSON whitespace
  json.front() = '{';
  json.back() = '}';
  h.SetSingleFile(std::move(json));
  std::vector<uint8_t> bytes = SerializeFileHeader(h);
  size_t consumed = 0;
  auto parsed = ParseFileHeader(bytes.data(), bytes.size(), &consumed);
  ASSERT_FALSE(parsed.ok());
  EXPECT_TRUE(parsed.status().IsDataLoss()) << parsed.status();
  EXPECT_NE(parsed.status().message().find("exceed the cap"), std::string::npos) << parsed.status();
}

TEST(Delta, WrongBaseIsRefusedAndLeavesNoOutput) {
  std::mt19937_64 rng(13);
  TempDir dir;
  std::vector<OwnedTensor> base, target;
  MakePair(rng, 0.03, &base, &target);
  ASSERT_TRUE(WriteSafetensors(dir / "b", Views(base)).ok());
  ASSERT_TRUE(WriteSafetensors(dir / "t", Views(target)).ok());
  auto b = Checkpoint::Open(dir / "b");
  auto t = Checkpoint::Open(dir / "t");
  DeltaFileSink sink(dir / "d");
  ASSERT_TRUE(BuildDelta(b->get(), **t, DeltaOptions{}, &sink).ok());
  // The target itself is a wrong base (same inventory, other bits).
  auto ap = ApplyDeltaFile(dir / "t", dir / "d", dir / "out", ApplyOptions{});
  EXPECT_TRUE(ap.status().IsFailedPrecondition()) << ap.status();
  EXPECT_FALSE(fs::exists(dir / "out"));
  for (const auto& e : fs::directory_iterator(dir.path))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
}

TEST(Delta, CorruptionGivesDataLossAndNoOutput) {
  std::mt19937_64 rng(17);
  TempDir dir;
  std::vector<OwnedTensor> base, target;
  MakePair(rng, 0.05, &base, &target);
  ASSERT_TRUE(WriteSafetensors(dir / "b", Views(base)).ok());
  ASSERT_TRUE(WriteSafetensors(dir / "t", Views(target)).ok());
  auto b = Checkpoint::Open(dir / "b");
  auto t = Checkpoint::Open(dir / "t");
  DeltaOptions opt;
  opt.chunk_elems = 800;
  DeltaMemorySink sink;
  ASSERT_TRUE(BuildDelta(b->get(), **t, opt, &sink).ok());
  const std::vector<uint8_t> good = sink.bytes();
  int rejected = 0;
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<uint8_t> bad = good;
    int kind = trial % 3;
    if (kind == 0) {
      bad.resize(rng() % good.size());  // truncation
    } else if (kind == 1) {
      size_t at = rng() % bad.size();
      bad[at] ^= static_cast<uint8_t>(1u << (rng() % 8));  // bit flip
    } else {
      size_t at = rng() % bad.size();
      uint64_t huge = ~0ull >> (rng() % 8);
      std::memcpy(bad.data() + std::min(at, bad.size() - 8), &huge, 8);  // absurd counts
    }
    if (bad == good) continue;
    ASSERT_TRUE(WriteFileAtomic(dir / "bad", bad.data(), bad.size()).ok());
    auto ap = ApplyDeltaFile(dir / "b", dir / "bad", dir / "out", ApplyOptions{});
    ASSERT_FALSE(ap.ok()) << "trial " << trial << " kind " << kind;
    EXPECT_TRUE(ap.status().IsDataLoss() || ap.status().IsFailedPrecondition()) << ap.status();
    EXPECT_FALSE(fs::exists(dir / "out"));
    ++rejected;
  }
  EXPECT_GT(rejected, 250);
}

// ApplyDeltaFile writes the output with pread/pwrite of each chunk's covered elements: chunks of
// strided boxes (a stride > 1 in the last dimension, a negative row stride), chunks of several
// segments over two tensors, and a contiguous range (taken from the base directly) all produce
// the target byte for byte, and the full rehash of the written file matches.
TEST(Delta, ApplyFileWritesStridedAndMultiSegmentChunks) {
  std::mt19937_64 rng(29);
  TempDir dir;
  // Inventory order is by name: a (BF16 64x48), b (F32 100), c (BF16 50).
  std::vector<OwnedTensor> base = {
      {"a", "BF16", {64, 48}, {}}, {"b", "F32", {100}, {}}, {"c", "BF16", {50}, {}}};
  for (auto& t : base) {
    uint64_t n = 1;
    for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
    t.bytes.resize(n * (t.dtype == "F32" ? 4 : 2));
    for (auto& b : t.bytes) b = static_cast<uint8_t>(rng());
  }
  auto seg = [](uint32_t tensor, uint64_t offset, std::vector<uint64_t> count,
                std::vector<int64_t> stride) {
    Segment s;
    s.tensor_index = tensor;
    s.ndim = static_cast<uint32_t>(count.size());
    s.offset = offset;
    for (size_t d = 0; d < count.size(); ++d) {
      s.count[d] = count[d];
      s.stride[d] = stride[d];
    }
    return s;
  };
  struct Plan {
    uint8_t width;
    std::vector<Segment> segments;
  };
  const std::vector<Plan> plans = {
      {2, {seg(0, 5, {10, 8}, {48, 3})}},                       // every third column of 10 rows
      {2, {seg(0, 63 * 48 + 40, {5, 4}, {-48, 1})}},            // rows 63..59, columns 40..43
      {2, {seg(2, 0, {50}, {1}), seg(0, 30 * 48, {48}, {1})}},  // two tensors in one chunk
      {4, {Segment::Range(1, 10, 80)}},                         // a contiguous range
  };
  std::vector<OwnedTensor> target = base;
  std::vector<std::vector<uint8_t>> records;
  const Inventory inv = [&] {
    auto img = SafetensorsImage(Views(target));
    auto ck = Checkpoint::FromBytes(img);
    return Inventory::FromCheckpoint(**ck);
  }();
  for (size_t c = 0; c < plans.size(); ++c) {
    ChunkChanges ch;
    ch.chunk_id = c;
    ch.width = plans[c].width;
    ch.segments = plans[c].segments;
    XXH3_state_t* st = XXH3_createState();
    XXH3_128bits_reset(st);
    uint64_t pos = 0;
    for (const Segment& sg : ch.segments) {
      OwnedTensor& t = target[sg.tensor_index];
      const OwnedTensor& b = base[sg.tensor_index];
      for (uint64_t i = 0; i < sg.num_elements(); ++i, ++pos) {
        const uint64_t e = sg.ElementAt(i);
        uint64_t old = 0, now = 0;
        std::memcpy(&old, b.bytes.data() + e * ch.width, ch.width);
        now = old;
        if (rng() % 3 == 0) now = old ^ (1 + rng() % 7);
        std::memcpy(t.bytes.data() + e * ch.width, &now, ch.width);
        XXH3_128bits_update(st, &now, ch.width);
        if (now == old) continue;
        ch.positions.push_back(pos);
        ch.old_bits.push_back(old);
        ch.new_bits.push_back(now);
      }
    }
    const XXH128_hash_t h = XXH3_128bits_digest(st);
    XXH3_freeState(st);
    ch.num_elements = pos;
    ch.target_range_hash = Hash128{h.low64, h.high64};
    auto rec = EncodeChunk(ch, c % 2 ? ValueMode::kXor : ValueMode::kUlpDelta, inv.salts, 1);
    ASSERT_TRUE(rec.ok()) << rec.status();
    records.push_back(*rec);
  }
  ASSERT_TRUE(WriteSafetensors(dir / "base", Views(base)).ok());
  ASSERT_TRUE(WriteSafetensors(dir / "target", Views(target)).ok());
  auto b = Checkpoint::Open(dir / "base");
  auto t = Checkpoint::Open(dir / "target");
  ASSERT_TRUE(b.ok() && t.ok());
  FileHeader fh;
  fh.base_hash = (*b)->ContentHash();
  fh.SetSingleFile((*t)->header_json());
  fh.chunk_elems = 1 << 20;
  std::vector<uint8_t> file = SerializeFileHeader(fh);
  Trailer tr;
  tr.target_hash = (*t)->ContentHash();
  for (size_t c = 0; c < records.size(); ++c) {
    tr.chunks.push_back({c, file.size(), records[c].size()});
    file.insert(file.end(), records[c].begin(), records[c].end());
  }
  const std::vector<uint8_t> trailer = SerializeTrailer(tr, file.size());
  file.insert(file.end(), trailer.begin(), trailer.end());
  ASSERT_TRUE(WriteFileAtomic(dir / "d", file.data(), file.size()).ok());
  for (int threads : {1, 3}) {
    ApplyOptions ao;
    ao.threads = threads;
    ao.verify_full = true;
    auto ap = ApplyDeltaFile(dir / "base", dir / "d", dir / "out", ao);
    ASSERT_TRUE(ap.ok()) << ap.status();
    EXPECT_EQ(ap->chunks, records.size());
    auto x = ReadFile(dir / "out");
    auto y = ReadFile(dir / "target");
    ASSERT_TRUE(x.ok() && y.ok());
    EXPECT_TRUE(*x == *y) << "threads " << threads;
  }
  // Two chunks covering the same elements (a strided one, a contiguous one): the second sees the
  // first's bits (as in place) and is refused as not applying to the base; nothing is left.
  for (size_t r : {size_t{0}, size_t{3}}) {
    std::vector<uint8_t> twice = SerializeFileHeader(fh);
    Trailer tr2;
    tr2.target_hash = tr.target_hash;
    for (uint64_t c = 0; c < 2; ++c) {
      tr2.chunks.push_back({c, twice.size(), records[r].size()});
      twice.insert(twice.end(), records[r].begin(), records[r].end());
    }
    const std::vector<uint8_t> trailer2 = SerializeTrailer(tr2, twice.size());
    twice.insert(twice.end(), trailer2.begin(), trailer2.end());
    ASSERT_TRUE(WriteFileAtomic(dir / "twice", twice.data(), twice.size()).ok());
    ApplyOptions one;
    one.threads = 1;
    auto ap = ApplyDeltaFile(dir / "base", dir / "twice", dir / "out2", one);
    EXPECT_TRUE(ap.status().IsFailedPrecondition()) << "record " << r << ": " << ap.status();
    EXPECT_FALSE(fs::exists(dir / "out2"));
  }
  for (const auto& e : fs::directory_iterator(dir.path))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
}

// The compact header of a context-coded record (version 8) carries every field of the full one:
// multi-dimensional segments with negative strides and 64-bit ids and counts round-trip, every
// truncation and every flipped header byte is refused as DATA_LOSS.
TEST(CompactFormat, ContextRecordHeaderRoundTripsAndRefusesDamage) {
  ChunkHeader h;
  h.chunk_id = (uint64_t{7} << 40) | 3;
  h.value_mode = ValueMode::kUlpDelta;
  h.elem_width = 4;
  Segment box;
  box.tensor_index = 300;
  box.ndim = 2;
  box.offset = uint64_t{1} << 33;
  box.count = {3, 5, 0, 0};
  box.stride = {-1024, 2, 0, 0};
  h.segments = {Segment::Range(0, 17, 200), box};
  h.num_elements = 215;
  h.num_changes = 9;
  h.base_change_hash = Hash128{1, 2};
  h.target_change_hash = Hash128{3, ~uint64_t{0}};
  h.version_delta = Hash128{5, 6};
  h.target_range_hash = Hash128{7, 8};
  std::vector<uint8_t> body(300);
  for (size_t i = 0; i < body.size(); ++i) body[i] = static_cast<uint8_t>(i * 7);
  const std::vector<uint8_t> rec = internal::SealContextRecord(h, body);
  ASSERT_EQ(0, std::memcmp(rec.data(), kContextChunkMagic, 4));
  size_t hsize = 0, rsize = 0;
  auto p = ParseChunkHeader(rec.data(), rec.size(), &hsize, &rsize);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(rsize, rec.size());
  EXPECT_EQ(hsize + body.size(), rec.size());
  EXPECT_TRUE(p->compact);
  EXPECT_EQ(p->chunk_id, h.chunk_id);
  EXPECT_EQ(p->position_mode, PositionMode::kContextV7);
  EXPECT_EQ(p->value_mode, h.value_mode);
  EXPECT_EQ(p->elem_width, 4);
  EXPECT_EQ(p->num_elements, h.num_elements);
  EXPECT_EQ(p->num_changes, h.num_changes);
  EXPECT_EQ(p->base_change_hash, h.base_change_hash);
  EXPECT_EQ(p->target_change_hash, h.target_change_hash);
  EXPECT_EQ(p->version_delta, h.version_delta);
  EXPECT_EQ(p->target_range_hash, h.target_range_hash);
  EXPECT_EQ(p->payload_checksum, XXH3_64bits(body.data(), body.size()));
  ASSERT_EQ(p->streams.size(), 1u);
  EXPECT_EQ(p->streams[0].stored_size, body.size());
  ASSERT_EQ(p->segments.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const Segment& a = p->segments[i];
    const Segment& b = h.segments[i];
    EXPECT_EQ(a.tensor_index, b.tensor_index);
    EXPECT_EQ(a.ndim, b.ndim);
    EXPECT_EQ(a.offset, b.offset);
    EXPECT_EQ(a.count, b.count);
    EXPECT_EQ(a.stride, b.stride);
  }
  // Re-sealing the parsed header gives the same bytes.
  EXPECT_EQ(internal::SealContextRecord(*p, body), rec);
  for (size_t n = 0; n < rec.size(); ++n) {
    auto t = ParseChunkHeader(rec.data(), n, nullptr, nullptr);
    ASSERT_FALSE(t.ok()) << n;
    EXPECT_EQ(t.status().code(), StatusCode::kDataLoss) << n;
  }
  for (size_t i = 4; i < hsize; ++i) {
    std::vector<uint8_t> bad = rec;
    bad[i] ^= 0x20;
    auto t = ParseChunkHeader(bad.data(), bad.size(), nullptr, nullptr);
    ASSERT_FALSE(t.ok()) << i;
    EXPECT_EQ(t.status().code(), StatusCode::kDataLoss) << i;
  }
}

// The compact trailer (version 8) round-trips ids and offsets in any order, keeps its form when
// parsed and written again, and refuses truncation.
TEST(CompactFormat, TrailerRoundTripsInAnyOrder) {
  Trailer t;
  t.compact = true;
  t.chunks = {{5, 100, 40}, {2, 60, 40}, {uint64_t{1} << 40, 140, 1u << 20}, {0, 1u << 30, 8}};
  t.target_hash = Hash128{11, 12};
  const std::vector<uint8_t> b = SerializeTrailer(t, 1234);
  ASSERT_EQ(0, std::memcmp(b.data(), kCompactTrailerMagic, 8));
  auto p = ParseTrailer(b.data(), b.size());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->compact);
  ASSERT_EQ(p->chunks.size(), t.chunks.size());
  for (size_t i = 0; i < t.chunks.size(); ++i) {
    EXPECT_EQ(p->chunks[i].chunk_id, t.chunks[i].chunk_id);
    EXPECT_EQ(p->chunks[i].offset, t.chunks[i].offset);
    EXPECT_EQ(p->chunks[i].size, t.chunks[i].size);
  }
  EXPECT_EQ(p->target_hash, t.target_hash);
  EXPECT_EQ(SerializeTrailer(*p, 1234), b);
  Trailer full = t;
  full.compact = false;
  EXPECT_LT(b.size(), SerializeTrailer(full, 1234).size());
  for (size_t n = 0; n < b.size(); ++n) {
    auto q = ParseTrailer(b.data(), n);
    ASSERT_FALSE(q.ok()) << n;
    EXPECT_EQ(q.status().code(), StatusCode::kDataLoss) << n;
  }
}

// A version-8 header stores its file sections zstd-compressed and reads back the same target;
// a compressed section in a header of an older version is refused.
TEST(CompactFormat, HeaderSectionsCompressInVersionEight) {
  FileHeader h;
  h.flags = kFlagContext;
  std::string json = "{";
  for (int i = 0; i < 40; ++i) {
    json += "\"layer." + std::to_string(i) +
            ".weight\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[" +
            std::to_string(8 * i) + "," + std::to_string(8 * i + 8) + "]},";
  }
  json.back() = '}';
  h.SetSingleFile(json);
  const std::vector<uint8_t> b = SerializeFileHeader(h);
  EXPECT_LT(b.size(), json.size());
  size_t consumed = 0;
  auto p = ParseFileHeader(b.data(), b.size(), &consumed);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(consumed, b.size());
  EXPECT_EQ(p->format_version, 8u);
  EXPECT_TRUE(p->SameTarget(h));
  uint32_t kind = 0;
  std::memcpy(&kind, b.data() + 52, 4);
  EXPECT_EQ(kind, kSectionZstd);
  // The same bytes relabelled version 7, checksum resealed: refused by the section.
  std::vector<uint8_t> old = b;
  const uint32_t seven = 7;
  std::memcpy(old.data() + 8, &seven, 4);
  const uint64_t sum = XXH3_64bits(old.data(), old.size() - 8);
  std::memcpy(old.data() + old.size() - 8, &sum, 8);
  auto q = ParseFileHeader(old.data(), old.size(), nullptr);
  ASSERT_FALSE(q.ok());
  EXPECT_EQ(q.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(q.status().message().find("needs format version 8"), std::string::npos) << q.status();
  // A plain (version 5) header keeps its sections verbatim.
  FileHeader plain = h;
  plain.flags = 0;
  EXPECT_GT(SerializeFileHeader(plain).size(), json.size());
}

}  // namespace
}  // namespace dcr
