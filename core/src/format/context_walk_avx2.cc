// The AVX2 build of the class walk of context-coded chunks of 2-byte elements (ContextWalk16Avx2
// in internal/simd.h; the portable walk is WalkClassesImpl in internal/context_walk.h, and both
// give the same positions and values). Compiled with -mavx2 (core/CMakeLists.txt); called only
// when CpuHasAvx2(). No C++ library headers here (see simd.h), and every helper has internal
// linkage, so no code built for AVX2 is shared with other files.
#include "internal/context_blocks_avx2.h"
#include "internal/context_walk16.h"
#include "internal/simd.h"

#if defined(__x86_64__) && defined(__AVX2__)
#include <immintrin.h>

namespace dcr::internal {

namespace {

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
// count is <= r (one compare of all eight, one popcnt), then a table within that byte. About
// twenty simple operations, for the CPUs whose PDEP is microcoded (CpuFastPdep() false).
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

// The AVX2 build of the block pass (ClassBounds256); a class's block by four compares of its 64
// counts against the rank; the select by PDEP (kPdep) or by bytes.
template <bool kPdep>
struct Avx2Build : ClassBounds256 {
  using ClassBounds256::ClassBounds256;
  // The last block whose count is <= t: 63 minus the blocks whose count is above t.
  struct Finder {
    explicit Finder(const int16_t* bc)
        : q0(_mm256_load_si256(reinterpret_cast<const __m256i*>(bc))),
          q1(_mm256_load_si256(reinterpret_cast<const __m256i*>(bc + 16))),
          q2(_mm256_load_si256(reinterpret_cast<const __m256i*>(bc + 32))),
          q3(_mm256_load_si256(reinterpret_cast<const __m256i*>(bc + 48))) {}
    __attribute__((always_inline)) uint64_t Block(uint64_t t) const {
      const __m256i tv = _mm256_set1_epi16(static_cast<int16_t>(t));
      const __m256i p01 =
          _mm256_packs_epi16(_mm256_cmpgt_epi16(q0, tv), _mm256_cmpgt_epi16(q1, tv));
      const __m256i p23 =
          _mm256_packs_epi16(_mm256_cmpgt_epi16(q2, tv), _mm256_cmpgt_epi16(q3, tv));
      const uint64_t above = static_cast<uint32_t>(_mm256_movemask_epi8(p01)) |
                             static_cast<uint64_t>(static_cast<uint32_t>(_mm256_movemask_epi8(p23)))
                                 << 32;
      return 63 - static_cast<uint64_t>(_mm_popcnt_u64(above));
    }
    __m256i q0, q1, q2, q3;
  };
  __attribute__((always_inline)) static uint64_t Select(uint64_t m, uint64_t r) {
    if constexpr (kPdep) {
      return SelectPdep(m, r);
    } else {
      return SelectBit(m, r);
    }
  }
};

}  // namespace

bool ContextWalk16Avx2(const uint16_t* base, uint64_t n, const uint8_t* bounds, int k,
                       const uint64_t* kc, const uint64_t* start_of, const uint64_t* gaps,
                       const uint64_t* vals, uint64_t* positions, uint64_t* values, bool pdep,
                       const WalkSink* sink) {
  if (pdep) {
    return Walk16(Avx2Build<true>(bounds, k), base, n, k, kc, start_of, gaps, vals, positions,
                  values, sink);
  }
  return Walk16(Avx2Build<false>(bounds, k), base, n, k, kc, start_of, gaps, vals, positions,
                values, sink);
}

}  // namespace dcr::internal

#else  // no AVX2 build on this target: CpuHasAvx2() is false and this is never called

namespace dcr::internal {
bool ContextWalk16Avx2(const uint16_t*, uint64_t, const uint8_t*, int, const uint64_t*,
                       const uint64_t*, const uint64_t*, const uint64_t*, uint64_t*, uint64_t*,
                       bool, const WalkSink*) {
  return false;
}
}  // namespace dcr::internal

#endif
