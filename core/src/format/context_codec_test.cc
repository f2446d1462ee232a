// Context-coded chunks: round trips against the plain form, the conversion back to plain bytes,
// deltas built with context coding applied offline and through BufferApplier, wrong bases,
// corruption and truncation.
#include "internal/context_codec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <random>

#include "dcr/apply.h"
#include "dcr/context.h"
#include "dcr/delta.h"
#include "dcr/hash.h"
#include "dcr/testing/fixtures.h"
#include "dcr/testing/synth.h"
#include "internal/context_walk.h"
#include "internal/simd.h"

namespace dcr {
namespace {

using dcr::testing::OwnedTensor;
using dcr::testing::TempDir;
using dcr::testing::Views;

// A float-like base of width w: small magnitudes, varied exponents; `rate` of the elements move
// by a few ulp (more often where the magnitude is small), a few get arbitrary bits.
void MakeFloatPair(std::mt19937_64& rng, int w, uint64_t n, double rate, std::vector<uint8_t>* base,
                   std::vector<uint8_t>* target) {
  base->resize(n * w);
  target->resize(n * w);
  const int mant = w == 2 ? 7 : (w == 4 ? 23 : 52);
  const int ebias = w == 2 ? 127 : (w == 4 ? 127 : 1023);
  const uint64_t mask = w == 8 ? ~0ull : ((1ull << (8 * w)) - 1);
  for (uint64_t i = 0; i < n; ++i) {
    const int e = ebias - 2 - static_cast<int>(rng() % 24);
    const uint64_t sign = rng() & 1;
    uint64_t bits =
        (sign << (8 * w - 1)) | (static_cast<uint64_t>(e) << mant) | (rng() & ((1ull << mant) - 1));
    if (rng() % 500 == 0) bits = rng() & mask;  // NaNs, infinities, anything
    uint64_t t = bits;
    const double scale = std::ldexp(1.0, -(ebias - 2 - e) / 4);  // small exponents change more
    if (std::uniform_real_distribution<double>(0, 1)(rng) < rate / scale * 0.25) {
      const int64_t d = 1 + static_cast<int64_t>(rng() % 3);
      t = (rng() & 1) ? bits + d : bits - d;
      if (rng() % 200 == 0) t = rng();
      t &= mask;
      if (t == bits) t ^= 1;
    }
    std::memcpy(base->data() + i * w, &bits, w);
    std::memcpy(target->data() + i * w, &t, w);
  }
}

// A plain chunk record of one contiguous tensor range, and its changes.
std::vector<uint8_t> PlainRecord(const std::vector<uint8_t>& base,
                                 const std::vector<uint8_t>& target, int w, ValueMode mode) {
  ChunkChanges c;
  c.chunk_id = 7;
  c.width = static_cast<uint8_t>(w);
  const uint64_t n = base.size() / w;
  c.num_elements = n;
  c.segments = {Segment::Range(0, 0, n)};
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t a = 0, b = 0;
    std::memcpy(&a, base.data() + i * w, w);
    std::memcpy(&b, target.data() + i * w, w);
    if (a != b) {
      c.positions.push_back(i);
      c.old_bits.push_back(a);
      c.new_bits.push_back(b);
    }
  }
  c.target_range_hash = BytesHash128(target.data(), target.size());
  auto r = EncodeChunk(c, mode, {0x1234}, 1);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : std::vector<uint8_t>{};
}

class ContextRoundTrip : public ::testing::TestWithParam<std::tuple<int, double, int>> {};

TEST_P(ContextRoundTrip, DecodesToThePlainChangesAndConvertsBackToItsBytes) {
  const auto [w, rate, mode] = GetParam();
  std::mt19937_64 rng(static_cast<uint64_t>(w * 1000 + rate * 1e5 + mode));
  for (uint64_t n : {70ull, 4096ull, 100000ull}) {
    std::vector<uint8_t> base, target;
    MakeFloatPair(rng, w, n, rate, &base, &target);
    const ValueMode vm = static_cast<ValueMode>(mode);
    const std::vector<uint8_t> plain = PlainRecord(base, target, w, vm);
    auto pd = DecodeChunk(plain.data(), plain.size());
    ASSERT_TRUE(pd.ok()) << pd.status();
    if (!ContextCodable(pd->header)) continue;
    auto ctx = EncodeContextChunk(plain.data(), plain.size(), base.data(), base.size());
    ASSERT_TRUE(ctx.ok()) << ctx.status();
    // Deterministic.
    auto again = EncodeContextChunk(plain.data(), plain.size(), base.data(), base.size());
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(*ctx, *again);
    // Same identity and hashes.
    auto ch = ParseChunkHeader(ctx->data(), ctx->size(), nullptr, nullptr);
    ASSERT_TRUE(ch.ok()) << ch.status();
    EXPECT_TRUE(IsContextCoded(*ch));
    EXPECT_EQ(ch->chunk_id, pd->header.chunk_id);
    EXPECT_EQ(ch->num_changes, pd->header.num_changes);
    EXPECT_EQ(ch->base_change_hash, pd->header.base_change_hash);
    EXPECT_EQ(ch->target_change_hash, pd->header.target_change_hash);
    EXPECT_EQ(ch->version_delta, pd->header.version_delta);
    EXPECT_EQ(ch->target_range_hash, pd->header.target_range_hash);
    // A plain decoder refuses it cleanly.
    auto refused = DecodeChunk(ctx->data(), ctx->size());
    ASSERT_FALSE(refused.ok());
    EXPECT_TRUE(refused.status().IsFailedPrecondition()) << refused.status();
    DecodedChunk dc;
    ASSERT_TRUE(
        DecodeContextChunkInto(ctx->data(), ctx->size(), base.data(), base.size(), &dc).ok());
    EXPECT_EQ(dc.positions, pd->positions);
    EXPECT_EQ(dc.values, pd->values);
    auto back = ContextChunkToPlain(ctx->data(), ctx->size(), base.data(), base.size(), 1);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, plain);
    // Applied through BufferApplier onto the base: the target.
    std::vector<uint8_t> buf = base;
    BufferApplier ap({TensorBuffer{buf.data(), n, w, 0x1234}});
    ASSERT_TRUE(ap.ApplyRecord(ctx->data(), ctx->size()).ok());
    EXPECT_EQ(buf, target);
    // Applied again (the base is gone): refused, nothing written.
    Status twice = ap.ApplyRecord(ctx->data(), ctx->size());
    EXPECT_TRUE(twice.IsFailedPrecondition()) << twice;
    EXPECT_EQ(buf, target);
  }
}

