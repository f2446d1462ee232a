// The AVX2 build of the class pass alone (context_pass.h). Compiled for it
// (bench/lib/CMakeLists.txt) and called only where the CPU runs it.
#include "context_pass.h"
#include "context_pass_impl.h"
#include "internal/context_blocks_avx2.h"

#if defined(__x86_64__) && defined(__AVX2__)

namespace dcr::internal {

uint64_t ContextClassPassAvx2(const uint16_t* base, uint64_t n, const uint8_t* bounds, int k,
                              uint64_t* members) {
  return ClassPass(ClassBounds256(bounds, k), base, n, k, members);
}

}  // namespace dcr::internal

#else  // no AVX2 build on this target: never called

namespace dcr::internal {
uint64_t ContextClassPassAvx2(const uint16_t*, uint64_t, const uint8_t*, int, uint64_t*) {
  return 0;
}
}  // namespace dcr::internal

#endif
