// AVX2 builds of the hot loops declared in internal/simd.h. Compiled with -mavx2 (core/CMakeLists
// .txt); called only when CpuHasAvx2(). No C++ library headers here (see simd.h).
#include "internal/simd.h"

#if defined(__x86_64__) && defined(__AVX2__)
#include <immintrin.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace dcr::internal {

void ByteDiffMasksAvx2(const uint8_t* a, const uint8_t* b, size_t nbytes, uint64_t* masks) {
  for (size_t i = 0, j = 0; i < nbytes; i += 64, ++j) {
    const __m256i a0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + i));
    const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + i));
    const __m256i a1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + i + 32));
    const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + i + 32));
    const uint64_t e0 = static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi8(a0, b0)));
    const uint64_t e1 = static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi8(a1, b1)));
    masks[j] = ~(e0 | (e1 << 32));
  }
}

void* Xxh3Avx2New() {
  XXH3_state_t* s = XXH3_createState();
  if (s != nullptr) XXH3_128bits_reset(s);
  return s;
}
void Xxh3Avx2Update(void* state, const void* data, size_t size) {
  XXH3_128bits_update(static_cast<XXH3_state_t*>(state), data, size);
}
void Xxh3Avx2Digest(void* state, uint64_t* low64, uint64_t* high64) {
  const XXH128_hash_t h = XXH3_128bits_digest(static_cast<XXH3_state_t*>(state));
  *low64 = h.low64;
  *high64 = h.high64;
}
void Xxh3Avx2Free(void* state) { XXH3_freeState(static_cast<XXH3_state_t*>(state)); }

}  // namespace dcr::internal

#else  // no AVX2 build on this target: CpuHasAvx2() is false and these are never called

namespace dcr::internal {
void ByteDiffMasksAvx2(const uint8_t* a, const uint8_t* b, size_t nbytes, uint64_t* masks) {
  ByteDiffMasks(a, b, nbytes, masks);
}
void* Xxh3Avx2New() { return nullptr; }
void Xxh3Avx2Update(void*, const void*, size_t) {}
void Xxh3Avx2Digest(void*, uint64_t* low64, uint64_t* high64) { *low64 = *high64 = 0; }
void Xxh3Avx2Free(void*) {}
}  // namespace dcr::internal

#endif