INSTANTIATE_TEST_SUITE_P(WidthsRatesModes, ContextRoundTrip,
                         ::testing::Combine(::testing::Values(2, 4, 8),
                                            ::testing::Values(0.001, 0.03, 0.3),
                                            ::testing::Values(0, 1)));

// DeltaOptions::context_classes caps the classes the encoder chooses: every cap from 1 to 16
// gives a record with at most that many classes (the class count is the body's byte after its
// 8-byte positions hash) that decodes to the plain record's changes and converts back to its
// bytes; the full 16 classes are never larger than one; 0 and 17 are refused.
TEST(Context, ClassCapBoundsTheClassesAndKeepsTheChanges) {
  std::mt19937_64 rng(23);
  for (int w : {2, 4, 8}) {
    std::vector<uint8_t> base, target;
    MakeFloatPair(rng, w, 60000, 0.03, &base, &target);
    const std::vector<uint8_t> plain = PlainRecord(base, target, w, ValueMode::kUlpDelta);
    auto pd = DecodeChunk(plain.data(), plain.size());
    ASSERT_TRUE(pd.ok()) << pd.status();
    ASSERT_TRUE(ContextCodable(pd->header));
    size_t size_one = 0, size_all = 0;
    int most = 0;
    for (int cap = 1; cap <= kContextClassesMax; ++cap) {
      auto ctx = EncodeContextChunk(plain.data(), plain.size(), base.data(), base.size(), cap);
      ASSERT_TRUE(ctx.ok()) << ctx.status();
      size_t hsize = 0;
      auto h = ParseChunkHeader(ctx->data(), ctx->size(), &hsize, nullptr);
      ASSERT_TRUE(h.ok()) << h.status();
      ASSERT_GT(ctx->size(), hsize + 8);
      const int k = (*ctx)[hsize + 8];
      EXPECT_GE(k, 1) << w << " " << cap;
      EXPECT_LE(k, cap) << w << " " << cap;
      most = std::max(most, k);
      DecodedChunk dc;
      ASSERT_TRUE(
          DecodeContextChunkInto(ctx->data(), ctx->size(), base.data(), base.size(), &dc).ok());
      EXPECT_EQ(dc.positions, pd->positions) << w << " " << cap;
      EXPECT_EQ(dc.values, pd->values) << w << " " << cap;
      auto back = ContextChunkToPlain(ctx->data(), ctx->size(), base.data(), base.size(), 1);
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_EQ(*back, plain) << w << " " << cap;
      if (cap == 1) size_one = ctx->size();
      if (cap == kContextClassesMax) {
        size_all = ctx->size();
        auto dflt = EncodeContextChunk(plain.data(), plain.size(), base.data(), base.size());
        ASSERT_TRUE(dflt.ok());
        EXPECT_EQ(*dflt, *ctx);
      }
    }
    // The data has many exponents: the encoder uses more than a few classes when it may.
    EXPECT_GT(most, 4) << w;
    EXPECT_LE(size_all, size_one) << w;
    for (int bad : {0, -1, kContextClassesMax + 1}) {
      auto r = EncodeContextChunk(plain.data(), plain.size(), base.data(), base.size(), bad);
      ASSERT_FALSE(r.ok()) << bad;
      EXPECT_TRUE(r.status().IsInvalidArgument()) << r.status();
    }
  }
}

