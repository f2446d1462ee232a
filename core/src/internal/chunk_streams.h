// A chunk record between parsing and expansion: header and checksums checked, streams
// decompressed, positions and values still in their stream form (internal).
//
// DecodeChunkInto expands a whole chunk into u64 position and value arrays (DecodedChunk). The
// offline and receiver BufferApplier instead walks the streams in small batches while it patches
// (BufferApplier::ApplyRecord): at 3% change the u64 arrays were 16 bytes written and read again
// per change, more memory traffic than the patching itself. Both walk positions with the same
// PositionReader, so both accept and refuse exactly the same records.
//
// Thread safety: DecodeChunkStreams' decompressed streams live in per-thread scratch, valid until
// the next DecodeChunkStreams call on the same thread.
#ifndef DCR_CORE_SRC_INTERNAL_CHUNK_STREAMS_H_
#define DCR_CORE_SRC_INTERNAL_CHUNK_STREAMS_H_

#include <cstdint>
#include <cstring>
#include <vector>

#include "dcr/delta.h"
#include "dcr/status.h"

namespace dcr::internal {

struct ChunkStreams {
  ChunkHeader header;
  const uint8_t* positions = nullptr;  // gap varints or bitmap bytes; null for kDense
  uint64_t positions_size = 0;
  const uint8_t* planes[8] = {};  // value byte plane b (little-endian byte b), num_changes bytes
};

// Parses and checks a chunk record and decompresses its streams (pointers into `data` for raw
// streams, per-thread scratch otherwise). Also checks what the position stream allows without
// expanding it: a gap stream is exactly num_changes varints (as many bytes below 0x80, the last
// byte one of them); a bitmap has exactly num_changes bits set, none past num_elements. What is
// left for PositionReader to find is a varint over 10 bytes or a position out of range.
// kDataLoss on any inconsistency; never reads outside [data, data+size).
Status DecodeChunkStreams(const uint8_t* data, size_t size, ChunkStreams* out);
// The same for a record whose header the caller parsed: `header`, `header_size` and
// `record_size` are what ParseChunkHeader(data, size, ...) returned for these bytes; the header
// is not parsed or checksummed again (the payload checksum is checked).
Status DecodeChunkStreams(const uint8_t* data, size_t size, const ChunkHeader& header,
                          size_t header_size, size_t record_size, ChunkStreams* out);

// Expands a chunk's streams into `out` (positions checked as they are expanded); the header is
// moved into `out`.
Status ExpandChunk(ChunkStreams&& streams, DecodedChunk* out);

// A chunk record built from raw (uncompressed) streams: `header` gives identity, modes, counts,
// hashes and segments; its streams and checksums are set here (each stream zstd at `zstd_level`,
// or raw when that is not smaller). Valid checksums over whatever the streams hold: tests use it
// to build records that pass every checksum yet are inconsistent inside.
std::vector<uint8_t> AssembleChunkRecord(ChunkHeader header,
                                         const std::vector<std::vector<uint8_t>>& raw_streams,
                                         int zstd_level);

// The value of change i from the byte planes, as the element type T (1/2/4/8 bytes).
template <typename T>
__attribute__((always_inline)) inline T PlaneValue(const uint8_t* const* planes, uint64_t i) {
  if constexpr (sizeof(T) == 1) {
    return planes[0][i];
  } else if constexpr (sizeof(T) == 2) {
    return static_cast<T>(planes[0][i] | planes[1][i] << 8);
  } else {
    T v = 0;
    for (size_t b = 0; b < sizeof(T); ++b) v |= static_cast<T>(planes[b][i]) << (8 * b);
    return v;
  }
}

// Local positions of a chunk's changes, n at a time, in order. Relies on DecodeChunkStreams'
// checks (the stream holds exactly num_changes entries), so it needs no bounds checks.
class PositionReader {
 public:
  explicit PositionReader(const ChunkStreams& s)
      : mode_(s.header.position_mode),
        p_(s.positions),
        size_(s.positions_size),
        num_elements_(s.header.num_elements) {}

