// The scanning chunk encoder used by BuildDelta (and its tests): encodes one chunk straight from
// base and target bytes. Internal: its input carries the caller's CPU dispatch decision.
#ifndef DCR_CORE_SRC_INTERNAL_CHUNK_SCAN_H_
#define DCR_CORE_SRC_INTERNAL_CHUNK_SCAN_H_

#include <cstdint>
#include <vector>

#include "dcr/delta.h"
#include "dcr/format.h"
#include "dcr/statusor.h"

namespace dcr {

// One chunk of a single contiguous segment given as its base and target bytes (width-byte
// elements, little-endian): EncodeChunkScan finds the changes itself, emitting each while the
// scan has its block in cache (no change arrays), and hashes the covered target bytes.
struct ChunkScanInput {
  uint64_t chunk_id = 0;
  uint8_t width = 2;
  const std::vector<Segment>* segments = nullptr;  // exactly one, contiguous
  const uint8_t* base = nullptr;                   // the segment's first element in the base
  const uint8_t* target = nullptr;                 // ... and in the target
  bool avx2 = false;            // internal::CpuHasAvx2(): the caller checked it once
  bool emit_unchanged = false;  // encode a record even when nothing changed
  // The XOR histogram of the entropy statistics, or null. With width 1 or 2: 2^(8 * width)
  // counters, of which xor_counts[old ^ new] is incremented once per change; ignored for wider
  // elements.
  uint64_t* xor_counts = nullptr;
  // When not null: the changes as DecodeChunk gives them for the record (chunk positions and the
  // value mode's values, k each), for an encoder of another form of the same chunk (the
  // context-coded one) that would otherwise decode the record again.
  std::vector<uint64_t>* positions = nullptr;
  std::vector<uint64_t>* values = nullptr;
  // For the same encoder, with elements of 2 bytes or more (ignored for 1-byte ones): when not
  // null, the context (internal::ContextOf) of each change's base element, k entries (set only
  // with positions and values) ...
  std::vector<uint8_t>* contexts = nullptr;
  // ... and when not null, 256 counters set to the counts by context of the class choice's sample
  // of the base (internal::ContextSampleStep), taken while the scan has each block in cache.
  uint64_t* context_sample = nullptr;
};
struct ChunkScanResult {
  uint64_t num_changes = 0;
  Hash128 target_range_hash;  // XXH3-128 of the covered target bytes
};
// The record EncodeChunk would write for the same changes (same bytes), or an empty vector when
// nothing changed and !emit_unchanged. Any value mode (the scan always has the old bits).
StatusOr<std::vector<uint8_t>> EncodeChunkScan(const ChunkScanInput& input, ValueMode value_mode,
                                               const std::vector<uint64_t>& salts, int zstd_level,
                                               ChunkScanResult* result);

}  // namespace dcr

#endif  // DCR_CORE_SRC_INTERNAL_CHUNK_SCAN_H_
