// BufferApplier::ApplyRecord (decode and apply from the record's streams) against the reference
// path, DecodeChunk + ApplyChunk: the same bytes for every width, value mode, position mode and
// change rate, and the same refusals, with storage untouched, for records that pass every
// checksum yet are inconsistent inside.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>
#include <functional>
#include <random>

#include "dcr/apply.h"
#include "dcr/delta.h"
#include "internal/chunk_streams.h"

namespace dcr {
namespace {

// A base and target of `n` elements of `width` bytes, `rate` of them changed (specials mixed in:
// NaN payloads, Inf, -0, subnormals, all-ones).
struct Pair {
  int width = 2;
  uint64_t n = 0;
  std::vector<uint8_t> base, target;
};

uint64_t Bits(const std::vector<uint8_t>& b, int w, uint64_t i) {
  uint64_t v = 0;
  std::memcpy(&v, b.data() + i * w, w);
  return v;
}
void SetBits(std::vector<uint8_t>* b, int w, uint64_t i, uint64_t v) {
  std::memcpy(b->data() + i * w, &v, w);
}

Pair MakePair(std::mt19937_64& rng, int width, uint64_t n, double rate, bool clustered) {
  Pair p;
  p.width = width;
  p.n = n;
  p.base.resize(n * width);
  const uint64_t specials[] = {0, 0x8000000000000000ull >> (64 - 8 * width), ~0ull, 1,
                               width == 2   ? 0x7FC1u
                               : width == 4 ? 0x7F800001u
                                            : 0x7Fu};
  for (uint64_t i = 0; i < n; ++i)
    SetBits(&p.base, width, i, rng() % 20 == 0 ? specials[rng() % 5] : rng());
  p.target = p.base;
  std::uniform_real_distribution<double> u(0, 1);
  for (uint64_t i = 0; i < n; ++i) {
    const bool change = clustered ? ((i / 64) % 10 == 0 && u(rng) < 0.9) : u(rng) < rate;
    if (!change) continue;
    const uint64_t old = Bits(p.base, width, i);
    uint64_t nv = (rng() % 3 == 0) ? rng() : old + 1 + rng() % 3;
    if (rng() % 7 == 0) nv = specials[rng() % 5];
    const uint64_t mask = width == 8 ? ~0ull : (uint64_t{1} << (8 * width)) - 1;
    if ((nv & mask) == old) nv = old ^ 1;
    SetBits(&p.target, width, i, nv);
  }
  return p;
}

// The record of a chunk covering all of `p` as one range (or as two ranges of tensor 0 when
// `split`): the encoder's own bytes.
std::vector<uint8_t> Encode(const Pair& p, ValueMode mode, bool split) {
  ChunkChanges c;
  c.width = static_cast<uint8_t>(p.width);
  c.num_elements = p.n;
  if (split) {
    c.segments = {Segment::Range(0, 0, p.n / 2), Segment::Range(0, p.n / 2, p.n - p.n / 2)};
  } else {
    c.segments = {Segment::Range(0, 0, p.n)};
  }
  for (uint64_t i = 0; i < p.n; ++i) {
    const uint64_t o = Bits(p.base, p.width, i), t = Bits(p.target, p.width, i);
    if (o == t) continue;
    c.positions.push_back(i);
    c.old_bits.push_back(o);
    c.new_bits.push_back(t);
  }
  c.dense = c.positions.size() == p.n;
  const XXH128_hash_t r = XXH3_128bits(p.target.data(), p.target.size());
  c.target_range_hash = Hash128{r.low64, r.high64};
  auto bytes = EncodeChunk(c, mode, {1234}, 1);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return bytes.ok() ? *bytes : std::vector<uint8_t>{};
}

std::vector<TensorBuffer> Over(std::vector<uint8_t>* buf, int width) {
  return {TensorBuffer{buf->data(), buf->size() / width, width, 1234}};
}

// Applies `record` to a copy of `start` both ways; checks both agree (status code and bytes) and
// that a refusal left the copy as it was. Returns the streamed path's status and result.
Status ApplyBothWays(const std::vector<uint8_t>& record, const std::vector<uint8_t>& start,
                     int width, bool verify_ranges, std::vector<uint8_t>* result) {
  std::vector<uint8_t> a = start, b = start;
  BufferApplier streamed(Over(&a, width));
  streamed.set_verify_ranges(verify_ranges);
  const Status sa = streamed.ApplyRecord(record.data(), record.size());
  BufferApplier reference(Over(&b, width));
  reference.set_verify_ranges(verify_ranges);
  StatusOr<DecodedChunk> dc = DecodeChunk(record.data(), record.size());
  const Status sb = dc.ok() ? reference.ApplyChunk(*dc) : dc.status();
  EXPECT_EQ(sa.code(), sb.code()) << "streamed: " << sa << "\nreference: " << sb;
  EXPECT_EQ(a, b) << "the two paths left different bytes";
  if (!sa.ok()) {
    EXPECT_EQ(a, start) << "a refused record changed storage: " << sa;
  } else {
    EXPECT_EQ(streamed.hash_delta(), reference.hash_delta());
  }
  *result = a;
  return sa;
}

TEST(ApplyRecord, SameBytesAsDecodeAndApply) {
  std::mt19937_64 rng(77);
  const double rates[] = {0.0, 0.00001, 0.01, 0.03, 0.05, 0.5, 1.0};
  const ValueMode modes[] = {ValueMode::kXor, ValueMode::kUlpDelta, ValueMode::kAbsolute};
  int cases = 0;
  for (int width : {1, 2, 4, 8}) {
    for (ValueMode mode : modes) {
      for (double rate : rates) {
        for (bool clustered : {false, true}) {
          if (clustered && rate != 0.05) continue;
          const uint64_t n = 1 + rng() % 30000;
          const Pair p = MakePair(rng, width, n, rate, clustered);
          for (bool split : {false, true}) {
            if (split && n < 2) continue;
            const std::vector<uint8_t> rec = Encode(p, mode, split);
            std::vector<uint8_t> out;
            const Status st = ApplyBothWays(rec, p.base, width, (cases % 2) == 0, &out);
            ASSERT_TRUE(st.ok()) << st << " width " << width << " rate " << rate;
            ASSERT_EQ(out, p.target) << "width " << width << " rate " << rate;
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_GE(cases, 150);
}

// The raw streams of a record and its header, to forge from.
struct Parts {
  ChunkHeader header;
  std::vector<std::vector<uint8_t>> streams;
};
Parts Split(const std::vector<uint8_t>& record) {
  internal::ChunkStreams cs;
  Status st = internal::DecodeChunkStreams(record.data(), record.size(), &cs);
  EXPECT_TRUE(st.ok()) << st;
  Parts p;
  p.header = cs.header;
  const uint64_t k = cs.header.num_changes;
  if (cs.positions != nullptr)
    p.streams.emplace_back(cs.positions, cs.positions + cs.positions_size);
  for (int b = 0; b < cs.header.elem_width; ++b)
    p.streams.emplace_back(cs.planes[b], cs.planes[b] + k);
  return p;
}

std::vector<uint8_t> Varint(uint64_t v) {
  std::vector<uint8_t> out;
  while (v >= 0x80) {
    out.push_back(static_cast<uint8_t>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<uint8_t>(v));
  return out;
}

// Records that pass every checksum but are wrong inside are refused by both paths with the same
// code, and the streamed path restores what it had already patched (the bad spot is placed past
// its first batches): relative values by undoing them, absolute ones from the saved bits.
class InconsistentRecords : public ::testing::TestWithParam<ValueMode> {};

TEST_P(InconsistentRecords, AreRefusedAndRestored) {
  const ValueMode mode = GetParam();
  std::mt19937_64 rng(5);
  const Pair p = MakePair(rng, 2, 60000, 0.1, false);  // ~6000 changes: gaps
  const std::vector<uint8_t> good = Encode(p, mode, false);
  const Parts parts = Split(good);
  ASSERT_EQ(parts.header.position_mode, PositionMode::kGaps);
  const uint64_t k = parts.header.num_changes;
  ASSERT_GT(k, 3000u);
  // Byte offset of varint number `i` in the gap stream.
  auto varint_at = [&](uint64_t i) {
    const std::vector<uint8_t>& g = parts.streams[0];
    uint64_t at = 0;
    for (uint64_t j = 0; j < i; ++j) {
      while (g[at] & 0x80) ++at;
      ++at;
    }
    return at;
  };
  struct Forgery {
    const char* what;
    std::function<void(Parts*)> edit;
    const char* message;  // expected in the error
  };
  const uint64_t late = k - 100;  // a change in the last batches
  const std::vector<Forgery> forgeries = {
      {"a gap past the end",
       [&](Parts* f) {
         std::vector<uint8_t>& g = f->streams[0];
         const uint64_t at = varint_at(late);
         uint64_t len = 1;
         while (g[at + len - 1] & 0x80) ++len;
         const std::vector<uint8_t> big = Varint(p.n);
         g.erase(g.begin() + at, g.begin() + at + len);
         g.insert(g.begin() + at, big.begin(), big.end());
       },
       "position out of range"},
      {"an overlong varint",
       [&](Parts* f) {
         std::vector<uint8_t>& g = f->streams[0];
         const uint64_t at = varint_at(late);
         g.insert(g.begin() + at, 11, 0x80);
       },
       "overlong position varint"},
      {"a truncated gap stream", [&](Parts* f) { f->streams[0].pop_back(); },
       "truncated or bad position varint"},
      {"a gap stream with an extra varint", [&](Parts* f) { f->streams[0].push_back(0); },
       "trailing bytes in the position stream"},
      {"a value that misses the target", [&](Parts* f) { f->streams[1][late] ^= 0x10; },
       "do not produce the target bits"},
      {"a wrong base-change hash", [&](Parts* f) { f->header.base_change_hash.lo ^= 1; },
       "differ from the delta's base"},
      {"a wrong range hash", [&](Parts* f) { f->header.target_range_hash.hi ^= 1; },
       "target range hash"},
  };
  for (const Forgery& fg : forgeries) {
    // An absolute overwrite has no base to check.
    if (mode == ValueMode::kAbsolute && std::string(fg.what) == "a wrong base-change hash")
      continue;
    SCOPED_TRACE(fg.what);
    Parts f = parts;
    fg.edit(&f);
    const std::vector<uint8_t> rec = internal::AssembleChunkRecord(f.header, f.streams, 1);
    std::vector<uint8_t> out;
    const Status st = ApplyBothWays(rec, p.base, 2, /*verify_ranges=*/true, &out);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find(fg.message), std::string::npos) << st;
    EXPECT_EQ(out, p.base);
  }
  // Unchanged parts reassemble into a record that applies.
  std::vector<uint8_t> out;
  ASSERT_TRUE(ApplyBothWays(internal::AssembleChunkRecord(parts.header, parts.streams, 1), p.base,
                            2, true, &out)
                  .ok());
  EXPECT_EQ(out, p.target);
}

INSTANTIATE_TEST_SUITE_P(ValueModes, InconsistentRecords,
                         ::testing::Values(ValueMode::kXor, ValueMode::kUlpDelta,
                                           ValueMode::kAbsolute));

// The gap stream's varint count (bytes without the continuation bit) is checked before the
// pass: flipping the continuation bit of any one byte, in the 32-byte blocks or the tail, makes the
// count wrong and the record refused (the stream's size is not a multiple of 32).
TEST(ApplyRecord, GapVarintCountIsCheckedAtEveryByte) {
  std::mt19937_64 rng(13);
  const Pair p = MakePair(rng, 2, 40000, 0.01, false);  // ~400 changes, some two-byte gaps
  const Parts parts = Split(Encode(p, ValueMode::kXor, false));
  ASSERT_EQ(parts.header.position_mode, PositionMode::kGaps);
  const uint64_t size = parts.streams[0].size();
  ASSERT_NE(size % 32, 0u) << size;
  ASSERT_GT(parts.header.num_changes, 100u);
  ASSERT_LT(parts.header.num_changes, size) << "no multi-byte gap";
  for (uint64_t at = 0; at < size; ++at) {
    Parts f = parts;
    f.streams[0][at] ^= 0x80;
    const std::vector<uint8_t> rec = internal::AssembleChunkRecord(f.header, f.streams, 1);
    internal::ChunkStreams cs;
    const Status st = internal::DecodeChunkStreams(rec.data(), rec.size(), &cs);
    ASSERT_TRUE(st.IsDataLoss()) << "byte " << at << ": " << st;
  }
  internal::ChunkStreams cs;
  const std::vector<uint8_t> rec = internal::AssembleChunkRecord(parts.header, parts.streams, 1);
  EXPECT_TRUE(internal::DecodeChunkStreams(rec.data(), rec.size(), &cs).ok());
}

TEST(ApplyRecord, InconsistentBitmapsAreRefused) {
  std::mt19937_64 rng(9);
  Pair p =
      MakePair(rng, 2, 8003, 0.6, false);  // dense changes: bitmap; 8003 = 7 bits in the last byte
  const std::vector<uint8_t> good = Encode(p, ValueMode::kXor, false);
  const Parts parts = Split(good);
  ASSERT_EQ(parts.header.position_mode, PositionMode::kBitmap);
  {  // a bit past the covered elements
    Parts f = parts;
    f.streams[0].back() |= 0x80;
    std::vector<uint8_t> out;
    const Status st = ApplyBothWays(internal::AssembleChunkRecord(f.header, f.streams, 1), p.base,
                                    2, false, &out);
    EXPECT_TRUE(st.IsDataLoss()) << st;
    EXPECT_NE(st.message().find("beyond the covered elements"), std::string::npos) << st;
  }
  {  // one bit fewer than num_changes
    Parts f = parts;
    for (uint8_t& b : f.streams[0]) {
      if (b != 0) {
        b &= static_cast<uint8_t>(b - 1);
        break;
      }
    }
    std::vector<uint8_t> out;
    const Status st = ApplyBothWays(internal::AssembleChunkRecord(f.header, f.streams, 1), p.base,
                                    2, false, &out);
    EXPECT_TRUE(st.IsDataLoss()) << st;
    EXPECT_NE(st.message().find("popcount"), std::string::npos) << st;
  }
}

// Storage that differs from the chunk's base at a changed element: refused (the base-change hash
// is checked after the pass) and restored, every change undone from its value, at every width.
TEST(ApplyRecord, WrongBaseIsRefusedAndRestored) {
  for (int w : {1, 2, 4, 8}) {
    std::mt19937_64 rng(11 + w);
    const Pair p = MakePair(rng, w, 50000, 0.03, false);
    for (ValueMode mode : {ValueMode::kXor, ValueMode::kUlpDelta}) {
      SCOPED_TRACE("width " + std::to_string(w) + " mode " + std::to_string(int(mode)));
      const std::vector<uint8_t> rec = Encode(p, mode, false);
      std::vector<uint8_t> start = p.base;
      uint64_t e = 40000;
      while (Bits(p.base, w, e) == Bits(p.target, w, e)) ++e;
      start[w * e + (w - 1) / 2] ^= 0x20;
      std::vector<uint8_t> out;
      const Status st = ApplyBothWays(rec, start, w, false, &out);
      EXPECT_TRUE(st.IsFailedPrecondition()) << st;
      EXPECT_EQ(out, start);
    }
  }
}

}  // namespace
}  // namespace dcr
