// Inverse per-element operations of the relative value modes (used to walk deltas backwards
// from a known target when composing catch-up deltas).
//
// Thread safety: pure functions.
#ifndef DCR_CORE_SRC_RECEIVERS_VALUE_OPS_H_
#define DCR_CORE_SRC_RECEIVERS_VALUE_OPS_H_

#include <cstdint>

#include "dcr/format.h"
#include "internal/element_ops.h"

namespace dcr::internal {

// The bits before a relative change: ApplyValue(mode, w, InverseValue(mode, w, x, v), v) == x.
// REQUIRES: IsRelative(mode).
inline uint64_t InverseValue(ValueMode mode, int width, uint64_t new_bits, uint64_t value) {
  return UndoOp(static_cast<uint8_t>(mode), width, new_bits, value);
}

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_RECEIVERS_VALUE_OPS_H_
