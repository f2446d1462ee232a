// Two-phase application of one decoded chunk over any element store (internal).
//
// Phase 1 reads the current bits of every changed element, computes the new bits with the shared
// per-element op (internal/element_ops.h) and sums the additive hash terms; the chunk is refused
// (nothing written) if the packed bits hashes (hash.h PackedBitsHash) disagree with the header's
// base_change_hash (relative payloads) or target_change_hash. The sums let the caller move its
// additive version hash by what actually changed (robust to absolute chunks applied twice or over
// partially applied ranges). Phase 2 writes. The store supplies:
//   Status Check(const Segment&)                         segment valid for this store
//   uint64_t Read(uint32_t tensor, uint64_t element)     current canonical bits
//   void Write(uint32_t tensor, uint64_t element, uint64_t bits)
//   uint64_t Salt(uint32_t tensor)
//   void OnSegment(const Segment&)                       the following changes lie in this segment
#ifndef DCR_CORE_SRC_RECEIVERS_CHUNK_APPLY_H_
#define DCR_CORE_SRC_RECEIVERS_CHUNK_APPLY_H_

#include <string>
#include <vector>

#include "dcr/delta.h"
#include "dcr/hash.h"
#include "dcr/status_macros.h"
#include "internal/element_ops.h"

namespace dcr {
namespace internal {

struct ChunkSums {
  Hash128 old_sum;  // terms of the bits before
  Hash128 new_sum;  // terms of the bits after
};

// The checks of a decoded chunk before any element is read, in this order: kDataLoss for an element
// width other than 1, 2, 4 or 8; the first error of `check_segment(segment)` (a Status: the segment
// is valid for the store), with context `id`; kDataLoss if the segments do not cover num_elements;
// kInvalidArgument if the decoded positions or values do not match the header's counts. `id` is
// "chunk <chunk_id>", the prefix of every message.
template <typename CheckSegment>
Status CheckDecodedChunk(const DecodedChunk& chunk, const std::string& id,
                         CheckSegment&& check_segment) {
  const ChunkHeader& h = chunk.header;
  const int w = h.elem_width;
  if (w != 1 && w != 2 && w != 4 && w != 8) return DataLossError(id + ": bad element width");
  uint64_t covered = 0;
  for (const Segment& sg : h.segments) {
    DCR_RETURN_IF_ERROR(check_segment(sg).WithContext(id));
    covered += sg.num_elements();
  }
  if (covered != h.num_elements) return DataLossError(id + ": segments do not cover num_elements");
  const bool dense = h.position_mode == PositionMode::kDense;
  const uint64_t k = h.num_changes;
  if ((!dense && chunk.positions.size() != k) || chunk.values.size() != k ||
      (dense && k != h.num_elements)) {
    return InvalidArgumentError(id + ": decoded chunk is inconsistent with its header");
  }
  return Status::OK();
}

template <typename Store>
StatusOr<ChunkSums> ApplyChunkTwoPhase(const DecodedChunk& chunk, Store* store) {
  const ChunkHeader& h = chunk.header;
  const int w = h.elem_width;
  const std::string id = "chunk " + std::to_string(h.chunk_id);
  DCR_RETURN_IF_ERROR(
      CheckDecodedChunk(chunk, id, [store](const Segment& sg) { return store->Check(sg); }));
  const bool dense = h.position_mode == PositionMode::kDense;
  const uint64_t k = h.num_changes;
  // Per-thread scratch reused across chunks (fresh k-sized vectors cost page faults per chunk).
  thread_local std::vector<uint32_t> tensor;
  thread_local std::vector<uint64_t> elem, obits, nbits;
  if (tensor.size() < k) {
    tensor.resize(k);
    elem.resize(k);
    obits.resize(k);
    nbits.resize(k);
  }
  SegmentCursor cursor(h.segments);
  ChunkSums sums;
  const uint8_t op = static_cast<uint8_t>(h.value_mode);
  uint32_t current = ~0u;
  for (uint64_t i = 0; i < k; ++i) {
    const uint64_t pos = dense ? i : chunk.positions[i];
    if (pos >= h.num_elements) return DataLossError(id + ": position out of range");
    uint32_t s;
    cursor.Locate(pos, &s, &elem[i]);
    if (s != current) {
      current = s;
      store->OnSegment(h.segments[s]);
    }
    tensor[i] = h.segments[s].tensor_index;
    const uint64_t salt = store->Salt(tensor[i]);
    obits[i] = store->Read(tensor[i], elem[i]);
    nbits[i] = ApplyOp(op, w, obits[i], chunk.values[i]);
    HashAdd(&sums.old_sum, ElementTerm(salt, elem[i], obits[i]));
    HashAdd(&sums.new_sum, ElementTerm(salt, elem[i], nbits[i]));
  }
  if (IsRelative(h.value_mode) && PackedBitsHash(obits.data(), k, w) != h.base_change_hash) {
    return FailedPreconditionError(id +
                                   ": current bits differ from the delta's base (wrong base, "
                                   "or the chunk was already applied); nothing written");
  }
  if (PackedBitsHash(nbits.data(), k, w) != h.target_change_hash) {
    return DataLossError(id + ": decoded values do not produce the target bits; nothing written");
  }
  SegmentCursor cursor2(h.segments);
  current = ~0u;
  for (uint64_t i = 0; i < k; ++i) {
    uint32_t s;
    uint64_t e;
    cursor2.Locate(dense ? i : chunk.positions[i], &s, &e);
    if (s != current) {
      current = s;
      store->OnSegment(h.segments[s]);
    }
    store->Write(tensor[i], elem[i], nbits[i]);
  }
  return sums;
}

// Checks that a segment stays inside a tensor of `n` elements.
inline Status CheckSegmentBounds(const Segment& sg, uint64_t n) {
  if (sg.ndim < 1 || sg.ndim > kMaxSegmentDims) return DataLossError("segment has a bad ndim");
  int64_t lo = static_cast<int64_t>(sg.offset), hi = lo;
  for (uint32_t d = 0; d < sg.ndim; ++d) {
    if (sg.count[d] == 0) return DataLossError("segment has an empty dimension");
    const int64_t span = static_cast<int64_t>(sg.count[d] - 1) * sg.stride[d];
    if (span < 0)
      lo += span;
    else
      hi += span;
  }
  if (lo < 0 || static_cast<uint64_t>(hi) >= n) return DataLossError("segment outside its tensor");
  return Status::OK();
}

}  // namespace internal
}  // namespace dcr

#endif  // DCR_CORE_SRC_RECEIVERS_CHUNK_APPLY_H_
