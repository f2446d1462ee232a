// UseDataPlaneAllocator (dcr/node.h): glibc malloc settings of a refit process.
#include <malloc.h>

#include "dcr/node.h"

namespace dcr {

void UseDataPlaneAllocator() {
  // 32 MiB is glibc's largest accepted threshold on 64-bit; setting it also fixes the trim
  // threshold at twice that and turns off the dynamic adjustment.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
}

}  // namespace dcr
