// Chunk records: encoding sparse changes into streams (format.h). Decoding: chunk_decode.cc.
#include <xxhash.h>
// ZSTD_c_literalCompressionMode (PackStream) is in zstd's experimental section.
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>

#include <algorithm>
#include <cstring>

#include "dcr/delta.h"
#include "dcr/hash.h"
#include "dcr/status_macros.h"
#include "internal/byte_io.h"
#include "internal/chunk_scan.h"
#include "internal/chunk_streams.h"
#include "internal/context_codec.h"
#include "internal/context_walk.h"
#include "internal/diff_scan.h"
#include "internal/element_ops.h"
#include "internal/positions.h"
#include "internal/range_hasher.h"

namespace dcr {
namespace {

// zstd contexts are reused per thread (creation costs more than compressing a small stream).
ZSTD_CCtx* ThreadCCtx() {
  thread_local struct Holder {
    ZSTD_CCtx* c = ZSTD_createCCtx();
    ~Holder() { ZSTD_freeCCtx(c); }
  } h;
  return h.c;
}

// What a stream holds: its zstd parameters differ (format section 3).
enum class StreamKind { kPositions, kValues };

// Whether a value plane is mostly one byte (the high plane of small ulp differences: nearly all
// zeros), judged on 1024 bytes spread over it: such a plane compresses by its runs, which only the
// match finder sees.
bool MostlyOneByte(const uint8_t* data, size_t size) {
  constexpr size_t kSample = 1024;
  uint32_t count[256] = {};
  const size_t n = std::min(size, kSample);
  for (size_t i = 0; i < n; ++i) ++count[data[i * size / n]];
  return *std::max_element(count, count + 256) * 8 >= n * 7;
}

// Compresses `raw` with zstd at `level`, keeping it raw if that is not smaller. Value planes are
// near-random bytes of a skewed distribution whose repeats are coincidences: matches cost more
// bits than the Huffman literals they replace, and zstd-1's match finder spent half their
// compression time finding them. Such a plane is compressed with the fast strategy's search
// step raised to 257 bytes (targetLength 256) and its literals still Huffman-coded (zstd turns
// that off with acceleration unless told): at 3% change ~2.3x faster, ~8% smaller and ~1.7x
// faster to decompress than with minMatch 7 alone (format version 3; this is version 4). A
// plane that is mostly one byte keeps the match finder (minMatch 7, hashLog 6), whose runs make
// it ~70x smaller. Position streams keep the level's defaults (a bitmap's runs are real matches).
StreamInfo PackStream(const uint8_t* raw_data, size_t raw_size, int level,
                      std::vector<uint8_t>* out, StreamKind kind = StreamKind::kPositions) {
  StreamInfo info;
  info.raw_size = raw_size;
  if (raw_size > 0) {
    size_t bound = ZSTD_compressBound(raw_size);
    size_t start = out->size();
    out->resize(start + bound);
    ZSTD_CCtx* cctx = ThreadCCtx();
    ZSTD_CCtx_reset(cctx, ZSTD_reset_session_and_parameters);
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level);
    if (kind == StreamKind::kValues) {
      ZSTD_CCtx_setParameter(cctx, ZSTD_c_minMatch, 7);
      ZSTD_CCtx_setParameter(cctx, ZSTD_c_hashLog, 6);
      if (!MostlyOneByte(raw_data, raw_size)) {
        ZSTD_CCtx_setParameter(cctx, ZSTD_c_strategy, ZSTD_fast);
        ZSTD_CCtx_setParameter(cctx, ZSTD_c_targetLength, 256);
        ZSTD_CCtx_setParameter(cctx, ZSTD_c_literalCompressionMode, ZSTD_ps_enable);
      }
    }
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 0);
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 1);
    size_t n = ZSTD_compress2(cctx, out->data() + start, bound, raw_data, raw_size);
    if (!ZSTD_isError(n) && n < raw_size) {
      out->resize(start + n);
      info.codec = StreamCodec::kZstd;
      info.stored_size = n;
      return info;
    }
    out->resize(start);
  }
  out->insert(out->end(), raw_data, raw_data + raw_size);
  info.codec = StreamCodec::kRaw;
  info.stored_size = raw_size;
  return info;
}

// Per-thread buffers reused across chunks: fresh large allocations cost page faults on every
// chunk (glibc serves them with mmap), which showed up as ~10% of encode time.
struct EncodeScratch {
  std::vector<uint8_t> gaps, bitmap, trial_a, trial_b, payload, planes, packed_old, packed_new;
};
EncodeScratch& Scratch() {
  thread_local EncodeScratch scratch;
  return scratch;
}

uint8_t* Grow(std::vector<uint8_t>* v, size_t n) {
  if (v->size() < n) v->resize(n);
  return v->data();
}

