// The in-memory C API (dcr/codec_c.h) through its C entry points: round trips byte for byte,
// equality with BuildDelta over the same tensors as a safetensors file, and all-or-nothing
// failures (the tensors keep their bytes whatever step refuses the delta).
#include "dcr/codec_c.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/delta.h"
#include "dcr/receiver.h"

namespace dcr {
namespace {

// A tensor set owning its bytes.
struct Set {
  std::vector<std::string> names, dtypes;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<std::vector<uint8_t>> bytes;

  void Add(std::string name, std::string dtype, std::vector<int64_t> shape, int width,
           std::mt19937_64* rng) {
    uint64_t n = 1;
    for (int64_t s : shape) n *= static_cast<uint64_t>(s);
    std::vector<uint8_t> b(n * width);
    for (auto& x : b) x = static_cast<uint8_t>((*rng)());
    names.push_back(std::move(name));
    dtypes.push_back(std::move(dtype));
    shapes.push_back(std::move(shape));
    bytes.push_back(std::move(b));
  }
  std::vector<dcr_tensor> Desc() {
    std::vector<dcr_tensor> d;
    for (size_t i = 0; i < names.size(); ++i) {
      d.push_back(dcr_tensor{names[i].c_str(), dtypes[i].c_str(), shapes[i].data(),
                             shapes[i].size(), bytes[i].data(), bytes[i].size()});
    }
    return d;
  }
};

// `base` with about `rate` of its bytes changed to other values.
Set Mutate(const Set& base, double rate, uint64_t seed) {
  Set t = base;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  for (auto& b : t.bytes) {
    for (auto& x : b) {
      if (u(rng) < rate) x = static_cast<uint8_t>(x + 1 + rng() % 255);
    }
  }
  return t;
}

Set Model(uint64_t seed) {
  std::mt19937_64 rng(seed);
  Set s;
  s.Add("a.weight", "BF16", {300, 257}, 2, &rng);
  s.Add("b.bias", "F32", {1000}, 4, &rng);
  s.Add("c.scale", "F8_E4M3", {64, 33}, 1, &rng);
  s.Add("d.table", "F64", {5, 7, 11}, 8, &rng);
  s.Add("e.scalar", "I8", {}, 1, &rng);
  return s;
}

std::vector<uint8_t> Encode(Set& base, Set& target, const dcr_codec_options& o) {
  auto b = base.Desc(), t = target.Desc();
  uint8_t* out = nullptr;
  size_t size = 0;
  EXPECT_EQ(dcr_encode_delta(b.data(), b.size(), t.data(), t.size(), &o, &out, &size), DCR_OK)
      << dcr_last_error();
  std::vector<uint8_t> v(out, out + size);
  dcr_bytes_free(out);
  return v;
}

int Apply(Set& s, const std::vector<uint8_t>& delta, const dcr_codec_options& o,
          dcr_apply_result* r = nullptr) {
  auto d = s.Desc();
  return dcr_apply_delta(d.data(), d.size(), delta.data(), delta.size(), &o, r);
}

dcr_codec_options SmallChunks() {
  dcr_codec_options o;
  dcr_codec_options_init(&o);
  o.chunk_elems = 4096;
  o.small_tensor_elems = 512;
  o.threads = 1;
  return o;
}

TEST(CodecCTest, RoundTripIsByteExactAtEveryRate) {
  for (double rate : {0.0, 0.01, 0.03, 1.0}) {
    for (int policy : {DCR_VALUES_AUTO, DCR_VALUES_XOR, DCR_VALUES_ABSOLUTE}) {
      Set base = Model(1), target = Mutate(base, rate, 2);
      dcr_codec_options o = SmallChunks();
      o.value_policy = policy;
      o.threads = 2;
      std::vector<uint8_t> delta = Encode(base, target, o);
      dcr_apply_result r{};
      ASSERT_EQ(Apply(base, delta, o, &r), DCR_OK) << dcr_last_error();
      EXPECT_EQ(base.bytes, target.bytes) << "rate " << rate << " policy " << policy;
      uint64_t h[2];
      auto d = target.Desc();
      ASSERT_EQ(dcr_tensors_hash(d.data(), d.size(), 0, h), DCR_OK);
      EXPECT_EQ(r.target_hash[0], h[0]);
      EXPECT_EQ(r.target_hash[1], h[1]);
      EXPECT_EQ(r.target_version, 1u);
    }
  }
}

TEST(CodecCTest, SameBytesAsBuildDeltaOfTheSafetensorsFiles) {
  Set base = Model(3), target = Mutate(base, 0.03, 4);
  dcr_codec_options o = SmallChunks();
  std::vector<uint8_t> delta = Encode(base, target, o);
  auto image = [](Set& s) {
    std::vector<TensorView> v;
    for (size_t i = 0; i < s.names.size(); ++i) {
      v.push_back(
          TensorView{s.names[i], s.dtypes[i], s.shapes[i], s.bytes[i].data(), s.bytes[i].size()});
    }
    return SafetensorsImage(v);
  };
  auto b = Checkpoint::FromBytes(image(base));
  auto t = Checkpoint::FromBytes(image(target));
  ASSERT_TRUE(b.ok() && t.ok());
  DeltaOptions d;
  d.chunk_elems = o.chunk_elems;
  d.small_tensor_elems = o.small_tensor_elems;
  DeltaMemorySink sink;
  ASSERT_TRUE(BuildDelta(b->get(), **t, d, &sink).ok());
  EXPECT_EQ(sink.bytes(), delta);
}

TEST(CodecCTest, FullFrameAppliesOverAnyBitsAndContextCodingRoundTrips) {
  Set base = Model(5), target = Mutate(base, 0.05, 6);
  dcr_codec_options o = SmallChunks();
  o.full = 1;
  auto t = target.Desc();
  uint8_t* out = nullptr;
  size_t size = 0;
  ASSERT_EQ(dcr_encode_delta(nullptr, 0, t.data(), t.size(), &o, &out, &size), DCR_OK)
      << dcr_last_error();
  std::vector<uint8_t> full(out, out + size);
  dcr_bytes_free(out);
  Set other = Model(99);
  ASSERT_EQ(Apply(other, full, o), DCR_OK) << dcr_last_error();
  EXPECT_EQ(other.bytes, target.bytes);

  o = SmallChunks();
  o.context_coding = 1;
  std::vector<uint8_t> ctx = Encode(base, target, o);
  ASSERT_EQ(Apply(base, ctx, o), DCR_OK) << dcr_last_error();
  EXPECT_EQ(base.bytes, target.bytes);
}

TEST(CodecCTest, RefusalsLeaveTheTensorsUnchanged) {
  Set base = Model(7), target = Mutate(base, 0.03, 8);
  dcr_codec_options o = SmallChunks();
  std::vector<uint8_t> delta = Encode(base, target, o);

  Set wrong = Mutate(base, 0.001, 9);
  const auto before = wrong.bytes;
  EXPECT_EQ(Apply(wrong, delta, o), DCR_FAILED_PRECONDITION);
  EXPECT_NE(std::string(dcr_last_error()).find("base"), std::string::npos) << dcr_last_error();
  EXPECT_EQ(wrong.bytes, before);

  Set copy = base;
  std::vector<uint8_t> cut(delta.begin(), delta.begin() + delta.size() / 2);
  EXPECT_EQ(Apply(copy, cut, o), DCR_DATA_LOSS) << dcr_last_error();
  EXPECT_EQ(copy.bytes, base.bytes);

  Set reshaped = base;
  reshaped.shapes[0] = {257, 300};
  EXPECT_EQ(Apply(reshaped, delta, o), DCR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(dcr_last_error()).find("a.weight"), std::string::npos);
  EXPECT_EQ(reshaped.bytes, base.bytes);

  Set missing = base;
  missing.names.pop_back(), missing.dtypes.pop_back(), missing.shapes.pop_back();
  missing.bytes.pop_back();
  EXPECT_EQ(Apply(missing, delta, o), DCR_INVALID_ARGUMENT);

  auto d = base.Desc();
  d[1].dtype = "F99";
  EXPECT_EQ(dcr_apply_delta(d.data(), d.size(), delta.data(), delta.size(), &o, nullptr),
            DCR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(dcr_last_error()).find("F99"), std::string::npos);
  d = base.Desc();
  d[0].nbytes -= 2;
  EXPECT_EQ(dcr_apply_delta(d.data(), d.size(), delta.data(), delta.size(), &o, nullptr),
            DCR_INVALID_ARGUMENT);
}

// A failure after some chunks were written takes every one of them back: a corrupt last chunk
// (its checksum fails when it is reached) under each kind of chunk, relative, overwrite and
// context-coded; and a base whose bits differ inside a late chunk while the caller vouched for
// the base hash.
TEST(CodecCTest, FailureMidApplyRestoresEveryAppliedChunk) {
  struct Case {
    int policy;
    int context;
  };
  for (Case c :
       {Case{DCR_VALUES_AUTO, 0}, Case{DCR_VALUES_ABSOLUTE, 0}, Case{DCR_VALUES_AUTO, 1}}) {
    Set base = Model(11), target = Mutate(base, 0.05, 12);
    dcr_codec_options o = SmallChunks();
    o.value_policy = c.policy;
    o.context_coding = c.context;
    std::vector<uint8_t> delta = Encode(base, target, o);
    auto reader = DeltaReader::FromBytes(delta);
    ASSERT_TRUE(reader.ok()) << reader.status();
    ASSERT_GT((*reader)->num_chunks(), 3u);
    const size_t last = (*reader)->num_chunks() - 1;
    const size_t at =
        (*reader)->trailer().chunks[last].offset + (*reader)->trailer().chunks[last].size - 1;
    std::vector<uint8_t> bad = delta;
    bad[at] ^= 0x40;
    Set copy = base;
    const int rc = Apply(copy, bad, o);
    EXPECT_TRUE(rc == DCR_DATA_LOSS || rc == DCR_FAILED_PRECONDITION) << rc << dcr_last_error();
    EXPECT_EQ(copy.bytes, base.bytes) << "policy " << c.policy << " context " << c.context;
  }

  Set base = Model(13), target = Mutate(base, 0.05, 14);
  dcr_codec_options o = SmallChunks();
  std::vector<uint8_t> delta = Encode(base, target, o);
  auto bd = base.Desc();
  ASSERT_EQ(dcr_tensors_hash(bd.data(), bd.size(), 1, o.known_base_hash), DCR_OK);
  Set drifted = base;
  std::vector<uint8_t>& last = drifted.bytes[3];  // d.table: in one of the last chunks
  for (size_t i = 0; i < last.size(); ++i) last[i] ^= 0x10;
  const auto before = drifted.bytes;
  EXPECT_EQ(Apply(drifted, delta, o), DCR_FAILED_PRECONDITION) << dcr_last_error();
  EXPECT_EQ(drifted.bytes, before);
}

TEST(CodecCTest, DeltaPartsFeedAReceiverAsATransportWould) {
  Set base = Model(17), target = Mutate(base, 0.03, 18);
  dcr_codec_options o = SmallChunks();
  std::vector<uint8_t> delta = Encode(base, target, o);
  size_t n = 0;
  ASSERT_EQ(dcr_delta_parts(delta.data(), delta.size(), nullptr, 0, &n), DCR_OK);
  std::vector<dcr_delta_part> parts(n);
  ASSERT_EQ(dcr_delta_parts(delta.data(), delta.size(), parts.data(), n, &n), DCR_OK);
  ASSERT_GE(n, 3u);
  std::vector<ReceiverTensor> storage;
  for (size_t i = 0; i < base.names.size(); ++i) {
    TensorInfo info;
    info.name = base.names[i];
    info.dtype_name = base.dtypes[i];
    info.dtype = DTypeFromName(info.dtype_name);
    info.shape = base.shapes[i];
    info.nbytes = base.bytes[i].size();
    storage.push_back(ReceiverTensor{info, base.bytes[i].data()});
  }
  uint64_t h[2];
  auto d = base.Desc();
  ASSERT_EQ(dcr_tensors_hash(d.data(), d.size(), 1, h), DCR_OK);
  BufferReceiver rx(storage, VersionId{0, Hash128{h[0], h[1]}});
  const uint8_t* p = delta.data();
  ASSERT_TRUE(rx.Begin(p + parts[0].offset, parts[0].size).ok());
  for (size_t i = n - 2; i >= 1; --i) {  // any order
    ASSERT_TRUE(rx.ApplyRecord(p + parts[i].offset, parts[i].size).ok());
  }
  ASSERT_TRUE(rx.Commit(p + parts[n - 1].offset, parts[n - 1].size).ok());
  EXPECT_EQ(base.bytes, target.bytes);
  std::vector<uint8_t> cut(delta.begin(), delta.end() - 1);
  EXPECT_EQ(dcr_delta_parts(cut.data(), cut.size(), nullptr, 0, &n), DCR_DATA_LOSS);
}

TEST(CodecCTest, EncodeRefusesMismatchedSetsAndBadDescriptors) {
  Set base = Model(15), target = Model(16);
  target.shapes[1] = {10, 100};
  dcr_codec_options o = SmallChunks();
  auto b = base.Desc(), t = target.Desc();
  uint8_t* out = reinterpret_cast<uint8_t*>(1);
  size_t size = 7;
  EXPECT_EQ(dcr_encode_delta(b.data(), b.size(), t.data(), t.size(), &o, &out, &size),
            DCR_FAILED_PRECONDITION);
  EXPECT_EQ(out, nullptr);
  EXPECT_EQ(size, 0u);
  EXPECT_NE(std::string(dcr_last_error()).find("b.bias"), std::string::npos) << dcr_last_error();
  t = base.Desc();
  t[2].name = t[0].name;
  EXPECT_EQ(dcr_encode_delta(b.data(), b.size(), t.data(), t.size(), &o, &out, &size),
            DCR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(dcr_last_error()).find("twice"), std::string::npos);
  o.chunk_elems = 0;
  EXPECT_EQ(dcr_encode_delta(b.data(), b.size(), b.data(), b.size(), &o, &out, &size),
            DCR_INVALID_ARGUMENT);
}

// An engine's layout of Model(): a.weight transposed into "qkv" with its first 10 rows also in
// "embed" (tied), b.bias reversed, c.scale not placed (a converted tensor), d.table and e.scalar
// verbatim. Built as index arrays, the way a recorder describes placements as data.
struct Engine {
  std::vector<uint8_t> qkv, embed, bias, table, scalar;
  std::vector<std::vector<int64_t>> src, dst;
  std::vector<dcr_placement> placements;

