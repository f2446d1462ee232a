// Iteration over the elements of a placement box (internal).
#ifndef DCR_CORE_SRC_RUNTIME_PLACEMENT_ITER_H_
#define DCR_CORE_SRC_RUNTIME_PLACEMENT_ITER_H_

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

}  // namespace internal
}  // namespace dcr

#endif  // DCR_CORE_SRC_RUNTIME_PLACEMENT_ITER_H_