// What one pass over a chunk's changes produces.
struct PassOut {
  bool sorted = true;    // positions strictly increasing
  uint64_t visited = 0;  // changes the segment walk reached (all of them when sorted and in range)
  Hash128 plus, minus;   // sums of ElementTerm over the new and the old bits
  size_t gaps_size = 0;
};

// Calls fn.template operator()<T, kOp>() with T the unsigned type of `width` (1/2/4/8 bytes)
// and kOp the value mode as its element_ops constant: the encoders' passes are instantiated per
// element type and mode, so the per-change body has no run-time switch.
template <typename Fn>
auto WithTypeAndOp(int width, ValueMode mode, Fn&& fn) {
  auto by_op = [&](auto tag) {
    using T = decltype(tag);
    switch (static_cast<uint8_t>(mode)) {
      case internal::kOpXor:
        return fn.template operator()<T, internal::kOpXor>();
      case internal::kOpUlpDelta:
        return fn.template operator()<T, internal::kOpUlpDelta>();
      default:
        return fn.template operator()<T, internal::kOpAbsolute>();
    }
  };
  switch (width) {
    case 1:
      return by_op(uint8_t{});
    case 2:
      return by_op(uint16_t{});
    case 4:
      return by_op(uint32_t{});
    default:
      return by_op(uint64_t{});
  }
}

// Running state of FusedPass and ScanPass: a local of the pass whose address never escapes
// (the per-change body below is always inlined), so it lives in registers.
struct PassState {
  uint64_t next = 0;      // smallest allowed next position
  uint64_t unsorted = 0;  // non-zero once a position is not above its predecessor
  uint64_t plus_lo = 0, plus_hi = 0, minus_lo = 0, minus_hi = 0;
  uint8_t* g = nullptr;  // next gap byte; null: no gaps (dense)
};

// Change i of a pass at canonical element `elem` (chunk position p) of a tensor with `salt`, old
// bits `obits` (when have_old) and new bits `nbits`: element terms, packed bits, value planes
// (plane b at planes + b * stride) and its gap.
// kScan: the scan encoder's call (positions increasing by construction, gaps always written).
template <typename T, uint8_t kOp, bool kScan = false>
__attribute__((always_inline)) inline void EmitChange(uint64_t i, uint64_t salt, uint64_t elem,
                                                      uint64_t p, bool have_old, uint64_t obits,
                                                      uint64_t nbits, uint64_t stride,
                                                      uint8_t* __restrict planes,
                                                      T* __restrict packed_old,
                                                      T* __restrict packed_new, PassState& st) {
  constexpr int kW = sizeof(T);
  const T n = static_cast<T>(nbits);
  const Hash128 tn = ElementTerm(salt, elem, nbits);
  st.plus_lo += tn.lo;
  st.plus_hi += tn.hi;
  packed_new[i] = n;
  uint64_t value;
  if (have_old) {
    const T o = static_cast<T>(obits);
    const Hash128 to = ElementTerm(salt, elem, obits);
    st.minus_lo += to.lo;
    st.minus_hi += to.hi;
    packed_old[i] = o;
    value = internal::EncodeValue(kOp, kW, o, n);
  } else {
    value = internal::EncodeValue(kOp, kW, 0, n);
  }
  for (int b = 0; b < kW; ++b) planes[b * stride + i] = static_cast<uint8_t>(value >> (8 * b));
  if (kScan || st.g != nullptr) {
    if (!kScan) st.unsorted |= static_cast<uint64_t>(p < st.next);
    uint64_t v = p - st.next;
    st.next = p + 1;
    while (v >= 0x80) {
      *st.g++ = static_cast<uint8_t>(v) | 0x80;
      v >>= 7;
    }
    *st.g++ = static_cast<uint8_t>(v);
  }
}

// Change i of the arrays of a ChunkChangesView (planes with stride k).
template <typename T, uint8_t kOp>
__attribute__((always_inline)) inline void PassChange(
    uint64_t i, uint64_t salt, uint64_t elem, uint64_t k, const uint64_t* __restrict pos,
    const uint64_t* __restrict oldp, const uint64_t* __restrict newp, uint8_t* __restrict planes,
    T* __restrict packed_old, T* __restrict packed_new, PassState& st) {
  EmitChange<T, kOp>(i, salt, elem, pos[i], oldp != nullptr, oldp != nullptr ? oldp[i] : 0, newp[i],
                     k, planes, packed_old, packed_new, st);
}