  void Add(uint32_t tensor, std::vector<uint8_t>* buf, int width, std::vector<int64_t> s,
           std::vector<int64_t> d) {
    src.push_back(std::move(s));
    dst.push_back(std::move(d));
    placements.push_back(dcr_placement{tensor, buf->data(), buf->size() / width, src.back().size(),
                                       src.back().data(), dst.back().data()});
  }
  explicit Engine(const Set& m) {
    src.reserve(8), dst.reserve(8);
    qkv.resize(m.bytes[0].size()), embed.resize(10 * 257 * 2);
    bias.resize(m.bytes[1].size()), table.resize(m.bytes[3].size()), scalar.resize(1);
    std::vector<int64_t> s, d, ts, td;
    for (int64_t r = 0; r < 300; ++r) {
      for (int64_t c = 0; c < 257; ++c) {
        s.push_back(r * 257 + c), d.push_back(c * 300 + r);
        if (r < 10) ts.push_back(r * 257 + c), td.push_back(r * 257 + c);
      }
    }
    Add(0, &qkv, 2, s, d);
    Add(0, &embed, 2, ts, td);
    s.clear(), d.clear();
    for (int64_t i = 0; i < 1000; ++i) s.push_back(i), d.push_back(999 - i);
    Add(1, &bias, 4, s, d);
    s.clear();
    for (int64_t i = 0; i < 5 * 7 * 11; ++i) s.push_back(i);
    Add(3, &table, 8, s, s);
    Add(4, &scalar, 1, {0}, {0});
  }
  // The dense load of `m` into this layout.
  std::vector<std::vector<uint8_t>> Dense(const Set& m) const {
    std::vector<std::vector<uint8_t>> out = {qkv, embed, bias, table, scalar};
    const std::vector<const uint8_t*> bases = {qkv.data(), embed.data(), bias.data(), table.data(),
                                               scalar.data()};
    for (size_t p = 0; p < placements.size(); ++p) {
      const dcr_placement& pl = placements[p];
      const int w = pl.tensor == 0 ? 2 : pl.tensor == 1 ? 4 : pl.tensor == 3 ? 8 : 1;
      size_t b = 0;
      while (bases[b] != pl.dst) ++b;
      for (uint64_t i = 0; i < pl.count; ++i) {
        std::memcpy(out[b].data() + pl.dst_index[i] * w, m.bytes[pl.tensor].data() + pl.src[i] * w,
                    w);
      }
    }
    return out;
  }
  std::vector<std::vector<uint8_t>> Now() const { return {qkv, embed, bias, table, scalar}; }
  void Load(const Set& m) {
    auto d = Dense(m);
    qkv = d[0], embed = d[1], bias = d[2], table = d[3], scalar = d[4];
  }
};

dcr_placement_map* MapOf(Set& canonical, Engine& e) {
  auto d = canonical.Desc();
  dcr_placement_map* m = nullptr;
  EXPECT_EQ(
      dcr_placement_map_create(d.data(), d.size(), e.placements.data(), e.placements.size(), &m),
      DCR_OK)
      << dcr_last_error();
  return m;
}

// Placed destinations written by a delta (each changed element times its placements).
uint64_t ExpectedWrites(const Set& base, const Set& target, const Engine& e) {
  uint64_t n = 0;
  for (const dcr_placement& pl : e.placements) {
    const int w = pl.tensor == 0 ? 2 : pl.tensor == 1 ? 4 : pl.tensor == 3 ? 8 : 1;
    for (uint64_t i = 0; i < pl.count; ++i) {
      n += std::memcmp(base.bytes[pl.tensor].data() + pl.src[i] * w,
                       target.bytes[pl.tensor].data() + pl.src[i] * w, w) != 0;
    }
  }
  return n;
}

TEST(CodecCTest, PlacedApplyWritesOnlyChangedElementsByteExact) {
  struct Case {
    double rate;
    int policy;
    int context;
  };
  for (Case c : {Case{0.0, DCR_VALUES_AUTO, 0}, Case{0.01, DCR_VALUES_AUTO, 0},
                 Case{0.03, DCR_VALUES_XOR, 0}, Case{0.03, DCR_VALUES_ABSOLUTE, 0},
                 Case{0.05, DCR_VALUES_AUTO, 1}, Case{1.0, DCR_VALUES_AUTO, 0}}) {
    SCOPED_TRACE("rate " + std::to_string(c.rate) + " policy " + std::to_string(c.policy) +
                 " context " + std::to_string(c.context));
    Set base = Model(21), target = Mutate(base, c.rate, 22);
    target.bytes[2] = base.bytes[2];  // c.scale unchanged: its flag stays 0
    Engine e(base);
    e.Load(base);
    dcr_codec_options o = SmallChunks();
    o.value_policy = c.policy;
    o.context_coding = c.context;
    o.threads = 2;
    std::vector<uint8_t> delta = Encode(base, target, o);
    const uint64_t expected = ExpectedWrites(base, target, e);
    dcr_placement_map* m = MapOf(base, e);
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(dcr_placement_map_elements(m), 300u * 257 + 10 * 257 + 1000 + 385 + 1);
    auto d = base.Desc();
    uint8_t changed[5] = {9, 9, 9, 9, 9};
    uint64_t written[5] = {9, 9, 9, 9, 9};
    dcr_apply_result r{};
    ASSERT_EQ(dcr_apply_delta_placed(d.data(), d.size(), delta.data(), delta.size(), m, &o, &r,
                                     changed, written),
              DCR_OK)
        << dcr_last_error();
    EXPECT_EQ(base.bytes, target.bytes);
    EXPECT_EQ(e.Now(), e.Dense(target));
    EXPECT_EQ(written[0] + written[1] + written[3] + written[4], expected);
    EXPECT_EQ(written[2], 0u);
    EXPECT_EQ(changed[2], 0);
    for (int t : {0, 1, 3}) EXPECT_EQ(changed[t], c.rate > 0 ? 1 : 0) << t;
    dcr_placement_map_free(m);
  }
}

TEST(CodecCTest, PlacedApplyRefusalsLeaveTensorsAndPlacementsUnchanged) {
  Set base = Model(23), target = Mutate(base, 0.05, 24);
  Engine e(base);
  e.Load(base);
  dcr_codec_options o = SmallChunks();
  std::vector<uint8_t> delta = Encode(base, target, o);
  dcr_placement_map* m = MapOf(base, e);
  ASSERT_NE(m, nullptr);
  const auto canonical = base.bytes;
  const auto placed = e.Now();
  std::vector<uint8_t> bad = delta;
  bad[bad.size() - 200] ^= 0x40;  // inside the last chunk record or the trailer
  auto d = base.Desc();
  const int rc = dcr_apply_delta_placed(d.data(), d.size(), bad.data(), bad.size(), m, &o, nullptr,
                                        nullptr, nullptr);
  EXPECT_TRUE(rc == DCR_DATA_LOSS || rc == DCR_FAILED_PRECONDITION) << rc << dcr_last_error();
  EXPECT_EQ(base.bytes, canonical);
  EXPECT_EQ(e.Now(), placed);

  // Another tensor set than the map's.
  Set other = base;
  other.names[1] = "b.other";
  auto od = other.Desc();
  EXPECT_EQ(dcr_apply_delta_placed(od.data(), od.size(), delta.data(), delta.size(), m, &o, nullptr,
                                   nullptr, nullptr),
            DCR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(dcr_last_error()).find("b.other"), std::string::npos) << dcr_last_error();
  EXPECT_EQ(e.Now(), placed);

  // Repair: scribbled destinations are rewritten from the canonical tensors.
  std::fill(e.qkv.begin(), e.qkv.end(), 0xAB);
  std::fill(e.bias.begin(), e.bias.end(), 0xCD);
  const uint8_t which[5] = {1, 1, 0, 0, 0};
  uint64_t written[5] = {9, 9, 9, 9, 9};
  ASSERT_EQ(dcr_placement_map_write(m, d.data(), d.size(), which, 2, written), DCR_OK)
      << dcr_last_error();
  EXPECT_EQ(written[0], 300u * 257 + 10 * 257);
  EXPECT_EQ(written[1], 1000u);
  EXPECT_EQ(written[3], 0u);
  EXPECT_EQ(e.Now(), placed);
  dcr_placement_map_free(m);
}

TEST(CodecCTest, PlacementMapRefusesBadPlacements) {
  Set base = Model(25);
  auto d = base.Desc();
  std::vector<uint8_t> buf(16);
  std::vector<int64_t> src = {0, 1}, dst = {0, 0}, far = {0, 8};
  dcr_placement_map* m = nullptr;
  dcr_placement twice{1, buf.data(), 4, 2, src.data(), dst.data()};
  EXPECT_EQ(dcr_placement_map_create(d.data(), d.size(), &twice, 1, &m), DCR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(dcr_last_error()).find("share destination"), std::string::npos)
      << dcr_last_error();
  EXPECT_EQ(m, nullptr);
  dcr_placement outside{1, buf.data(), 4, 2, src.data(), far.data()};
  EXPECT_EQ(dcr_placement_map_create(d.data(), d.size(), &outside, 1, &m), DCR_INVALID_ARGUMENT);
  std::vector<int64_t> big = {1000};
  dcr_placement past{1, buf.data(), 4, 1, big.data(), dst.data()};
  EXPECT_EQ(dcr_placement_map_create(d.data(), d.size(), &past, 1, &m), DCR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(dcr_last_error()).find("b.bias"), std::string::npos) << dcr_last_error();
  dcr_placement index{7, buf.data(), 4, 1, src.data(), dst.data()};
  EXPECT_EQ(dcr_placement_map_create(d.data(), d.size(), &index, 1, &m), DCR_INVALID_ARGUMENT);
}

}  // namespace
}  // namespace dcr
