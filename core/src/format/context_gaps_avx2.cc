// The AVX2 build of the encoder's class-local gaps of 2-byte elements (ContextGaps16Avx2 in
// internal/simd.h; the portable ClassGapsGroupedImpl in internal/context_walk.h gives the same
// gaps and values). Compiled with -mavx2 (core/CMakeLists.txt); called only when CpuHasAvx2(). No
// C++ library headers here (see simd.h), and every helper has internal linkage, so no code built
// for AVX2 is shared with other files.
#include "internal/context_blocks_avx2.h"
#include "internal/simd.h"

#if defined(__x86_64__) && defined(__AVX2__)
#include <immintrin.h>

namespace dcr::internal {

namespace {

constexpr int kClasses = 16;


}  // namespace

void ContextGaps16Avx2(const uint16_t* base, uint64_t n, const uint8_t* bounds, int nclasses,
                       const uint64_t* positions, const uint64_t* values, uint64_t k,
                       const uint64_t* start_of, uint64_t* gaps, uint64_t* vals) {
  const int K = nclasses;
  // Class c holds the contexts above bounds[c] - 1 and not above bounds[c + 1] - 1: one signed
  // compare of the biased contexts per bound.
  __m256i bv[kClasses - 1];
  for (int c = 0; c + 1 < K; ++c) {
    bv[c] = _mm256_set1_epi8(static_cast<char>((bounds[c + 1] - 1) ^ 0x80));
  }
  uint8_t lut[256];
  for (int e = 0, c = 0; e < 256; ++e) {
    while (c + 1 < K && e >= bounds[c + 1]) ++c;
    lut[e] = static_cast<uint8_t>(c);
  }
  // count[c]: members of class c before the block; next[c]: the rank after the class's last
  // change; at[c]: where the class's next change goes.
  uint64_t count[kClasses] = {}, next[kClasses] = {}, at[kClasses];
  for (int c = 0; c < K; ++c) at[c] = start_of[c];
  uint64_t ci = 0;
  for (uint64_t start = 0; start < n && ci < k; start += 64) {
    __m256i e0, e1;
    const uint64_t valid = BlockContextsAt(base, start, n, &e0, &e1);
    uint64_t m[kClasses];
    uint64_t ge = valid;
    for (int c = 0; c + 1 < K; ++c) {
      const uint64_t g0 = static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpgt_epi8(e0, bv[c])));
      const uint64_t g1 = static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpgt_epi8(e1, bv[c])));
      const uint64_t above = (g0 | (g1 << 32)) & valid;
      m[c] = ge & ~above;
      ge = above;
    }
    m[K - 1] = ge;
    const uint64_t end = start + 64;
    for (; ci < k && positions[ci] < end; ++ci) {
      const uint64_t p = positions[ci];
      const uint64_t bit = p - start;
      const int c = lut[(base[p] >> 7) & 0xFF];
      const uint64_t j =
          count[c] + static_cast<uint64_t>(_mm_popcnt_u64(m[c] & ((uint64_t{1} << bit) - 1)));
      const uint64_t o = at[c]++;
      gaps[o] = j - next[c];
      vals[o] = values[ci];
      next[c] = j + 1;
    }
    for (int c = 0; c < K; ++c) count[c] += static_cast<uint64_t>(_mm_popcnt_u64(m[c]));
  }
}

}  // namespace dcr::internal

#else  // no AVX2 build on this target: CpuHasAvx2() is false and this is never called

namespace dcr::internal {
void ContextGaps16Avx2(const uint16_t*, uint64_t, const uint8_t*, int, const uint64_t*,
                       const uint64_t*, uint64_t, const uint64_t*, uint64_t*, uint64_t*) {}
}  // namespace dcr::internal

#endif
