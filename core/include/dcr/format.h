// The dcr delta format, version 8 (normative text: core/FORMAT.md; this comment mirrors it).
//
// All integers little-endian. A delta is a byte stream:
//
//  1. FileHeader (variable size):
//       magic "DCRDELTA" (8) | u32 format_version (5; 6 with kFlagSigned; 8 with kFlagContext; 2
//       to 4, and 6 and 7 with kFlagContext, are read too) | u32 flags
//       | u64 base_version | Hash128 base_hash (lo,hi) | u64 target_version
//       | u32 num_sections | per section: u32 kind, u32 size, size bytes
//       | u64 chunk_elems (grid option) | u64 header_checksum (XXH3-64 of all previous bytes)
//     flags bit 0: kFlagNoBase (every chunk is a full frame; base_hash is zero); bit 1 (version 6):
//     kFlagSigned (manifest records precede the chunks they list, see 2a); bit 2 (versions 7 and 8;
//     version 6 read): kFlagContext (chunks may be context-coded).
//     Sections: kFile (u32 name_size | name | the file's safetensors JSON header, verbatim), one
//     per file of the target in order (a single-file target has one, with an empty name); kIndex
//     (u32 name_size | name | the index file's bytes, verbatim), at most one. A kind with bit 31
//     set must be understood by the reader (refused otherwise); others are skipped and kept.
//     Version 8 writes each kFile and kIndex section as kZstdSection: u32 inner kind | one zstd
//     frame (content size set) of the inner section's body.
//     Versions 2 to 4 have, instead of the sections, u32 inventory_size | the target's JSON header.
//  2. Chunk records, any number, in any order (each independently decodable given the header):
//       ChunkHeader:
//         magic "DCRC" (4) | u32 header_size (bytes of this header incl. magic & checksum)
//         | u64 chunk_id | u8 position_mode | u8 value_mode | u8 elem_width | u8 reserved (0)
//         | u32 num_segments | u64 num_elements (elements covered) | u64 num_changes
//         | Hash128 base_change_hash   (XXH3-128 of the base bits at the changed positions, packed:
//                                       elem_width bytes each, little-endian, in position order)
//         | Hash128 target_change_hash (same for the target bits)
//         | Hash128 version_delta      (sum over changes of ElementTerm(target) -
//         ElementTerm(base),
//                                       two 64-bit lanes mod 2^64: how the additive content hash of
//                                       the version moves when this chunk is applied to the base)
//         | Hash128 target_range_hash  (XXH3-128 of the target bytes of all covered elements, in
//         order) | u32 num_streams | per stream: u8 stream_codec, u64 raw_size, u64 stored_size |
//         per segment: u32 tensor_index, u32 ndim (1..4), u64 offset, ndim x (u64 count, i64
//         stride) | u64 payload_checksum (XXH3-64 of the stored stream bytes, concatenated) | u64
//         header_checksum (XXH3-64 of the header bytes before this field)
//       then the streams' stored bytes back to back.
//       Version 8 context-coded records have the compact header instead (FORMAT.md section 2.2.1):
//         magic "DCRX" (4) | LEB128 header_size | LEB128 chunk_id | u8 modes (position mode in bits
//         0-3, value mode in bits 4-5, log2 elem_width in bits 6-7) | LEB128 num_segments
//         | LEB128 num_elements | LEB128 num_changes | the four Hash128 as above | LEB128 body_size
//         | per segment: LEB128 tensor_index, u8 ndim, LEB128 offset, ndim x (LEB128 count,
//           LEB128 zigzag(stride)) | u64 payload_checksum | u64 header_checksum
//       then the context body (body_size bytes): one raw stream.
//     Covered elements: the segments in order; a segment is an affine box in the canonical element
//     space of tensor `tensor_index` (position in the inventory, sorted by name): element
//     offset + sum_d digit_d * stride_d, digits row-major over counts (last dimension fastest).
//     A change position is an index into the covered elements (0 .. num_elements-1), strictly
//     increasing. All segments of a chunk have the element width elem_width.
// 2a. Manifest records (version 6, kFlagSigned), each before the chunks it lists:
//       magic "DCRM" (4) | u32 record_size (whole record) | u32 flags (bit 0 final, bit 1
//       commitment: final only) | u32 sequence
//       | u64 run_id | u64 base_version | Hash128 base_hash | u64 target_version
//       | u8[32] header_sha256 (SHA-256 of the file header bytes) | u32 num_entries
//       | per entry: u64 chunk_id | u8 forms (1 plain; 2 plain and context-coded)
//                   | u8[32] SHA-256 of the plain record | [u8[32] SHA-256 of the context form]
//       | final only: u64 num_chunks (of the delta) | Hash128 target_hash
//       | commitment only: u8[32] commitment root of the target (dcr/commitment.h, FORMAT.md 4.2)
//         | u32 num_leaves | num_leaves x u8[32] leaf digests
//       | u8[32] signer's Ed25519 public key | u8[64] Ed25519 signature of all previous bytes.
//  3. Trailer:
//       magic "DCRTABLE" (8) | u64 num_chunks | num_chunks x (u64 chunk_id, u64 offset, u64 size)
//       | Hash128 target_hash | u64 trailer_offset (offset of this trailer's magic)
//       | u64 trailer_checksum (XXH3-64 of the trailer bytes before this field) | "DCREND\0\0" (8)
//     Version 8 (kFlagContext) writes the compact trailer: magic "DCRTABLC" (8) | LEB128 num_chunks
//       | per entry: LEB128 zigzag(chunk_id - previous id), LEB128 zigzag(offset - previous end),
//         LEB128 size (previous id and end start at 0) | then as above from target_hash.
//
// Position modes: kGaps (varint LEB128 of gap-1 between sorted positions, first gap from -1),
// kBitmap (num_elements bits, LSB first), kDense (every covered element changes; no positions),
// kContext (version 6) and kContextV7 (the version-7 body, in versions 7 and 8: models may be
// geometric laws or repeats): one raw stream, the context body of FORMAT.md section 2.5: positions
// and values rANS-coded per class of base exponents; decodable only with the base bits of every
// covered element: dcr/context.h. Value modes: kXor (bits ^ base), kUlpDelta (zigzag(ord(new) -
// ord(old)) mod 2^(8w), ord = the order-preserving integer map of sign-magnitude floats; identity
// for integers), kAbsolute (new bits). Streams: [positions (absent for kDense)] then elem_width
// value byte planes (byte 0 = least significant). Stream codecs: kRaw (stored bytes = raw bytes),
// kZstd (one zstd frame, level in options). Released enum values are pinned.
//
// Thread safety: plain data.
#ifndef DCR_CORE_INCLUDE_DCR_FORMAT_H_
#define DCR_CORE_INCLUDE_DCR_FORMAT_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "dcr/checkpoint.h"

