// Base contexts of 64-element blocks of 2-byte elements, and the counts before each block, for the
// AVX2 and AVX-512 builds of the context coder's class passes (internal). Included only by files
// compiled with -mavx2 or above (core/CMakeLists.txt); every function here is static, so each such
// file keeps its own copy and no vector code is shared with other files (see simd.h).
#ifndef DCR_CORE_SRC_INTERNAL_CONTEXT_BLOCKS_AVX2_H_
#define DCR_CORE_SRC_INTERNAL_CONTEXT_BLOCKS_AVX2_H_

#include <cstdint>

#include "internal/context_walk_start.h"

#if defined(__x86_64__) && defined(__AVX2__)
#include <immintrin.h>

namespace dcr::internal {

// The 64 contexts (exponent bytes) of the block at p as bytes biased by 0x80, element i of the
// block in byte i of the pair e0, e1, so that one signed compare orders them.
__attribute__((always_inline)) static inline void BlockContexts(const uint16_t* p, __m256i* e0,
                                                                __m256i* e1) {
  const __m256i low = _mm256_set1_epi16(0xFF);
  const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
  auto exps = [&](const uint16_t* q) __attribute__((always_inline)) {
    const __m256i x0 = _mm256_and_si256(
        _mm256_srli_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)), 7), low);
    const __m256i x1 = _mm256_and_si256(
        _mm256_srli_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 16)), 7), low);
    return _mm256_xor_si256(_mm256_permute4x64_epi64(_mm256_packus_epi16(x0, x1), 0xD8), bias);
  };
  *e0 = exps(p);
  *e1 = exps(p + 32);
}

// BlockContexts of the block of base[0, n) that starts at `start` (< n); returns the mask of
// its elements. A last, partial block is copied into a zeroed block first, so its elements past
// the end read as zero bits (context 0, above no class bound) and are masked off.
__attribute__((always_inline)) static inline uint64_t BlockContextsAt(const uint16_t* base,
                                                                      uint64_t start, uint64_t n,
                                                                      __m256i* e0, __m256i* e1) {
  if (n - start >= 64) {
    BlockContexts(base + start, e0, e1);
    return ~uint64_t{0};
  }
  alignas(32) uint16_t tail[64] = {};
  const uint64_t len = n - start;
  for (uint64_t i = 0; i < len; ++i) tail[i] = base[start + i];
  BlockContexts(tail, e0, e1);
  return (uint64_t{1} << len) - 1;
}

namespace {  // internal linkage: each file compiled for a vector unit keeps its own build

// Classes as runs of contexts (internal/context_walk.h ClassMap), for the AVX2 block pass.
struct ClassBounds256 {
  ClassBounds256(const uint8_t* bounds, int nclasses) : k(nclasses) {
    for (int c = 0; c + 1 < k; ++c) {
      bv[c] = _mm256_set1_epi8(static_cast<char>((bounds[c + 1] - 1) ^ 0x80));
    }
  }
  // fn(c, mask) for every class c in order, mask bit i set when element start + i (< n) of the
  // block that starts at `start` is in class c (ClassChain over one signed compare of the biased
  // contexts per bound; unread elements, context 0, are above none).
  template <typename F>
  __attribute__((always_inline)) void Classify(const uint16_t* base, uint64_t start, uint64_t n,
                                               F&& fn) const {
    __m256i e0, e1;
    const uint64_t valid = BlockContextsAt(base, start, n, &e0, &e1);
    ClassChain(
        k, valid,
        [&](int c) __attribute__((always_inline)) {
          const uint64_t g0 =
              static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpgt_epi8(e0, bv[c])));
          const uint64_t g1 =
              static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpgt_epi8(e1, bv[c])));
          return g0 | (g1 << 32);
        },
        fn);
  }
  int k;
  __m256i bv[15];
};

}  // namespace

// Replaces row[0..64) (16-bit counts whose sum is below 2^15) by the sums of the entries
// before each, and returns the sum of all.
__attribute__((always_inline)) static inline uint64_t ExclusiveSums64(int16_t* row) {
  // Broadcasts of word 7 of the low lane into the high lane (the low lane zero), and of word 15.
  const __m256i word7 = _mm256_set1_epi16(0x0F0E);
  __m256i carry = _mm256_setzero_si256();
  for (int i = 0; i < 4; ++i) {
    __m256i* p = reinterpret_cast<__m256i*>(row + 16 * i);
    const __m256i x = _mm256_load_si256(p);
    __m256i s = _mm256_add_epi16(x, _mm256_slli_si256(x, 2));
    s = _mm256_add_epi16(s, _mm256_slli_si256(s, 4));
    s = _mm256_add_epi16(s, _mm256_slli_si256(s, 8));  // sums within each 128-bit lane
    s = _mm256_add_epi16(s, _mm256_shuffle_epi8(_mm256_permute2x128_si256(s, s, 0x08), word7));
    s = _mm256_add_epi16(s, carry);  // inclusive sums
    _mm256_store_si256(p, _mm256_sub_epi16(s, x));
    carry = _mm256_shuffle_epi8(_mm256_permute4x64_epi64(s, 0xFF), _mm256_set1_epi16(0x0706));
  }
  return static_cast<uint16_t>(_mm256_extract_epi16(carry, 0));
}

}  // namespace dcr::internal

#endif  // __x86_64__ && __AVX2__
#endif  // DCR_CORE_SRC_INTERNAL_CONTEXT_BLOCKS_AVX2_H_
