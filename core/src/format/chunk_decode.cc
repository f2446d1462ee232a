// Chunk records: parsing their headers and decoding their streams back (format.h).
#include <xxhash.h>
#include <zstd.h>

#include <cstring>

#include "dcr/delta.h"
#include "dcr/hash.h"
#include "dcr/status_macros.h"
#include "internal/byte_io.h"
#include "internal/chunk_streams.h"
#include "internal/context_codec.h"
#include "internal/positions.h"

namespace dcr {
namespace {

constexpr uint64_t kMaxChunkElements = uint64_t{1} << 34;
constexpr uint32_t kMaxSegments = 1u << 20;
constexpr uint32_t kMaxStreams = 9;

// zstd contexts are reused per thread (creation costs more than decompressing a small stream).
ZSTD_DCtx* ThreadDCtx() {
  thread_local struct Holder {
    ZSTD_DCtx* d = ZSTD_createDCtx();
    ~Holder() { ZSTD_freeDCtx(d); }
  } h;
  return h.d;
}

// The compact header of a context-coded record (magic kContextChunkMagic, read already by the
// caller): the checks of ParseChunkHeader for a context-coded record, on LEB128 fields.
StatusOr<ChunkHeader> ParseCompactHeader(const uint8_t* data, size_t size, size_t* header_size,
                                         size_t* record_size) {
  internal::ByteReader r(data, size);
  r.Skip(4);
  const uint64_t hsize = r.Leb();
  if (r.failed() || hsize < r.offset() + 16 || hsize > size) {
    return DataLossError("truncated chunk header (needs " + std::to_string(hsize) +
                         " bytes, have " + std::to_string(size) + ")");
  }
  uint64_t stored_checksum;
  std::memcpy(&stored_checksum, data + hsize - 8, 8);
  if (XXH3_64bits(data, hsize - 8) != stored_checksum)
    return DataLossError("chunk header checksum mismatch");
  // Fields end at the header checksum: a read past it is a header size mismatch.
  internal::ByteReader f(data, hsize - 8);
  f.Skip(r.offset());
  ChunkHeader h;
  h.compact = true;
  h.chunk_id = f.Leb();
  const uint8_t modes = f.U8();
  const uint64_t nseg = f.Leb();
  h.num_elements = f.Leb();
  h.num_changes = f.Leb();
  h.base_change_hash = f.H128();
  h.target_change_hash = f.H128();
  h.version_delta = f.H128();
  h.target_range_hash = f.H128();
  const uint64_t body_size = f.Leb();
  if (f.failed()) return DataLossError("truncated chunk header");
  const uint8_t pm = modes & 0x0F, vm = (modes >> 4) & 3;
  if (pm != static_cast<uint8_t>(PositionMode::kContextV7)) {
    return DataLossError("compact chunk header with position mode " + std::to_string(pm) +
                         " (only context-coded records have one)");
  }
  if (vm > 1) return DataLossError("compact chunk header with value mode " + std::to_string(vm));
  h.position_mode = static_cast<PositionMode>(pm);
  h.value_mode = static_cast<ValueMode>(vm);
  if ((modes >> 6) == 0) return DataLossError("context-coded chunk with 1-byte elements");
  h.elem_width = static_cast<uint8_t>(1u << (modes >> 6));
  if (nseg == 0 || nseg > kMaxSegments)
    return DataLossError("bad segment count " + std::to_string(nseg));
  if (h.num_elements == 0 || h.num_elements > kMaxChunkElements) {
    return DataLossError("bad chunk element count " + std::to_string(h.num_elements));
  }
  if (h.num_changes == 0 || h.num_changes >= h.num_elements) {
    return DataLossError("context-coded chunk with no change or every element changed");
  }
  if (body_size > size) return DataLossError("stream larger than the chunk");
  h.streams.assign(1, StreamInfo{StreamCodec::kRaw, body_size, body_size});
  uint64_t seg_total = 0;
  for (uint64_t i = 0; i < nseg; ++i) {
    Segment sg;
    const uint64_t tensor = f.Leb();
    sg.ndim = f.U8();
    if (f.failed()) return DataLossError("truncated chunk segments");
    if (tensor > UINT32_MAX) return DataLossError("bad segment tensor index");
    sg.tensor_index = static_cast<uint32_t>(tensor);
    if (sg.ndim < 1 || sg.ndim > kMaxSegmentDims) return DataLossError("bad segment ndim");
    sg.offset = f.Leb();
    uint64_t n = 1;
    for (uint32_t d = 0; d < sg.ndim; ++d) {
      sg.count[d] = f.Leb();
      const uint64_t z = f.Leb();
      sg.stride[d] = static_cast<int64_t>((z >> 1) ^ (~(z & 1) + 1));
      if (sg.count[d] == 0 || sg.count[d] > kMaxChunkElements)
        return DataLossError("bad segment count");
      // Checked before multiplying: two counts of 2^32 would wrap to 0 in 64 bits.
      if (sg.count[d] > kMaxChunkElements / n) return DataLossError("segment too large");
      n *= sg.count[d];
    }
    seg_total += n;
    if (f.failed()) return DataLossError("truncated chunk segments");
    h.segments.push_back(sg);
  }
  if (seg_total != h.num_elements) return DataLossError("segments do not cover num_elements");
  h.payload_checksum = f.U64();
  if (f.failed() || f.remaining() != 0) return DataLossError("chunk header size mismatch");
  if (hsize + body_size > size) {
    return DataLossError("truncated chunk: payload needs " + std::to_string(hsize + body_size) +
                         " bytes, have " + std::to_string(size));
  }
  if (header_size) *header_size = hsize;
  if (record_size) *record_size = hsize + body_size;
  return h;
}

}  // namespace

StatusOr<ChunkHeader> ParseChunkHeader(const uint8_t* data, size_t size, size_t* header_size,
                                       size_t* record_size) {
  internal::ByteReader r(data, size);
  char magic[4];
  r.Raw(magic, 4);
  if (r.failed()) return DataLossError("truncated chunk: no header");
  if (std::memcmp(magic, kContextChunkMagic, 4) == 0) {
    return ParseCompactHeader(data, size, header_size, record_size);
  }
  if (std::memcmp(magic, kChunkMagic, 4) != 0) return DataLossError("bad chunk magic");
  uint32_t hsize = r.U32();
  if (hsize < 16 || hsize > size) {
    return DataLossError("truncated chunk header (needs " + std::to_string(hsize) +
                         " bytes, have " + std::to_string(size) + ")");
  }
  uint64_t stored_checksum;
  std::memcpy(&stored_checksum, data + hsize - 8, 8);
  if (XXH3_64bits(data, hsize - 8) != stored_checksum)
    return DataLossError("chunk header checksum mismatch");
  ChunkHeader h;
  h.chunk_id = r.U64();
  uint8_t pm = r.U8(), vm = r.U8();
  h.elem_width = r.U8();
  r.U8();
  uint32_t nseg = r.U32();
  h.num_elements = r.U64();
  h.num_changes = r.U64();
  h.base_change_hash = r.H128();
  h.target_change_hash = r.H128();
  h.version_delta = r.H128();
  h.target_range_hash = r.H128();
  uint32_t nstreams = r.U32();
  if (r.failed()) return DataLossError("truncated chunk header");
  if (pm > 4) return DataLossError("unknown position mode " + std::to_string(pm));
  if (vm > 2) return DataLossError("unknown value mode " + std::to_string(vm));
  h.position_mode = static_cast<PositionMode>(pm);
  h.value_mode = static_cast<ValueMode>(vm);
  const int w = h.elem_width;
  if (w != 1 && w != 2 && w != 4 && w != 8)
    return DataLossError("bad element width " + std::to_string(w));
  if (nseg == 0 || nseg > kMaxSegments)
    return DataLossError("bad segment count " + std::to_string(nseg));
  if (h.num_elements == 0 || h.num_elements > kMaxChunkElements) {
    return DataLossError("bad chunk element count " + std::to_string(h.num_elements));
  }
  if (h.num_changes > h.num_elements) return DataLossError("more changes than covered elements");
  const bool context =
      h.position_mode == PositionMode::kContext || h.position_mode == PositionMode::kContextV7;
  if (context && (w == 1 || !IsRelative(h.value_mode) || h.num_changes == 0 ||
                  h.num_changes >= h.num_elements)) {
    return DataLossError(
        "context-coded chunk with absolute values, 1-byte elements, no change or "
        "every element changed");
  }
  uint32_t want_streams =
      context ? 1 : static_cast<uint32_t>(w) + (h.position_mode == PositionMode::kDense ? 0 : 1);
  if (nstreams != want_streams || nstreams > kMaxStreams) {
    return DataLossError("chunk has " + std::to_string(nstreams) + " streams, expected " +
                         std::to_string(want_streams));
  }
  if (h.position_mode == PositionMode::kDense && h.num_changes != h.num_elements) {
    return DataLossError("dense chunk must change every covered element");
  }
  uint64_t stored_total = 0;
  for (uint32_t i = 0; i < nstreams; ++i) {
    StreamInfo s;
    uint8_t codec = r.U8();
    s.raw_size = r.U64();
    s.stored_size = r.U64();
    if (codec > 1) return DataLossError("unknown stream codec " + std::to_string(codec));
    s.codec = static_cast<StreamCodec>(codec);
    if (s.codec == StreamCodec::kRaw && s.raw_size != s.stored_size) {
      return DataLossError("raw stream with differing sizes");
    }
    if (context && s.codec != StreamCodec::kRaw) {
      return DataLossError("context-coded chunk with a compressed stream");
    }
    if (s.stored_size > size) return DataLossError("stream larger than the chunk");
    stored_total += s.stored_size;
    h.streams.push_back(s);
  }
  uint64_t seg_total = 0;
  for (uint32_t i = 0; i < nseg; ++i) {
    Segment sg;
    sg.tensor_index = r.U32();
    sg.ndim = r.U32();
    if (sg.ndim < 1 || sg.ndim > kMaxSegmentDims) return DataLossError("bad segment ndim");
    sg.offset = r.U64();
    uint64_t n = 1;
    for (uint32_t d = 0; d < sg.ndim; ++d) {
      sg.count[d] = r.U64();
      sg.stride[d] = r.I64();
      if (sg.count[d] == 0 || sg.count[d] > kMaxChunkElements)
        return DataLossError("bad segment count");
      // Checked before multiplying: two counts of 2^32 would wrap to 0 in 64 bits.
      if (sg.count[d] > kMaxChunkElements / n) return DataLossError("segment too large");
      n *= sg.count[d];
    }
    seg_total += n;
    if (r.failed()) return DataLossError("truncated chunk segments");
    h.segments.push_back(sg);
  }
  if (seg_total != h.num_elements) return DataLossError("segments do not cover num_elements");
  h.payload_checksum = r.U64();
  if (r.failed() || r.offset() + 8 != hsize) return DataLossError("chunk header size mismatch");
  if (hsize + stored_total > size) {
    return DataLossError("truncated chunk: payload needs " + std::to_string(hsize + stored_total) +
                         " bytes, have " + std::to_string(size));
  }
  if (header_size) *header_size = hsize;
  if (record_size) *record_size = hsize + stored_total;
  return h;
}

namespace {

// Decoded raw streams, per thread, reused across chunks (no page faults from fresh buffers).
struct DecodeScratch {
  std::vector<uint8_t> raw[1 + 8];
};
DecodeScratch& DScratch() {
  thread_local DecodeScratch scratch;
  return scratch;
}

// What a position stream must satisfy before PositionReader may walk it without bounds checks.
const char* CheckPositionStream(const ChunkHeader& h, const uint8_t* p, uint64_t size) {
  const uint64_t k = h.num_changes;
  if (h.position_mode == PositionMode::kGaps) {
    // Exactly k varints: k terminating bytes (below 0x80), the last byte one of them. The bytes
    // with the continuation bit are counted 32 at a time: each 64-bit word's high bits moved to
    // the bottom of its bytes, four words summed bytewise (at most 4 per byte) and the bytes
    // added by one multiply. 1.7x faster than the byte loop g++ vectorizes into 64-bit lanes.
    constexpr uint64_t kLow = 0x0101010101010101ULL;
    uint64_t continued = 0, i = 0;
    for (; i + 32 <= size; i += 32) {
      uint64_t w[4];
      std::memcpy(w, p + i, 32);
      const uint64_t sum =
          ((w[0] >> 7) & kLow) + ((w[1] >> 7) & kLow) + ((w[2] >> 7) & kLow) + ((w[3] >> 7) & kLow);
      continued += (sum * kLow) >> 56;
    }
    for (; i < size; ++i) continued += p[i] >> 7;
    const uint64_t ends = size - continued;
    if (ends < k || (size > 0 && p[size - 1] >= 0x80)) return "truncated or bad position varint";
    if (ends > k) return "trailing bytes in the position stream";
    return nullptr;
  }
  if (h.position_mode == PositionMode::kBitmap) {
    if (size != (h.num_elements + 7) / 8) return "bitmap size mismatch";
    if ((h.num_elements & 7) != 0 && size > 0 && (p[size - 1] >> (h.num_elements & 7)) != 0) {
      return "bitmap bit beyond the covered elements";
    }
    uint64_t bits = 0, i = 0;
    for (; i + 8 <= size; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      bits += static_cast<uint64_t>(__builtin_popcountll(w));
    }
    for (; i < size; ++i) bits += static_cast<uint64_t>(__builtin_popcount(p[i]));
    if (bits != k) return "bitmap popcount differs from num_changes";
  }
  return nullptr;
}

}  // namespace

namespace internal {

Status DecodeChunkStreams(const uint8_t* data, size_t size, ChunkStreams* out) {
  size_t hsize = 0, rsize = 0;
  DCR_ASSIGN_OR_RETURN(ChunkHeader h, ParseChunkHeader(data, size, &hsize, &rsize));
  return DecodeChunkStreams(data, size, h, hsize, rsize, out);
}

Status DecodeChunkStreams(const uint8_t* data, size_t size, const ChunkHeader& header, size_t hsize,
                          size_t rsize, ChunkStreams* out) {
  (void)size;  // ParseChunkHeader checked rsize <= size
  const ChunkHeader& h = header;
  if (h.position_mode == PositionMode::kContext || h.position_mode == PositionMode::kContextV7) {
    return FailedPreconditionError("chunk " + std::to_string(h.chunk_id) +
                                   " is context-coded: it decodes only against its base bits "
                                   "(DecodeContextChunkInto, or ContextChunkToPlain first)");
  }
  const uint8_t* payload = data + hsize;
  const size_t payload_size = rsize - hsize;
  if (XXH3_64bits(payload, payload_size) != h.payload_checksum) {
    return DataLossError("chunk " + std::to_string(h.chunk_id) + ": payload checksum mismatch");
  }
  const uint64_t k = h.num_changes;
  const int w = h.elem_width;
  DecodeScratch& sc = DScratch();
  // Stream i's raw bytes: raw pointers into the payload for raw streams, scratch otherwise.
  // Value streams hold exactly one byte per change: checked before anything is allocated.
  const size_t first_value = h.position_mode == PositionMode::kDense ? 0 : 1;
  for (int b = 0; b < w; ++b) {
    if (h.streams[first_value + b].raw_size != k) {
      return DataLossError("value stream length differs from num_changes");
    }
  }
  const uint8_t* raws[1 + 8];
  size_t off = 0;
  for (size_t i = 0; i < h.streams.size(); ++i) {
    const StreamInfo& s = h.streams[i];
    const bool is_pos = h.position_mode != PositionMode::kDense && i == 0;
    // A gap g takes 1 + floor(log128 g) <= 1 + g / 128 bytes and the gaps sum to below
    // num_elements: at most k + num_elements / 128 bytes of gaps.
    uint64_t max_raw = is_pos
                           ? (h.position_mode == PositionMode::kBitmap ? (h.num_elements + 7) / 8
                                                                       : k + h.num_elements / 128)
                           : k;
    if (s.raw_size > max_raw) return DataLossError("stream raw size exceeds what the counts allow");
    if (s.codec == StreamCodec::kRaw) {
      raws[i] = payload + off;
    } else {
      // A zstd block yields at most 128 KiB and takes at least 4 bytes (an RLE block), so a frame
      // cannot expand more than 32768x: a larger claim is corrupt, refused before allocating it.
      if (s.raw_size / 32768 > s.stored_size) {
        return DataLossError("zstd stream claims " + std::to_string(s.raw_size) + " bytes from " +
                             std::to_string(s.stored_size) + " compressed");
      }
      unsigned long long fcs = ZSTD_getFrameContentSize(payload + off, s.stored_size);
      if (fcs != s.raw_size) return DataLossError("zstd frame size disagrees with the header");
      std::vector<uint8_t>& buf = sc.raw[i];
      if (buf.size() < s.raw_size) buf.resize(s.raw_size);
      size_t n =
          ZSTD_decompressDCtx(ThreadDCtx(), buf.data(), s.raw_size, payload + off, s.stored_size);
      if (ZSTD_isError(n) || n != s.raw_size) {
        return DataLossError(std::string("zstd stream: ") +
                             (ZSTD_isError(n) ? ZSTD_getErrorName(n) : "short output"));
      }
      raws[i] = buf.data();
    }
    off += s.stored_size;
  }
  out->positions = nullptr;
  out->positions_size = 0;
  if (first_value == 1) {
    out->positions = raws[0];
    out->positions_size = h.streams[0].raw_size;
    if (const char* bad = CheckPositionStream(h, out->positions, out->positions_size)) {
      return DataLossError("chunk " + std::to_string(h.chunk_id) + ": " + bad);
    }
  }
  for (int b = 0; b < 8; ++b) out->planes[b] = b < w ? raws[first_value + b] : nullptr;
  out->header = h;
  return Status::OK();
}

Status ExpandChunk(ChunkStreams&& cs, DecodedChunk* out) {
  const ChunkHeader& h = cs.header;
  const uint64_t k = h.num_changes;
  // Sized, not cleared and regrown: every entry below k is written before it is read, and a
  // clear() would zero-fill all k again on every chunk (a 1 MB memset per 4M-element chunk at 3%).
  if (h.position_mode == PositionMode::kDense) {
    out->positions.clear();
  } else {
    out->positions.resize(k);
    PositionReader reader(cs);
    if (const char* bad = reader.Next(k, out->positions.data())) {
      return DataLossError("chunk " + std::to_string(h.chunk_id) + ": " + bad);
    }
  }
  out->values.resize(k);
  uint64_t* v = out->values.data();
  switch (h.elem_width) {
    case 1:
      for (uint64_t i = 0; i < k; ++i) v[i] = PlaneValue<uint8_t>(cs.planes, i);
      break;
    case 2:
      for (uint64_t i = 0; i < k; ++i) v[i] = PlaneValue<uint16_t>(cs.planes, i);
      break;
    case 4:
      for (uint64_t i = 0; i < k; ++i) v[i] = PlaneValue<uint32_t>(cs.planes, i);
      break;
    default:
      for (uint64_t i = 0; i < k; ++i) v[i] = PlaneValue<uint64_t>(cs.planes, i);
      break;
  }
  out->header = std::move(cs.header);
  return Status::OK();
}

}  // namespace internal

Status DecodeChunkInto(const uint8_t* data, size_t size, DecodedChunk* out) {
  internal::ChunkStreams cs;
  DCR_RETURN_IF_ERROR(internal::DecodeChunkStreams(data, size, &cs));
  return internal::ExpandChunk(std::move(cs), out);
}

StatusOr<DecodedChunk> DecodeChunk(const uint8_t* data, size_t size) {
  DecodedChunk out;
  DCR_RETURN_IF_ERROR(DecodeChunkInto(data, size, &out));
  return out;
}

}  // namespace dcr