// Against a base that differs (in one element's exponent, or everywhere) the decoder refuses
// with kFailedPrecondition and never reads outside its inputs.
TEST(Context, WrongBaseIsRefused) {
  std::mt19937_64 rng(5);
  std::vector<uint8_t> base, target;
  MakeFloatPair(rng, 2, 50000, 0.03, &base, &target);
  const std::vector<uint8_t> plain = PlainRecord(base, target, 2, ValueMode::kUlpDelta);
  auto ctx = EncodeContextChunk(plain.data(), plain.size(), base.data(), base.size());
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  auto pd = DecodeChunk(plain.data(), plain.size());
  ASSERT_TRUE(pd.ok());
  int refused = 0, decoded = 0;
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<uint8_t> wrong = base;
    if (trial == 0) {
      for (auto& b : wrong) b = static_cast<uint8_t>(rng());
    } else {
      const uint64_t i = rng() % 50000;
      wrong[2 * i + 1] ^= static_cast<uint8_t>(1 + rng() % 127);
    }
    DecodedChunk dc;
    Status s = DecodeContextChunkInto(ctx->data(), ctx->size(), wrong.data(), wrong.size(), &dc);
    auto p = ContextChunkToPlain(ctx->data(), ctx->size(), wrong.data(), wrong.size());
    // Applied onto those bits (decoded and applied in one pass, window by window): refused the
    // same way, and every element written so far taken back.
    std::vector<uint8_t> buf = wrong;
    BufferApplier ap({TensorBuffer{buf.data(), 50000, 2, 0x1234}});
    const Status applied = ap.ApplyRecord(ctx->data(), ctx->size());
    if (!applied.ok()) {
      EXPECT_TRUE(applied.IsFailedPrecondition()) << trial << ": " << applied;
      EXPECT_TRUE(buf == wrong) << trial;
    }
    if (s.ok()) {
      // The element changed kept its class and is not a changed one: the changes decode as
      // they are, and so does the plain form.
      ASSERT_TRUE(p.ok()) << p.status();
      EXPECT_EQ(*p, plain);
      EXPECT_EQ(dc.positions, pd->positions);
      EXPECT_EQ(dc.values, pd->values);
      ++decoded;
      continue;
    }
    ++refused;
    EXPECT_FALSE(applied.ok()) << trial;
    EXPECT_TRUE(s.IsFailedPrecondition()) << trial << ": " << s;
    EXPECT_FALSE(p.ok());
  }
  EXPECT_GT(refused, 10);
  // A base of the wrong size is an argument error.
  DecodedChunk dc;
  EXPECT_TRUE(DecodeContextChunkInto(ctx->data(), ctx->size(), base.data(), base.size() - 2, &dc)
                  .IsInvalidArgument());
  // Encoding against bits that are not the chunk's base is refused too.
  std::vector<uint8_t> other = target;
  auto bad = EncodeContextChunk(plain.data(), plain.size(), other.data(), other.size());
  EXPECT_TRUE(bad.status().IsFailedPrecondition()) << bad.status();
}

// Every truncation and every single-byte corruption is an error (never a crash, never a wrong
// result); corruptions inside the body with fixed-up checksums are caught by the body's checks.
TEST(Context, CorruptionAndTruncationAreErrors) {
  std::mt19937_64 rng(9);
  std::vector<uint8_t> base, target;
  MakeFloatPair(rng, 2, 20000, 0.05, &base, &target);
  const std::vector<uint8_t> plain = PlainRecord(base, target, 2, ValueMode::kUlpDelta);
  auto ctx = EncodeContextChunk(plain.data(), plain.size(), base.data(), base.size());
  ASSERT_TRUE(ctx.ok());
  auto pd = DecodeChunk(plain.data(), plain.size());
  ASSERT_TRUE(pd.ok());
  DecodedChunk dc;
  for (size_t cut = 0; cut < ctx->size(); cut += 1 + cut / 16) {
    std::vector<uint8_t> t(ctx->begin(), ctx->begin() + static_cast<ptrdiff_t>(cut));
    EXPECT_FALSE(DecodeContextChunkInto(t.data(), t.size(), base.data(), base.size(), &dc).ok())
        << cut;
  }
  size_t hsize = 0, rsize = 0;
  auto h = ParseChunkHeader(ctx->data(), ctx->size(), &hsize, &rsize);
  ASSERT_TRUE(h.ok());
  for (int trial = 0; trial < 400; ++trial) {
    std::vector<uint8_t> body(ctx->begin() + static_cast<ptrdiff_t>(hsize), ctx->end());
    const size_t at = rng() % body.size();
    body[at] ^= static_cast<uint8_t>(1 + rng() % 255);
    if (trial % 3 == 0) body.resize(rng() % body.size());
    std::vector<uint8_t> rec = internal::SealContextRecord(*h, body);
    Status s = DecodeContextChunkInto(rec.data(), rec.size(), base.data(), base.size(), &dc);
    if (s.ok()) {
      // Only a change that leaves the decoded changes as they were passes every check (a class
      // bound moved across contexts no element has): the result is the plain chunk's.
      EXPECT_EQ(dc.positions, pd->positions) << trial;
      EXPECT_EQ(dc.values, pd->values) << trial;
      continue;
    }
    EXPECT_TRUE(s.IsDataLoss() || s.IsFailedPrecondition()) << s;
  }
}

