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
    o[0] = base + static_cast<uint32_t>(_tzcnt_u64(m) >> kShift);
    m = _blsr_u64(m);
    o[1] = base + static_cast<uint32_t>(_tzcnt_u64(m) >> kShift);
    m = _blsr_u64(m);
    o[2] = base + static_cast<uint32_t>(_tzcnt_u64(m) >> kShift);
    m = _blsr_u64(m);
    o[3] = base + static_cast<uint32_t>(_tzcnt_u64(m) >> kShift);
    m = _blsr_u64(m);
    for (size_t j = 4; j < c; j += 4) {
      o[j] = base + static_cast<uint32_t>(_tzcnt_u64(m) >> kShift);
      m = _blsr_u64(m);
      o[j + 1] = base + static_cast<uint32_t>(_tzcnt_u64(m) >> kShift);
      m = _blsr_u64(m);
      o[j + 2] = base + static_cast<uint32_t>(_tzcnt_u64(m) >> kShift);
      m = _blsr_u64(m);
      o[j + 3] = base + static_cast<uint32_t>(_tzcnt_u64(m) >> kShift);
      m = _blsr_u64(m);
    }
    count += c;
  }
  return count;
}

}  // namespace

size_t DiffIndexesAvx2(const uint8_t* a, const uint8_t* b, size_t nbytes, int width,
                       uint32_t* out) {
  switch (width) {
    case 1:
      return DiffIndexesT<1>(a, b, nbytes, out);
    case 2:
      return DiffIndexesT<2>(a, b, nbytes, out);
    case 4:
      return DiffIndexesT<4>(a, b, nbytes, out);
    default:
      return DiffIndexesT<8>(a, b, nbytes, out);
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

namespace {

// lo ^ hi of the 128-bit products x * b of four 64-bit lanes, from 32x32->64-bit products;
// b_hi = b >> 32 per lane.
inline __m256i MulFold(__m256i x, __m256i b, __m256i b_hi) {
  const __m256i m32 = _mm256_set1_epi64x(0xFFFFFFFFLL);
  const __m256i x_hi = _mm256_srli_epi64(x, 32);
  const __m256i ll = _mm256_mul_epu32(x, b);
  const __m256i lh = _mm256_mul_epu32(x, b_hi);
  const __m256i hl = _mm256_mul_epu32(x_hi, b);
  const __m256i hh = _mm256_mul_epu32(x_hi, b_hi);
  const __m256i mid =
      _mm256_add_epi64(_mm256_add_epi64(_mm256_srli_epi64(ll, 32), _mm256_and_si256(lh, m32)),
                       _mm256_and_si256(hl, m32));
  const __m256i lo = _mm256_or_si256(_mm256_and_si256(ll, m32), _mm256_slli_epi64(mid, 32));
  const __m256i hi =
      _mm256_add_epi64(_mm256_add_epi64(hh, _mm256_srli_epi64(lh, 32)),
                       _mm256_add_epi64(_mm256_srli_epi64(hl, 32), _mm256_srli_epi64(mid, 32)));
  return _mm256_xor_si256(lo, hi);
}

// Four elements [i, i + 4) zero-extended to 64-bit lanes.
template <int kWidth>
inline __m256i LoadFour(const uint8_t* data, uint64_t i) {
  if constexpr (kWidth == 1) {
    int32_t v;
    __builtin_memcpy(&v, data + i, 4);
    return _mm256_cvtepu8_epi64(_mm_cvtsi32_si128(v));
  } else if constexpr (kWidth == 2) {
    return _mm256_cvtepu16_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(data + 2 * i)));
  } else {
    return _mm256_cvtepu32_epi64(_mm_loadu_si128(reinterpret_cast<const __m128i*>(data + 4 * i)));
  }
}

// One element's term (hash.h ElementTerm) added to the two lane sums, with scalar 64x64->128-bit
// products; `k` is salt ^ (index * kG).
inline void AddScalarTerm(uint64_t k, uint64_t v, uint64_t* a, uint64_t* b) {
  constexpr uint64_t kKeyA = 0xA0761D6478BD642FULL, kBitsA = 0xE7037ED1A0B428DBULL;
  constexpr uint64_t kKeyB = 0x8EBC6AF09C88C6E3ULL, kBitsB = 0x589965CC75374CC3ULL;
  const unsigned __int128 pa = static_cast<unsigned __int128>(k ^ kKeyA) * (v ^ kBitsA);
  const unsigned __int128 pb = static_cast<unsigned __int128>(k ^ kKeyB) * (v ^ kBitsB);
  *a += static_cast<uint64_t>(pa) ^ static_cast<uint64_t>(pa >> 64);
  *b += static_cast<uint64_t>(pb) ^ static_cast<uint64_t>(pb >> 64);
}

template <int kWidth>
void TermSum(uint64_t salt, const uint8_t* data, uint64_t begin, uint64_t count, uint64_t* lo,
             uint64_t* hi) {
  // hash.h ElementTerm, six elements per step: four in AVX2 lanes and two with scalar products,
  // which run on the integer multiplier beside the vector one (on AMD Zen, 1.47x the AVX2 lanes
  // alone and 1.25x scalar alone). Element bits are below 2^32 for these widths, so the high half
  // of (bits ^ Kb) is Kb's and its 32-bit products need no per-element split. The sum is the same
  // however the elements are split between the two.
  constexpr uint64_t kG = 0x9E3779B97F4A7C15ULL;
  constexpr uint64_t kKeyA = 0xA0761D6478BD642FULL, kBitsA = 0xE7037ED1A0B428DBULL;
  constexpr uint64_t kKeyB = 0x8EBC6AF09C88C6E3ULL, kBitsB = 0x589965CC75374CC3ULL;
  constexpr uint64_t kStep = 6;
  const __m256i key_a = _mm256_set1_epi64x(static_cast<long long>(salt ^ kKeyA));
  const __m256i key_b = _mm256_set1_epi64x(static_cast<long long>(salt ^ kKeyB));
  const __m256i bits_a = _mm256_set1_epi64x(static_cast<long long>(kBitsA));
  const __m256i bits_b = _mm256_set1_epi64x(static_cast<long long>(kBitsB));
  const __m256i bits_a_hi = _mm256_set1_epi64x(static_cast<long long>(kBitsA >> 32));
  const __m256i bits_b_hi = _mm256_set1_epi64x(static_cast<long long>(kBitsB >> 32));
  __m256i idx = _mm256_set_epi64x(
      static_cast<long long>((begin + 3) * kG), static_cast<long long>((begin + 2) * kG),
      static_cast<long long>((begin + 1) * kG), static_cast<long long>(begin * kG));
  const __m256i step = _mm256_set1_epi64x(static_cast<long long>(kStep * kG));
  __m256i acc_a = _mm256_setzero_si256(), acc_b = _mm256_setzero_si256();
  uint64_t sum_a = 0, sum_b = 0, sum_a2 = 0, sum_b2 = 0;
  uint64_t k4 = (begin + 4) * kG;  // index * kG of the step's first scalar element
  const uint64_t end = begin + count;
  uint64_t i = begin;
  for (; i + kStep <= end; i += kStep) {
    const __m256i v = LoadFour<kWidth>(data, i);
    acc_a = _mm256_add_epi64(
        acc_a, MulFold(_mm256_xor_si256(key_a, idx), _mm256_xor_si256(v, bits_a), bits_a_hi));
    acc_b = _mm256_add_epi64(
        acc_b, MulFold(_mm256_xor_si256(key_b, idx), _mm256_xor_si256(v, bits_b), bits_b_hi));
    idx = _mm256_add_epi64(idx, step);
    uint64_t v4 = 0, v5 = 0;
    __builtin_memcpy(&v4, data + kWidth * (i + 4), kWidth);
    __builtin_memcpy(&v5, data + kWidth * (i + 5), kWidth);
    AddScalarTerm(salt ^ k4, v4, &sum_a, &sum_b);
    AddScalarTerm(salt ^ (k4 + kG), v5, &sum_a2, &sum_b2);
    k4 += kStep * kG;
  }
  alignas(32) uint64_t a[4], b[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(a), acc_a);
  _mm256_store_si256(reinterpret_cast<__m256i*>(b), acc_b);
  sum_a += sum_a2 + a[0] + a[1] + a[2] + a[3];
  sum_b += sum_b2 + b[0] + b[1] + b[2] + b[3];
  for (; i < end; ++i) {  // the last 0-5 elements, one at a time
    uint64_t v = 0;
    __builtin_memcpy(&v, data + kWidth * i, kWidth);
    AddScalarTerm(salt ^ (i * kG), v, &sum_a, &sum_b);
  }
  *lo = sum_a;
  *hi = sum_b;
}

}  // namespace