// One pass over the changes (the three arrays are read once): checks the order, sums the element
// terms, writes the varint gaps (unless `gaps` is null), the value byte planes and the packed
// old/new bits for the change hashes. T is the element type (width sizeof(T)).
template <typename T, uint8_t kOp>
PassOut FusedPass(const ChunkChangesView& c, const std::vector<uint64_t>& salts, bool have_old,
                  uint8_t* __restrict gaps, uint8_t* __restrict planes, T* __restrict packed_old,
                  T* __restrict packed_new) {
  const uint64_t k = c.num_changes;
  const std::vector<Segment>& segments = *c.segments;
  const uint64_t* __restrict pos = c.positions;
  const uint64_t* __restrict oldp = have_old ? c.old_bits : nullptr;
  const uint64_t* __restrict newp = c.new_bits;
  PassOut r;
  PassState st;
  st.g = gaps;
  uint64_t visited = 0;
  if (segments.size() == 1 && segments[0].IsContiguous()) {
    // Common case, one contiguous segment: a plain loop (no segment walk). Positions past the
    // segment are caught by the caller's range check of the last position plus the order check.
    const uint64_t salt = salts[segments[0].tensor_index];
    const uint64_t offset = segments[0].offset;
    for (uint64_t i = 0; i < k; ++i) {
      PassChange<T, kOp>(i, salt, offset + pos[i], k, pos, oldp, newp, planes, packed_old,
                         packed_new, st);
    }
    visited = k;
  } else {
    internal::ForEachPosition(segments, pos, k, [&](uint64_t i, size_t s, uint64_t elem) {
      ++visited;
      PassChange<T, kOp>(i, salts[segments[s].tensor_index], elem, k, pos, oldp, newp, planes,
                         packed_old, packed_new, st);
    });
  }
  r.sorted = st.unsorted == 0;
  r.visited = visited;
  r.plus = Hash128{st.plus_lo, st.plus_hi};
  r.minus = Hash128{st.minus_lo, st.minus_hi};
  r.gaps_size = static_cast<size_t>(st.g - gaps);
  return r;
}

// The compact header of a context-coded record (FORMAT.md section 2.2.1): every field before the
// checksums, then header_size (its own LEB128 bytes included) in front after the magic.
void SerializeCompactHeader(const ChunkHeader& h, std::vector<uint8_t>* out) {
  std::vector<uint8_t> fields;
  fields.reserve(128 + 16 * h.segments.size());
  internal::ByteWriter f(&fields);
  f.Leb(h.chunk_id);
  const uint8_t log_w = h.elem_width == 8 ? 3 : h.elem_width == 4 ? 2 : 1;
  f.U8(static_cast<uint8_t>(static_cast<uint8_t>(h.position_mode) |
                            (static_cast<uint8_t>(h.value_mode) << 4) | (log_w << 6)));
  f.Leb(h.segments.size());
  f.Leb(h.num_elements);
  f.Leb(h.num_changes);
  f.H128(h.base_change_hash);
  f.H128(h.target_change_hash);
  f.H128(h.version_delta);
  f.H128(h.target_range_hash);
  f.Leb(h.streams.empty() ? 0 : h.streams[0].stored_size);
  for (const auto& sg : h.segments) {
    f.Leb(sg.tensor_index);
    f.U8(static_cast<uint8_t>(sg.ndim));
    f.Leb(sg.offset);
    for (uint32_t d = 0; d < sg.ndim; ++d) {
      f.Leb(sg.count[d]);
      const uint64_t s = static_cast<uint64_t>(sg.stride[d]);
      f.Leb((s << 1) ^ (sg.stride[d] < 0 ? ~uint64_t{0} : 0));
    }
  }
  f.U64(h.payload_checksum);
  // header_size = magic + its own LEB128 + fields + header checksum.
  uint64_t header_size = 4 + 1 + fields.size() + 8;
  while (true) {
    uint64_t len = 1;
    for (uint64_t v = header_size; v >= 0x80; v >>= 7) ++len;
    const uint64_t want = 4 + len + fields.size() + 8;
    if (want == header_size) break;
    header_size = want;
  }
  internal::ByteWriter w(out);
  const size_t start = out->size();
  w.Raw(kContextChunkMagic, 4);
  w.Leb(header_size);
  w.Raw(fields.data(), fields.size());
  w.U64(XXH3_64bits(out->data() + start, out->size() - start));
}

void SerializeChunkHeader(const ChunkHeader& h, std::vector<uint8_t>* out) {
  if (h.compact) {
    SerializeCompactHeader(h, out);
    return;
  }
  internal::ByteWriter w(out);
  size_t start = out->size();
  w.Raw(kChunkMagic, 4);
  w.U32(0);  // header_size, patched below
  w.U64(h.chunk_id);
  w.U8(static_cast<uint8_t>(h.position_mode));
  w.U8(static_cast<uint8_t>(h.value_mode));
  w.U8(h.elem_width);
  w.U8(0);
  w.U32(static_cast<uint32_t>(h.segments.size()));
  w.U64(h.num_elements);
  w.U64(h.num_changes);
  w.H128(h.base_change_hash);
  w.H128(h.target_change_hash);
  w.H128(h.version_delta);
  w.H128(h.target_range_hash);
  w.U32(static_cast<uint32_t>(h.streams.size()));
  for (const auto& s : h.streams) {
    w.U8(static_cast<uint8_t>(s.codec));
    w.U64(s.raw_size);
    w.U64(s.stored_size);
  }
  for (const auto& sg : h.segments) {
    w.U32(sg.tensor_index);
    w.U32(sg.ndim);
    w.U64(sg.offset);
    for (uint32_t d = 0; d < sg.ndim; ++d) {
      w.U64(sg.count[d]);
      w.I64(sg.stride[d]);
    }
  }
  w.U64(h.payload_checksum);
  uint32_t header_size = static_cast<uint32_t>(out->size() - start + 8);
  std::memcpy(out->data() + start + 4, &header_size, 4);
  w.U64(XXH3_64bits(out->data() + start, out->size() - start));
}

