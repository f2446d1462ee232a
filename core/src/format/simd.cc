// Portable builds and the run-time check of internal/simd.h.
#include "internal/simd.h"

#include <cstdlib>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace dcr::internal {

namespace {

// The highest level DCR_SIMD allows: "portable", "avx2", or unset (or anything else) for all.
Simd SimdCap() {
  const char* v = std::getenv("DCR_SIMD");
  if (v == nullptr) return Simd::kAvx512;
  if (std::strcmp(v, "portable") == 0) return Simd::kPortable;
  if (std::strcmp(v, "avx2") == 0) return Simd::kAvx2;
  return Simd::kAvx512;
}

Simd DetectSimd() {
#if defined(__x86_64__) && defined(DCR_HAVE_AVX2_BUILD)
  const Simd cap = SimdCap();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi") &&
                    __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("popcnt");
  if (!avx2 || cap == Simd::kPortable) return Simd::kPortable;
#if defined(DCR_HAVE_AVX512_BUILD)
  // libgcc's check includes the OS's saving of the zmm and mask registers (XCR0).
  if (cap == Simd::kAvx512 && __builtin_cpu_supports("avx512f") &&
      __builtin_cpu_supports("avx512bw")) {
    return Simd::kAvx512;
  }
#endif
  return Simd::kAvx2;
#else
  return Simd::kPortable;
#endif
}

}  // namespace

Simd CpuSimd() {
  static const Simd level = DetectSimd();
  return level;
}

bool CpuHasAvx2() { return CpuSimd() != Simd::kPortable; }

bool CpuFastPdep() {
  static const bool fast = [] {
#if defined(__x86_64__)
    if (!__builtin_cpu_supports("bmi2")) return false;
    unsigned a, b, c, d;
    if (__get_cpuid(0, &a, &b, &c, &d) == 0) return false;
    char vendor[13];
    std::memcpy(vendor, &b, 4);
    std::memcpy(vendor + 4, &d, 4);
    std::memcpy(vendor + 8, &c, 4);
    vendor[12] = 0;
    const bool amd =
        std::strcmp(vendor, "AuthenticAMD") == 0 || std::strcmp(vendor, "HygonGenuine") == 0;
    if (!amd) return true;
    if (__get_cpuid(1, &a, &b, &c, &d) == 0) return false;
    // The family: the base field, plus the extended field when the base is 0xF.
    unsigned family = (a >> 8) & 0xF;
    if (family == 0xF) family += (a >> 20) & 0xFF;
    return family >= 0x19;
#else
    return false;
#endif
  }();
  return fast;
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

size_t DiffIndexes(const uint8_t* a, const uint8_t* b, size_t nbytes, int width, uint32_t* out) {
  uint64_t masks[64];
  const uint64_t elem_bits = (uint64_t{1} << width) - 1;
  const uint32_t per = static_cast<uint32_t>(64 / width);
  size_t count = 0;
  for (size_t i0 = 0; i0 < nbytes; i0 += 64 * 64) {
    const size_t m = nbytes - i0 < 64 * 64 ? nbytes - i0 : 64 * 64;
    ByteDiffMasks(a + i0, b + i0, m, masks);
    const uint32_t base = static_cast<uint32_t>(i0 / width);
    for (size_t s = 0; s < m / 64; ++s) {
      uint64_t diff = masks[s];
      while (diff != 0) {
        const unsigned e = static_cast<unsigned>(__builtin_ctzll(diff)) / width;
        out[count++] = base + static_cast<uint32_t>(s) * per + e;
        diff &= ~(elem_bits << (e * width));
      }
    }
  }
  return count;
}

}  // namespace dcr::internal
