// AVX2 builds of the hot loops declared in internal/simd.h. Compiled with -mavx2 (core/CMakeLists
// .txt); called only when CpuHasAvx2(). No C++ library headers here (see simd.h).
#include "internal/simd.h"

#if defined(__x86_64__) && defined(__AVX2__)
#include <immintrin.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace dcr::internal {

namespace {

// One bit per element of a 64-byte block: the lowest bit of each differing element's byte group.
template <int kWidth>
inline uint64_t ElementDiffBits(const uint8_t* a, const uint8_t* b) {
  const __m256i a0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
  const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
  const __m256i a1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 32));
  const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 32));
  __m256i q0, q1;
  uint64_t low;  // the lowest byte of every element
  if constexpr (kWidth == 1) {
    q0 = _mm256_cmpeq_epi8(a0, b0), q1 = _mm256_cmpeq_epi8(a1, b1), low = ~uint64_t{0};
  } else if constexpr (kWidth == 2) {
    q0 = _mm256_cmpeq_epi16(a0, b0), q1 = _mm256_cmpeq_epi16(a1, b1);
    low = 0x5555555555555555ULL;
  } else if constexpr (kWidth == 4) {
    q0 = _mm256_cmpeq_epi32(a0, b0), q1 = _mm256_cmpeq_epi32(a1, b1);
    low = 0x1111111111111111ULL;
  } else {
    q0 = _mm256_cmpeq_epi64(a0, b0), q1 = _mm256_cmpeq_epi64(a1, b1);
    low = 0x0101010101010101ULL;
  }
  const uint64_t e0 = static_cast<uint32_t>(_mm256_movemask_epi8(q0));
  const uint64_t e1 = static_cast<uint32_t>(_mm256_movemask_epi8(q1));
  return ~(e0 | (e1 << 32)) & low;
}

template <int kWidth>
size_t DiffIndexesT(const uint8_t* a, const uint8_t* b, size_t nbytes, uint32_t* out) {
  constexpr int kShift = kWidth == 1 ? 0 : kWidth == 2 ? 1 : kWidth == 4 ? 2 : 3;
  size_t count = 0;
  for (size_t i = 0; i < nbytes; i += 64) {
    uint64_t m = ElementDiffBits<kWidth>(a + i, b + i);
    const uint32_t base = static_cast<uint32_t>(i >> kShift);
    const size_t c = static_cast<size_t>(_mm_popcnt_u64(m));
    uint32_t* o = out + count;
    // Four slots unconditionally (tzcnt of 0 is 64: a scratch value past `c`), more only when
    // the block has more differences: one well-predicted branch per block at low change rates.
    o[0] = base + static_cast<uint32_t>(_tzcnt_u64(m) >> kShift); m = _blsr_u64(m);
    o[1] = base + static_cast<uint32_t>(_tzcnt_u64(m) >> kShift); m = _blsr_u64(m);
    o[2] = base + static_cast<uint32_t>(_tzcnt_u64(m) >> kShift); m = _blsr_u64(m);
    o[3] = base + static_cast<uint32_t>(_tzcnt_u64(m) >> kShift); m = _blsr_u64(m);
    for (size_t j = 4; j < c; j += 4) {
      o[j] = base + static_cast<uint32_t>(_tzcnt_u64(m) >> kShift); m = _blsr_u64(m);
      o[j + 1] = base + static_cast<uint32_t>(_tzcnt_u64(m) >> kShift); m = _blsr_u64(m);
      o[j + 2] = base + static_cast<uint32_t>(_tzcnt_u64(m) >> kShift); m = _blsr_u64(m);
      o[j + 3] = base + static_cast<uint32_t>(_tzcnt_u64(m) >> kShift); m = _blsr_u64(m);
    }
    count += c;
  }
  return count;
}

}  // namespace

size_t DiffIndexesAvx2(const uint8_t* a, const uint8_t* b, size_t nbytes, int width, uint32_t* out) {
  switch (width) {
    case 1: return DiffIndexesT<1>(a, b, nbytes, out);
    case 2: return DiffIndexesT<2>(a, b, nbytes, out);
    case 4: return DiffIndexesT<4>(a, b, nbytes, out);
    default: return DiffIndexesT<8>(a, b, nbytes, out);
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
size_t DiffIndexesAvx2(const uint8_t* a, const uint8_t* b, size_t nbytes, int width, uint32_t* out) {
  return DiffIndexes(a, b, nbytes, width, out);
}
void* Xxh3Avx2New() { return nullptr; }
void Xxh3Avx2Update(void*, const void*, size_t) {}
void Xxh3Avx2Digest(void*, uint64_t* low64, uint64_t* high64) { *low64 = *high64 = 0; }
void Xxh3Avx2Free(void*) {}
}  // namespace dcr::internal

#endif
