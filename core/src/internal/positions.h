// Walking a chunk's changes in canonical coordinates (internal, header-only so loops inline).
#ifndef DCR_CORE_SRC_INTERNAL_POSITIONS_H_
#define DCR_CORE_SRC_INTERNAL_POSITIONS_H_

#include <cstdint>
#include <vector>

#include "dcr/format.h"

namespace dcr::internal {

// Calls fn(change index i, segment index s, canonical element) for the k changes whose local
// positions are `positions` (sorted; nullptr = dense: change i is local element i), segment by
// segment. Contiguous segments take a loop without any division.
template <typename Fn>
inline void ForEachPosition(const std::vector<Segment>& segments, const uint64_t* positions,
                            uint64_t k, Fn&& fn) {
  uint64_t i = 0, seg_begin = 0;
  for (size_t s = 0; s < segments.size() && i < k; ++s) {
    const Segment& sg = segments[s];
    const uint64_t seg_end = seg_begin + sg.num_elements();
    if (sg.IsContiguous()) {
      const uint64_t base = sg.offset - seg_begin;
      if (positions == nullptr) {
        for (; i < k && i < seg_end; ++i) fn(i, s, base + i);
      } else {
        for (; i < k && positions[i] < seg_end; ++i) fn(i, s, base + positions[i]);
      }
    } else {
      for (; i < k; ++i) {
        const uint64_t p = positions == nullptr ? i : positions[i];
        if (p >= seg_end) break;
        fn(i, s, sg.ElementAt(p - seg_begin));
      }
    }
    seg_begin = seg_end;
  }
}

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_INTERNAL_POSITIONS_H_