// A chunk record: `h` (its payload checksum set here) followed by the packed streams.
std::vector<uint8_t> SealChunkRecord(ChunkHeader& h, const std::vector<uint8_t>& payload) {
  h.payload_checksum = XXH3_64bits(payload.data(), payload.size());
  std::vector<uint8_t> out;
  out.reserve(256 + payload.size());
  SerializeChunkHeader(h, &out);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

}  // namespace

ValueMode ChooseValueMode(ValuePolicy policy, DType dtype) {
  switch (policy) {
    case ValuePolicy::kXor:
      return ValueMode::kXor;
    case ValuePolicy::kUlpDelta:
      return ValueMode::kUlpDelta;
    case ValuePolicy::kAbsolute:
      return ValueMode::kAbsolute;
    case ValuePolicy::kAuto:
      break;
  }
  return DTypeIsFloat(dtype) ? ValueMode::kUlpDelta : ValueMode::kXor;
}

const char* PositionModeName(PositionMode m) {
  switch (m) {
    case PositionMode::kGaps:
      return "gaps";
    case PositionMode::kBitmap:
      return "bitmap";
    case PositionMode::kDense:
      return "dense";
    case PositionMode::kContext:
      return "context";
    case PositionMode::kContextV7:
      return "context-v7";
  }
  return "?";
}

const char* ValueModeName(ValueMode m) {
  switch (m) {
    case ValueMode::kXor:
      return "xor";
    case ValueMode::kUlpDelta:
      return "ulp";
    case ValueMode::kAbsolute:
      return "absolute";
  }
  return "?";
}

SegmentCursor::SegmentCursor(const std::vector<Segment>& segs) : segs_(segs) {}

void SegmentCursor::Locate(uint64_t pos, uint32_t* seg, uint64_t* elem) {
  if (pos < base_) {  // positions went backwards: restart
    s_ = 0;
    base_ = 0;
  }
  while (pos >= base_ + segs_[s_].num_elements()) {
    base_ += segs_[s_].num_elements();
    ++s_;
  }
  *seg = static_cast<uint32_t>(s_);
  const Segment& sg = segs_[s_];
  *elem = sg.IsContiguous() ? sg.offset + (pos - base_) : sg.ElementAt(pos - base_);
}

StatusOr<std::vector<uint8_t>> EncodeChunk(const ChunkChanges& c, ValueMode value_mode,
                                           const std::vector<uint64_t>& salts, int zstd_level) {
  const uint64_t k = c.positions.size();
  if (c.new_bits.size() != k || (value_mode != ValueMode::kAbsolute && c.old_bits.size() != k)) {
    return InvalidArgumentError("chunk changes: positions and values differ in length");
  }
  ChunkChangesView v;
  v.chunk_id = c.chunk_id;
  v.width = c.width;
  v.segments = &c.segments;
  v.num_elements = c.num_elements;
  v.num_changes = k;
  v.positions = c.positions.data();
  // Non-null marks "old bits given" even with no changes (base_change_hash of nothing is then
  // written, as for any relative chunk); an empty vector's data() may be null.
  static constexpr uint64_t kNone = 0;
  v.old_bits = c.old_bits.size() == k ? (k > 0 ? c.old_bits.data() : &kNone) : nullptr;
  v.new_bits = c.new_bits.data();
  v.target_range_hash = c.target_range_hash;
  v.dense = c.dense;
  return EncodeChunk(v, value_mode, salts, zstd_level);
}

