// The AVX-512 build of the encoder's class-local gaps of 2-byte elements (ContextGaps16Avx512 in
// internal/simd.h): Gaps16 of internal/context_walk16.h over the AVX-512 block pass, the same gaps
// and values as ContextGaps16Avx2 and the portable ClassGapsGroupedImpl. Compiled for AVX-512 BW
// (core/CMakeLists.txt); called only when CpuSimd() is kAvx512. No C++ library headers here (see
// simd.h), and every helper has internal linkage.
#include "internal/simd.h"

#if defined(__x86_64__) && defined(__AVX512BW__)
#include <immintrin.h>

#include "internal/context_blocks_avx512.h"
#include "internal/context_walk16.h"

namespace dcr::internal {

void ContextGaps16Avx512(const uint16_t* base, uint64_t n, const uint8_t* bounds, int nclasses,
                         const uint64_t* positions, const uint64_t* values, uint64_t k,
                         const uint64_t* start_of, uint64_t* gaps, uint64_t* vals) {
  Gaps16(ClassBounds512(bounds, nclasses), base, n, bounds, nclasses, positions, values, k,
         start_of, gaps, vals);
}

}  // namespace dcr::internal

#else  // no AVX-512 build on this target: CpuSimd() is below kAvx512 and this is never called

namespace dcr::internal {
void ContextGaps16Avx512(const uint16_t*, uint64_t, const uint8_t*, int, const uint64_t*,
                         const uint64_t*, uint64_t, const uint64_t*, uint64_t*, uint64_t*) {}
}  // namespace dcr::internal

#endif
