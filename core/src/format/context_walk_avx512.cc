// The AVX-512 build of the class walk of context-coded chunks of 2-byte elements
// (ContextWalk16Avx512 in internal/simd.h): the walk of ContextWalk16Avx2
// (internal/context_walk16.h) with the 64 contexts of a block in one register, a class bound's
// compare giving its 64-bit mask directly, two compares of a class's 64 counts per change, and the
// element found by PDEP (fast on every CPU with AVX-512). Compiled for AVX-512 BW
// (core/CMakeLists.txt); called only when CpuSimd() is kAvx512. No C++ library headers here (see
// simd.h), and every helper has internal linkage.
#include "internal/simd.h"

#if defined(__x86_64__) && defined(__AVX512BW__)
#include <immintrin.h>

#include "internal/context_blocks_avx512.h"
#include "internal/context_walk16.h"

namespace dcr::internal {

namespace {

struct Avx512Build : ClassBounds512 {
  using ClassBounds512::ClassBounds512;
  // The last block whose count is <= t: the blocks whose count is <= t, less one (block 0's
  // count is 0).
  struct Finder {
    explicit Finder(const int16_t* bc)
        : q0(_mm512_load_si512(bc)), q1(_mm512_load_si512(bc + 32)) {}
    __attribute__((always_inline)) uint64_t Block(uint64_t t) const {
      const __m512i tv = _mm512_set1_epi16(static_cast<int16_t>(t));
      const __mmask64 le =
          _mm512_kunpackd(_mm512_cmple_epi16_mask(q1, tv), _mm512_cmple_epi16_mask(q0, tv));
      return static_cast<uint64_t>(_mm_popcnt_u64(_cvtmask64_u64(le))) - 1;
    }
    __m512i q0, q1;
  };
  __attribute__((always_inline)) static uint64_t Select(uint64_t m, uint64_t r) {
    return SelectPdep(m, r);
  }
};

}  // namespace

bool ContextWalk16Avx512(const uint16_t* base, uint64_t n, const uint8_t* bounds, int k,
                         const uint64_t* kc, const uint64_t* start_of, const uint64_t* gaps,
                         const uint64_t* vals, uint64_t* positions, uint64_t* values,
                         const WalkSink* sink) {
  return Walk16(Avx512Build(bounds, k), base, n, k, kc, start_of, gaps, vals, positions, values,
                sink);
}

}  // namespace dcr::internal

#else  // no AVX-512 build on this target: CpuSimd() is below kAvx512 and this is never called

namespace dcr::internal {
bool ContextWalk16Avx512(const uint16_t*, uint64_t, const uint8_t*, int, const uint64_t*,
                         const uint64_t*, const uint64_t*, const uint64_t*, uint64_t*, uint64_t*,
                         const WalkSink*) {
  return false;
}
}  // namespace dcr::internal

#endif
