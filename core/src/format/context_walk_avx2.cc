// The AVX2 build of the class walk of context-coded chunks of 2-byte elements (ContextWalk16Avx2
// in internal/simd.h; the portable walk is WalkClassesImpl in internal/context_walk.h, and both
// give the same positions and values). Compiled with -mavx2 (core/CMakeLists.txt); called only
// when CpuHasAvx2(). No C++ library headers here (see simd.h), and every helper has internal
// linkage, so no code built for AVX2 is shared with other files.
#include "internal/context_blocks_avx2.h"
#include "internal/simd.h"

#if defined(__x86_64__) && defined(__AVX2__)
#include <immintrin.h>

namespace dcr::internal {

namespace {

constexpr int kClasses = 16;
constexpr uint64_t kBlocks = 64;  // blocks of 64 elements per window
// before[][] of blocks past a window's end: above any rank (ranks within a window are < 4096),
// and positive as a signed 16-bit value, so that one signed compare orders it.
constexpr int16_t kPastEnd = 0x7FFF;

// select_in_byte[r][v]: the index of the r-th set bit of byte v (8 when v has fewer).
struct SelectTable {
  uint8_t at[8][256];
};
constexpr SelectTable MakeSelectTable() {
  SelectTable t{};
  for (int v = 0; v < 256; ++v) {
    int r = 0;
    for (int i = 0; i < 8; ++i) {
      if ((v >> i) & 1) t.at[r++][v] = static_cast<uint8_t>(i);
    }
    for (; r < 8; ++r) t.at[r][v] = 8;
  }
  return t;
}
constexpr SelectTable kSelectInByte = MakeSelectTable();

// The index of the r-th set bit of m (r < popcount(m)), by bytes: the set bits up to each byte
// (SWAR counts summed by one multiply), the byte holding bit r as the number of bytes whose
// count is <= r (one compare of all eight, one popcnt), then a table within that byte. No PDEP:
// on AMD before Zen 3 it is microcoded, tens to hundreds of cycles as the mask fills, where this
// is about twenty simple operations.
__attribute__((always_inline)) inline uint64_t SelectBit(uint64_t m, uint64_t r) {
  constexpr uint64_t kL8 = 0x0101010101010101ULL, kH8 = 0x8080808080808080ULL;
  uint64_t s = m - ((m >> 1) & 0x5555555555555555ULL);
  s = (s & 0x3333333333333333ULL) + ((s >> 2) & 0x3333333333333333ULL);
  s = ((s + (s >> 4)) & 0x0F0F0F0F0F0F0F0FULL) * kL8;  // byte i: set bits of bytes 0..i
  // Byte i's top bit: s_i <= r (0x80 + r - s_i does not borrow: both are at most 64).
  const uint64_t le = ((r * kL8 | kH8) - s) & kH8;
  const uint64_t shift = 8 * static_cast<uint64_t>(_mm_popcnt_u64(le));
  const uint64_t before = ((s << 8) >> shift) & 0xFF;  // set bits below the byte
  return shift + kSelectInByte.at[r - before][(m >> shift) & 0xFF];
}


// Replaces row[0..64) (16-bit counts whose sum is below 2^15) by the sums of the entries
// before each, and returns the sum of all.
__attribute__((always_inline)) inline uint64_t ExclusiveSums64(int16_t* row) {
  // Broadcasts of word 7 of the low lane into the high lane (the low lane zero), and of word 15.
  const __m256i word7 = _mm256_set1_epi16(0x0F0E);
  __m256i carry = _mm256_setzero_si256();
  for (int i = 0; i < 4; ++i) {
    __m256i* p = reinterpret_cast<__m256i*>(row + 16 * i);
    const __m256i x = _mm256_load_si256(p);
    __m256i s = _mm256_add_epi16(x, _mm256_slli_si256(x, 2));
    s = _mm256_add_epi16(s, _mm256_slli_si256(s, 4));
    s = _mm256_add_epi16(s, _mm256_slli_si256(s, 8));  // sums within each 128-bit lane
    s = _mm256_add_epi16(s, _mm256_shuffle_epi8(_mm256_permute2x128_si256(s, s, 0x08), word7));
    s = _mm256_add_epi16(s, carry);  // inclusive sums
    _mm256_store_si256(p, _mm256_sub_epi16(s, x));
    carry = _mm256_shuffle_epi8(_mm256_permute4x64_epi64(s, 0xFF), _mm256_set1_epi16(0x0706));
  }
  return static_cast<uint16_t>(_mm256_extract_epi16(carry, 0));
}

}  // namespace

bool ContextWalk16Avx2(const uint16_t* base, uint64_t n, const uint8_t* bounds, int k,
                       const uint64_t* kc, const uint64_t* start_of, const uint64_t* gaps,
                       const uint64_t* vals, uint64_t* positions, uint64_t* values,
                       const WalkSink* sink) {
  // next[c]: the rank among the class's members, counted from the current window's first
  // element, of the class's next change; used[c]: its changes placed so far.
  uint64_t next[kClasses], used[kClasses];
  uint32_t active = 0;
  for (int c = 0; c < k; ++c) {
    used[c] = 0;
    next[c] = 0;
    if (kc[c] > 0) {
      if (gaps[start_of[c]] >= n) return false;
      active |= 1u << c;
      next[c] = gaps[start_of[c]];
    }
  }
  __m256i bv[kClasses - 1];
  for (int c = 0; c + 1 < k; ++c) {
    bv[c] = _mm256_set1_epi8(static_cast<char>((bounds[c + 1] - 1) ^ 0x80));
  }
  alignas(32) uint64_t masks[kBlocks][kClasses];
  // before[c][b]: members of class c in the window's blocks before block b.
  alignas(32) int16_t before[kClasses][kBlocks];
  uint64_t chg[kBlocks];
  // slot[b * 64 + i]: the value of the change at element i of block b; a row to spare for the
  // unconditional writes of the output pass.
  uint64_t slot[kBlocks * 64 + 64];
  for (uint64_t i = kBlocks * 64; i < kBlocks * 64 + 64; ++i) slot[i] = 0;
  const uint64_t kc_total = start_of[k];
  uint64_t out = 0;
  for (uint64_t w0 = 0; w0 < n && active != 0; w0 += kBlocks * 64) {
    const uint64_t span = n - w0 < kBlocks * 64 ? n - w0 : kBlocks * 64;
    const uint64_t nb = (span + 63) / 64;
    // The masks and counts of the window's blocks: class c's mask is the elements above class
    // c - 1's top and not above its own.
    uint64_t count[kClasses] = {};
    for (uint64_t b = 0; b < nb; ++b) {
      __m256i e0, e1;
      const uint64_t start = w0 + 64 * b;
      const uint64_t valid = BlockContextsAt(base, start, n, &e0, &e1);
      uint64_t* m = masks[b];
      uint64_t ge = valid;
      for (int c = 0; c + 1 < k; ++c) {
        const uint64_t g0 = static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpgt_epi8(e0, bv[c])));
        const uint64_t g1 = static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpgt_epi8(e1, bv[c])));
        const uint64_t above = g0 | (g1 << 32);
        const uint64_t mc = ge & ~above;
        m[c] = mc;
        before[c][b] = static_cast<int16_t>(_mm_popcnt_u64(mc));
        ge = above;
      }
      m[k - 1] = ge;
      before[k - 1][b] = static_cast<int16_t>(_mm_popcnt_u64(ge));
    }
    // The blocks' member counts turned into the counts before each block.
    for (int c = 0; c < k; ++c) {
      for (uint64_t b = nb; b < kBlocks; ++b) before[c][b] = 0;
      count[c] = ExclusiveSums64(before[c]);
      for (uint64_t b = nb; b < kBlocks; ++b) before[c][b] = kPastEnd;
    }
    for (uint64_t b = 0; b < nb; ++b) chg[b] = 0;
    // Each class's changes that fall in the window: a change's block is the last whose count
    // before it is <= its rank t, i.e. 63 minus the blocks whose count is above t (the counts
    // ascend), found with four compares of the class's 64 counts against t.
    for (uint32_t a = active; a != 0; a &= a - 1) {
      const int c = __builtin_ctz(a);
      uint64_t t = next[c];
      const int16_t* bc = before[c];
      const __m256i q0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(bc));
      const __m256i q1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(bc + 16));
      const __m256i q2 = _mm256_load_si256(reinterpret_cast<const __m256i*>(bc + 32));
      const __m256i q3 = _mm256_load_si256(reinterpret_cast<const __m256i*>(bc + 48));
      const uint64_t* gc = gaps + start_of[c];
      const uint64_t* vc = vals + start_of[c];
      const uint64_t total = count[c];
      uint64_t u = used[c];
      while (t < total) {
        const __m256i tv = _mm256_set1_epi16(static_cast<int16_t>(t));
        const __m256i p01 = _mm256_packs_epi16(_mm256_cmpgt_epi16(q0, tv), _mm256_cmpgt_epi16(q1, tv));
        const __m256i p23 = _mm256_packs_epi16(_mm256_cmpgt_epi16(q2, tv), _mm256_cmpgt_epi16(q3, tv));
        const uint64_t above =
            static_cast<uint32_t>(_mm256_movemask_epi8(p01)) |
            static_cast<uint64_t>(static_cast<uint32_t>(_mm256_movemask_epi8(p23))) << 32;
        const uint64_t b = 63 - static_cast<uint64_t>(_mm_popcnt_u64(above));
        const uint64_t bit = SelectBit(masks[b][c], t - static_cast<uint64_t>(bc[b]));
        chg[b] |= uint64_t{1} << bit;
        slot[b * 64 + bit] = vc[u];
        if (++u == kc[c]) {
          active &= ~(1u << c);
          break;
        }
        // Each class reads its own run of gaps and values: kept ahead of the loads.
        _mm_prefetch(reinterpret_cast<const char*>(gc + u + 16), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(vc + u + 16), _MM_HINT_T0);
        if (gc[u] >= n) return false;
        t += 1 + gc[u];
      }
      used[c] = u;
      next[c] = t - total;
    }
    const uint64_t window_first = out;
    // The window's changes in position order. The first four of a block are written whatever
    // their number (a missing one writes entries past the block's, which the next change
    // overwrites; its bit index is 64, and slot[] has a row to spare).
    for (uint64_t b = 0; b < nb; ++b) {
      uint64_t m = chg[b];
      const uint64_t cnt = static_cast<uint64_t>(_mm_popcnt_u64(m));
      if (kc_total - out >= 4) {
        for (int r = 0; r < 4; ++r) {
          const uint64_t bit = _tzcnt_u64(m);
          positions[out + r] = w0 + b * 64 + bit;
          values[out + r] = slot[b * 64 + bit];
          m &= m - 1;
        }
        if (cnt <= 4) {
          out += cnt;
          continue;
        }
        out += 4;
      }
      for (; m != 0; m &= m - 1) {
        const uint64_t bit = _tzcnt_u64(m);
        positions[out] = w0 + b * 64 + bit;
        values[out] = slot[b * 64 + bit];
        ++out;
      }
    }
    if (sink != nullptr && out > window_first) {
      sink->fn(sink->ctx, positions + window_first, values + window_first, out - window_first);
    }
  }
  return active == 0;
}

}  // namespace dcr::internal

#else  // no AVX2 build on this target: CpuHasAvx2() is false and this is never called

namespace dcr::internal {
bool ContextWalk16Avx2(const uint16_t*, uint64_t, const uint8_t*, int, const uint64_t*,
                       const uint64_t*, const uint64_t*, const uint64_t*, uint64_t*, uint64_t*,
                       const WalkSink*) {
  return false;
}
}  // namespace dcr::internal

#endif