// The models of a version-7 body, as (offset in the body, form): -1 an explicit table, 0 geometric,
// 1 repeat. Reads the body's layout (core/FORMAT.md section 2.5); the body is the encoder's.
std::vector<std::pair<size_t, int>> ModelsOf(const std::vector<uint8_t>& body) {
  size_t p = 8;
  auto varint = [&] {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      const uint8_t b = body[p++];
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if ((b & 0x80) == 0) return v;
    }
  };
  const int k = body[p++];
  p += static_cast<size_t>(k - 1);
  std::vector<uint64_t> kc;
  for (int c = 0; c < k; ++c) kc.push_back(varint());
  std::vector<std::pair<size_t, int>> models;
  for (int c = 0; c < k; ++c) {
    if (kc[c] == 0) continue;
    for (int role = 0; role < 2; ++role) {
      const size_t at = p;
      const uint64_t n = varint();
      if (n == 0) {
        const int form = body[p++];
        models.emplace_back(at, form);
        if (form == 0) p += 3;
        continue;
      }
      models.emplace_back(at, -1);
      for (uint64_t sym = 0; sym < n;) {
        if (varint() != 0) {
          ++sym;
        } else {
          sym += varint() + 1;
        }
      }
    }
  }
  return models;
}

// The encoder writes version-7 bodies (position mode kContextV7) whose models include geometric
// laws and repeats on float-like data; a model form that is unknown, a geometric law of ratio 0
// and a repeat with no previous model of its role are kDataLoss.
TEST(Context, VersionSevenModelFormsAndTheirErrors) {
  std::mt19937_64 rng(11);
  std::vector<uint8_t> base, target;
  MakeFloatPair(rng, 2, 200000, 0.02, &base, &target);
  const std::vector<uint8_t> plain = PlainRecord(base, target, 2, ValueMode::kUlpDelta);
  auto ctx = EncodeContextChunk(plain.data(), plain.size(), base.data(), base.size());
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  size_t hsize = 0, rsize = 0;
  auto h = ParseChunkHeader(ctx->data(), ctx->size(), &hsize, &rsize);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->position_mode, PositionMode::kContextV7);
  const std::vector<uint8_t> body(ctx->begin() + static_cast<ptrdiff_t>(hsize), ctx->end());
  const auto models = ModelsOf(body);
  size_t geometric = 0, repeat = 0;
  for (const auto& [at, form] : models) {
    geometric += form == 0;
    repeat += form == 1;
  }
  EXPECT_GT(geometric, 0u);
  EXPECT_GT(repeat, 0u);
  auto decode = [&](const std::vector<uint8_t>& b) {
    std::vector<uint8_t> rec = internal::SealContextRecord(*h, b);
    DecodedChunk dc;
    return DecodeContextChunkInto(rec.data(), rec.size(), base.data(), base.size(), &dc);
  };
  EXPECT_TRUE(decode(body).ok());
  for (const auto& [at, form] : models) {
    if (form != 0) continue;
    std::vector<uint8_t> b = body;
    b[at + 1] = 7;
    Status s = decode(b);
    EXPECT_TRUE(s.IsDataLoss()) << s;
    EXPECT_NE(s.message().find("unknown model form"), std::string::npos) << s;
    b = body;
    b[at + 3] = b[at + 4] = 0;
    s = decode(b);
    EXPECT_TRUE(s.IsDataLoss()) << s;
    EXPECT_NE(s.message().find("bad geometric model"), std::string::npos) << s;
    break;
  }
  // The first model (class 0's gap model) as a repeat.
  std::vector<uint8_t> b(body.begin(), body.begin() + static_cast<ptrdiff_t>(models[0].first));
  b.push_back(0);
  b.push_back(1);
  b.insert(b.end(), body.begin() + static_cast<ptrdiff_t>(models[1].first), body.end());
  Status s = decode(b);
  EXPECT_TRUE(s.IsDataLoss()) << s;
  EXPECT_NE(s.message().find("repeated model without a previous one"), std::string::npos) << s;
}

