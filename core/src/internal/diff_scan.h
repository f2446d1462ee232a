// Finding the elements where two arrays differ (internal, header-only so the callback inlines).
// The compare runs on 64-byte steps and lists the differing elements' indexes per 16 KiB batch
// (internal/simd.h DiffIndexes: AVX2 when the CPU has it); only differing elements are visited,
// so unchanged data costs no per-element branch.
#ifndef DCR_CORE_SRC_INTERNAL_DIFF_SCAN_H_
#define DCR_CORE_SRC_INTERNAL_DIFF_SCAN_H_

#include <algorithm>
#include <cstdint>

#include "internal/simd.h"

namespace dcr::internal {

// Bytes of each array a difference scan reads per batch; encoders hash and emit a block of this
// size while the scan has just brought it into cache.
constexpr uint64_t kScanBlockBytes = 16384;

// Calls fn(j) for every j in [0, n) with a[j] != b[j], in increasing order. T is an unsigned
// integer of the element width (1, 2, 4 or 8 bytes).
template <typename T, typename Fn>
__attribute__((always_inline)) inline void ForEachDifference(const T* a, const T* b, uint64_t n,
                                                             bool avx2, Fn&& fn) {
  constexpr uint64_t kPer = 64 / sizeof(T);                 // elements per 64-byte step
  constexpr uint64_t kBatch = kScanBlockBytes / sizeof(T);  // elements per batch
  uint32_t idx[kBatch + 64];
  const uint64_t whole = n / kPer * kPer;
  for (uint64_t e0 = 0; e0 < whole; e0 += kBatch) {
    const uint64_t m = std::min(kBatch, whole - e0);
    const auto* ab = reinterpret_cast<const uint8_t*>(a + e0);
    const auto* bb = reinterpret_cast<const uint8_t*>(b + e0);
    const size_t c = avx2 ? DiffIndexesAvx2(ab, bb, m * sizeof(T), sizeof(T), idx)
                          : DiffIndexes(ab, bb, m * sizeof(T), sizeof(T), idx);
    for (size_t i = 0; i < c; ++i) fn(e0 + idx[i]);
  }
  for (uint64_t j = whole; j < n; ++j) {
    if (a[j] != b[j]) fn(j);
  }
}

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_INTERNAL_DIFF_SCAN_H_
