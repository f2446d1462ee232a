// One suite for every Device backend: compiled once per backend (DCR_TEST_DEVICE_KIND: 1 = host,
// label quick; 2 = cuda, label gpu, every case skipped without a usable device). Each case runs
// the same product code on the backend and compares bytes with the host-side reference (the
// scalar element ops and hash.h, a dense load of the target, a serving replica's host storage):
// zero tolerance.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>

#include "dcr/copy_interposers.h"  // this binary records loads
#include "dcr/delta.h"
#include "dcr/device.h"
#include "dcr/hash.h"
#include "dcr/runtime.h"
#include "dcr/status_macros.h"
#include "dcr/testing/device_fixtures.h"
#include "dcr/testing/reference_loader.h"
#include "dcr/testing/synth_pair.h"
#include "dcr/testing/test_model.h"
#include "internal/element_ops.h"

namespace dcr {
namespace {

constexpr DeviceKind kKind = testing::kTestDeviceKind;
#define OPEN_DEVICE_OR_SKIP(var) DCR_OPEN_TEST_DEVICE_OR_SKIP(var)

// Device bytes freed with the test.
struct DeviceBytes {
  Device* d;
  void* p = nullptr;
  DeviceBytes(Device* dev, const void* host, uint64_t n) : d(dev) {
    auto a = d->Allocate(n);
    EXPECT_TRUE(a.ok()) << a.status();
    p = *a;
    EXPECT_TRUE(d->Upload(p, host, n).ok());
  }
  ~DeviceBytes() { d->Free(p); }
  std::vector<uint8_t> Get(uint64_t n) const {
    std::vector<uint8_t> h(n);
    EXPECT_TRUE(d->Download(h.data(), p, n).ok());
    return h;
  }
};

TEST(DeviceBackendTest, OperationsMatchTheScalarReference) {
  OPEN_DEVICE_OR_SKIP(d);
  EXPECT_EQ(d->kind(), kKind);
  std::mt19937_64 rng(9);
  for (int w : {1, 2, 4, 8}) {
    const uint64_t n = 100003;
    std::vector<uint8_t> a(n * w), b;
    for (auto& x : a) x = static_cast<uint8_t>(rng());
    // -0 and a NaN payload in the top bits of the first elements.
    internal::StoreElem(a.data(), w, 0, internal::SignBit(w));
    internal::StoreElem(a.data(), w, 1, internal::WidthMask(w) >> 1);
    b = a;
    for (uint64_t i = 0; i < n; i += 1 + rng() % 30) b[i * w + rng() % w] ^= 1 + rng() % 255;
    DeviceBytes da(d.get(), a.data(), a.size()), db(d.get(), b.data(), b.size());
    for (ValueMode m : {ValueMode::kXor, ValueMode::kUlpDelta, ValueMode::kAbsolute}) {
      auto r = d->Diff(da.p, db.p, n, w, m);
      ASSERT_TRUE(r.ok()) << r.status();
      size_t k = 0;
      for (uint64_t i = 0; i < n; ++i) {
        const uint64_t o = internal::LoadElem(a.data(), w, i),
                       nb = internal::LoadElem(b.data(), w, i);
        if (o == nb) continue;
        ASSERT_LT(k, r->positions.size());
        EXPECT_EQ(r->positions[k], i);
        EXPECT_EQ(r->values[k], internal::EncodeValue(static_cast<uint8_t>(m), w, o, nb));
        EXPECT_EQ(r->old_bits[k], o);
        EXPECT_EQ(r->new_bits[k], nb);
        ++k;
      }
      EXPECT_EQ(k, r->positions.size());
      // Gather + Scatter of the diff into a copy of `a` (each change written twice: to the copy
      // and to a second copy) yields `b` in both.
      DeviceBytes w1(d.get(), a.data(), a.size()), w2(d.get(), a.data(), a.size());
      std::vector<uint64_t> read(k), write(2 * k), begin(k + 1), ob(k), nbits(k);
      for (size_t i = 0; i < k; ++i) {
        read[i] = reinterpret_cast<uint64_t>(w1.p) + r->positions[i] * w;
        write[2 * i] = read[i];
        write[2 * i + 1] = reinterpret_cast<uint64_t>(w2.p) + r->positions[i] * w;
        begin[i + 1] = 2 * (i + 1);
      }
      ASSERT_TRUE(d->Gather(read.data(), r->values.data(), k, w, m, ob.data(), nbits.data()).ok());
      EXPECT_EQ(ob, r->old_bits);
      EXPECT_EQ(nbits, r->new_bits);
      ASSERT_TRUE(d->Scatter(write.data(), begin.data(), nbits.data(), k, w).ok());
      EXPECT_EQ(w1.Get(b.size()), b);
      EXPECT_EQ(w2.Get(b.size()), b);
    }
    auto h = d->RangeHash(77, db.p, w, 10, n - 20);
    ASSERT_TRUE(h.ok());
    EXPECT_EQ(*h, RangeHash(77, b.data(), w, 10, n - 20));
    uint64_t first = 0;
    while (a[first] == b[first]) ++first;
    auto fd = d->FirstDifference(da.p, db.p, a.size());
    ASSERT_TRUE(fd.ok());
    EXPECT_EQ(*fd, first);
    // Unaligned starts and the tail of a range.
    auto fd2 = d->FirstDifference(static_cast<uint8_t*>(da.p) + 3, static_cast<uint8_t*>(db.p) + 3,
                                  a.size() - 3);
    ASSERT_TRUE(fd2.ok());
    uint64_t first2 = 3;
    while (a[first2] == b[first2]) ++first2;
    EXPECT_EQ(*fd2, first2 - 3);
    auto same = d->FirstDifference(da.p, da.p, a.size());
    ASSERT_TRUE(same.ok());
    EXPECT_EQ(*same, a.size());
    DeviceBytes dc(d.get(), a.data(), a.size());
    ASSERT_TRUE(d->Copy(dc.p, db.p, b.size()).ok());
    EXPECT_EQ(dc.Get(b.size()), b);
  }
}

TEST(DeviceBackendTest, AnAllocationTheDeviceCannotHoldIsResourceExhausted) {
  OPEN_DEVICE_OR_SKIP(d);
  auto p = d->Allocate(uint64_t{1} << 52);  // 4 PiB
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kResourceExhausted) << p.status();
  EXPECT_EQ(p.status().message().rfind("out of device memory on " + d->name(), 0), 0u)
      << p.status();
  // The device is still usable.
  auto q = d->Allocate(64);
  ASSERT_TRUE(q.ok()) << q.status();
  d->Free(*q);
}

// A serving rank recorded on the host (reference runtime), its storage mirrored on the device and
// refitted there through the placement map; compared with a dense load of the target.
TEST(DeviceBackendTest, PlacementApplierRefitsAServingRank) {
  OPEN_DEVICE_OR_SKIP(d);
  const ServingConfig cfg = testing::SmallMoeServingConfig();
  auto [v0, v1] = testing::SyntheticCheckpointPair(cfg.model, 3, 0.05, 4, true);
  Storage st(0);
  std::unique_ptr<ModelLoader> loader;
  auto map = RecordLoad(*v0, ReferenceLoaderFactory(cfg), 0, &loader, &st);
  ASSERT_TRUE(map.ok()) << map.status();
  std::vector<std::unique_ptr<DeviceBytes>> dev;
  std::vector<void*> ptrs;
  for (const auto& b : st.buffers()) {
    dev.push_back(std::make_unique<DeviceBytes>(d.get(), b.data, b.nbytes));
    ptrs.push_back(dev.back()->p);
  }
  EXPECT_TRUE(MakeDevicePlacementApplier(d, *map, {}).status().IsInvalidArgument());
  auto app = MakeDevicePlacementApplier(d, *map, ptrs);
  ASSERT_TRUE(app.ok()) << app.status();
  DeltaOptions o;
  o.chunk_elems = 4096;
  DeltaMemorySink sink;
  ASSERT_TRUE(BuildDelta(v0.get(), *v1, o, &sink).ok());
  auto reader = DeltaReader::FromBytes(sink.Release());
  ASSERT_TRUE(reader.ok());
  for (size_t i = 0; i < (*reader)->num_chunks(); ++i) {
    auto c = (*reader)->Decode(i);
    ASSERT_TRUE(c.ok());
    Status s = (*app)->ApplyChunk(*c);
    ASSERT_TRUE(s.ok()) << s;
  }
  Storage dense(0);
  auto l2 = MakeReferenceLoader(cfg, 0);
  ASSERT_TRUE(l2.ok());
  ASSERT_TRUE(LoadCheckpoint(*v1, l2->get(), &dense).ok());
  for (size_t b = 0; b < dense.buffers().size(); ++b) {
    EXPECT_EQ(0, std::memcmp(dev[b]->Get(dense.buffers()[b].nbytes).data(), dense.buffers()[b].data,
                             dense.buffers()[b].nbytes))
        << dense.buffers()[b].name;
  }
}

// The device receiver through three versions of a synthetic model (NaN/-0 specials), records
// applied by four threads, each version verified on the device and downloaded for comparison.
TEST(DeviceBackendTest, DeviceReceiverRefitsBitExact) {
  OPEN_DEVICE_OR_SKIP(d);
  ModelConfig mc;
  mc.vocab = 1000;
  mc.hidden = 128;
  mc.layers = 2;
  mc.heads = 8;
  mc.kv_heads = 2;
  mc.head_dim = 16;
  mc.intermediate = 256;
  auto model = internal::MakeSyntheticModel(mc, 5);
  auto prev = model.ToCheckpoint();
  auto rx = MakeDeviceReceiver(d, *prev, 0);
  ASSERT_TRUE(rx.ok()) << rx.status();
  EXPECT_EQ((*rx)->held().hash, prev->ContentHash());
  const double rates[] = {0.01, 0.3, 1.0};
  for (int step = 1; step <= 3; ++step) {
    internal::StepSyntheticModel(&model, rates[step - 1], 10 + step, true);
    auto next = model.ToCheckpoint();
    DeltaOptions o;
    o.chunk_elems = 4096;
    o.base_version = step - 1;
    o.target_version = step;
    DeltaMemorySink sink;
    ASSERT_TRUE(BuildDelta(prev.get(), *next, o, &sink).ok());
    auto dr = DeltaReader::FromBytes(sink.Release());
    ASSERT_TRUE(dr.ok());
    const DeltaReader& delta = **dr;
    ASSERT_TRUE(BeginDelta(delta, rx->get()).ok());
    std::atomic<size_t> next_chunk{0};
    std::atomic<int> failures{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t) {
      ts.emplace_back([&] {
        for (size_t i; (i = next_chunk++) < delta.num_chunks();) {
          if (!(*rx)->ApplyRecord(delta.chunk_data(i), delta.chunk_size(i)).ok()) ++failures;
        }
      });
    }
    for (auto& t : ts) t.join();
    ASSERT_EQ(failures.load(), 0);
    Status c = CommitDelta(delta, rx->get());
    ASSERT_TRUE(c.ok()) << c;
    Status v = (*rx)->Verify(*next);
    EXPECT_TRUE(v.ok()) << v;
    if (rates[step - 1] > 0) {
      EXPECT_TRUE((*rx)->Verify(*prev).IsDataLoss());
    }
    for (const DeviceReceiverTensor& t : (*rx)->tensors()) {
      const TensorInfo* want = next->Find(t.info.name);
      ASSERT_NE(want, nullptr);
      std::vector<uint8_t> h(t.info.nbytes);
      ASSERT_TRUE(d->Download(h.data(), t.data, h.size()).ok());
      EXPECT_EQ(0, std::memcmp(h.data(), next->data(*want), h.size())) << t.info.name;
    }
    prev = std::move(next);
  }
}

}  // namespace
}  // namespace dcr
