// The class walk of context-coded chunks (core/FORMAT.md section 2.5), internal and header-only
// so its loops inline into the encoder and the decoder.
//
// An element's context is 8 bits of its base bits below the sign (the exponent of BF16, FP32,
// and the top of FP64's); classes are runs of contexts. A change's position is coded as its gap
// among the covered elements of its class: the walk goes over the covered elements 64 at a time,
// with one mask per class of the block's elements in it, and finds each class's next change by
// counting set bits.
//
// Thread safety: pure functions.
#ifndef DCR_CORE_SRC_INTERNAL_CONTEXT_WALK_H_
#define DCR_CORE_SRC_INTERNAL_CONTEXT_WALK_H_

#include <cstdint>
#include <cstring>

#include "dcr/delta.h"
#include "internal/context_walk_start.h"
#include "internal/simd.h"

namespace dcr::internal {

inline constexpr int kMaxContextClasses = kContextClassesMax;

// The context of covered element i of base bits with width w (2, 4 or 8 bytes).
inline uint8_t ContextOf(const uint8_t* base, int w, uint64_t i) {
  switch (w) {
    case 2: {
      uint16_t v;
      std::memcpy(&v, base + 2 * i, 2);
      return static_cast<uint8_t>(v >> 7);
    }
    case 4: {
      uint32_t v;
      std::memcpy(&v, base + 4 * i, 4);
      return static_cast<uint8_t>(v >> 23);
    }
    default: {
      uint64_t v;
      std::memcpy(&v, base + 8 * i, 8);
      return static_cast<uint8_t>(v >> 55);
    }
  }
}

// Classes as runs of contexts: class c holds contexts [bounds[c], bounds[c + 1]) (the last up to
// 255). REQUIRES: bounds[0] == 0, bounds strictly increasing, 1 <= K <= kMaxContextClasses.
struct ClassMap {
  ClassMap(const uint8_t* b, int k) : K(k) {
    for (int c = 0; c < k; ++c) bounds[c] = b[c];
    int c = 0;
    for (int e = 0; e < 256; ++e) {
      while (c + 1 < k && e >= b[c + 1]) ++c;
      lut[e] = static_cast<uint8_t>(c);
    }
  }
  int ClassOf(uint8_t e) const { return lut[e]; }
  int K;
  uint8_t bounds[kMaxContextClasses] = {};
  uint8_t lut[256];
};

// masks[c] (c < K) bit i: covered element start + i is in class c, for i < len (<= 64). (The
// vector builds of 2-byte elements classify in internal/context_walk16.h.)
__attribute__((always_inline)) inline void ClassMasks(const uint8_t* base, int w, uint64_t start,
                                                      uint64_t len, const ClassMap& map,
                                                      uint64_t* masks) {
  for (int c = 0; c < map.K; ++c) masks[c] = 0;
  for (uint64_t i = 0; i < len; ++i)
    masks[map.lut[ContextOf(base, w, start + i)]] |= uint64_t{1} << i;
}

// Bit counts: the popcnt instruction in the kFast builds (compiled for it, run only when
// CpuHasAvx2(), which implies POPCNT, BMI1 and BMI2), a branch-free count otherwise (g++ calls a
// libgcc routine for __builtin_popcountll without -mpopcnt, several times slower).
template <bool kFast>
__attribute__((always_inline)) inline uint64_t Pop(uint64_t x) {
  if constexpr (kFast) {
    return static_cast<uint64_t>(__builtin_popcountll(x));
  } else {
    x = x - ((x >> 1) & 0x5555555555555555ULL);
    x = (x & 0x3333333333333333ULL) + ((x >> 2) & 0x3333333333333333ULL);
    x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0FULL;
    return (x * 0x0101010101010101ULL) >> 56;
  }
}

// kSelectInByte.at[r][v]: the index of the r-th set bit of byte v (8 when v has fewer).
struct SelectInByteTable {
  uint8_t at[8][256];
};
constexpr SelectInByteTable MakeSelectInByteTable() {
  SelectInByteTable t{};
  for (int v = 0; v < 256; ++v) {
    int r = 0;
    for (int i = 0; i < 8; ++i) {
      if ((v >> i) & 1) t.at[r++][v] = static_cast<uint8_t>(i);
    }
    for (; r < 8; ++r) t.at[r][v] = 8;
  }
  return t;
}
inline constexpr SelectInByteTable kSelectInByte = MakeSelectInByteTable();

// The index of the r-th set bit of m (r < popcount(m)). kFast builds go by bytes: the set bits
// up to each byte (SWAR counts summed by one multiply), the byte holding bit r as the number of
// bytes whose count is <= r, then a table within the byte (no PDEP: on AMD before Zen 3 it is
// microcoded and takes tens to hundreds of cycles). Otherwise halves narrowed by counts, then
// the last byte bit by bit.
template <bool kFast>
__attribute__((always_inline)) inline int SelectBit(uint64_t m, uint64_t r) {
  if constexpr (kFast) {
    constexpr uint64_t kL8 = 0x0101010101010101ULL, kH8 = 0x8080808080808080ULL;
    uint64_t s = m - ((m >> 1) & 0x5555555555555555ULL);
    s = (s & 0x3333333333333333ULL) + ((s >> 2) & 0x3333333333333333ULL);
    s = ((s + (s >> 4)) & 0x0F0F0F0F0F0F0F0FULL) * kL8;  // byte i: set bits of bytes 0..i
    const uint64_t le = ((r * kL8 | kH8) - s) & kH8;     // byte i's top bit: s_i <= r
    const uint64_t shift = 8 * Pop<true>(le);
    const uint64_t before = ((s << 8) >> shift) & 0xFF;
    return static_cast<int>(shift + kSelectInByte.at[r - before][(m >> shift) & 0xFF]);
  }
  int at = 0;
  for (int half = 32; half >= 8; half /= 2) {
    const uint64_t low = m & ((uint64_t{1} << half) - 1);
    const uint64_t c = Pop<kFast>(low);
    if (r >= c) {
      r -= c;
      m >>= half;
      at += half;
    } else {
      m = low;
    }
  }
  for (; r > 0; --r) m &= m - 1;
  return at + __builtin_ctzll(m);
}

// Positions and values from class-local gaps: class c's changes are gaps[start_of[c] ..
// start_of[c] + kc[c]) (the first counted from the class's first element, each further one from
// the element after the previous change) and their values vals[...] in the same order. Writes
// the changes in position order to positions[] and values[]. False when a class's gaps run past
// its elements (the base is not the encoder's).
// The walk goes over windows of kWalkBlocks blocks: the class masks of a window first, with each
// class's member count before every block; then each class takes its changes that fall in the
// window, each one's block found by a branch-free binary search over those counts and its
// element by a select in the block's mask (no per-block loop, so the branches are per window and
// class, not per change); the changes then come out in position order.
inline constexpr uint64_t kWalkBlocks = 64;

template <bool kFast>
__attribute__((always_inline)) inline bool WalkClassesImpl(const uint8_t* base, int w, uint64_t n,
                                                           const ClassMap& map, const uint64_t* kc,
                                                           const uint64_t* start_of,
                                                           const uint64_t* gaps,
                                                           const uint64_t* vals,
                                                           uint64_t* positions, uint64_t* values) {
  static_assert(kWalkBlocks == 64, "the binary search below covers 64 blocks");
  const int K = map.K;
  // next[c]: the rank among the class's members, counted from the current window's first
  // element, of the class's next change; used[c]: its changes placed so far.
  uint64_t next[kMaxContextClasses], used[kMaxContextClasses];
  uint32_t active;
  if (!StartClasses(n, K, kc, start_of, gaps, next, used, &active)) return false;
  uint64_t out = 0;
  uint64_t masks[kWalkBlocks][kMaxContextClasses];
  // before[c][b]: members of class c in the window's blocks before block b; blocks past the
  // window's end hold a count above any rank.
  uint16_t before[kMaxContextClasses][kWalkBlocks];
  uint64_t chg[kWalkBlocks];
  uint64_t slot[kWalkBlocks * 64 + 64];
  const uint64_t kc_total = start_of[K];
  if constexpr (kFast) std::memset(slot + kWalkBlocks * 64, 0, 64 * sizeof(uint64_t));
  for (uint64_t w0 = 0; w0 < n && active != 0; w0 += kWalkBlocks * 64) {
    const uint64_t span = n - w0 < kWalkBlocks * 64 ? n - w0 : kWalkBlocks * 64;
    const uint64_t nb = (span + 63) / 64;
    uint64_t total[kMaxContextClasses] = {};
    for (uint64_t b = 0; b < nb; ++b) {
      const uint64_t start = w0 + b * 64;
      const uint64_t len = n - start < 64 ? n - start : 64;
      ClassMasks(base, w, start, len, map, masks[b]);
      for (int c = 0; c < K; ++c) {
        before[c][b] = static_cast<uint16_t>(total[c]);
        total[c] += Pop<kFast>(masks[b][c]);
      }
    }
    for (uint64_t b = 0; b < nb; ++b) chg[b] = 0;
    for (uint64_t b = nb; b < kWalkBlocks; ++b) {
      for (int c = 0; c < K; ++c) before[c][b] = 0xFFFF;
    }
    for (uint32_t a = active; a != 0; a &= a - 1) {
      const int c = __builtin_ctz(a);
      uint64_t t = next[c];
      const uint16_t* bc = before[c];
      const uint64_t* gc = gaps + start_of[c];
      const uint64_t* vc = vals + start_of[c];
      uint64_t u = used[c];
      while (t < total[c]) {
        // The last block whose count before it is <= t holds member t.
        uint64_t b = 0;
        b += bc[b + 32] <= t ? 32 : 0;
        b += bc[b + 16] <= t ? 16 : 0;
        b += bc[b + 8] <= t ? 8 : 0;
        b += bc[b + 4] <= t ? 4 : 0;
        b += bc[b + 2] <= t ? 2 : 0;
        b += bc[b + 1] <= t ? 1 : 0;
        const int bit = SelectBit<kFast>(masks[b][c], t - bc[b]);
        chg[b] |= uint64_t{1} << bit;
        slot[b * 64 + static_cast<uint64_t>(bit)] = vc[u];
        if (++u == kc[c]) {
          active &= ~(1u << c);
          break;
        }
        if (gc[u] >= n) return false;
        t += 1 + gc[u];
      }
      used[c] = u;
      next[c] = t - total[c];
    }
    out = EmitWindow<kFast>(chg, nb, slot, w0, kc_total, out, positions, values);
  }
  return active == 0;
}

// The inverse of WalkClassesImpl: the class-local gap of each change (sorted positions[0..k)
// among n covered elements, values[0..k) theirs), grouped by class as the encoder codes them:
// class c's gaps, and the values of the same changes, at [start_of[c], start_of[c + 1]) of
// gaps[] and vals[], in position order within the class. REQUIRES: start_of[c + 1] -
// start_of[c] is the number of changes in class c.
template <bool kFast>
__attribute__((always_inline)) inline void ClassGapsGroupedImpl(
    const uint8_t* base, int w, uint64_t n, const ClassMap& map, const uint64_t* positions,
    const uint64_t* values, uint64_t k, const uint64_t* start_of, uint64_t* gaps, uint64_t* vals) {
  const int K = map.K;
  uint64_t count[kMaxContextClasses] = {}, next[kMaxContextClasses] = {}, at[kMaxContextClasses];
  for (int c = 0; c < K; ++c) at[c] = start_of[c];
  uint64_t ci = 0;
  for (uint64_t start = 0; start < n && ci < k; start += 64) {
    const uint64_t len = n - start < 64 ? n - start : 64;
    uint64_t masks[kMaxContextClasses];
    ClassMasks(base, w, start, len, map, masks);
    for (; ci < k && positions[ci] < start + len; ++ci) {
      const uint64_t bit = positions[ci] - start;
      const int c = map.ClassOf(ContextOf(base, w, positions[ci]));
      const uint64_t below = bit == 0 ? 0 : masks[c] & (~uint64_t{0} >> (64 - bit));
      const uint64_t j = count[c] + Pop<kFast>(below);
      const uint64_t o = at[c]++;
      gaps[o] = j - next[c];
      vals[o] = values[ci];
      next[c] = j + 1;
    }
    for (int c = 0; c < K; ++c) count[c] += Pop<kFast>(masks[c]);
  }
}

// The walk and its inverse at a vector level (CpuSimd() or below): portable; compiled for
// POPCNT, BMI1 and BMI2 (kAvx2 and above, widths 4 and 8); or, for width 2, the AVX2 or AVX-512
// build of internal/context_walk16.h. Every level gives the same results.
__attribute__((target("popcnt,bmi,bmi2"))) inline bool WalkClassesFast(
    const uint8_t* base, int w, uint64_t n, const ClassMap& map, const uint64_t* kc,
    const uint64_t* start_of, const uint64_t* gaps, const uint64_t* vals, uint64_t* positions,
    uint64_t* values) {
  return WalkClassesImpl<true>(base, w, n, map, kc, start_of, gaps, vals, positions, values);
}
// `sink` (null: none) is handed the changes as WalkSink says: by the vector walks of 2-byte
// elements a window at a time, by the others all at once after a walk that succeeded.
inline bool WalkClasses(const uint8_t* base, int w, uint64_t n, const ClassMap& map,
                        const uint64_t* kc, const uint64_t* start_of, const uint64_t* gaps,
                        const uint64_t* vals, uint64_t* positions, uint64_t* values, Simd simd,
                        const WalkSink* sink = nullptr) {
  if (simd == Simd::kAvx512 && w == 2) {
    return ContextWalk16Avx512(reinterpret_cast<const uint16_t*>(base), n, map.bounds, map.K, kc,
                               start_of, gaps, vals, positions, values, sink);
  }
  if (simd != Simd::kPortable && w == 2) {
    return ContextWalk16Avx2(reinterpret_cast<const uint16_t*>(base), n, map.bounds, map.K, kc,
                             start_of, gaps, vals, positions, values, CpuFastPdep(), sink);
  }
  const bool ok =
      simd != Simd::kPortable
          ? WalkClassesFast(base, w, n, map, kc, start_of, gaps, vals, positions, values)
          : WalkClassesImpl<false>(base, w, n, map, kc, start_of, gaps, vals, positions, values);
  if (ok && sink != nullptr && start_of[map.K] > 0) {
    sink->fn(sink->ctx, positions, values, start_of[map.K]);
  }
  return ok;
}
__attribute__((target("popcnt,bmi,bmi2"))) inline void ClassGapsGroupedFast(
    const uint8_t* base, int w, uint64_t n, const ClassMap& map, const uint64_t* positions,
    const uint64_t* values, uint64_t k, const uint64_t* start_of, uint64_t* gaps, uint64_t* vals) {
  ClassGapsGroupedImpl<true>(base, w, n, map, positions, values, k, start_of, gaps, vals);
}
inline void ClassGapsGrouped(const uint8_t* base, int w, uint64_t n, const ClassMap& map,
                             const uint64_t* positions, const uint64_t* values, uint64_t k,
                             const uint64_t* start_of, uint64_t* gaps, uint64_t* vals, Simd simd) {
  if (simd == Simd::kAvx512 && w == 2) {
    return ContextGaps16Avx512(reinterpret_cast<const uint16_t*>(base), n, map.bounds, map.K,
                               positions, values, k, start_of, gaps, vals);
  }
  if (simd != Simd::kPortable && w == 2) {
    return ContextGaps16Avx2(reinterpret_cast<const uint16_t*>(base), n, map.bounds, map.K,
                             positions, values, k, start_of, gaps, vals);
  }
  if (simd != Simd::kPortable) {
    return ClassGapsGroupedFast(base, w, n, map, positions, values, k, start_of, gaps, vals);
  }
  ClassGapsGroupedImpl<false>(base, w, n, map, positions, values, k, start_of, gaps, vals);
}

// The class choice's sample of a chunk's base: every element of a chunk of fewer than
// kContextSampleMin elements, else every kContextSampleStep-th (the choice needs proportions, not
// exact counts). Its counts are by context, unscaled.
inline constexpr uint64_t kContextSampleStep = 16;
inline constexpr uint64_t kContextSampleMin = 65536;
inline uint64_t ContextSampleStep(uint64_t n) {
  return n >= kContextSampleMin ? kContextSampleStep : 1;
}

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_INTERNAL_CONTEXT_WALK_H_
