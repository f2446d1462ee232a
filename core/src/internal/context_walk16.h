// The class walk and the class-local gaps of context-coded chunks of 2-byte elements, generic over
// a vector build's block pass (internal). Included only by the files compiled for a vector unit
// (context_walk_avx2.cc, context_walk_avx512.cc, context_gaps_avx2.cc, context_gaps_avx512.cc;
// core/CMakeLists.txt); everything here has internal linkage, so each such file keeps its own copy
// built for its own instructions (see simd.h).
//
// A build `B` supplies:
//   template <class F> void B::Classify(const uint16_t* base, uint64_t start, uint64_t n, F fn)
//       const: fn(c, mask) for every class c < k in order, mask bit i set when element start + i
//       (< n) of the block that starts at `start` is in class c;
//   B::Finder(const int16_t* before): over a class's counts before each of a window's 64 blocks,
//       Block(t): the last block whose count is <= t (the counts ascend from 0);
//   static uint64_t B::Select(uint64_t m, uint64_t r): the index of the r-th set bit of m.
#ifndef DCR_CORE_SRC_INTERNAL_CONTEXT_WALK16_H_
#define DCR_CORE_SRC_INTERNAL_CONTEXT_WALK16_H_

#include <cstdint>

#include "internal/context_walk_start.h"
#include "internal/simd.h"

#if defined(__x86_64__) && defined(__AVX2__)
#include <immintrin.h>

#include "internal/context_blocks_avx2.h"