namespace dcr {

// The newest version this build reads and writes. An encoder writes version 8 for a delta with
// context-coded chunks (kFlagContext: zstd header sections, compact context records of position
// mode kContextV7 and the compact trailer), version 6 for one with manifest records (kFlagSigned)
// and no context-coded chunks, and any other delta as version 5, byte for byte
// (kPlainFormatVersion). Version 6 and 7 deltas with context-coded chunks (position modes kContext
// and kContextV7 in "DCRC" records) are read as well.
inline constexpr uint32_t kFormatVersion = 8;
inline constexpr uint32_t kPlainFormatVersion = 5;
// The oldest version this build reads (versions 2 to 4 are read as version 5's: core/FORMAT.md
// section 5).
inline constexpr uint32_t kOldestReadableFormatVersion = 2;
inline constexpr char kFileMagic[8] = {'D', 'C', 'R', 'D', 'E', 'L', 'T', 'A'};
inline constexpr char kChunkMagic[4] = {'D', 'C', 'R', 'C'};
// Version 8: a context-coded chunk record with the compact header.
inline constexpr char kContextChunkMagic[4] = {'D', 'C', 'R', 'X'};
inline constexpr char kTrailerMagic[8] = {'D', 'C', 'R', 'T', 'A', 'B', 'L', 'E'};
// Version 8: the trailer with LEB128 table entries.
inline constexpr char kCompactTrailerMagic[8] = {'D', 'C', 'R', 'T', 'A', 'B', 'L', 'C'};
inline constexpr char kEndMagic[8] = {'D', 'C', 'R', 'E', 'N', 'D', '\0', '\0'};
inline constexpr uint32_t kFlagNoBase = 1u << 0;
// Version 6: the stream carries signed manifest records (dcr/manifest.h) before its chunks.
inline constexpr uint32_t kFlagSigned = 1u << 1;
// Versions 6 to 8: chunks may be context-coded (position modes kContext, kContextV7;
// dcr/context.h).
inline constexpr uint32_t kFlagContext = 1u << 2;
inline constexpr char kManifestMagic[4] = {'D', 'C', 'R', 'M'};
inline constexpr uint32_t kMaxSegmentDims = 4;
// Header section kinds (version 5). Bit 31: a reader that does not know the kind must refuse.
inline constexpr uint32_t kSectionCritical = 1u << 31;
inline constexpr uint32_t kSectionFile = kSectionCritical | 1;
inline constexpr uint32_t kSectionIndex = kSectionCritical | 2;
// Version 8: u32 inner kind (kSectionFile or kSectionIndex) | a zstd frame of that section's body.
inline constexpr uint32_t kSectionZstd = kSectionCritical | 3;

// kContext (version 6) and kContextV7 (the version-7 body; version 8 writes it in the compact
// "DCRX" record): positions and values coded against the base exponents in one stream
// (dcr/context.h); the two differ in how the body describes its models.
enum class PositionMode : uint8_t {
  kGaps = 0,
  kBitmap = 1,
  kDense = 2,
  kContext = 3,
  kContextV7 = 4
};
enum class ValueMode : uint8_t { kXor = 0, kUlpDelta = 1, kAbsolute = 2 };
enum class StreamCodec : uint8_t { kRaw = 0, kZstd = 1 };

const char* PositionModeName(PositionMode m);
const char* ValueModeName(ValueMode m);

// True for modes whose decoded values depend on the receiver's current bits (XOR, ulp delta).
inline bool IsRelative(ValueMode m) { return m != ValueMode::kAbsolute; }

struct Segment {
  uint32_t tensor_index = 0;
  uint32_t ndim = 1;
  uint64_t offset = 0;
  std::array<uint64_t, kMaxSegmentDims> count{};
  std::array<int64_t, kMaxSegmentDims> stride{};

