// Streamed XXH3-128 of a chunk's covered target bytes (the chunk's target_range_hash), with the
// AVX2 accumulator when the CPU has it (internal; same digest either way).
#ifndef DCR_CORE_SRC_INTERNAL_RANGE_HASHER_H_
#define DCR_CORE_SRC_INTERNAL_RANGE_HASHER_H_

#include <xxhash.h>

#include <cstddef>
#include <cstdint>

#include "dcr/checkpoint.h"
#include "internal/simd.h"

namespace dcr::internal {

class RangeHasher {
 public:
  explicit RangeHasher(bool avx2) : avx2_(avx2) {
    if (avx2_) {
      st_ = Xxh3Avx2New();
    } else {
      lib_ = XXH3_createState();
      XXH3_128bits_reset(lib_);
    }
  }
  ~RangeHasher() {
    if (avx2_) {
      Xxh3Avx2Free(st_);
    } else {
      XXH3_freeState(lib_);
    }
  }
  RangeHasher(const RangeHasher&) = delete;
  RangeHasher& operator=(const RangeHasher&) = delete;
  void Update(const void* p, size_t n) {
    if (avx2_) {
      Xxh3Avx2Update(st_, p, n);
    } else {
      XXH3_128bits_update(lib_, p, n);
    }
  }
  Hash128 Digest() {
    Hash128 h;
    if (avx2_) {
      Xxh3Avx2Digest(st_, &h.lo, &h.hi);
    } else {
      const XXH128_hash_t r = XXH3_128bits_digest(lib_);
      h = Hash128{r.low64, r.high64};
    }
    return h;
  }

 private:
  bool avx2_;
  void* st_ = nullptr;
  XXH3_state_t* lib_ = nullptr;
};

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_INTERNAL_RANGE_HASHER_H_
