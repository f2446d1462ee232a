// Base contexts and class masks of 64-element blocks of 2-byte elements, for the AVX-512 builds
// of the context coder's class passes (internal). Included only by files compiled for AVX-512 BW
// (core/CMakeLists.txt); everything here has internal linkage, so no vector code is shared with
// other files (see simd.h).
#ifndef DCR_CORE_SRC_INTERNAL_CONTEXT_BLOCKS_AVX512_H_
#define DCR_CORE_SRC_INTERNAL_CONTEXT_BLOCKS_AVX512_H_

#include <cstdint>

#include "internal/context_walk_start.h"

#if defined(__x86_64__) && defined(__AVX512BW__)
#include <immintrin.h>

namespace dcr::internal {
namespace {

// The contexts (bits 7..14) of the 32 + 32 elements in x0, x1, element i of the pair in byte i.
__attribute__((always_inline)) inline __m512i Contexts512(__m512i x0, __m512i x1) {
  // The words shifted right by 7 and cut to their low byte (the context) are packed a 128-bit
  // lane at a time (lane j: 8 bytes of x0's lane j, then 8 of x1's), then the 8-byte groups put
  // back in element order (by the zero-masking permute with every lane kept: g++ 12's unmasked
  // intrinsic starts from an undefined vector it then warns about).
  const __m512i low = _mm512_set1_epi16(0xFF);
  const __m512i p = _mm512_packus_epi16(_mm512_and_si512(_mm512_srli_epi16(x0, 7), low),
                                        _mm512_and_si512(_mm512_srli_epi16(x1, 7), low));
  return _mm512_maskz_permutexvar_epi64(0xFF, _mm512_set_epi64(7, 5, 3, 1, 6, 4, 2, 0), p);
}

// The contexts of the block of base[0, n) that starts at `start` (< n). The elements of a last,
// partial block past n are not read (masked loads) and read as context 0.
__attribute__((always_inline)) inline __m512i BlockContexts512At(const uint16_t* base,
                                                                 uint64_t start, uint64_t n) {
  const uint16_t* p = base + start;
  if (n - start >= 64) return Contexts512(_mm512_loadu_si512(p), _mm512_loadu_si512(p + 32));
  const uint64_t len = n - start;
  const __mmask32 m0 = len >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((1u << len) - 1);
  const __mmask32 m1 = len <= 32 ? 0 : static_cast<__mmask32>((1u << (len - 32)) - 1);
  return Contexts512(_mm512_maskz_loadu_epi16(m0, p), _mm512_maskz_loadu_epi16(m1, p + 32));
}

// The mask of the elements of base[0, n) in the block that starts at `start` (< n).
__attribute__((always_inline)) inline uint64_t BlockValid(uint64_t start, uint64_t n) {
  return n - start >= 64 ? ~uint64_t{0} : (uint64_t{1} << (n - start)) - 1;
}

// Classes as runs of contexts (internal/context_walk.h ClassMap): class c holds the contexts at or
// above bounds[c] and below bounds[c + 1].
struct ClassBounds512 {
  ClassBounds512(const uint8_t* bounds, int nclasses) : k(nclasses) {
    for (int c = 1; c < k; ++c) bv[c - 1] = _mm512_set1_epi8(static_cast<char>(bounds[c]));
  }
  // fn(c, mask) for every class c in order, mask bit i set when element start + i (< n) of the
  // block that starts at `start` is in class c (ClassChain over one unsigned compare per bound).
  // Context 0, which unread elements have, is at or above no bound but the first.
  template <typename F>
  __attribute__((always_inline)) void Classify(const uint16_t* base, uint64_t start, uint64_t n,
                                               F&& fn) const {
    const __m512i e = BlockContexts512At(base, start, n);
    ClassChain(
        k, BlockValid(start, n),
        [&](int c) __attribute__((always_inline)) {
          return _cvtmask64_u64(_mm512_cmpge_epu8_mask(e, bv[c]));
        },
        fn);
  }
  int k;
  __m512i bv[15];
};

}  // namespace
}  // namespace dcr::internal

#endif  // __x86_64__ && __AVX512BW__
#endif  // DCR_CORE_SRC_INTERNAL_CONTEXT_BLOCKS_AVX512_H_
