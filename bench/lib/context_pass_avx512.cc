// The AVX-512 BW build of the class pass alone (context_pass.h). Compiled for it
// (bench/lib/CMakeLists.txt) and called only where the CPU runs it.
#include "context_pass.h"
#include "internal/context_blocks_avx2.h"
#include "internal/context_blocks_avx512.h"
#include "internal/context_walk16.h"

#if defined(__x86_64__) && defined(__AVX512BW__)

namespace dcr::internal {

uint64_t ContextClassPassAvx512(const uint16_t* base, uint64_t n, const uint8_t* bounds, int k,
                                uint64_t* members) {
  const ClassBounds512 vb(bounds, k);
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

}  // namespace dcr::internal

#else  // no AVX-512 BW build on this target: never called

namespace dcr::internal {
uint64_t ContextClassPassAvx512(const uint16_t*, uint64_t, const uint8_t*, int, uint64_t*) {
  return 0;
}
}  // namespace dcr::internal

#endif
