// The in-memory C API on device tensors (dcr/codec_c.h *_device functions), per backend of this
// suite (DCR_TEST_DEVICE_KIND: the host backend, label quick; CUDA, label gpu, skipped without a
// device): tensors in the backend's memory are encoded, hashed and applied through the C entry
// points, and compared byte for byte with the host functions over the same bytes and with a dense
// load of the target; every refused or failed apply leaves the device bytes as they were.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "dcr/codec_c.h"
#include "dcr/delta.h"
#include "dcr/device.h"
#include "dcr/testing/device_fixtures.h"
#include "internal/element_ops.h"

namespace dcr {
namespace {

constexpr DeviceKind kKind = testing::kTestDeviceKind;

// A tensor set owning its host bytes.
struct Set {
  std::vector<std::string> names, dtypes;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<std::vector<uint8_t>> bytes;

  std::vector<dcr_tensor> Desc() {
    std::vector<dcr_tensor> d;
    for (size_t i = 0; i < names.size(); ++i) {
      d.push_back(dcr_tensor{names[i].c_str(), dtypes[i].c_str(), shapes[i].data(),
                             shapes[i].size(), bytes[i].data(), bytes[i].size()});
    }
    return d;
  }
};

struct DType {
  const char* name;
  int width;
  bool floating;
};
constexpr DType kDTypes[] = {{"BF16", 2, true}, {"F16", 2, true},     {"F32", 4, true},
                             {"F64", 8, true},  {"F8_E4M3", 1, true}, {"I8", 1, false},
                             {"U8", 1, false},  {"I32", 4, false}};

// Special bit patterns of the IEEE float of `w` bytes (F8_E4M3, F16, F32, F64; BF16 tensors get
// F16's patterns, special or not there): +-0, +-inf (all-ones exponent), a NaN with a payload,
// the smallest subnormal, the largest finite value, all ones.
std::vector<uint64_t> Specials(int w) {
  const uint64_t sign = internal::SignBit(w), mask = internal::WidthMask(w);
  const int exp_bits = w == 1 ? 4 : w == 2 ? 5 : w == 4 ? 8 : 11;
  const int man_bits = w * 8 - 1 - exp_bits;
  const uint64_t inf = ((uint64_t{1} << exp_bits) - 1) << man_bits;
  return {0,
          sign,
          inf,
          inf | sign,
          inf | (uint64_t{1} << (man_bits - 1)) | 5,
          1,
          (mask >> 1) & ~(uint64_t{1} << man_bits),
          mask};
}

// A random layout: 1..7 tensors of random dtypes and shapes (scalars, empty and multi-chunk
// tensors among them), random bytes with special float values planted.
Set RandomLayout(uint64_t seed) {
  std::mt19937_64 rng(seed);
  Set s;
  const int n = 1 + static_cast<int>(rng() % 7);
  for (int i = 0; i < n; ++i) {
    const DType& dt = kDTypes[rng() % (sizeof(kDTypes) / sizeof(kDTypes[0]))];
    std::vector<int64_t> shape;
    const int ndim = static_cast<int>(rng() % 4);
    for (int d = 0; d < ndim; ++d) shape.push_back(static_cast<int64_t>(rng() % 60));
    if (rng() % 4 == 0) shape = {static_cast<int64_t>(5000 + rng() % 20000)};
    uint64_t elems = 1;
    for (int64_t x : shape) elems *= static_cast<uint64_t>(x);
    std::vector<uint8_t> b(elems * dt.width);
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    if (dt.floating && elems > 0) {
      for (uint64_t v : Specials(dt.width)) {
        for (int k = 0; k < 3; ++k) internal::StoreElem(b.data(), dt.width, rng() % elems, v);
      }
    }
    std::string name = std::to_string(i);
    name.append(".").append(dt.name);
    s.names.push_back(std::move(name));
    s.dtypes.push_back(dt.name);
    s.shapes.push_back(shape);
    s.bytes.push_back(std::move(b));
  }
  return s;
}

// `base` with about `rate` of its elements given other bits (special values among them).
Set Mutate(const Set& base, double rate, uint64_t seed) {
  Set t = base;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  for (size_t i = 0; i < t.bytes.size(); ++i) {
    int w = 1;
    for (const DType& d : kDTypes) {
      if (t.dtypes[i] == d.name) w = d.width;
    }
    const std::vector<uint64_t> specials = Specials(w);
    const uint64_t elems = t.bytes[i].size() / w;
    for (uint64_t e = 0; e < elems; ++e) {
      if (u(rng) >= rate) continue;
      const uint64_t old = internal::LoadElem(t.bytes[i].data(), w, e);
      uint64_t v = rng() % 8 == 0 ? specials[rng() % specials.size()] : rng();
      v &= internal::WidthMask(w);
      if (v == old) v = (old + 1) & internal::WidthMask(w);
      internal::StoreElem(t.bytes[i].data(), w, e, v);
    }
  }
  return t;
}

// A tensor set in the memory of the backend under test: for the host backend the bytes stay in
// host vectors (what a caller's CPU tensors are; the C API adopts them), for CUDA they are copied
// into device allocations (what torch's CUDA tensors are).
class OnDevice {
 public:
  OnDevice(std::shared_ptr<Device> device, const Set& s) : device_(std::move(device)), set_(s) {
    if (kKind == DeviceKind::kHost) return;
    for (auto& b : set_.bytes) {
      auto p = device_->Allocate(b.size());
      EXPECT_TRUE(p.ok()) << p.status();
      EXPECT_TRUE(device_->Upload(*p, b.data(), b.size()).ok());
      ptrs_.push_back(*p);
    }
  }
  ~OnDevice() {
    for (void* p : ptrs_) device_->Free(p);
  }
  std::vector<dcr_tensor> Desc() {
    std::vector<dcr_tensor> d = set_.Desc();
    for (size_t i = 0; i < ptrs_.size(); ++i) d[i].data = ptrs_[i];
    return d;
  }
  // The current bytes, read back from the device.
  std::vector<std::vector<uint8_t>> Bytes() {
    if (kKind == DeviceKind::kHost) return set_.bytes;
    std::vector<std::vector<uint8_t>> out;
    for (size_t i = 0; i < ptrs_.size(); ++i) {
      out.emplace_back(set_.bytes[i].size());
      EXPECT_TRUE(device_->Download(out.back().data(), ptrs_[i], out.back().size()).ok());
    }
    return out;
  }

