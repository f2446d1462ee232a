// Finding the elements where two arrays differ (internal, header-only so the callback inlines).
// The compare runs on byte-difference masks of 64-byte steps (internal/simd.h: AVX2 when the CPU
// has it); only differing elements are visited, so unchanged data costs no per-element branch.
#ifndef DCR_CORE_SRC_INTERNAL_DIFF_SCAN_H_
#define DCR_CORE_SRC_INTERNAL_DIFF_SCAN_H_

#include <algorithm>
#include <cstdint>

#include "internal/simd.h"

namespace dcr::internal {

// Calls fn(j) for every j in [0, n) with a[j] != b[j], in increasing order. T is an unsigned
// integer of the element width (1, 2, 4 or 8 bytes).
template <typename T, typename Fn>
inline void ForEachDifference(const T* a, const T* b, uint64_t n, bool avx2, Fn&& fn) {
  constexpr uint64_t kPer = 64 / sizeof(T);      // elements per 64-byte step
  constexpr uint64_t kSteps = 256;               // steps per batch of masks (16 KiB of each array)
  constexpr uint64_t kElemBits = (uint64_t{1} << sizeof(T)) - 1;
  uint64_t masks[kSteps];
  const uint64_t steps = n / kPer;
  for (uint64_t s0 = 0; s0 < steps; s0 += kSteps) {
    const uint64_t m = std::min(kSteps, steps - s0);
    const auto* ab = reinterpret_cast<const uint8_t*>(a + s0 * kPer);
    const auto* bb = reinterpret_cast<const uint8_t*>(b + s0 * kPer);
    if (avx2) {
      ByteDiffMasksAvx2(ab, bb, m * 64, masks);
    } else {
      ByteDiffMasks(ab, bb, m * 64, masks);
    }
    for (uint64_t s = 0; s < m; ++s) {
      uint64_t diff = masks[s];
      while (diff != 0) {
        const unsigned elem = static_cast<unsigned>(__builtin_ctzll(diff)) / sizeof(T);
        fn((s0 + s) * kPer + elem);
        diff &= ~(kElemBits << (elem * sizeof(T)));
      }
    }
  }
  for (uint64_t j = steps * kPer; j < n; ++j) {
    if (a[j] != b[j]) fn(j);
  }
}

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_INTERNAL_DIFF_SCAN_H_