// A delta built with context coding: version 7, same target hash and chunk table ids as the
// plain delta, applied offline and chunk by chunk; each chunk converts back to the plain delta's
// record byte for byte; the output does not depend on the thread count.
TEST(Context, DeltaWithContextCodingAppliesAndConvertsToThePlainDelta) {
  TempDir dir;
  std::vector<TensorSpec> specs = {{"a.weight", "BF16", {300, 512}},
                                   {"b.weight", "BF16", {64, 64}},
                                   {"c.norm", "BF16", {512}},
                                   {"d.weight", "F32", {100, 300}},
                                   {"e.weight", "BF16", {7000}}};
  SynthOptions so;
  so.change_rate = 0.03;
  so.steps = 2;
  so.threads = 2;
  so.calibration_sample = 1 << 14;
  auto tr = SynthTrainer::Create(specs, so);
  ASSERT_TRUE(tr.ok()) << tr.status();
  ASSERT_TRUE(WriteSafetensors(dir / "b.st", (*tr)->Views()).ok());
  (*tr)->Step();
  ASSERT_TRUE(WriteSafetensors(dir / "t.st", (*tr)->Views()).ok());
  auto b = Checkpoint::Open(dir / "b.st");
  auto t = Checkpoint::Open(dir / "t.st");
  ASSERT_TRUE(b.ok() && t.ok());
  DeltaOptions opt;
  opt.chunk_elems = 40000;
  opt.small_tensor_elems = 10000;
  DeltaMemorySink plain_sink;
  opt.threads = 1;
  ASSERT_TRUE(BuildDelta(b->get(), **t, opt, &plain_sink).ok());
  opt.context_coding = true;
  std::vector<uint8_t> first;
  for (int threads : {1, 3}) {
    opt.threads = threads;
    DeltaMemorySink sink;
    auto st = BuildDelta(b->get(), **t, opt, &sink);
    ASSERT_TRUE(st.ok()) << st.status();
    if (first.empty()) first = sink.bytes();
    EXPECT_EQ(sink.bytes(), first) << threads;
  }
  EXPECT_LT(first.size(), plain_sink.bytes().size());
  auto d = DeltaReader::FromBytes(first);
  auto pd = DeltaReader::FromBytes(plain_sink.bytes());
  ASSERT_TRUE(d.ok() && pd.ok()) << d.status();
  EXPECT_EQ((*d)->header().format_version, 8u);
  EXPECT_EQ((*pd)->header().format_version, 5u);
  EXPECT_EQ((*d)->trailer().target_hash, (*pd)->trailer().target_hash);
  ASSERT_EQ((*d)->num_chunks(), (*pd)->num_chunks());
  // Chunk by chunk against a copy of the base; the context ones convert back to plain bytes.
  const Inventory& inv = (*d)->inventory();
  std::vector<std::vector<uint8_t>> bufs;
  std::vector<TensorBuffer> tbs;
  for (size_t i = 0; i < inv.tensors.size(); ++i) {
    const TensorInfo* bt = (*b)->Find(inv.tensors[i].name);
    bufs.emplace_back((*b)->data(*bt), (*b)->data(*bt) + bt->nbytes);
  }
  for (size_t i = 0; i < inv.tensors.size(); ++i) {
    tbs.push_back(TensorBuffer{bufs[i].data(), inv.tensors[i].num_elements(),
                               inv.tensors[i].width(), inv.salts[i]});
  }
  int context_chunks = 0;
  for (size_t i = 0; i < (*d)->num_chunks(); ++i) {
    auto h = ParseChunkHeader((*d)->chunk_data(i), (*d)->chunk_size(i), nullptr, nullptr);
    ASSERT_TRUE(h.ok());
    if (!IsContextCoded(*h)) {
      EXPECT_EQ(
          std::vector<uint8_t>((*d)->chunk_data(i), (*d)->chunk_data(i) + (*d)->chunk_size(i)),
          std::vector<uint8_t>((*pd)->chunk_data(i), (*pd)->chunk_data(i) + (*pd)->chunk_size(i)));
      continue;
    }
    ++context_chunks;
    std::vector<uint8_t> covered;
    ASSERT_TRUE(GatherCoveredBits(*h, tbs, &covered).ok());
    auto p = ContextChunkToPlain((*d)->chunk_data(i), (*d)->chunk_size(i), covered.data(),
                                 covered.size());
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(*p, std::vector<uint8_t>((*pd)->chunk_data(i),
                                       (*pd)->chunk_data(i) + (*pd)->chunk_size(i)));
  }
  EXPECT_GT(context_chunks, 2);
  BufferApplier ap(tbs);
  for (size_t i = 0; i < (*d)->num_chunks(); ++i) {
    ASSERT_TRUE(ap.ApplyRecord((*d)->chunk_data(i), (*d)->chunk_size(i)).ok()) << i;
  }
  for (size_t i = 0; i < inv.tensors.size(); ++i) {
    const TensorInfo* tt = (*t)->Find(inv.tensors[i].name);
    EXPECT_EQ(0, std::memcmp(bufs[i].data(), (*t)->data(*tt), tt->nbytes)) << inv.tensors[i].name;
  }
  // Offline refit.
  ASSERT_TRUE(WriteFileAtomic(dir / "d.dcr", first.data(), first.size()).ok());
  auto ap2 =
      ApplyDeltaFile(dir / "b.st", dir / "d.dcr", dir / "out.st", ApplyOptions{2, true, true});
  ASSERT_TRUE(ap2.ok()) << ap2.status();
  auto out = ReadFile(dir / "out.st");
  auto want = ReadFile(dir / "t.st");
  ASSERT_TRUE(out.ok() && want.ok());
  EXPECT_EQ(*out, *want);
  // The size sample over every cell is the two builds' chunk bytes.
  auto sample = SampleContextSize(**b, **t, opt, 0);
  ASSERT_TRUE(sample.ok()) << sample.status();
  uint64_t ctx_bytes = 0, plain_bytes = 0;
  for (size_t i = 0; i < (*d)->num_chunks(); ++i) ctx_bytes += (*d)->chunk_size(i);
  for (size_t i = 0; i < (*pd)->num_chunks(); ++i) plain_bytes += (*pd)->chunk_size(i);
  EXPECT_EQ(sample->context_bytes, ctx_bytes);
  EXPECT_EQ(sample->plain_bytes, plain_bytes);
  EXPECT_EQ(sample->chunks, (*d)->num_chunks());
  EXPECT_EQ(sample->context_chunks, static_cast<uint64_t>(context_chunks));
}