namespace {

// What both encoders hand to FinishChunk: the pass's results over k changes.
struct PassProducts {
  uint64_t k = 0;
  bool dense = false;  // every covered element changed: no position stream
  bool have_old = false;
  const uint64_t* positions = nullptr;  // chunk positions; null: decode them from the gaps
  const uint8_t* gaps = nullptr;
  size_t gaps_size = 0;
  const uint8_t* planes = nullptr;  // plane b at planes + b * plane_stride, k bytes each
  uint64_t plane_stride = 0;
  const uint8_t* packed_old = nullptr;
  const uint8_t* packed_new = nullptr;
  Hash128 plus, minus;
  // The header's hashes are set already (a record rebuilt from decoded changes): packed bits
  // and sums unused.
  bool hashes_given = false;
};

// Packs the streams of a pass and serializes the record; `h` has the chunk's identity filled in.
std::vector<uint8_t> FinishChunk(ChunkHeader& h, const PassProducts& pp, uint64_t num_elements,
                                 int zstd_level, EncodeScratch& sc) {
  const uint64_t k = pp.k;
  const int w = h.elem_width;
  if (!pp.hashes_given) {
    h.version_delta = pp.plus;
    HashSub(&h.version_delta, pp.minus);
    // Packed little-endian bits (the packed arrays hold T values: little-endian on x86-64/arm64).
    if (pp.have_old) h.base_change_hash = BytesHash128(pp.packed_old, k * w);
    h.target_change_hash = BytesHash128(pp.packed_new, k * w);
  }

  // Position stream.
  std::vector<uint8_t>& payload = sc.payload;
  payload.clear();
  // Whether the position stream still has to be packed (not a test of the gap pointer: with no
  // changes the gap buffer of a fresh thread is empty and its data() may be null).
  bool pack_positions = !pp.dense;
  if (pp.dense) {
    h.position_mode = PositionMode::kDense;
  } else {
    const uint64_t bitmap_bytes = (num_elements + 7) / 8;
    h.position_mode = PositionMode::kGaps;
    if (pp.gaps_size * 4 > bitmap_bytes) {
      // Dense-ish: the bitmap may win; pick by compressed size (deterministic). Compressing the
      // whole bitmap only to lose (random changes up to ~40%) was half the encode time at 5%:
      // its first eighth is compressed first, and a bitmap that extrapolates to over 1.25x the
      // packed gaps is not tried further.
      uint8_t* bm = Grow(&sc.bitmap, bitmap_bytes);
      // Sets the bits of the changes below element `end` not set yet (positions from the list,
      // or from the gaps, which are well formed: this encoder wrote them), clearing the bytes
      // first: the sample needs only the bitmap's first eighth.
      uint64_t next_i = 0, p = 0, filled = 0;  // changes done, next position, bytes cleared
      size_t g = 0;
      auto fill = [&](uint64_t end_byte) {
        std::memset(bm + filled, 0, end_byte - filled);
        filled = end_byte;
        const uint64_t end = end_byte * 8;
        if (pp.positions != nullptr) {
          for (; next_i < k && pp.positions[next_i] < end; ++next_i) {
            const uint64_t q = pp.positions[next_i];
            bm[q >> 3] |= static_cast<uint8_t>(1u << (q & 7));
          }
          return;
        }
        while (next_i < k) {
          size_t at = g;
          uint64_t v = 0;
          for (int shift = 0;; shift += 7) {
            const uint8_t byte = pp.gaps[at++];
            v |= static_cast<uint64_t>(byte & 0x7F) << shift;
            if ((byte & 0x80) == 0) break;
          }
          const uint64_t q = p + v;
          if (q >= end) return;  // not consumed: the next fill starts from this gap
          g = at;
          bm[q >> 3] |= static_cast<uint8_t>(1u << (q & 7));
          p = q + 1;
          ++next_i;
        }
      };
      sc.trial_a.clear();
      sc.trial_b.clear();
      StreamInfo sa = PackStream(pp.gaps, pp.gaps_size, zstd_level, &sc.trial_a);
      const uint64_t sample = std::max<uint64_t>(uint64_t{1} << 16, bitmap_bytes / 8);
      bool try_bitmap = true;
      if (sample < bitmap_bytes) {
        fill(sample);
        const StreamInfo ss = PackStream(bm, sample, zstd_level, &sc.trial_b);
        sc.trial_b.clear();
        try_bitmap = ss.stored_size * static_cast<double>(bitmap_bytes) / sample <=
                     1.25 * static_cast<double>(sa.stored_size);
      }
      StreamInfo sb;
      if (try_bitmap) {
        fill(bitmap_bytes);
        sb = PackStream(bm, bitmap_bytes, zstd_level, &sc.trial_b);
      }
      // The winner's packed bytes are the position stream: the payload starts with them.
      const bool bitmap_wins = try_bitmap && sb.stored_size < sa.stored_size;
      if (bitmap_wins) h.position_mode = PositionMode::kBitmap;
      const std::vector<uint8_t>& won = bitmap_wins ? sc.trial_b : sc.trial_a;
      payload.insert(payload.end(), won.begin(), won.end());
      h.streams.push_back(bitmap_wins ? sb : sa);
      pack_positions = false;
    }
  }
  if (pack_positions) h.streams.push_back(PackStream(pp.gaps, pp.gaps_size, zstd_level, &payload));
  for (int b = 0; b < w; ++b) {
    h.streams.push_back(
        PackStream(pp.planes + b * pp.plane_stride, k, zstd_level, &payload, StreamKind::kValues));
  }
  return SealChunkRecord(h, payload);
}

// The scan encoder's pass over one contiguous segment: difference scan, emission and range hash
// block by block, so each block is read from memory once.
template <typename T, uint8_t kOp>
uint64_t ScanPass(const T* __restrict base, const T* __restrict target, uint64_t n, uint64_t salt,
                  uint64_t offset, bool avx2, internal::RangeHasher* rh, EncodeScratch& sc,
                  uint8_t* __restrict planes, T* __restrict packed_old, T* __restrict packed_new,
                  PassState& out, uint64_t* __restrict context_sample) {
  constexpr uint64_t kBlock = internal::kScanBlockBytes / sizeof(T);
  // The context sample of the base (internal::ContextSampleStep) is taken while each block is in
  // cache: every block starts at a multiple of the step. Four tables, so that runs of one
  // context do not wait on their own increments.
  static_assert(kBlock % internal::kContextSampleStep == 0);
  const uint64_t sample_step = internal::ContextSampleStep(n);
  uint64_t sample[4][256];
  if (context_sample != nullptr) std::memset(sample, 0, sizeof(sample));
  // A local copy whose address never escapes (the emission inlines): it lives in registers.
  PassState st = out;
  uint64_t k = 0;
  for (uint64_t b0 = 0; b0 < n; b0 += kBlock) {
    const uint64_t m = std::min(kBlock, n - b0);
    // Room for this block's gaps (at most 10 bytes per element).
    const size_t used = static_cast<size_t>(st.g - sc.gaps.data());
    st.g = Grow(&sc.gaps, used + m * 10) + used;
    const T* const a = base + b0;
    const T* const b = target + b0;
    const uint64_t elem0 = offset + b0;
    // The next block is prefetched a line of each array per change emitted and the rest while
    // this block is hashed: the scan is memory-bound, emission and hashing are not, and the
    // hardware prefetcher stops following the arrays while they run.
    const char* const next_a = reinterpret_cast<const char*>(a + m);
    const char* const next_b = reinterpret_cast<const char*>(b + m);
    const uint64_t next_bytes = std::min(kBlock, n - b0 - m) * sizeof(T);
    uint64_t fetched = 0;
    auto prefetch = [&](uint64_t bytes) __attribute__((always_inline)) {
      const uint64_t end = std::min(next_bytes, fetched + bytes);
      for (; fetched < end; fetched += 64) {
        __builtin_prefetch(next_a + fetched);
        __builtin_prefetch(next_b + fetched);
      }
    };
    internal::ForEachDifference(a, b, m, avx2, [&](uint64_t j) {
      EmitChange<T, kOp, true>(k, salt, elem0 + j, b0 + j, true, a[j], b[j], n, planes, packed_old,
                               packed_new, st);
      prefetch(64);
      ++k;
    });
    if constexpr (sizeof(T) >= 2) {
      if (context_sample != nullptr) {
        constexpr int kShift = 8 * sizeof(T) - 9;  // the context: 8 bits below the sign
        uint64_t j = 0;
        for (; j + 3 * sample_step < m; j += 4 * sample_step) {
          ++sample[0][static_cast<uint8_t>(a[j] >> kShift)];
          ++sample[1][static_cast<uint8_t>(a[j + sample_step] >> kShift)];
          ++sample[2][static_cast<uint8_t>(a[j + 2 * sample_step] >> kShift)];
          ++sample[3][static_cast<uint8_t>(a[j + 3 * sample_step] >> kShift)];
        }
        for (; j < m; j += sample_step) ++sample[0][static_cast<uint8_t>(a[j] >> kShift)];
      }
    }
    constexpr uint64_t kPiece = 2048;
    const uint64_t bytes = m * sizeof(T);
    for (uint64_t h0 = 0; h0 < bytes; h0 += kPiece) {
      rh->Update(reinterpret_cast<const char*>(b) + h0, std::min(kPiece, bytes - h0));
      prefetch(internal::kScanBlockBytes * kPiece / bytes + 64);
    }
  }
  out = st;
  if (context_sample != nullptr) {
    for (int e = 0; e < 256; ++e) {
      context_sample[e] = sample[0][e] + sample[1][e] + sample[2][e] + sample[3][e];
    }
  }
  return k;
}

}  // namespace