void ElementTermSumAvx2(uint64_t salt, const uint8_t* data, int width, uint64_t begin,
                        uint64_t count, uint64_t* lo, uint64_t* hi) {
  switch (width) {
    case 1:
      TermSum<1>(salt, data, begin, count, lo, hi);
      break;
    case 2:
      TermSum<2>(salt, data, begin, count, lo, hi);
      break;
    default:
      TermSum<4>(salt, data, begin, count, lo, hi);
      break;
  }
}

}  // namespace dcr::internal

#else  // no AVX2 build on this target: CpuHasAvx2() is false and these are never called

namespace dcr::internal {
size_t DiffIndexesAvx2(const uint8_t* a, const uint8_t* b, size_t nbytes, int width,
                       uint32_t* out) {
  return DiffIndexes(a, b, nbytes, width, out);
}
void* Xxh3Avx2New() { return nullptr; }
void Xxh3Avx2Update(void*, const void*, size_t) {}
void Xxh3Avx2Digest(void*, uint64_t* low64, uint64_t* high64) { *low64 = *high64 = 0; }
void Xxh3Avx2Free(void*) {}
void ElementTermSumAvx2(uint64_t, const uint8_t*, int, uint64_t, uint64_t, uint64_t* lo,
                        uint64_t* hi) {
  *lo = *hi = 0;
}
}  // namespace dcr::internal

#endif