// Deltas built under every class cap apply bit-exact: float-like tensors of 2-, 4- and 8-byte
// dtypes with NaNs and infinities, from no change to every element changed, refit offline and
// compared byte for byte with the target file; a cap outside 1..16 is refused before anything is
// written.
TEST(Context, EveryClassCapAppliesBitExact) {
  TempDir dir;
  const std::vector<std::tuple<std::string, std::string, std::vector<int64_t>>> layout = {
      {"a.weight", "BF16", {257, 300}},
      {"b.weight", "F16", {5000}},
      {"c.weight", "F32", {100, 301}},
      {"d.weight", "F64", {3000}},
      {"e.norm", "BF16", {64}}};
  std::mt19937_64 rng(31);
  dcr::testing::Model base;
  for (const auto& [name, dtype, shape] : layout) {
    OwnedTensor t{name, dtype, shape, {}};
    uint64_t n = 1;
    for (int64_t d : shape) n *= static_cast<uint64_t>(d);
    std::vector<uint8_t> unused;
    MakeFloatPair(rng, DTypeWidth(DTypeFromName(dtype)), n, 0, &t.bytes, &unused);
    base.push_back(std::move(t));
  }
  ASSERT_TRUE(WriteSafetensors(dir / "b.st", Views(base)).ok());
  auto b = Checkpoint::Open(dir / "b.st");
  ASSERT_TRUE(b.ok()) << b.status();
  for (double rate : {0.0, 0.01, 0.03, 0.3, 1.0}) {
    dcr::testing::Model target = base;
    for (OwnedTensor& t : target) {
      const int w = t.width();
      const uint64_t mask = w == 8 ? ~0ull : ((1ull << (8 * w)) - 1);
      for (uint64_t i = 0; i < t.n(); ++i) {
        if (rate < 1 && std::uniform_real_distribution<double>(0, 1)(rng) >= rate) continue;
        uint64_t v = 0;
        std::memcpy(&v, t.bytes.data() + i * w, w);
        uint64_t nv = (rng() & 1) ? v + 1 + rng() % 3 : v - 1 - rng() % 3;
        if (rng() % 100 == 0) nv = rng();  // anything
        if (rng() % 300 == 0) nv = ~0ull;  // a NaN
        if (rng() % 300 == 0)
          nv = w == 2 ? 0x7F80 : (w == 4 ? 0x7F800000 : 0x7FF0ull << 48);  // inf
        nv &= mask;
        if (nv == v) nv = v ^ 1;
        std::memcpy(t.bytes.data() + i * w, &nv, w);
      }
    }
    ASSERT_TRUE(WriteSafetensors(dir / "t.st", Views(target)).ok());
    auto t = Checkpoint::Open(dir / "t.st");
    ASSERT_TRUE(t.ok()) << t.status();
    auto want = ReadFile(dir / "t.st");
    ASSERT_TRUE(want.ok());
    DeltaOptions opt;
    opt.chunk_elems = 20000;
    opt.small_tensor_elems = 1000;
    opt.context_coding = true;
    opt.threads = 2;
    size_t full_size = 0;
    for (int cap : {kContextClassesMax, 1, 2, 4, 9}) {
      opt.context_classes = cap;
      DeltaMemorySink sink;
      auto st = BuildDelta(b->get(), **t, opt, &sink);
      ASSERT_TRUE(st.ok()) << st.status();
      if (cap == kContextClassesMax) full_size = sink.bytes().size();
      // Changes here do not depend on the exponent: classes only cost tables, so a cap may be
      // smaller or larger, but the delta is the same kind of thing.
      EXPECT_LT(sink.bytes().size(), full_size * 1.2 + 256) << rate << " " << cap;
      ASSERT_TRUE(WriteFileAtomic(dir / "d.dcr", sink.bytes().data(), sink.bytes().size()).ok());
      std::filesystem::remove(dir / "out.st");
      auto ap =
          ApplyDeltaFile(dir / "b.st", dir / "d.dcr", dir / "out.st", ApplyOptions{2, true, true});
      ASSERT_TRUE(ap.ok()) << ap.status() << " " << rate << " " << cap;
      auto out = ReadFile(dir / "out.st");
      ASSERT_TRUE(out.ok());
      EXPECT_TRUE(*out == *want) << rate << " " << cap;
    }
    for (int bad : {0, kContextClassesMax + 1}) {
      opt.context_classes = bad;
      DeltaMemorySink sink;
      auto st = BuildDelta(b->get(), **t, opt, &sink);
      ASSERT_FALSE(st.ok()) << bad;
      EXPECT_TRUE(st.status().IsInvalidArgument()) << st.status();
      EXPECT_TRUE(sink.bytes().empty());
    }
  }
}

