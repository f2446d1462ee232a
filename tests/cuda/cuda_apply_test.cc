// CPU/CUDA parity of the receiver side: every device result is compared byte for byte with the host
// path (zero tolerance). Skips without a GPU; the build is checked by CI everywhere.
#include "dcr/cuda_apply.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "dcr/copy_interposers.h"  // this binary records loads
#include "dcr/delta.h"
#include "dcr/hash.h"
#include "dcr/runtime.h"
#include "dcr/testing/reference_loader.h"
#include "dcr/testing/synth_pair.h"
#include "dcr/testing/test_model.h"
#include "internal/element_ops.h"

namespace dcr {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!cuda::DeviceAvailable()) GTEST_SKIP() << cuda::DeviceDescription()

struct DeviceCopy {
  void* p = nullptr;
  size_t n = 0;
  explicit DeviceCopy(const void* host, size_t bytes) : n(bytes) {
    EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(bytes, 1)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceCopy() { cudaFree(p); }
  std::vector<uint8_t> Download() const {
    std::vector<uint8_t> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n, cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

TEST(CudaTest, NoDeviceGivesAStatusNotAnAbort) {
  if (cuda::DeviceAvailable()) GTEST_SKIP() << "a device is present: " << cuda::DeviceDescription();
  auto a = cuda::MakeDeviceApplier({}, nullptr);
  ASSERT_FALSE(a.ok());
  EXPECT_TRUE(a.status().IsUnavailable()) << a.status();
  auto h = cuda::DeviceRangeHash(1, nullptr, 2, 0, 10, nullptr);
  EXPECT_FALSE(h.ok());
}

// Random tensors of every width with special values; deltas in every value mode; chunks in random
// order on the device, compared byte for byte with the target storage image.
TEST(CudaTest, DeviceApplierMatchesHostForEveryWidthAndMode) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(5);
  const char* dtypes[] = {"U8", "BF16", "F32", "F64"};
  Storage host_base(0);
  for (int i = 0; i < 4; ++i) {
    // Appended, not "t" + to_string(i): that form trips a g++ 12 -Wrestrict false positive.
    std::string name = "t";
    name += std::to_string(i);
    auto p = host_base.Allocate(name, dtypes[i], {257, 131});
    ASSERT_TRUE(p.ok());
    for (uint64_t b = 0; b < host_base.buffers()[i].nbytes; ++b) (*p)[b] = rng();
  }
  auto base = StorageImage(host_base);
  ASSERT_TRUE(base.ok());
  for (ValuePolicy pol : {ValuePolicy::kXor, ValuePolicy::kUlpDelta, ValuePolicy::kAbsolute}) {
    Storage tgt(0);
    for (const auto& b : host_base.buffers()) {
      auto p = tgt.Allocate(b.name, b.dtype_name, b.shape);
      std::memcpy(*p, b.data, b.nbytes);
      for (uint64_t e = 0; e < b.nbytes; e += 1 + rng() % 40) (*p)[e] ^= 1 + rng() % 255;
      if (b.dtype == DType::kBF16) {  // NaN payload, -0, Inf, subnormal
        const uint16_t sp[] = {0x7FC1, 0x8000, 0x7F80, 0x0001};
        for (int k = 0; k < 4; ++k) std::memcpy(*p + 2 * (rng() % (b.nbytes / 2)), &sp[k], 2);
      }
    }
    auto target = StorageImage(tgt);
    DeltaOptions o;
    o.chunk_elems = 4096;
    o.value_policy = pol;
    o.threads = 1;
    DeltaMemorySink sink;
    ASSERT_TRUE(BuildDelta(base->get(), **target, o, &sink).ok());
    auto reader = DeltaReader::FromBytes(sink.Release());
    ASSERT_TRUE(reader.ok());
    // Device: tensors in inventory (sorted-name) order.
    std::vector<std::unique_ptr<DeviceCopy>> dev;
    std::vector<cuda::DeviceTensor> dt;
    for (const TensorInfo& t : (*reader)->inventory().tensors) {
      const Storage::Buffer* b = host_base.Find(t.name);
      dev.push_back(std::make_unique<DeviceCopy>(b->data, b->nbytes));
      dt.push_back(
          cuda::DeviceTensor{dev.back()->p, t.num_elements(), t.width(), TensorSalt(t.name)});
    }
    auto app = cuda::MakeDeviceApplier(dt, nullptr);
    ASSERT_TRUE(app.ok()) << app.status();
    std::vector<size_t> order((*reader)->num_chunks());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t i : order) {
      auto c = (*reader)->Decode(i);
      ASSERT_TRUE(c.ok());
      Status s = (*app)->ApplyChunk(*c);
      ASSERT_TRUE(s.ok()) << s;
      if (IsRelative(c->header.value_mode) && c->header.num_changes > 0) {
        EXPECT_TRUE((*app)->ApplyChunk(*c).IsFailedPrecondition());  // twice: refused, no write
      }
    }
    Hash128 h = base->get()->ContentHash();
    HashAdd(&h, (*app)->hash_delta());
    EXPECT_EQ(h, (*target)->ContentHash());
    size_t i = 0;
    for (const TensorInfo& t : (*reader)->inventory().tensors) {
      const Storage::Buffer* want = tgt.Find(t.name);
      EXPECT_EQ(0, std::memcmp(dev[i++]->Download().data(), want->data, want->nbytes)) << t.name;
    }
  }
}

// The reference runtime recorded on the host, its storage mirrored on the device and refitted there
// through the placement map; BF16 norms (no converted tensors).
TEST(CudaTest, PlacementApplierRefitsAServingRankOnTheDevice) {
  SKIP_WITHOUT_GPU();
  const ServingConfig cfg = testing::SmallMoeServingConfig();
  auto [v0, v1] = testing::SyntheticCheckpointPair(cfg.model, 3, 0.05, 4, true);
  Storage st(0);
  std::unique_ptr<ModelLoader> loader;
  auto map = RecordLoad(*v0, ReferenceLoaderFactory(cfg), 0, &loader, &st);
  ASSERT_TRUE(map.ok()) << map.status();
  std::vector<std::unique_ptr<DeviceCopy>> dev;
  std::vector<void*> ptrs;
  for (const auto& b : st.buffers()) {
    dev.push_back(std::make_unique<DeviceCopy>(b.data, b.nbytes));
    ptrs.push_back(dev.back()->p);
  }
  auto app = cuda::MakePlacementApplier(*map, ptrs, nullptr);
  ASSERT_TRUE(app.ok()) << app.status();
  DeltaOptions o;
  o.chunk_elems = 4096;
  DeltaMemorySink sink;
  ASSERT_TRUE(BuildDelta(v0.get(), *v1, o, &sink).ok());
  auto reader = DeltaReader::FromBytes(sink.Release());
  for (size_t i = 0; i < (*reader)->num_chunks(); ++i) {
    auto c = (*reader)->Decode(i);
    Status s = (*app)->ApplyChunk(*c);
    ASSERT_TRUE(s.ok()) << s;
  }
  Storage dense(0);
  auto l2 = MakeReferenceLoader(cfg, 0);
  ASSERT_TRUE(LoadCheckpoint(*v1, l2->get(), &dense).ok());
  for (size_t b = 0; b < dense.buffers().size(); ++b) {
    EXPECT_EQ(0, std::memcmp(dev[b]->Download().data(), dense.buffers()[b].data,
                             dense.buffers()[b].nbytes))
        << dense.buffers()[b].name;
  }
}

TEST(CudaTest, DiffAndRangeHashMatchTheHost) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(9);
  for (int w : {1, 2, 4, 8}) {
    const uint64_t n = 100003;
    std::vector<uint8_t> a(n * w), b;
    for (auto& x : a) x = rng();
    b = a;
    for (uint64_t i = 0; i < n; i += 1 + rng() % 30) b[i * w + rng() % w] ^= 1 + rng() % 255;
    DeviceCopy da(a.data(), a.size()), db(b.data(), b.size());
    for (ValueMode m : {ValueMode::kXor, ValueMode::kUlpDelta, ValueMode::kAbsolute}) {
      auto r = cuda::DeviceDiff(da.p, db.p, n, w, m, nullptr);
      ASSERT_TRUE(r.ok()) << r.status();
      size_t k = 0;
      for (uint64_t i = 0; i < n; ++i) {
        const uint64_t o = internal::LoadElem(a.data(), w, i),
                       nb = internal::LoadElem(b.data(), w, i);
        if (o == nb) continue;
        ASSERT_LT(k, r->positions.size());
        EXPECT_EQ(r->positions[k], i);
        EXPECT_EQ(r->values[k], internal::EncodeValue(static_cast<uint8_t>(m), w, o, nb));
        ++k;
      }
      EXPECT_EQ(k, r->positions.size());
    }
    auto h = cuda::DeviceRangeHash(77, db.p, w, 10, n - 20, nullptr);
    ASSERT_TRUE(h.ok());
    EXPECT_EQ(*h, RangeHash(77, b.data(), w, 10, n - 20));
  }
}

}  // namespace
}  // namespace dcr