namespace dcr::internal {
namespace {

constexpr int kWalk16Classes = 16;
constexpr uint64_t kWalk16Blocks = 64;  // blocks of 64 elements per window
// before[][] of blocks past a window's end: above any rank (ranks within a window are < 4096),
// and positive as a signed 16-bit value, so that one signed compare orders it.
constexpr int16_t kWalk16PastEnd = 0x7FFF;

// The index of the r-th set bit of m (r < popcount(m)) by BMI2 PDEP, for builds on CPUs where it
// is fast (CpuFastPdep() in simd.h).
__attribute__((always_inline)) inline uint64_t SelectPdep(uint64_t m, uint64_t r) {
  return Tzcnt(_pdep_u64(uint64_t{1} << r, m));
}
// How far ahead of the block being classified its base bits are prefetched, in blocks of 128
// bytes: a window's class pass is short enough that the hardware prefetcher alone leaves it
// waiting on the first lines of each window.
constexpr uint64_t kWalk16PrefetchBlocks = 16;

// The class pass of the window of base[0, n) that starts at w0 (< n): masks[b][c], the class-c
// mask of the window's block b; before[c][b], class c's members in the window's blocks before b
// (kWalk16PastEnd for blocks past the chunk's end); count[c], class c's members in the window.
// Returns the window's blocks. This is the part of a walk that every covered element pays,
// whatever the changes.
template <typename B>
__attribute__((always_inline)) inline uint64_t ClassWindow16(const B& vb, const uint16_t* base,
                                                             uint64_t n, int k, uint64_t w0,
                                                             uint64_t (*masks)[kWalk16Classes],
                                                             int16_t (*before)[kWalk16Blocks],
                                                             uint64_t* count) {
  const uint64_t span = n - w0 < kWalk16Blocks * 64 ? n - w0 : kWalk16Blocks * 64;
  const uint64_t nb = (span + 63) / 64;
  for (uint64_t b = 0; b < nb; ++b) {
    const uint64_t start = w0 + 64 * b;
    // Prefetching past the chunk's end is harmless: a prefetch never faults.
    const char* ahead = reinterpret_cast<const char*>(base + start + 64 * kWalk16PrefetchBlocks);
    _mm_prefetch(ahead, _MM_HINT_T0);
    _mm_prefetch(ahead + 64, _MM_HINT_T0);
    uint64_t* m = masks[b];
    vb.Classify(
        base, start, n, [&](int c, uint64_t mc) __attribute__((always_inline)) {
          m[c] = mc;
          before[c][b] = static_cast<int16_t>(_mm_popcnt_u64(mc));
        });
  }
  // The blocks' member counts turned into the counts before each block.
  for (int c = 0; c < k; ++c) {
    for (uint64_t b = nb; b < kWalk16Blocks; ++b) before[c][b] = 0;
    count[c] = ExclusiveSums64(before[c]);
    for (uint64_t b = nb; b < kWalk16Blocks; ++b) before[c][b] = kWalk16PastEnd;
  }
  return nb;
}

// The walk (ContextWalk16Avx2 in simd.h) over windows of 64 blocks: the class masks of the
// window's blocks and each class's member count before every block first; then each class's
// changes that fall in the window, each one's block found from those counts and its element by a
// select in the block's class mask; then the window's changes in position order, handed to
// `sink`.
template <typename B>
__attribute__((always_inline)) inline bool Walk16(const B& vb, const uint16_t* base, uint64_t n,
                                                  int k, const uint64_t* kc,
                                                  const uint64_t* start_of, const uint64_t* gaps,
                                                  const uint64_t* vals, uint64_t* positions,
                                                  uint64_t* values, const WalkSink* sink) {
  // next[c]: the rank among the class's members, counted from the current window's first
  // element, of the class's next change; used[c]: its changes placed so far.
  uint64_t next[kWalk16Classes], used[kWalk16Classes];
  uint32_t active;
  if (!StartClasses(n, k, kc, start_of, gaps, next, used, &active)) return false;
  alignas(64) uint64_t masks[kWalk16Blocks][kWalk16Classes];
  // before[c][b]: members of class c in the window's blocks before block b.
  alignas(64) int16_t before[kWalk16Classes][kWalk16Blocks];
  uint64_t chg[kWalk16Blocks];
  // slot[b * 64 + i]: the value of the change at element i of block b; a row to spare for the
  // unconditional writes of the output pass.
  uint64_t slot[kWalk16Blocks * 64 + 64];
  for (uint64_t i = kWalk16Blocks * 64; i < kWalk16Blocks * 64 + 64; ++i) slot[i] = 0;
  const uint64_t kc_total = start_of[k];
  uint64_t out = 0;
  for (uint64_t w0 = 0; w0 < n && active != 0; w0 += kWalk16Blocks * 64) {
    uint64_t count[kWalk16Classes];
    const uint64_t nb = ClassWindow16(vb, base, n, k, w0, masks, before, count);
    for (uint64_t b = 0; b < nb; ++b) chg[b] = 0;
    for (uint32_t a = active; a != 0; a &= a - 1) {
      const int c = __builtin_ctz(a);
      uint64_t t = next[c];
      const int16_t* bc = before[c];
      const typename B::Finder find(bc);
      const uint64_t* gc = gaps + start_of[c];
      const uint64_t* vc = vals + start_of[c];
      const uint64_t total = count[c];
      uint64_t u = used[c];
      while (t < total) {
        const uint64_t b = find.Block(t);
        const uint64_t bit = B::Select(masks[b][c], t - static_cast<uint64_t>(bc[b]));
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
    out = EmitWindow<true>(chg, nb, slot, w0, kc_total, out, positions, values);
    if (sink != nullptr && out > window_first) {
      sink->fn(sink->ctx, positions + window_first, values + window_first, out - window_first);
    }
  }
  return active == 0;
}

// The class-local gaps grouped by class (ContextGaps16Avx2 in simd.h), block by block: each
// change's rank among its class's members is the class's members before the block plus those
// below it in the block's class mask.
template <typename B>
__attribute__((always_inline)) inline void Gaps16(const B& vb, const uint16_t* base, uint64_t n,
                                                  const uint8_t* bounds, int K,
                                                  const uint64_t* positions, const uint64_t* values,
                                                  uint64_t k, const uint64_t* start_of,
                                                  uint64_t* gaps, uint64_t* vals) {
  uint8_t lut[256];
  for (int e = 0, c = 0; e < 256; ++e) {
    while (c + 1 < K && e >= bounds[c + 1]) ++c;
    lut[e] = static_cast<uint8_t>(c);
  }
  // count[c]: members of class c before the block; next[c]: the rank after the class's last
  // change; at[c]: where the class's next change goes.
  uint64_t count[kWalk16Classes] = {}, next[kWalk16Classes] = {}, at[kWalk16Classes];
  for (int c = 0; c < K; ++c) at[c] = start_of[c];
  uint64_t ci = 0;
  for (uint64_t start = 0; start < n && ci < k; start += 64) {
    const char* ahead = reinterpret_cast<const char*>(base + start + 64 * kWalk16PrefetchBlocks);
    _mm_prefetch(ahead, _MM_HINT_T0);
    _mm_prefetch(ahead + 64, _MM_HINT_T0);
    uint64_t m[kWalk16Classes];
    vb.Classify(
        base, start, n, [&](int c, uint64_t mc) __attribute__((always_inline)) { m[c] = mc; });
    const uint64_t end = start + 64;
    for (; ci < k && positions[ci] < end; ++ci) {
      const uint64_t p = positions[ci];
      const uint64_t bit = p - start;
      const int c = lut[(base[p] >> 7) & 0xFF];
      const uint64_t j =
          count[c] + static_cast<uint64_t>(_mm_popcnt_u64(m[c] & ((uint64_t{1} << bit) - 1)));
      const uint64_t o = at[c]++;
      gaps[o] = j - next[c];
      vals[o] = values[ci];
      next[c] = j + 1;
    }
    for (int c = 0; c < K; ++c) count[c] += static_cast<uint64_t>(_mm_popcnt_u64(m[c]));
  }
}

}  // namespace
}  // namespace dcr::internal

#endif  // __x86_64__ && __AVX2__
#endif  // DCR_CORE_SRC_INTERNAL_CONTEXT_WALK16_H_
