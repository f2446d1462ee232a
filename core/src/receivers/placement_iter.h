// Iteration over the elements of a placement box (internal).
#ifndef DCR_CORE_SRC_RECEIVERS_PLACEMENT_ITER_H_
#define DCR_CORE_SRC_RECEIVERS_PLACEMENT_ITER_H_

#include <cstdint>

#include "dcr/runtime.h"

namespace dcr {
namespace internal {

// Calls fn(canonical element, byte offset in the buffer) for every element of `p`, digits
// row-major.
template <typename Fn>
void ForEachPlaced(const Placement& p, Fn&& fn) {
  for (uint64_t a = 0; a < p.count[0]; ++a) {
    for (uint64_t b = 0; b < (p.ndim > 1 ? p.count[1] : 1); ++b) {
      for (uint64_t c = 0; c < (p.ndim > 2 ? p.count[2] : 1); ++c) {
        int64_t e = static_cast<int64_t>(p.elem_offset) + static_cast<int64_t>(a) * p.src_stride[0];
        int64_t o = static_cast<int64_t>(p.dst_offset) + static_cast<int64_t>(a) * p.dst_stride[0];
        if (p.ndim > 1) {
          e += static_cast<int64_t>(b) * p.src_stride[1];
          o += static_cast<int64_t>(b) * p.dst_stride[1];
        }
        if (p.ndim > 2) {
          e += static_cast<int64_t>(c) * p.src_stride[2];
          o += static_cast<int64_t>(c) * p.dst_stride[2];
        }
        fn(static_cast<uint64_t>(e), static_cast<uint64_t>(o));
      }
    }
  }
}

// A cached run of consecutive canonical elements (innermost dimension with source stride 1) of one
// placement: elements [lo, hi) live at base + (e - lo) * step. Empty when lo >= hi.
struct PlacementRun {
  uint64_t lo = 1, hi = 0;
  int64_t base = 0, step = 0;
  int64_t Find(uint64_t e) const { return base + static_cast<int64_t>(e - lo) * step; }
  bool Contains(uint64_t e) const { return e >= lo && e < hi; }
};

// Placement::Locate that also returns the run around `e` (for sorted positions, most lookups then
// hit the run without a division).
inline int64_t LocateWithRun(const Placement& p, uint64_t e, PlacementRun* run) {
  const int64_t off = p.Locate(e);
  if (off < 0) return off;
  const uint32_t d = p.ndim - 1;
  if (p.src_stride[d] == 1) {
    uint64_t rel = e - p.elem_offset;
    for (uint32_t k = 0; k < d; ++k) rel %= static_cast<uint64_t>(p.src_stride[k]);
    run->lo = e - rel;
    run->hi = run->lo + p.count[d];
    run->step = p.dst_stride[d];
    run->base = off - static_cast<int64_t>(rel) * run->step;
  }
  return off;
}

}  // namespace internal
}  // namespace dcr

#endif  // DCR_CORE_SRC_RECEIVERS_PLACEMENT_ITER_H_
