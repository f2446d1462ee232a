// The class pass of the context decoder alone, for `dcr bench codec`: over a chunk's base bits,
// every 64-element block's class masks and member counts and each window's counts before every
// block (ClassWindow16 of internal/context_walk16.h, the decoder's own code for 2-byte elements),
// without the entropy decoding, the search for each change and the apply that the whole decoder
// adds. Every covered element pays it whatever the changes, so its speed bounds the speed of any
// decoder of context-coded chunks built on it.
//
// Thread safety: pure functions.
#ifndef DCR_BENCH_LIB_CONTEXT_PASS_H_
#define DCR_BENCH_LIB_CONTEXT_PASS_H_

#include <cstdint>

namespace dcr::internal {

// The pass over base[0, n) with the k classes of `bounds` (internal/context_walk.h ClassMap):
// members[c] (c < k) receives class c's members; returns a sum of the last block's masks and
// counts of every window, so that none of the pass is optimized away. REQUIRES: CpuHasAvx2()
// for the first, CpuSimd() == Simd::kAvx512 for the second, 1 <= k <= 16, n > 0.
uint64_t ContextClassPassAvx2(const uint16_t* base, uint64_t n, const uint8_t* bounds, int k,
                              uint64_t* members);
uint64_t ContextClassPassAvx512(const uint16_t* base, uint64_t n, const uint8_t* bounds, int k,
                                uint64_t* members);

}  // namespace dcr::internal

#endif  // DCR_BENCH_LIB_CONTEXT_PASS_H_