  uint64_t num_elements() const {
    uint64_t n = 1;
    for (uint32_t d = 0; d < ndim; ++d) n *= count[d];
    return n;
  }
  // A contiguous 1-D range [begin, begin+n).
  static Segment Range(uint32_t tensor, uint64_t begin, uint64_t n) {
    Segment s;
    s.tensor_index = tensor;
    s.ndim = 1;
    s.offset = begin;
    s.count[0] = n;
    s.stride[0] = 1;
    return s;
  }
  bool IsContiguous() const { return ndim == 1 && stride[0] == 1; }
  // Canonical element index of the segment's local element `i` (REQUIRES: i < num_elements()).
  uint64_t ElementAt(uint64_t i) const {
    uint64_t e = offset;
    for (int d = static_cast<int>(ndim) - 1; d >= 0; --d) {
      uint64_t c = count[d];
      e += static_cast<uint64_t>(static_cast<int64_t>(i % c) * stride[d]);
      i /= c;
    }
    return e;
  }
};

struct StreamInfo {
  StreamCodec codec = StreamCodec::kRaw;
  uint64_t raw_size = 0;
  uint64_t stored_size = 0;
};

struct ChunkHeader {
  uint64_t chunk_id = 0;
  PositionMode position_mode = PositionMode::kGaps;
  ValueMode value_mode = ValueMode::kXor;
  uint8_t elem_width = 2;
  uint64_t num_elements = 0;
  uint64_t num_changes = 0;
  Hash128 base_change_hash;    // PackedBitsHash of the base bits at the changed positions
  Hash128 target_change_hash;  // PackedBitsHash of the target bits at the changed positions
  Hash128 version_delta;       // additive content-hash change (hash.h) of applying to the base
  Hash128 target_range_hash;   // BytesHash128 of the target bytes of all covered elements
  std::vector<StreamInfo> streams;
  std::vector<Segment> segments;
  uint64_t payload_checksum = 0;
  // The record has the compact header (magic kContextChunkMagic; context-coded records only).
  bool compact = false;
};

// One file of the target checkpoint as a delta header names it.
struct TargetFile {
  std::string name;    // file name in the checkpoint directory; empty for a single-file target
  std::string header;  // its safetensors JSON header bytes (without the length prefix)
  bool operator==(const TargetFile& o) const { return name == o.name && header == o.header; }
  bool operator!=(const TargetFile& o) const { return !(*this == o); }
};

// A header section this build does not interpret (not critical): skipped, kept verbatim.
struct HeaderSection {
  uint32_t kind = 0;
  std::string bytes;
};

struct FileHeader {
  uint32_t format_version = kFormatVersion;
  uint32_t flags = 0;
  uint64_t base_version = 0;
  Hash128 base_hash;
  uint64_t target_version = 0;
  std::vector<TargetFile> files;  // the target's files, at least one
  std::string index_name;         // the target's index file; empty: none
  std::string index;              // its bytes
  std::vector<HeaderSection> other_sections;
  uint64_t chunk_elems = 0;

  // A single-file target whose safetensors JSON header is `json`.
  void SetSingleFile(std::string json) {
    files.assign(1, TargetFile{std::string(), std::move(json)});
    index_name.clear();
    index.clear();
  }
  // Whether two headers describe the same target layout (files, headers, index).
  bool SameTarget(const FileHeader& o) const {
    return files == o.files && index_name == o.index_name && index == o.index;
  }
  // True when the target is a directory of shards.
  bool sharded() const { return files.size() != 1 || !files[0].name.empty(); }
};

struct ChunkTableEntry {
  uint64_t chunk_id = 0;
  uint64_t offset = 0;  // from the start of the delta stream
  uint64_t size = 0;    // whole record: header + streams
};

struct Trailer {
  std::vector<ChunkTableEntry> chunks;
  Hash128 target_hash;
  // Serialized as the compact trailer (magic kCompactTrailerMagic; version 8).
  bool compact = false;
};

}  // namespace dcr

#endif  // DCR_CORE_INCLUDE_DCR_FORMAT_H_
