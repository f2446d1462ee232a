// Context-coded chunk records (format version 8, and versions 6 and 7 read: core/FORMAT.md
// section 2.5).
//
// A context-coded chunk carries the same changes as a plain chunk record (same chunk id, segments,
// value mode, counts and the four hashes, so every proof over chunks is unchanged), but codes its
// positions and values with rANS models conditioned on the exponent of each covered element's
// base bits: changes concentrate on elements of small magnitude, and their ulp steps differ by
// exponent. Decoding therefore needs the base bits of every covered element of the chunk (a
// receiver that holds the canonical base has them; one with a converted or sharded placement
// does not, and takes the plain form: ContextChunkToPlain).
//
// Only chunks with relative values (XOR, ulp delta), elements of 2, 4 or 8 bytes and not every
// element changed have a context form (ContextCodable). Overwrite chunks (absolute values: repairs,
// retries), full frames and the deltas retained for composing stay plain.
//
// "Base bits" below are the chunk's covered elements of the base, packed in covered order
// (position 0 first), elem_width little-endian bytes each: num_elements * elem_width bytes.
// GatherCoveredBits collects them from per-tensor buffers.
//
// Thread safety: free functions are thread-safe (per-thread scratch only).
#ifndef DCR_CORE_INCLUDE_DCR_CONTEXT_H_
#define DCR_CORE_INCLUDE_DCR_CONTEXT_H_

#include <cstdint>
#include <vector>

#include "dcr/apply.h"
#include "dcr/checkpoint.h"
#include "dcr/delta.h"
#include "dcr/format.h"
#include "dcr/status.h"
#include "dcr/statusor.h"

namespace dcr {

// Whether a chunk with this header may be context-coded: relative value mode, element width 2, 4
// or 8, at least one change and not every covered element changed.
bool ContextCodable(const ChunkHeader& header);

// Whether a parsed chunk header is context-coded (position mode kContext or kContextV7).
inline bool IsContextCoded(const ChunkHeader& header) {
  return header.position_mode == PositionMode::kContext ||
         header.position_mode == PositionMode::kContextV7;
}

// OK when `classes` is a valid DeltaOptions::context_classes (1..kContextClassesMax), else
// kInvalidArgument saying so.
Status CheckContextClasses(int classes);

// The context-coded form of the plain chunk record `plain` (size bytes), given the chunk's base
// bits (`base`, base_size bytes). The result is a pure function of the record, the base bits and
// max_classes. Errors: those of DecodeChunk (kDataLoss) for the plain record; kInvalidArgument if
// it is not ContextCodable or is context-coded already, or base_size is not num_elements *
// elem_width; kFailedPrecondition if the base bits at the changed positions do not hash to the
// record's base_change_hash (the bits are not the chunk's base); kInvalidArgument for max_classes
// outside 1..kContextClassesMax (DeltaOptions::context_classes: the most exponent classes it may
// have).
StatusOr<std::vector<uint8_t>> EncodeContextChunk(const uint8_t* plain, size_t size,
                                                  const uint8_t* base, size_t base_size,
                                                  int max_classes = kContextClassesMax);

// Decodes a context-coded record against its base bits into positions and values (the value
// mode's values, as DecodeChunk gives them for a plain record), checked: the header and payload
// checksums, the body's structure (kDataLoss), then that the base bits give back the encoder's
// positions and, at them, bits that hash to base_change_hash and, with the values applied, to
// target_change_hash (kFailedPrecondition when the base bits are not the chunk's base: a wrong
// base, or the chunk already applied; kDataLoss when the target bits do not come out). Never reads
// outside [record, record + size) or [base, base + base_size). `out` may be reused; on error it
// holds unspecified contents.
Status DecodeContextChunkInto(const uint8_t* record, size_t size, const uint8_t* base,
                              size_t base_size, DecodedChunk* out);

// The plain record of a context-coded chunk record: byte for byte the record BuildDelta writes
// for the same cell without context coding at zstd level `zstd_level` (default 1, BuildDelta's
// default: DeltaOptions::zstd_level of the delta's encoder). What an edge relay forwards to
// receivers without the base, and what a manifest's plain SHA-256 is taken over. Errors: those
// of DecodeContextChunkInto; kInvalidArgument for a record that is not context-coded.
StatusOr<std::vector<uint8_t>> ContextChunkToPlain(const uint8_t* record, size_t size,
                                                   const uint8_t* base, size_t base_size,
                                                   int zstd_level = 1);

// The base bits of a chunk (header `h`) from one buffer per inventory tensor (index =
// tensor_index; TensorBuffer::data holds the tensor's current bits), into `out`. kDataLoss if a
// segment lies outside its tensor or has another element width.
Status GatherCoveredBits(const ChunkHeader& h, const std::vector<TensorBuffer>& tensors,
                         std::vector<uint8_t>* out);

// Sizes of the context-coded and plain forms of a sample of a delta's chunks.
struct ContextSizeSample {
  uint64_t cells = 0;           // grid cells of the delta
  uint64_t sampled_cells = 0;   // cells encoded for the sample
  uint64_t chunks = 0;          // sampled cells with a change (the records measured)
  uint64_t context_chunks = 0;  // of them, records whose context form is the smaller
  uint64_t elements = 0;        // elements of the sampled cells
  uint64_t changes = 0;
  uint64_t plain_bytes = 0;    // plain records of the sampled cells
  uint64_t context_bytes = 0;  // the records BuildDelta with context_coding writes for them
  uint64_t dense_bytes = 0;    // the sampled cells' target bytes
};

// A sampled context-coded record and the base bits of the elements it covers, in the order of
// its segments: what ContextChunkToPlain takes (record, base).
struct ContextSampleRecord {
  std::vector<uint8_t> record;
  std::vector<uint8_t> base;
};

// Encodes `max_cells` grid cells of the delta from `base` to `target` (evenly spaced over the
// grid, all of them when max_cells is 0 or at least the grid's size) in both forms, with
// `options` (zstd level, grid, value policy, context classes; threads for the encoding), and sums
// their sizes: what a simulator sizes a long-link payload with. With `records` non-null, also
// appends every sampled record whose context form is the smaller, with its cell's base bits
// (ascending cell order): what an edge relay would transcode. Deterministic. Errors: those of
// BuildDelta.
StatusOr<ContextSizeSample> SampleContextSize(const Checkpoint& base, const Checkpoint& target,
                                              const DeltaOptions& options, uint64_t max_cells,
                                              std::vector<ContextSampleRecord>* records = nullptr);

}  // namespace dcr

#endif  // DCR_CORE_INCLUDE_DCR_CONTEXT_H_