// BuildDelta's context-coded records, for which the scan hands over the contexts of the changes
// and the class choice's sample of the base, are the records EncodeContextChunk makes from the
// plain record and the base alone: cells below and above the size where the sample thins out,
// 2- and 4-byte elements, and cells of several small tensors (scanned change by change).
TEST(Context, ScanHintsGiveTheSameRecords) {
  TempDir dir;
  std::vector<TensorSpec> specs = {{"a.weight", "BF16", {300, 512}},
                                   {"b.weight", "BF16", {64, 64}},
                                   {"c.norm", "BF16", {512}},
                                   {"d.weight", "F32", {300, 300}},
                                   {"e.weight", "BF16", {7000}}};
  SynthOptions so;
  so.change_rate = 0.03;
  so.steps = 2;
  so.threads = 2;
  so.calibration_sample = 1 << 14;
  auto tr = SynthTrainer::Create(specs, so);
  ASSERT_TRUE(tr.ok()) << tr.status();
  ASSERT_TRUE(WriteSafetensors(dir / "b.st", (*tr)->Views()).ok());
  (*tr)->Step();
  ASSERT_TRUE(WriteSafetensors(dir / "t.st", (*tr)->Views()).ok());
  auto b = Checkpoint::Open(dir / "b.st");
  auto t = Checkpoint::Open(dir / "t.st");
  ASSERT_TRUE(b.ok() && t.ok());
  DeltaOptions opt;
  opt.chunk_elems = 1 << 17;
  opt.small_tensor_elems = 10000;
  opt.threads = 1;
  DeltaMemorySink plain_sink;
  ASSERT_TRUE(BuildDelta(b->get(), **t, opt, &plain_sink).ok());
  opt.context_coding = true;
  DeltaMemorySink sink;
  ASSERT_TRUE(BuildDelta(b->get(), **t, opt, &sink).ok());
  auto d = DeltaReader::FromBytes(sink.bytes());
  auto pd = DeltaReader::FromBytes(plain_sink.bytes());
  ASSERT_TRUE(d.ok() && pd.ok()) << d.status();
  ASSERT_EQ((*d)->num_chunks(), (*pd)->num_chunks());
  const Inventory& inv = (*d)->inventory();
  std::vector<std::vector<uint8_t>> bufs;
  std::vector<TensorBuffer> tbs;
  for (size_t i = 0; i < inv.tensors.size(); ++i) {
    const TensorInfo* bt = (*b)->Find(inv.tensors[i].name);
    bufs.emplace_back((*b)->data(*bt), (*b)->data(*bt) + bt->nbytes);
  }
  for (size_t i = 0; i < inv.tensors.size(); ++i) {
    tbs.push_back(TensorBuffer{bufs[i].data(), inv.tensors[i].num_elements(),
                               inv.tensors[i].width(), inv.salts[i]});
  }
  int context_chunks = 0;
  bool sampled = false;
  for (size_t i = 0; i < (*d)->num_chunks(); ++i) {
    auto h = ParseChunkHeader((*d)->chunk_data(i), (*d)->chunk_size(i), nullptr, nullptr);
    ASSERT_TRUE(h.ok());
    if (!IsContextCoded(*h)) continue;
    ++context_chunks;
    sampled |= h->num_elements >= internal::kContextSampleMin;
    std::vector<uint8_t> covered;
    ASSERT_TRUE(GatherCoveredBits(*h, tbs, &covered).ok());
    auto again = EncodeContextChunk((*pd)->chunk_data(i), (*pd)->chunk_size(i), covered.data(),
                                    covered.size());
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(*again,
              std::vector<uint8_t>((*d)->chunk_data(i), (*d)->chunk_data(i) + (*d)->chunk_size(i)))
        << "chunk " << h->chunk_id;
  }
  EXPECT_GT(context_chunks, 3);
  EXPECT_TRUE(sampled);
}