 private:
  std::shared_ptr<Device> device_;
  Set set_;
  std::vector<void*> ptrs_;
};

dcr_device TestDevice() {
  return dcr_device{kKind == DeviceKind::kHost ? DCR_DEVICE_HOST : DCR_DEVICE_CUDA, 0};
}

dcr_codec_options SmallChunks(int policy = DCR_VALUES_AUTO) {
  dcr_codec_options o;
  dcr_codec_options_init(&o);
  o.chunk_elems = 4096;
  o.small_tensor_elems = 512;
  o.value_policy = policy;
  o.threads = 2;
  return o;
}

std::vector<uint8_t> EncodeHost(Set& base, Set& target, const dcr_codec_options& o) {
  auto b = base.Desc(), t = target.Desc();
  uint8_t* out = nullptr;
  size_t size = 0;
  EXPECT_EQ(dcr_encode_delta(b.data(), b.size(), t.data(), t.size(), &o, &out, &size), DCR_OK)
      << dcr_last_error();
  std::vector<uint8_t> v(out, out + size);
  dcr_bytes_free(out);
  return v;
}

int ApplyDevice(OnDevice& s, const std::vector<uint8_t>& delta, const dcr_codec_options& o,
                dcr_apply_result* r = nullptr) {
  const dcr_device dev = TestDevice();
  auto d = s.Desc();
  return dcr_apply_delta_device(&dev, d.data(), d.size(), delta.data(), delta.size(), &o, r);
}

// Random layouts, dtypes and special values at 0..100% change under each value policy: the
// device encode gives the host encode's bytes, the device hash the host hash, and the device
// apply a dense load of the target.
TEST(CodecCDeviceTest, ByteExactWithADenseLoadOverRandomLayouts) {
  DCR_OPEN_TEST_DEVICE_OR_SKIP(device);
  const dcr_device dev = TestDevice();
  int round = 0;
  for (double rate : {0.0, 0.01, 0.3, 1.0}) {
    for (int policy : {DCR_VALUES_AUTO, DCR_VALUES_XOR, DCR_VALUES_ABSOLUTE}) {
      ++round;
      SCOPED_TRACE("rate " + std::to_string(rate) + " policy " + std::to_string(policy));
      Set base = RandomLayout(100 + round), target = Mutate(base, rate, 200 + round);
      const dcr_codec_options o = SmallChunks(policy);
      const std::vector<uint8_t> want = EncodeHost(base, target, o);

      OnDevice db(device, base), dt(device, target);
      auto bd = db.Desc(), td = dt.Desc();
      uint8_t* out = nullptr;
      size_t size = 0;
      ASSERT_EQ(dcr_encode_delta_device(&dev, bd.data(), bd.size(), td.data(), td.size(), &o, &out,
                                        &size),
                DCR_OK)
          << dcr_last_error();
      const std::vector<uint8_t> delta(out, out + size);
      dcr_bytes_free(out);
      EXPECT_EQ(delta, want);

      uint64_t host_hash[2], dev_hash[2];
      auto hd = base.Desc();
      ASSERT_EQ(dcr_tensors_hash(hd.data(), hd.size(), 0, host_hash), DCR_OK);
      ASSERT_EQ(dcr_tensors_hash_device(&dev, bd.data(), bd.size(), 2, dev_hash), DCR_OK)
          << dcr_last_error();
      EXPECT_EQ(dev_hash[0], host_hash[0]);
      EXPECT_EQ(dev_hash[1], host_hash[1]);

      dcr_apply_result r{};
      ASSERT_EQ(ApplyDevice(db, delta, o, &r), DCR_OK) << dcr_last_error();
      EXPECT_EQ(db.Bytes(), target.bytes);
      auto tdh = target.Desc();
      ASSERT_EQ(dcr_tensors_hash(tdh.data(), tdh.size(), 0, host_hash), DCR_OK);
      EXPECT_EQ(r.target_hash[0], host_hash[0]);
      EXPECT_EQ(r.target_hash[1], host_hash[1]);

      // The next version with the hash the apply returned, as a caller chains updates.
      Set next = Mutate(target, 0.02, 300 + round);
      dcr_codec_options o2 = o;
      o2.base_version = 1;
      o2.target_version = 2;
      const std::vector<uint8_t> delta2 = EncodeHost(target, next, o2);
      o2.known_base_hash[0] = r.target_hash[0];
      o2.known_base_hash[1] = r.target_hash[1];
      ASSERT_EQ(ApplyDevice(db, delta2, o2), DCR_OK) << dcr_last_error();
      EXPECT_EQ(db.Bytes(), next.bytes);
    }
  }
}

TEST(CodecCDeviceTest, FullFrameAppliesOverAnyBits) {
  DCR_OPEN_TEST_DEVICE_OR_SKIP(device);
  const dcr_device dev = TestDevice();
  Set base = RandomLayout(7), target = Mutate(base, 0.1, 8);
  dcr_codec_options o = SmallChunks();
  o.full = 1;
  OnDevice dt(device, target);
  auto td = dt.Desc();
  uint8_t* out = nullptr;
  size_t size = 0;
  ASSERT_EQ(dcr_encode_delta_device(&dev, nullptr, 0, td.data(), td.size(), &o, &out, &size),
            DCR_OK)
      << dcr_last_error();
  const std::vector<uint8_t> full(out, out + size);
  dcr_bytes_free(out);
  OnDevice other(device, Mutate(base, 0.5, 9));
  ASSERT_EQ(ApplyDevice(other, full, o), DCR_OK) << dcr_last_error();
  EXPECT_EQ(other.Bytes(), target.bytes);
}

// A failure after chunks were written takes every one back on the device: a corrupt last chunk
// (relative and overwrite chunks), a base that differs inside a late chunk while the caller
// vouched for its hash, a context-coded delta (which the device path refuses) and a delta of
// another base.
TEST(CodecCDeviceTest, FailuresLeaveTheDeviceBytesUnchanged) {
  DCR_OPEN_TEST_DEVICE_OR_SKIP(device);
  Set base;
  {
    std::mt19937_64 rng(11);
    for (auto [name, dtype, elems, w] :
         {std::tuple<const char*, const char*, int64_t, int>{"a", "BF16", 40000, 2},
          {"b", "F32", 9000, 4},
          {"c", "F64", 6000, 8}}) {
      std::vector<uint8_t> b(elems * w);
      for (auto& x : b) x = static_cast<uint8_t>(rng());
      base.names.push_back(name);
      base.dtypes.push_back(dtype);
      base.shapes.push_back({elems});
      base.bytes.push_back(std::move(b));
    }
  }
  Set target = Mutate(base, 0.05, 12);
  for (int policy : {DCR_VALUES_AUTO, DCR_VALUES_ABSOLUTE}) {
    dcr_codec_options o = SmallChunks(policy);
    o.threads = 1;
    const std::vector<uint8_t> delta = EncodeHost(base, target, o);
    auto reader = DeltaReader::FromBytes(delta);
    ASSERT_TRUE(reader.ok()) << reader.status();
    ASSERT_GT((*reader)->num_chunks(), 3u);
    const auto& last = (*reader)->trailer().chunks.back();
    std::vector<uint8_t> bad = delta;
    bad[last.offset + last.size - 1] ^= 0x40;
    OnDevice d(device, base);
    const int rc = ApplyDevice(d, bad, o);
    EXPECT_TRUE(rc == DCR_DATA_LOSS || rc == DCR_FAILED_PRECONDITION) << rc << dcr_last_error();
    EXPECT_NE(std::string(dcr_last_error()).find(DeviceKindName(kKind)), std::string::npos)
        << dcr_last_error();
    EXPECT_EQ(d.Bytes(), base.bytes) << "policy " << policy;
  }

  dcr_codec_options o = SmallChunks();
  o.threads = 1;
  const std::vector<uint8_t> delta = EncodeHost(base, target, o);
  auto bd = base.Desc();
  ASSERT_EQ(dcr_tensors_hash(bd.data(), bd.size(), 1, o.known_base_hash), DCR_OK);
  Set drifted = base;
  for (auto& x : drifted.bytes[2]) x ^= 0x10;  // c: the last chunks
  OnDevice dd(device, drifted);
  EXPECT_EQ(ApplyDevice(dd, delta, o), DCR_FAILED_PRECONDITION) << dcr_last_error();
  EXPECT_EQ(dd.Bytes(), drifted.bytes);

  OnDevice wrong(device, Mutate(base, 0.001, 13));
  const auto before = wrong.Bytes();
  o = SmallChunks();
  EXPECT_EQ(ApplyDevice(wrong, delta, o), DCR_FAILED_PRECONDITION) << dcr_last_error();
  EXPECT_EQ(wrong.Bytes(), before);

  dcr_codec_options ctx = SmallChunks();
  ctx.context_coding = 1;
  const std::vector<uint8_t> ctx_delta = EncodeHost(base, target, ctx);
  OnDevice dc(device, base);
  EXPECT_NE(ApplyDevice(dc, ctx_delta, ctx), DCR_OK);
  EXPECT_EQ(dc.Bytes(), base.bytes);
}

// Destination buffers of a placement map in the memory of the backend under test: buffer k holds
// the elements of canonical tensor k at a random permutation of the front half of twice its
// size (the rest keeps its filler bytes), and one more buffer replicates tensor 0 (a tied copy).
struct PlacedEngine {
  std::vector<uint32_t> tensor;  // buffer -> canonical tensor
  std::vector<int> width;
  std::vector<std::vector<int64_t>> src, dst;  // per buffer
  std::vector<std::vector<uint8_t>> filler;    // per buffer: its bytes before any load

