// Portable builds and the run-time check of internal/simd.h.
#include "internal/simd.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace dcr::internal {

bool CpuHasAvx2() {
#if defined(__x86_64__) && defined(DCR_HAVE_AVX2_BUILD)
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
#else
  return false;
#endif
}

void ByteDiffMasks(const uint8_t* a, const uint8_t* b, size_t nbytes, uint64_t* masks) {
  for (size_t i = 0, j = 0; i < nbytes; i += 64, ++j) {
#if defined(__SSE2__)
    uint64_t eq = 0;
    for (int q = 0; q < 4; ++q) {
      const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i + 16 * q));
      const __m128i y = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i + 16 * q));
      eq |= static_cast<uint64_t>(static_cast<uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(x, y))))
            << (16 * q);
    }
    masks[j] = ~eq;
#else
    uint64_t m = 0;
    for (int q = 0; q < 64; ++q) m |= static_cast<uint64_t>(a[i + q] != b[i + q]) << q;
    masks[j] = m;
#endif
  }
}

}  // namespace dcr::internal
