// The AVX2 builds give the portable builds' results (difference indexes, XXH3-128 digests) on
// random data of every width, density, length and split; skipped where the CPU lacks AVX2.
#include "internal/simd.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>
#include <random>
#include <vector>

#include "dcr/hash.h"

namespace dcr::internal {
namespace {

TEST(Simd, DiffMasksMatchTheBytes) {
  std::mt19937_64 rng(3);
  for (size_t n : {0, 64, 128, 4096, 16384}) {
    for (size_t align : {0, 1, 7}) {
      std::vector<uint8_t> a(n + align), b(n + align);
      for (size_t i = 0; i < a.size(); ++i) {
        a[i] = static_cast<uint8_t>(rng());
        b[i] = rng() % 4 == 0 ? static_cast<uint8_t>(a[i] ^ (1 + rng() % 255)) : a[i];
      }
      std::vector<uint64_t> portable(n / 64 + 1, 7);
      ByteDiffMasks(a.data() + align, b.data() + align, n, portable.data());
      for (size_t j = 0; j < n / 64; ++j) {
        uint64_t want = 0;
        for (int q = 0; q < 64; ++q) {
          want |= static_cast<uint64_t>(a[align + 64 * j + q] != b[align + 64 * j + q]) << q;
        }
        ASSERT_EQ(portable[j], want) << "n=" << n << " block " << j;
      }
    }
  }
}

// Both builds list exactly the differing elements, in order, for every width and change density
// (0 to 100%: the AVX2 build's unconditional slots and its loop past four per block).
TEST(Simd, DiffIndexesListTheDifferingElements) {
  std::mt19937_64 rng(4);
  for (int width : {1, 2, 4, 8}) {
    for (int percent : {0, 1, 3, 30, 90, 100}) {
      for (size_t n : {0, 64, 128, 4096, 16384}) {
        std::vector<uint8_t> a(n), b(n);
        std::vector<uint32_t> want;
        for (size_t e = 0; e < n / width; ++e) {
          const bool change = static_cast<int>(rng() % 100) < percent;
          for (int q = 0; q < width; ++q)
            a[e * width + q] = b[e * width + q] = static_cast<uint8_t>(rng());
          if (change) {
            const int q = static_cast<int>(rng() % width);  // any byte of the element
            b[e * width + q] ^= static_cast<uint8_t>(1 + rng() % 255);
            want.push_back(static_cast<uint32_t>(e));
          }
        }
        std::vector<uint32_t> got(n / width + 64, 0xFFFFFFFF);
        const size_t c = DiffIndexes(a.data(), b.data(), n, width, got.data());
        got.resize(c);
        ASSERT_EQ(got, want) << "portable width=" << width << " percent=" << percent << " n=" << n;
        if (!CpuHasAvx2()) continue;
        std::vector<uint32_t> fast(n / width + 64, 0xFFFFFFFF);
        const size_t cf = DiffIndexesAvx2(a.data(), b.data(), n, width, fast.data());
        fast.resize(cf);
        EXPECT_EQ(fast, want) << "AVX2 width=" << width << " percent=" << percent << " n=" << n;
      }
    }
  }
}

TEST(Simd, Xxh3Avx2EqualsTheLibrary) {
  if (!CpuHasAvx2()) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937_64 rng(5);
  std::vector<uint8_t> data(300000);
  for (auto& x : data) x = static_cast<uint8_t>(rng());
  for (size_t n : {0, 1, 16, 17, 128, 129, 240, 241, 1024, 4096, 100000, 300000}) {
    const XXH128_hash_t want = XXH3_128bits(data.data(), n);
    void* st = Xxh3Avx2New();
    ASSERT_NE(st, nullptr);
    // Uneven updates: the streaming state must not depend on how the bytes are split.
    size_t off = 0;
    while (off < n) {
      const size_t m = std::min<size_t>(n - off, 1 + rng() % 20000);
      Xxh3Avx2Update(st, data.data() + off, m);
      off += m;
    }
    uint64_t lo = 0, hi = 0;
    Xxh3Avx2Digest(st, &lo, &hi);
    Xxh3Avx2Free(st);
    EXPECT_EQ(lo, want.low64) << n;
    EXPECT_EQ(hi, want.high64) << n;
  }
}

}  // namespace
}  // namespace dcr::internal

namespace dcr::internal {
namespace {

// The AVX2 element-term sum equals hash.h ElementTerm summed one element at a time, for every
// width it takes, unaligned data, any begin (the lane order of the index) and any tail length.
TEST(Simd, ElementTermSumAvx2EqualsTheScalarSum) {
  if (!CpuHasAvx2()) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937_64 rng(11);
  for (int width : {1, 2, 4}) {
    for (uint64_t count : {0, 1, 3, 4, 5, 63, 1000, 4099}) {
      for (uint64_t begin : {uint64_t{0}, uint64_t{1}, uint64_t{7}, (uint64_t{1} << 20) + 3}) {
        const uint64_t salt = rng();
        std::vector<uint8_t> bytes(1 + (count + 1) * width);
        for (auto& b : bytes) b = static_cast<uint8_t>(rng());
        if (count > 2) std::memset(bytes.data() + 1, 0xFF, width);  // all-ones bits
        const uint8_t* data = bytes.data() + 1 - begin * width;     // element `begin` at offset 1
        Hash128 want;
        for (uint64_t i = begin; i < begin + count; ++i) {
          HashAdd(&want, ElementTerm(salt, i, LoadBits(data, width, i)));
        }
        Hash128 got;
        ElementTermSumAvx2(salt, data, width, begin, count, &got.lo, &got.hi);
        EXPECT_EQ(got, want) << "width " << width << " count " << count << " begin " << begin;
        EXPECT_EQ(RangeHash(salt, data, width, begin, count), want);
      }
    }
  }
}

}  // namespace
}  // namespace dcr::internal