StatusOr<std::vector<uint8_t>> EncodeChunk(const ChunkChangesView& c, ValueMode value_mode,
                                           const std::vector<uint64_t>& salts, int zstd_level) {
  const uint64_t k = c.num_changes;
  const int w = c.width;
  if (w != 1 && w != 2 && w != 4 && w != 8)
    return InvalidArgumentError("element width must be 1/2/4/8");
  if (c.segments == nullptr || c.segments->empty())
    return InvalidArgumentError("chunk without segments");
  uint64_t covered = 0;
  for (const auto& s : *c.segments) {
    if (s.ndim < 1 || s.ndim > kMaxSegmentDims)
      return InvalidArgumentError("segment ndim out of range");
    if (s.tensor_index >= salts.size())
      return InvalidArgumentError("segment tensor index out of range");
    covered += s.num_elements();
  }
  if (covered != c.num_elements) {
    return InvalidArgumentError("chunk num_elements does not match its segments");
  }
  if ((k > 0 && (c.positions == nullptr || c.new_bits == nullptr)) ||
      (value_mode != ValueMode::kAbsolute && k > 0 && c.old_bits == nullptr)) {
    return InvalidArgumentError("chunk changes: positions and values differ in length");
  }
  if (c.dense && k != c.num_elements) {
    return InvalidArgumentError("dense chunk must list every covered element");
  }
  const bool dense = k == c.num_elements;

  ChunkHeader h;
  h.chunk_id = c.chunk_id;
  h.value_mode = value_mode;
  h.elem_width = static_cast<uint8_t>(w);
  h.num_elements = c.num_elements;
  h.num_changes = k;
  h.segments = *c.segments;
  h.target_range_hash = c.target_range_hash;

  // One pass: order check, element terms, gaps, value planes, packed bits for the hashes.
  const bool have_old = c.old_bits != nullptr;
  if (k > 0 && !dense && c.positions[k - 1] >= c.num_elements) {
    return InvalidArgumentError("chunk position beyond the covered elements");
  }
  EncodeScratch& sc = Scratch();
  uint8_t* const gaps = dense ? nullptr : Grow(&sc.gaps, k * 10);
  uint8_t* const planes = Grow(&sc.planes, k * w);
  uint8_t* const packed_old = Grow(&sc.packed_old, have_old ? k * w : 0);
  uint8_t* const packed_new = Grow(&sc.packed_new, k * w);
  const PassOut po = WithTypeAndOp(w, value_mode, [&]<typename T, uint8_t kOp>() {
    return FusedPass<T, kOp>(c, salts, have_old, gaps, planes, reinterpret_cast<T*>(packed_old),
                             reinterpret_cast<T*>(packed_new));
  });
  if (!po.sorted || po.visited != k) {
    return InvalidArgumentError("chunk positions must be strictly increasing");
  }
  if (dense) {
    for (uint64_t i = 0; i < k; ++i) {
      if (c.positions[i] != i)
        return InvalidArgumentError("chunk positions must be strictly increasing");
    }
  }
  PassProducts pp;
  pp.k = k;
  pp.dense = dense;
  pp.have_old = have_old;
  pp.positions = c.positions;
  pp.gaps = gaps;
  pp.gaps_size = po.gaps_size;
  pp.planes = planes;
  pp.plane_stride = k;
  pp.packed_old = packed_old;
  pp.packed_new = packed_new;
  pp.plus = po.plus;
  pp.minus = po.minus;
  return FinishChunk(h, pp, c.num_elements, zstd_level, sc);
}

