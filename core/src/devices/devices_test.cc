// The device interface on the host backend: every operation against the scalar reference of the
// same bytes (element_ops.h, hash.h), allocation limits and range checks, OpenDevice's refusals.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <random>
#include <thread>

#include "dcr/device.h"
#include "dcr/hash.h"
#include "internal/element_ops.h"

namespace dcr {
namespace {

std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// A device copy of host bytes.
void* Put(Device* d, const std::vector<uint8_t>& h) {
  auto p = d->Allocate(h.size());
  EXPECT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(d->Upload(*p, h.data(), h.size()).ok());
  return *p;
}

TEST(DeviceKindTest, ParsesAndNames) {
  for (DeviceKind k : {DeviceKind::kCpu, DeviceKind::kHost, DeviceKind::kCuda}) {
    auto p = ParseDeviceKind(DeviceKindName(k));
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(*p, k);
  }
  auto bad = ParseDeviceKind("gpu");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(bad.status().IsInvalidArgument());
  EXPECT_NE(bad.status().message().find("cpu, host or cuda"), std::string::npos);
}

TEST(DeviceKindTest, LocalRankFromTheLaunchersVariables) {
  unsetenv("LOCAL_RANK");
  unsetenv("SLURM_LOCALID");
  unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
  EXPECT_EQ(LocalRankFromEnvironment(), -1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3", 1);
  EXPECT_EQ(LocalRankFromEnvironment(), 3);
  setenv("SLURM_LOCALID", "2", 1);
  EXPECT_EQ(LocalRankFromEnvironment(), 2);
  setenv("LOCAL_RANK", "1", 1);
  EXPECT_EQ(LocalRankFromEnvironment(), 1);
  setenv("LOCAL_RANK", "x1", 1);
  EXPECT_EQ(LocalRankFromEnvironment(), -1);
  unsetenv("LOCAL_RANK");
  unsetenv("SLURM_LOCALID");
  unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
}

TEST(OpenDeviceTest, HostOpensCpuIsNotADevice) {
  auto h = OpenDevice(DeviceKind::kHost);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ((*h)->name(), "host");
  EXPECT_EQ((*h)->kind(), DeviceKind::kHost);
  EXPECT_TRUE(ProbeDevice(DeviceKind::kHost).ok());
  EXPECT_TRUE(OpenDevice(DeviceKind::kHost, 1).status().IsInvalidArgument());
  EXPECT_TRUE(OpenDevice(DeviceKind::kCpu).status().IsInvalidArgument());
}

// Without a usable GPU (this build machine, CI) kCuda is kUnavailable naming CUDA and the reason;
// with one it opens and names the device.
TEST(OpenDeviceTest, CudaOpensOrSaysWhyNot) {
  auto d = OpenDevice(DeviceKind::kCuda);
  const Status probe = ProbeDevice(DeviceKind::kCuda);
  EXPECT_EQ(d.ok(), probe.ok());
  if (d.ok()) {
    EXPECT_EQ((*d)->name().rfind("cuda:0 (", 0), 0u) << (*d)->name();
    return;
  }
  EXPECT_TRUE(d.status().IsUnavailable()) << d.status();
  EXPECT_EQ(d.status().message().rfind("CUDA: ", 0), 0u) << d.status();
  const std::string& m = d.status().message();
  EXPECT_TRUE(m.find("no usable device: ") != std::string::npos ||
              m.find("dcr was built without CUDA") != std::string::npos)
      << m;
  EXPECT_TRUE(probe.IsUnavailable());
  EXPECT_TRUE(OpenDevice(DeviceKind::kCuda, 4096).status().IsUnavailable());
}

TEST(HostDeviceTest, CopiesRoundTripAndStayInsideAllocations) {
  auto d = MakeHostDevice();
  const auto bytes = RandomBytes(1000, 1);
  void* a = Put(d.get(), bytes);
  auto b = d->Allocate(1000);
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(d->Copy(*b, a, 1000).ok());
  std::vector<uint8_t> back(1000);
  ASSERT_TRUE(d->Download(back.data(), *b, 1000).ok());
  EXPECT_EQ(back, bytes);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 256, 0u);
  // Host memory passed as a device address, and ranges running past an allocation, are refused.
  EXPECT_TRUE(d->Upload(back.data(), bytes.data(), 10).IsInvalidArgument());
  EXPECT_TRUE(d->Download(back.data(), back.data(), 10).IsInvalidArgument());
  EXPECT_TRUE(d->Copy(static_cast<uint8_t*>(*b) + 1, a, 1000).IsInvalidArgument());
  EXPECT_TRUE(d->FirstDifference(a, back.data(), 10).status().IsInvalidArgument());
  auto z = d->Allocate(0);
  auto z2 = d->Allocate(0);
  ASSERT_TRUE(z.ok() && z2.ok());
  EXPECT_NE(*z, *z2);
  d->Free(a);
  d->Free(*b);
  d->Free(*z);
  d->Free(*z2);
  d->Free(nullptr);
}

TEST(HostDeviceTest, ByteBudgetGivesResourceExhaustedAndFreesReturnIt) {
  HostDeviceOptions o;
  o.memory_bytes = 4096;
  auto d = MakeHostDevice(o);
  auto a = d->Allocate(3000);
  ASSERT_TRUE(a.ok());
  auto b = d->Allocate(2000);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kResourceExhausted) << b.status();
  EXPECT_EQ(b.status().message().rfind("out of device memory on host: ", 0), 0u) << b.status();
  d->Free(*a);
  auto c = d->Allocate(4096);
  EXPECT_TRUE(c.ok()) << c.status();
  d->Free(*c);
}

// Gather, Scatter, Diff, RangeHash and FirstDifference against the scalar reference, every width
// and value mode, NaN and -0 bit patterns included.
TEST(HostDeviceTest, OperationsMatchTheReference) {
  auto d = MakeHostDevice();
  std::mt19937_64 rng(7);
  for (int w : {1, 2, 4, 8}) {
    const uint64_t n = 1537;
    auto old_h = RandomBytes(n * w, 10 + w);
    // Special patterns at the front: -0, +0, NaN, -NaN, +Inf in every width's top bits.
    const uint64_t specials[] = {internal::SignBit(w), 0, internal::WidthMask(w) >> 1,
                                 internal::WidthMask(w), internal::WidthMask(w) >> 2};
    for (int i = 0; i < 5; ++i) internal::StoreElem(old_h.data(), w, i, specials[i]);
    auto new_h = old_h;
    for (uint64_t i = 0; i < n; ++i) {
      if (i < 5 || rng() % 4 == 0) internal::StoreElem(new_h.data(), w, i, rng());
    }
    void* od = Put(d.get(), old_h);
    void* nd = Put(d.get(), new_h);
    for (ValueMode mode : {ValueMode::kXor, ValueMode::kUlpDelta, ValueMode::kAbsolute}) {
      const uint8_t op = static_cast<uint8_t>(mode);
      auto diff = d->Diff(od, nd, n, w, mode);
      ASSERT_TRUE(diff.ok()) << diff.status();
      std::vector<uint64_t> want_pos;
      for (uint64_t i = 0; i < n; ++i) {
        const uint64_t o = internal::LoadElem(old_h.data(), w, i);
        const uint64_t nb = internal::LoadElem(new_h.data(), w, i);
        if (o == nb) continue;
        want_pos.push_back(i);
        const size_t k = want_pos.size() - 1;
        ASSERT_LT(k, diff->values.size());
        EXPECT_EQ(diff->values[k], internal::EncodeValue(op, w, o, nb));
        EXPECT_EQ(diff->old_bits[k], o);
        EXPECT_EQ(diff->new_bits[k], nb);
      }
      EXPECT_EQ(diff->positions, want_pos);
      // Gather the old bits at the changed positions, scatter the new ones into a copy of old:
      // the copy then equals new, byte for byte.
      void* work = Put(d.get(), old_h);
      const uint64_t k = want_pos.size();
      std::vector<uint64_t> addr(k), begin(k + 1), ob(k), nb(k);
      for (uint64_t i = 0; i < k; ++i) {
        addr[i] = reinterpret_cast<uint64_t>(work) + want_pos[i] * w;
        begin[i + 1] = i + 1;
      }
      ASSERT_TRUE(
          d->Gather(addr.data(), diff->values.data(), k, w, mode, ob.data(), nb.data()).ok());
      EXPECT_EQ(ob, diff->old_bits);
      EXPECT_EQ(nb, diff->new_bits);
      ASSERT_TRUE(d->Scatter(addr.data(), begin.data(), nb.data(), k, w).ok());
      auto fd = d->FirstDifference(work, nd, n * w);
      ASSERT_TRUE(fd.ok());
      EXPECT_EQ(*fd, n * w);
      d->Free(work);
    }
    auto fd = d->FirstDifference(od, nd, n * w);
    ASSERT_TRUE(fd.ok());
    uint64_t first = 0;
    while (old_h[first] == new_h[first]) ++first;
    EXPECT_EQ(*fd, first);
    for (auto [b, c] : {std::pair<uint64_t, uint64_t>{0, n}, {5, 700}, {n - 1, 1}, {3, 0}}) {
      auto h = d->RangeHash(99, nd, w, b, c);
      ASSERT_TRUE(h.ok());
      EXPECT_EQ(*h, RangeHash(99, new_h.data(), w, b, c));
    }
    EXPECT_TRUE(d->Diff(od, nd, n, 3, ValueMode::kXor).status().IsInvalidArgument());
    d->Free(od);
    d->Free(nd);
  }
}

// Arrays of several scan blocks: the positions come back ascending and complete.
TEST(HostDeviceTest, DiffOfALargeArrayIsCompleteAndOrdered) {
  auto d = MakeHostDevice();
  const uint64_t n = (uint64_t{5} << 20) / 2 + 12345;
  auto a = RandomBytes(n * 2, 21);
  auto b = a;
  std::vector<uint64_t> want;
  for (uint64_t i = 0; i < n; i += 1 + (i * 7919) % 613) {
    b[2 * i + 1] ^= 0x40;
    want.push_back(i);
  }
  void* da = Put(d.get(), a);
  void* db = Put(d.get(), b);
  auto r = d->Diff(da, db, n, 2, ValueMode::kXor);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->positions, want);
  ASSERT_EQ(r->values.size(), want.size());
  for (size_t k = 0; k < want.size(); ++k) {
    EXPECT_EQ(r->values[k], 0x4000u);
    EXPECT_EQ(r->old_bits[k] ^ r->new_bits[k], 0x4000u);
  }
  d->Free(da);
  d->Free(db);
}

TEST(HostDeviceTest, ConcurrentCallsFromManyThreads) {
  auto d = MakeHostDevice();
  const auto bytes = RandomBytes(1 << 16, 3);
  void* src = Put(d.get(), bytes);
  std::vector<std::thread> ts;
  std::vector<int> ok(8, 0);
  for (int t = 0; t < 8; ++t) {
    ts.emplace_back([&, t] {
      for (int r = 0; r < 20; ++r) {
        auto p = d->Allocate(bytes.size());
        if (!p.ok()) return;
        if (!d->Copy(*p, src, bytes.size()).ok()) return;
        auto fd = d->FirstDifference(*p, src, bytes.size());
        if (!fd.ok() || *fd != bytes.size()) return;
        d->Free(*p);
      }
      ok[t] = 1;
    });
  }
  for (auto& t : ts) t.join();
  for (int t = 0; t < 8; ++t) EXPECT_EQ(ok[t], 1) << t;
  d->Free(src);
}

}  // namespace
}  // namespace dcr
