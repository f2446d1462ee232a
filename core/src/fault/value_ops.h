// Inverse per-element operations of the relative value modes (used to walk deltas backwards
// from a known target when composing catch-up deltas).
//
// Thread safety: pure functions.
#ifndef DCR_CORE_SRC_FAULT_VALUE_OPS_H_
#define DCR_CORE_SRC_FAULT_VALUE_OPS_H_

#include <cstdint>

#include "dcr/apply.h"
#include "dcr/format.h"

namespace dcr::internal {

inline uint64_t WidthMask(int width) {
  return width >= 8 ? ~uint64_t{0} : ((uint64_t{1} << (8 * width)) - 1);
}

// zigzag(-d) for the zigzag-coded difference `z` of a `width`-byte element (mod 2^(8w)).
inline uint64_t NegateZigzag(uint64_t z, int width) {
  const uint64_t m = WidthMask(width);
  const int n = 8 * width;
  const uint64_t d = ((z >> 1) ^ (uint64_t{0} - (z & 1))) & m;
  const uint64_t neg = (uint64_t{0} - d) & m;
  const uint64_t sign = (neg >> (n - 1)) & 1;
  return ((neg << 1) ^ (sign ? m : 0)) & m;
}

// The bits before a relative change: ApplyValue(mode, w, InverseValue(mode, w, x, v), v) == x.
// REQUIRES: IsRelative(mode).
inline uint64_t InverseValue(ValueMode mode, int width, uint64_t new_bits, uint64_t value) {
  if (mode == ValueMode::kXor) return (new_bits ^ value) & WidthMask(width);
  return ApplyValue(ValueMode::kUlpDelta, width, new_bits, NegateZigzag(value, width));
}

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_FAULT_VALUE_OPS_H_