StatusOr<std::vector<uint8_t>> EncodeChunkScan(const ChunkScanInput& in, ValueMode value_mode,
                                               const std::vector<uint64_t>& salts, int zstd_level,
                                               ChunkScanResult* result) {
  const int w = in.width;
  if (w != 1 && w != 2 && w != 4 && w != 8)
    return InvalidArgumentError("element width must be 1/2/4/8");
  if (in.segments == nullptr || in.segments->size() != 1 || !(*in.segments)[0].IsContiguous()) {
    return InvalidArgumentError("the scan encoder takes one contiguous segment");
  }
  const Segment& sg = (*in.segments)[0];
  if (sg.tensor_index >= salts.size())
    return InvalidArgumentError("segment tensor index out of range");
  const uint64_t n = sg.num_elements();
  if (n == 0 || in.base == nullptr || in.target == nullptr) {
    return InvalidArgumentError("the scan encoder needs base and target bytes");
  }
  EncodeScratch& sc = Scratch();
  uint8_t* const planes = Grow(&sc.planes, n * w);
  uint8_t* const packed_old = Grow(&sc.packed_old, n * w);
  uint8_t* const packed_new = Grow(&sc.packed_new, n * w);
  internal::RangeHasher rh(in.avx2);
  PassState st;
  st.g = Grow(&sc.gaps, 1);
  const uint64_t salt = salts[sg.tensor_index];
  const uint64_t k = WithTypeAndOp(w, value_mode, [&]<typename T, uint8_t kOp>() {
    return ScanPass<T, kOp>(
        reinterpret_cast<const T*>(in.base), reinterpret_cast<const T*>(in.target), n, salt,
        sg.offset, in.avx2, &rh, sc, planes, reinterpret_cast<T*>(packed_old),
        reinterpret_cast<T*>(packed_new), st, w >= 2 ? in.context_sample : nullptr);
  });
  result->num_changes = k;
  result->target_range_hash = rh.Digest();
  if (in.xor_counts != nullptr && w <= 2) {
    // From the packed bits the scan left for the change hashes: k values each, in cache.
    if (w == 1) {
      for (uint64_t i = 0; i < k; ++i) ++in.xor_counts[packed_old[i] ^ packed_new[i]];
    } else {
      const uint16_t* o = reinterpret_cast<const uint16_t*>(packed_old);
      const uint16_t* nw = reinterpret_cast<const uint16_t*>(packed_new);
      for (uint64_t i = 0; i < k; ++i) ++in.xor_counts[o[i] ^ nw[i]];
    }
  }
  if (k == 0 && !in.emit_unchanged) return std::vector<uint8_t>();
  if (in.positions != nullptr && in.values != nullptr) {
    // From the gap bytes and the packed bits of the scan, still in cache.
    in.positions->resize(k);
    in.values->resize(k);
    uint64_t* pos = in.positions->data();
    uint64_t* val = in.values->data();
    const uint8_t* g = sc.gaps.data();
    uint64_t next = 0;
    for (uint64_t i = 0; i < k; ++i) {
      uint64_t v = 0;
      for (int shift = 0;; shift += 7) {
        const uint8_t b = *g++;
        v |= static_cast<uint64_t>(b & 0x7F) << shift;
        if ((b & 0x80) == 0) break;
      }
      pos[i] = next + v;
      next = pos[i] + 1;
    }
    const uint8_t mode = static_cast<uint8_t>(value_mode);
    for (uint64_t i = 0; i < k; ++i) {
      val[i] = internal::EncodeValue(mode, w, internal::LoadElem(packed_old, w, i),
                                     internal::LoadElem(packed_new, w, i));
    }
    if (in.contexts != nullptr && w >= 2) {
      in.contexts->resize(k);
      uint8_t* ctx = in.contexts->data();
      for (uint64_t i = 0; i < k; ++i) ctx[i] = internal::ContextOf(packed_old, w, i);
    }
  }

  ChunkHeader h;
  h.chunk_id = in.chunk_id;
  h.value_mode = value_mode;
  h.elem_width = static_cast<uint8_t>(w);
  h.num_elements = n;
  h.num_changes = k;
  h.segments = *in.segments;
  h.target_range_hash = result->target_range_hash;
  PassProducts pp;
  pp.k = k;
  pp.dense = k == n;
  pp.have_old = true;
  pp.gaps = sc.gaps.data();
  pp.gaps_size = static_cast<size_t>(st.g - sc.gaps.data());
  pp.planes = planes;
  pp.plane_stride = n;
  pp.packed_old = packed_old;
  pp.packed_new = packed_new;
  pp.plus = Hash128{st.plus_lo, st.plus_hi};
  pp.minus = Hash128{st.minus_lo, st.minus_hi};
  return FinishChunk(h, pp, n, zstd_level, sc);
}

