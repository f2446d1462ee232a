// The class pass alone (context_pass.h), generic over a vector build's block pass. Included only
// by the files compiled for a vector unit (context_pass_avx2.cc, context_pass_avx512.cc), each of
// which keeps its own copy built for its own instructions.
#ifndef DCR_BENCH_LIB_CONTEXT_PASS_IMPL_H_
#define DCR_BENCH_LIB_CONTEXT_PASS_IMPL_H_

#include <cstdint>

#include "internal/context_walk16.h"

#if defined(__x86_64__) && defined(__AVX2__)

namespace dcr::internal {
namespace {

template <typename B>
uint64_t ClassPass(const B& vb, const uint16_t* base, uint64_t n, int k, uint64_t* members) {
  alignas(64) uint64_t masks[kWalk16Blocks][kWalk16Classes];
  alignas(64) int16_t before[kWalk16Classes][kWalk16Blocks];
  uint64_t count[kWalk16Classes];
  uint64_t sum = 0;
  for (int c = 0; c < k; ++c) members[c] = 0;
  for (uint64_t w0 = 0; w0 < n; w0 += kWalk16Blocks * 64) {
    const uint64_t nb = ClassWindow16(vb, base, n, k, w0, masks, before, count);
    for (int c = 0; c < k; ++c) {
      members[c] += count[c];
      sum += masks[nb - 1][c] ^ static_cast<uint64_t>(before[c][nb - 1]);
    }
  }
  return sum;
}

}  // namespace
}  // namespace dcr::internal

#endif  // __x86_64__ && __AVX2__
#endif  // DCR_BENCH_LIB_CONTEXT_PASS_IMPL_H_
