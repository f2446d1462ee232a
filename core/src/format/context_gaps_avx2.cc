// The AVX2 build of the encoder's class-local gaps of 2-byte elements (ContextGaps16Avx2 in
// internal/simd.h): Gaps16 of internal/context_walk16.h over the AVX2 block pass; the portable
// ClassGapsGroupedImpl in internal/context_walk.h gives the same gaps and values. Compiled with
// -mavx2 (core/CMakeLists.txt); called only when CpuHasAvx2(). No C++ library headers here (see
// simd.h), and every helper has internal linkage, so no code built for AVX2 is shared with other
// files.
#include "internal/context_blocks_avx2.h"
#include "internal/context_walk16.h"
#include "internal/simd.h"

#if defined(__x86_64__) && defined(__AVX2__)
#include <immintrin.h>

namespace dcr::internal {

void ContextGaps16Avx2(const uint16_t* base, uint64_t n, const uint8_t* bounds, int nclasses,
                       const uint64_t* positions, const uint64_t* values, uint64_t k,
                       const uint64_t* start_of, uint64_t* gaps, uint64_t* vals) {
  Gaps16(ClassBounds256(bounds, nclasses), base, n, bounds, nclasses, positions, values, k,
         start_of, gaps, vals);
}

}  // namespace dcr::internal

#else  // no AVX2 build on this target: CpuHasAvx2() is false and this is never called

namespace dcr::internal {
void ContextGaps16Avx2(const uint16_t*, uint64_t, const uint8_t*, int, const uint64_t*,
                       const uint64_t*, uint64_t, const uint64_t*, uint64_t*, uint64_t*) {}
}  // namespace dcr::internal

#endif