  PlacedEngine(const Set& s, uint64_t seed) {
    std::mt19937_64 rng(seed);
    for (uint32_t t = 0; t <= s.names.size(); ++t) {
      const uint32_t ti = t == s.names.size() ? 0 : t;
      int w = 1;
      for (const DType& d : kDTypes) {
        if (s.dtypes[ti] == d.name) w = d.width;
      }
      const int64_t elems = static_cast<int64_t>(s.bytes[ti].size() / w);
      std::vector<int64_t> perm(2 * elems);
      for (int64_t i = 0; i < 2 * elems; ++i) perm[i] = i;
      std::shuffle(perm.begin(), perm.end(), rng);
      std::vector<int64_t> src_i(elems);
      for (int64_t i = 0; i < elems; ++i) src_i[i] = i;
      perm.resize(elems);
      std::vector<uint8_t> fill(2 * elems * w);
      for (auto& x : fill) x = static_cast<uint8_t>(rng());
      tensor.push_back(ti);
      width.push_back(w);
      src.push_back(std::move(src_i));
      dst.push_back(std::move(perm));
      filler.push_back(std::move(fill));
    }
  }
  // The bytes of every buffer once `s` is placed.
  std::vector<std::vector<uint8_t>> Expected(const Set& s) const {
    std::vector<std::vector<uint8_t>> out = filler;
    for (size_t b = 0; b < out.size(); ++b) {
      const int w = width[b];
      for (size_t i = 0; i < src[b].size(); ++i) {
        std::memcpy(out[b].data() + dst[b][i] * w, s.bytes[tensor[b]].data() + src[b][i] * w, w);
      }
    }
    return out;
  }
  std::vector<dcr_placement> Placements(std::vector<dcr_tensor>& bufs) const {
    std::vector<dcr_placement> p;
    for (size_t b = 0; b < src.size(); ++b) {
      p.push_back(dcr_placement{tensor[b], const_cast<void*>(bufs[b].data),
                                filler[b].size() / width[b], src[b].size(), src[b].data(),
                                dst[b].data()});
    }
    return p;
  }
  // The buffers as a tensor set (U8 of their bytes), to put them on the device.
  Set AsSet(const std::vector<std::vector<uint8_t>>& bytes) const {
    Set s;
    for (size_t b = 0; b < bytes.size(); ++b) {
      s.names.push_back("buf" + std::to_string(b));
      s.dtypes.push_back("U8");
      s.shapes.push_back({static_cast<int64_t>(bytes[b].size())});
      s.bytes.push_back(bytes[b]);
    }
    return s;
  }
};

// A placement map whose destinations are on the device: the canonical set (host) moves all or
// nothing, the device destinations receive exactly a dense placement of the target, a refused
// delta writes nothing there, and the repair rewrites scribbled destinations.
TEST(CodecCDeviceTest, PlacedApplyScattersToDeviceDestinationsByteExact) {
  DCR_OPEN_TEST_DEVICE_OR_SKIP(device);
  const dcr_device dev = TestDevice();
  int round = 0;
  for (double rate : {0.0, 0.02, 0.5, 1.0}) {
    for (int policy : {DCR_VALUES_AUTO, DCR_VALUES_ABSOLUTE}) {
      ++round;
      SCOPED_TRACE("rate " + std::to_string(rate) + " policy " + std::to_string(policy));
      Set base = RandomLayout(400 + round), target = Mutate(base, rate, 500 + round);
      PlacedEngine eng(base, 600 + round);
      OnDevice bufs(device, eng.AsSet(eng.Expected(base)));
      auto bd = bufs.Desc();
      auto canon = base.Desc();
      std::vector<dcr_placement> pl = eng.Placements(bd);
      dcr_placement_map* m = nullptr;
      ASSERT_EQ(dcr_placement_map_create_device(&dev, canon.data(), canon.size(), pl.data(),
                                                pl.size(), &m),
                DCR_OK)
          << dcr_last_error();
      const dcr_codec_options o = SmallChunks(policy);
      const std::vector<uint8_t> delta = EncodeHost(base, target, o);

      std::vector<uint8_t> bad = delta;
      bad[bad.size() - 100] ^= 0x40;  // the last chunk record or the trailer
      Set copy = base;
      auto cd = copy.Desc();
      EXPECT_NE(dcr_apply_delta_placed(cd.data(), cd.size(), bad.data(), bad.size(), m, &o, nullptr,
                                       nullptr, nullptr),
                DCR_OK);
      EXPECT_EQ(copy.bytes, base.bytes);
      EXPECT_EQ(bufs.Bytes(), eng.Expected(base));

      std::vector<uint8_t> changed(canon.size(), 9);
      std::vector<uint64_t> written(canon.size(), 9);
      ASSERT_EQ(dcr_apply_delta_placed(cd.data(), cd.size(), delta.data(), delta.size(), m, &o,
                                       nullptr, changed.data(), written.data()),
                DCR_OK)
          << dcr_last_error();
      EXPECT_EQ(copy.bytes, target.bytes);
      EXPECT_EQ(bufs.Bytes(), eng.Expected(target));
      for (size_t t = 0; t < canon.size(); ++t) {
        EXPECT_EQ(changed[t] != 0, base.bytes[t] != target.bytes[t]) << t;
      }

      // Repair after scribbling over the device destinations.
      for (size_t b = 0; b < bd.size(); ++b) {
        if (kKind == DeviceKind::kHost) {
          std::memset(const_cast<void*>(bd[b].data), 0xAB, bd[b].nbytes);
        } else {
          std::vector<uint8_t> x(bd[b].nbytes, 0xAB);
          ASSERT_TRUE(device->Upload(const_cast<void*>(bd[b].data), x.data(), x.size()).ok());
        }
      }
      ASSERT_EQ(dcr_placement_map_write(m, cd.data(), cd.size(), nullptr, 2, written.data()),
                DCR_OK)
          << dcr_last_error();
      const auto now = bufs.Bytes();
      const auto want = eng.Expected(target);
      for (size_t b = 0; b < now.size(); ++b) {
        const int w = eng.width[b];
        for (size_t i = 0; i < eng.src[b].size(); ++i) {
          ASSERT_EQ(
              std::memcmp(now[b].data() + eng.dst[b][i] * w, want[b].data() + eng.dst[b][i] * w, w),
              0)
              << "buffer " << b << " element " << eng.dst[b][i];
        }
      }
      dcr_placement_map_free(m);
    }
  }
}

TEST(CodecCDeviceTest, RefusesUnknownDevicesAndUnavailableCuda) {
  Set base = RandomLayout(21);
  auto d = base.Desc();
  uint64_t h[2];
  dcr_device bad{7, 0};
  EXPECT_EQ(dcr_tensors_hash_device(&bad, d.data(), d.size(), 0, h), DCR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(dcr_last_error()).find("unknown device kind 7"), std::string::npos)
      << dcr_last_error();
  dcr_device host1{DCR_DEVICE_HOST, 1};
  EXPECT_EQ(dcr_tensors_hash_device(&host1, d.data(), d.size(), 0, h), DCR_INVALID_ARGUMENT);
  dcr_device neg{DCR_DEVICE_CUDA, -1};
  EXPECT_EQ(dcr_tensors_hash_device(&neg, d.data(), d.size(), 0, h), DCR_INVALID_ARGUMENT);
  // NULL and DCR_DEVICE_CPU are the host functions.
  uint64_t want[2], got[2];
  ASSERT_EQ(dcr_tensors_hash(d.data(), d.size(), 0, want), DCR_OK);
  dcr_device cpu{DCR_DEVICE_CPU, 0};
  ASSERT_EQ(dcr_tensors_hash_device(&cpu, d.data(), d.size(), 0, got), DCR_OK);
  EXPECT_EQ(got[0], want[0]);
  ASSERT_EQ(dcr_tensors_hash_device(nullptr, d.data(), d.size(), 0, got), DCR_OK);
  EXPECT_EQ(got[1], want[1]);
  // Without a usable CUDA device the CUDA kind is refused with the reason, code kUnavailable.
  if (!ProbeDevice(DeviceKind::kCuda).ok()) {
    dcr_device cuda{DCR_DEVICE_CUDA, 0};
    EXPECT_EQ(dcr_tensors_hash_device(&cuda, d.data(), d.size(), 0, h),
              static_cast<int>(StatusCode::kUnavailable));
    EXPECT_NE(std::string(dcr_last_error()).find("CUDA"), std::string::npos) << dcr_last_error();
  }
}

}  // namespace
}  // namespace dcr