namespace internal {

std::vector<uint8_t> AssembleChunkRecord(ChunkHeader h,
                                         const std::vector<std::vector<uint8_t>>& raw_streams,
                                         int zstd_level) {
  std::vector<uint8_t> payload;
  h.streams.clear();
  const size_t first_value = h.position_mode == PositionMode::kDense ? 0 : 1;
  for (size_t i = 0; i < raw_streams.size(); ++i) {
    const std::vector<uint8_t>& s = raw_streams[i];
    h.streams.push_back(PackStream(s.data(), s.size(), zstd_level, &payload,
                                   i < first_value ? StreamKind::kPositions : StreamKind::kValues));
  }
  return SealChunkRecord(h, payload);
}

std::vector<uint8_t> SealRecord(ChunkHeader& h, const std::vector<uint8_t>& payload) {
  return SealChunkRecord(h, payload);
}

std::vector<uint8_t> EncodePlainRecord(ChunkHeader h, const uint64_t* positions,
                                       const uint64_t* values, int zstd_level) {
  const uint64_t k = h.num_changes;
  const int w = h.elem_width;
  EncodeScratch& sc = Scratch();
  const bool dense = k == h.num_elements;
  uint8_t* const gaps = Grow(&sc.gaps, dense ? 1 : k * 10);
  uint8_t* const planes = Grow(&sc.planes, k * w);
  uint8_t* g = gaps;
  uint64_t next = 0;
  for (uint64_t i = 0; i < k; ++i) {
    if (!dense) {
      uint64_t v = positions[i] - next;
      next = positions[i] + 1;
      while (v >= 0x80) {
        *g++ = static_cast<uint8_t>(v) | 0x80;
        v >>= 7;
      }
      *g++ = static_cast<uint8_t>(v);
    }
    for (int b = 0; b < w; ++b) planes[b * k + i] = static_cast<uint8_t>(values[i] >> (8 * b));
  }
  h.streams.clear();
  h.compact = false;
  PassProducts pp;
  pp.k = k;
  pp.dense = dense;
  pp.have_old = IsRelative(h.value_mode);
  pp.positions = positions;
  pp.gaps = gaps;
  pp.gaps_size = static_cast<size_t>(g - gaps);
  pp.planes = planes;
  pp.plane_stride = k;
  pp.hashes_given = true;
  return FinishChunk(h, pp, h.num_elements, zstd_level, sc);
}

}  // namespace internal

}  // namespace dcr
