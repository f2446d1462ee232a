// Base contexts of 64-element blocks of 2-byte elements, for the AVX2 builds of the context
// coder's class passes (internal). Included only by files compiled with -mavx2
// (core/CMakeLists.txt); every function here is static, so each such file keeps its own copy and
// no code built for AVX2 is shared with other files (see simd.h).
#ifndef DCR_CORE_SRC_INTERNAL_CONTEXT_BLOCKS_AVX2_H_
#define DCR_CORE_SRC_INTERNAL_CONTEXT_BLOCKS_AVX2_H_

#include <cstdint>

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

}  // namespace dcr::internal

#endif  // __x86_64__ && __AVX2__
#endif  // DCR_CORE_SRC_INTERNAL_CONTEXT_BLOCKS_AVX2_H_