  // Writes the next n positions (n <= changes left) to out. Returns nullptr, or what is wrong
  // with the stream (the reader is then spent).
  __attribute__((always_inline)) const char* Next(uint64_t n, uint64_t* out) {
    switch (mode_) {
      case PositionMode::kDense:
        for (uint64_t j = 0; j < n; ++j) out[j] = next_ + j;
        next_ += n;
        return nullptr;
      case PositionMode::kGaps:
        return NextGaps(n, out);
      case PositionMode::kBitmap:
        NextBits(n, out);
        return nullptr;
      case PositionMode::kContext:
      case PositionMode::kContextV7:
        break;  // never given one: DecodeChunkStreams refuses context-coded chunks
    }
    return "unknown position mode";
  }

 private:
  // Gaps are mostly one byte from ~3% change up: sixteen stream bytes without a continuation bit
  // are sixteen gaps, taken with one test instead of two branches per change (decode+apply ~6%
  // faster at 5%). Positions increase, so the last of them is the one to check against the range:
  // the same records are accepted, with the same errors. Where the test fails (a longer gap in
  // the window, most windows at 1%) the next eight gaps are read one by one.
  __attribute__((always_inline)) const char* NextGaps(uint64_t n, uint64_t* out) {
    const uint8_t* g = p_;
    uint64_t at = at_, next = next_;  // next: the smallest position allowed next
    uint64_t j = 0;
    while (j < n) {
      uint64_t slow_end = n;
      if (j + 16 <= n && at + 16 <= size_) {
        uint64_t w[2];
        std::memcpy(w, g + at, 16);
        if (((w[0] | w[1]) & 0x8080808080808080ULL) == 0) {
          uint64_t p = next;
          for (int b = 0; b < 16; ++b) {
            p += (w[b / 8] >> (8 * (b % 8))) & 0x7F;
            out[j + b] = p++;
          }
          if (p > num_elements_) return "position out of range";
          next = p;
          at += 16;
          j += 16;
          continue;
        }
        slow_end = j + 8;
      }
      for (; j < slow_end; ++j) {
        uint64_t v = g[at++];
        if (v >= 0x80) {
          v &= 0x7F;
          int shift = 7;
          while (true) {
            const uint8_t b = g[at++];
            v |= static_cast<uint64_t>(b & 0x7F) << shift;
            if (!(b & 0x80)) break;
            shift += 7;
            if (shift > 63) return "overlong position varint";
          }
        }
        if (v >= num_elements_ - next) return "position out of range";
        next += v;
        out[j] = next;
        ++next;
      }
    }
    at_ = at;
    next_ = next;
    return nullptr;
  }

  void NextBits(uint64_t n, uint64_t* out) {
    uint64_t got = 0;
    while (got < n) {
      while (word_ == 0) {
        if (at_ + 8 <= size_) {
          std::memcpy(&word_, p_ + at_, 8);  // little-endian: bit i of the word is element i
        } else {
          word_ = p_[at_];  // no bit past num_elements (checked by DecodeChunkStreams)
          word_base_ = at_ * 8;
          at_ += 1;
          continue;
        }
        word_base_ = at_ * 8;
        at_ += 8;
      }
      out[got++] = word_base_ + static_cast<uint64_t>(__builtin_ctzll(word_));
      word_ &= word_ - 1;
    }
  }

  PositionMode mode_;
  const uint8_t* p_;
  uint64_t size_;
  uint64_t num_elements_;
  uint64_t at_ = 0;    // next stream byte
  uint64_t next_ = 0;  // dense: next position; gaps: smallest position allowed next
  uint64_t word_ = 0;  // bitmap: bits of the current word not yet returned
  uint64_t word_base_ = 0;
};

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_INTERNAL_CHUNK_STREAMS_H_
