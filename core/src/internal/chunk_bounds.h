// Bounds of a chunk record against the tensors it names, checked from its header alone, before
// anything of the record is decoded or allocated (internal). Every decoder of records that come
// from outside (appliers, receivers, `dcr inspect`, the edge relay's transcoding) checks them
// first: a record's header claims up to 2^34 elements and its streams up to 32768 times their
// stored bytes, while the elements a record really covers are those of the tensors it names.
//
// Thread safety: the functions are pure (CheckChunkBounds uses per-thread scratch).
#ifndef DCR_CORE_SRC_INTERNAL_CHUNK_BOUNDS_H_
#define DCR_CORE_SRC_INTERNAL_CHUNK_BOUNDS_H_

#include <cstddef>
#include <cstdint>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "dcr/apply.h"
#include "dcr/delta.h"
#include "dcr/status.h"
#include "dcr/statusor.h"

namespace dcr::internal {

// One tensor a chunk's segments may name: its element count and element width in bytes.
struct TensorBound {
  uint64_t num_elements = 0;
  int width = 1;
};

// The bounds of an inventory's tensors, in tensor_index order (width at least 1, as
// DeltaTensors in receivers/delta_session.h gives them).
std::vector<TensorBound> TensorBounds(const Inventory& inventory);

// Whether the segments of `h` fit the tensors: every tensor_index names one, every tensor named
// has h.elem_width, every element a segment reaches (offset + sum of (count - 1) * stride, both
// signs, computed without overflow) lies inside its tensor, and the segments of one tensor
// cover at most its element count together (a chunk's segments never overlap). Then
// h.num_elements is at most the elements of the tensors the record names, and so is every size a
// decoder takes from the header (its streams: a gaps stream at most num_changes +
// num_elements / 128 bytes, a bitmap num_elements / 8, value planes num_changes each; its
// changes; the base bits a context-coded record is decoded against).
// kDataLoss naming the chunk and what does not fit; nothing else.
Status CheckChunkBounds(const ChunkHeader& h, const TensorBound* tensors, size_t num_tensors);
inline Status CheckChunkBounds(const ChunkHeader& h, const std::vector<TensorBound>& tensors) {
  return CheckChunkBounds(h, tensors.data(), tensors.size());
}
// The same against buffers (their num_elements and width), and against an inventory's tensors
// (TensorBounds).
Status CheckChunkBounds(const ChunkHeader& h, const std::vector<TensorBuffer>& tensors);
Status CheckChunkBounds(const ChunkHeader& h, const Inventory& inventory);

// ParseChunkHeader, then CheckChunkBounds: the header of a record that may be decoded against
// `tensors`. *header_size and *record_size as ParseChunkHeader sets them (may be null).
StatusOr<ChunkHeader> ParseCheckedChunkHeader(const uint8_t* data, size_t size,
                                              const std::vector<TensorBound>& tensors,
                                              size_t* header_size = nullptr,
                                              size_t* record_size = nullptr);

// Runs fn() (returning Status) and turns an exception into a Status: std::bad_alloc into
// kResourceExhausted, any other into kInternal, each with `what` as context. For the entry points
// of worker threads and of APIs that allocate what their input asks for: no exception leaves
// them, no worker thread ends the process.
template <typename Fn>
Status NoThrow(const char* what, Fn&& fn) noexcept {
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError(std::string(what) + ": out of memory");
  } catch (const std::exception& e) {
    return InternalError(std::string(what) + ": " + e.what());
  } catch (...) {
    return InternalError(std::string(what) + ": unknown exception");
  }
}

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_INTERNAL_CHUNK_BOUNDS_H_
