// The context-coded chunk body (core/FORMAT.md section 2.5), internal: the pieces shared by the
// public functions of dcr/context.h, BuildDelta and the appliers.
//
// Thread safety: functions use per-thread scratch only.
#ifndef DCR_CORE_SRC_INTERNAL_CONTEXT_CODEC_H_
#define DCR_CORE_SRC_INTERNAL_CONTEXT_CODEC_H_

#include <cstdint>
#include <vector>

#include "dcr/delta.h"
#include "dcr/status.h"
#include "dcr/statusor.h"
#include "internal/simd.h"

namespace dcr::internal {

// What a scan that had the base in cache can hand the context encoder, so that it does not read
// the base for them again: each null field is computed from the base.
struct ContextHints {
  // contexts[i]: the context (ContextOf) of change i's base element.
  const uint8_t* contexts = nullptr;
  // 256 counts by context of the class choice's sample of the base (ContextSampleStep in
  // internal/context_walk.h), unscaled.
  const uint64_t* sample = nullptr;
};

// The context body of a chunk's changes: `k` sorted local positions and their values (the value
// mode's, width `w` bytes) against the base bits `base` of `n` covered elements. REQUIRES:
// w in {2, 4, 8}, positions strictly increasing and < n, 0 < k < n, hints (when given) of the
// same base and changes. At most max_classes classes (DeltaOptions::context_classes; clamped
// to 1..kMaxContextClasses).
std::vector<uint8_t> EncodeContextBody(const uint8_t* base, uint64_t n, int w,
                                       const uint64_t* positions, const uint64_t* values,
                                       uint64_t k, const ContextHints& hints = {},
                                       int max_classes = kContextClassesMax);

// The context-coded record of a plain record's changes: `h` is the plain record's header,
// positions[0..k) and values[0..k) its changes as DecodeChunk gives them (k = h.num_changes) and
// `base` the chunk's base bits. The bytes EncodeContextChunk writes for that record, without
// decoding it again or checking the base bits against it. REQUIRES: ContextCodable(h), h not
// context-coded, the changes are the record's, base holds num_elements * elem_width bytes.
std::vector<uint8_t> EncodeContextRecord(const ChunkHeader& h, const uint64_t* positions,
                                         const uint64_t* values, const uint8_t* base,
                                         const ContextHints& hints = {},
                                         int max_classes = kContextClassesMax);

// Decodes a context body against the base bits of the header's covered elements into
// positions[0..k) and values[0..k) (k = h.num_changes; the arrays hold k entries). kDataLoss for
// a malformed body; kFailedPrecondition when the base bits do not give back the encoder's
// positions. Reads only [body, body + body_size) and [base, base + n * w).
// With `sink` the changes are also handed to it as the walk places them (WalkSink in
// internal/simd.h); a kFailedPrecondition may then come after some were handed on.
Status DecodeContextBody(const ChunkHeader& h, const uint8_t* body, size_t body_size,
                         const uint8_t* base, uint64_t* positions, uint64_t* values,
                         const WalkSink* sink = nullptr);

// DecodeContextChunkInto; without `verify_hashes` the change hashes are left to the caller (an
// applier that checks them while it applies, taking the chunk back on a mismatch). With `sink`
// (REQUIRES !verify_hashes) the changes are handed to it as DecodeContextBody says, and the
// caller takes back those it applied when this fails; sink may write the base bits.
Status DecodeContextRecord(const uint8_t* record, size_t size, const uint8_t* base,
                           size_t base_size, DecodedChunk* out, bool verify_hashes,
                           const WalkSink* sink = nullptr);

// A plain chunk record of the changes (positions, values) with the identity and the four
// hashes of `h` as given (not recomputed): the bytes EncodeChunk writes for the same changes at
// `zstd_level`. REQUIRES: h is consistent with the changes; h.value_mode relative.
std::vector<uint8_t> EncodePlainRecord(ChunkHeader h, const uint64_t* positions,
                                       const uint64_t* values, int zstd_level);

// A chunk record: `h` (its payload checksum set here) followed by `payload` (its streams' stored
// bytes, which h.streams describes).
std::vector<uint8_t> SealRecord(ChunkHeader& h, const std::vector<uint8_t>& payload);

// A context-coded record: `h` (identity, value mode, counts, hashes) with position mode
// kContextV7, the compact header (version 8) and one raw stream holding `body`.
std::vector<uint8_t> SealContextRecord(ChunkHeader h, const std::vector<uint8_t>& body);

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_INTERNAL_CONTEXT_CODEC_H_
