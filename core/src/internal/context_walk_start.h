// The start, the class masks and the output of a class walk of a context-coded chunk (internal;
// shared by the portable walk in internal/context_walk.h and the vector builds of
// internal/context_walk16.h, so only <cstdint> and builtins, which expand for the instructions of
// the function they inline into).
#ifndef DCR_CORE_SRC_INTERNAL_CONTEXT_WALK_START_H_
#define DCR_CORE_SRC_INTERNAL_CONTEXT_WALK_START_H_

#include <cstdint>

namespace dcr::internal {
namespace {

// For classes c < k with kc[c] changes whose gaps start at gaps[start_of[c]]: next[c] the rank of
// the class's first change among its members (0 for a class without changes), used[c] = 0, and
// *active the mask of the classes with changes. False when a first gap is n or more (no element
// is that far into a chunk of n: the base is not the encoder's).
__attribute__((always_inline)) inline bool StartClasses(uint64_t n, int k, const uint64_t* kc,
                                                        const uint64_t* start_of,
                                                        const uint64_t* gaps, uint64_t* next,
                                                        uint64_t* used, uint32_t* active) {
  *active = 0;
  for (int c = 0; c < k; ++c) {
    used[c] = 0;
    next[c] = 0;
    if (kc[c] > 0) {
      if (gaps[start_of[c]] >= n) return false;
      *active |= 1u << c;
      next[c] = gaps[start_of[c]];
    }
  }
  return true;
}

// Class masks from the masks of the elements at or above each class's lowest context:
// fn(c, mask) for every class c < k in order, where class c holds the elements at or above its
// own lowest context and not at or above the next class's. `valid`: the block's elements (all of
// class 0 and above); above(c): those at or above class c + 1's lowest context (c + 1 < k), none
// of them outside `valid`.
template <typename Above, typename F>
__attribute__((always_inline)) inline void ClassChain(int k, uint64_t valid, Above&& above,
                                                      F&& fn) {
  uint64_t ge = valid;
  for (int c = 0; c + 1 < k; ++c) {
    const uint64_t next = above(c);
    fn(c, ge & ~next);
    ge = next;
  }
  fn(k - 1, ge);
}

// The index of the lowest set bit of m, 64 for m == 0 (TZCNT: run only where CpuHasAvx2()
// holds, which implies BMI1).
#if defined(__x86_64__)
__attribute__((always_inline)) inline uint64_t Tzcnt(uint64_t m) {
  uint64_t r;
  __asm__("tzcnt %1, %0" : "=r"(r) : "rm"(m) : "cc");
  return r;
}
#else
__attribute__((always_inline)) inline uint64_t Tzcnt(uint64_t m) {
  return m == 0 ? 64 : static_cast<uint64_t>(__builtin_ctzll(m));
}
#endif

// A window's changes in position order: block b (< nb) of the window at w0 has its changes at the
// set bits of chg[b], the value of the one at element i in slot[b * 64 + i]. Writes them to
// positions[] and values[] from entry `out` on and returns the entry after the last; kc_total:
// the chunk's changes (the arrays' length). kFast (REQUIRES popcnt and TZCNT, i.e. a function built
// for them, and slot[] with a spare row of 64 entries): the first four changes of a block are
// written whatever their number (a missing one writes entries past the block's, which the next
// change overwrites; its bit index is 64), so that only blocks of more take a loop.
template <bool kFast>
__attribute__((always_inline)) inline uint64_t EmitWindow(const uint64_t* chg, uint64_t nb,
                                                          const uint64_t* slot, uint64_t w0,
                                                          uint64_t kc_total, uint64_t out,
                                                          uint64_t* positions, uint64_t* values) {
  for (uint64_t b = 0; b < nb; ++b) {
    uint64_t m = chg[b];
    if constexpr (kFast) {
      const uint64_t cnt = static_cast<uint64_t>(__builtin_popcountll(m));
      if (kc_total - out >= 4) {
        for (int r = 0; r < 4; ++r) {
          const uint64_t bit = Tzcnt(m);
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
    }
    for (; m != 0; m &= m - 1) {
      const uint64_t bit = static_cast<uint64_t>(__builtin_ctzll(m));
      positions[out] = w0 + b * 64 + bit;
      values[out] = slot[b * 64 + bit];
      ++out;
    }
  }
  return out;
}

}  // namespace
}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_INTERNAL_CONTEXT_WALK_START_H_