// The class walk and its inverse agree between the portable build and the AVX2 and AVX-512 ones
// this CPU runs, and the walk gives back the positions and values the gaps came from (windows of
// every fill, partial last blocks, one class to the most classes, classes without changes, a gap
// past the class's members refused).
TEST(Context, ClassWalkPortableAndFastAgree) {
  std::mt19937_64 rng(11);
  const std::vector<std::vector<uint8_t>> class_bounds = {
      {0},
      {0, 118, 121, 122, 123, 124, 126, 200},
      {0, 100, 110, 114, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 127}};
  for (const std::vector<uint8_t>& bounds : class_bounds) {
    for (int w : {2, 4, 8}) {
      for (uint64_t n :
           {uint64_t{1}, uint64_t{63}, uint64_t{4096}, uint64_t{4097}, uint64_t{70001}}) {
        std::vector<uint8_t> base, target;
        MakeFloatPair(rng, w, n, 0.2, &base, &target);
        std::vector<uint64_t> pos, val;
        for (uint64_t i = 0; i < n; ++i) {
          if (rng() % 7 == 0 || (i == n - 1 && pos.empty())) {
            pos.push_back(i);
            val.push_back(rng() % 1000);
          }
        }
        const uint64_t k = pos.size();
        const int K = static_cast<int>(bounds.size());
        const internal::ClassMap map(bounds.data(), K);
        uint64_t kc[internal::kMaxContextClasses] = {};
        for (uint64_t i = 0; i < k; ++i)
          ++kc[map.ClassOf(internal::ContextOf(base.data(), w, pos[i]))];
        uint64_t start_of[internal::kMaxContextClasses + 1] = {};
        for (int c = 0; c < K; ++c) start_of[c + 1] = start_of[c] + kc[c];
        // Gaps and values grouped by class, as the body stores them.
        std::vector<uint64_t> g(k), v(k);
        internal::ClassGapsGrouped(base.data(), w, n, map, pos.data(), val.data(), k, start_of,
                                   g.data(), v.data(), internal::Simd::kPortable);
        for (const internal::Simd simd :
             {internal::Simd::kPortable, internal::Simd::kAvx2, internal::Simd::kAvx512}) {
          if (simd > internal::CpuSimd()) continue;
          SCOPED_TRACE("K=" + std::to_string(K) + " w=" + std::to_string(w) + " n=" +
                       std::to_string(n) + " simd=" + std::to_string(static_cast<int>(simd)));
          std::vector<uint64_t> g_fast(k), v_fast(k);
          internal::ClassGapsGrouped(base.data(), w, n, map, pos.data(), val.data(), k, start_of,
                                     g_fast.data(), v_fast.data(), simd);
          EXPECT_EQ(g_fast, g);
          EXPECT_EQ(v_fast, v);
          std::vector<uint64_t> p2(k), v2(k);
          ASSERT_TRUE(internal::WalkClasses(base.data(), w, n, map, kc, start_of, g.data(),
                                            v.data(), p2.data(), v2.data(), simd));
          EXPECT_EQ(p2, pos);
          EXPECT_EQ(v2, val);
          if (w == 2 && simd == internal::Simd::kAvx2) {
            // Both selects of the AVX2 walk, whichever CpuFastPdep() picks on this CPU.
            for (const bool pdep : {false, true}) {
              std::vector<uint64_t> p3(k), v3(k);
              ASSERT_TRUE(internal::ContextWalk16Avx2(
                  reinterpret_cast<const uint16_t*>(base.data()), n, map.bounds, K, kc, start_of,
                  g.data(), v.data(), p3.data(), v3.data(), pdep, nullptr));
              EXPECT_EQ(p3, pos) << "pdep " << pdep;
              EXPECT_EQ(v3, val) << "pdep " << pdep;
            }
          }
          // The last change of a class pushed past the class's members.
          std::vector<uint64_t> bad = g;
          int c = 0;
          while (kc[c] == 0) ++c;
          bad[start_of[c + 1] - 1] += n;
          EXPECT_FALSE(internal::WalkClasses(base.data(), w, n, map, kc, start_of, bad.data(),
                                             v.data(), p2.data(), v2.data(), simd));
          // ... and a gap below n that still runs past them.
          bad = g;
          bad[start_of[c + 1] - 1] = n - 1;
          if (n > 1) {
            EXPECT_FALSE(internal::WalkClasses(base.data(), w, n, map, kc, start_of, bad.data(),
                                               v.data(), p2.data(), v2.data(), simd));
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace dcr
