// Hot loops with AVX2 and AVX-512 builds chosen at run time (internal).
//
// The vector builds live in the *_avx2.cc and *_avx512.cc files of core/src/format, the only files
// compiled for those instruction sets (core/CMakeLists.txt). They include no C++ library headers,
// so no inline library code built for a vector unit can be picked by the linker for other files.
// Results are identical to the portable builds (same masks; XXH3 is defined independently of the
// vector width).
#ifndef DCR_CORE_SRC_INTERNAL_SIMD_H_
#define DCR_CORE_SRC_INTERNAL_SIMD_H_

#include <cstddef>
#include <cstdint>

namespace dcr::internal {

// The vector builds this CPU may run, checked once: kAvx2 needs AVX2, BMI1, BMI2 and POPCNT;
// kAvx512 those and AVX-512 F and BW (with the OS saving their registers). The environment
// variable DCR_SIMD=portable or DCR_SIMD=avx2 caps the level (to compare builds on one machine,
// or to keep a CPU off its 512-bit units); results are identical at every level.
enum class Simd { kPortable, kAvx2, kAvx512 };
Simd CpuSimd();

// True when the AVX2 builds may run (CpuSimd() is kAvx2 or above).
bool CpuHasAvx2();

// True when BMI2's PDEP runs in a few cycles, as on every Intel CPU that has it and on AMD from
// Zen 3 (family 19h) on; AMD's families 17h and 18h (Zen 1 and 2, Hygon) run it in microcode, tens
// to hundreds of cycles as its mask fills. Checked once.
bool CpuFastPdep();

// masks[j] bit b = (a[64j + b] != b[64j + b]) for the 64-byte blocks of [0, nbytes);
// nbytes must be a multiple of 64. Portable.
void ByteDiffMasks(const uint8_t* a, const uint8_t* b, size_t nbytes, uint64_t* masks);

// The indexes of the differing elements of `width`-byte elements (1, 2, 4 or 8) in the 64-byte
// blocks of [0, nbytes), in increasing order, written to out[0..count); returns count. nbytes must
// be a multiple of 64 and `out` must hold nbytes / width + 64 entries (the AVX2 build writes up to
// 4 scratch entries past the last index). The AVX2 build extracts indexes without a branch per
// difference (BMI1 tzcnt/blsr, popcnt): the portable walk mispredicts once per changed block.
size_t DiffIndexes(const uint8_t* a, const uint8_t* b, size_t nbytes, int width, uint32_t* out);
size_t DiffIndexesAvx2(const uint8_t* a, const uint8_t* b, size_t nbytes, int width, uint32_t* out);

// Streaming XXH3-128 with the AVX2 accumulator (digests equal libxxhash's XXH3_128bits).
void* Xxh3Avx2New();
void Xxh3Avx2Update(void* state, const void* data, size_t size);
void Xxh3Avx2Digest(void* state, uint64_t* low64, uint64_t* high64);
void Xxh3Avx2Free(void* state);

// The sum of hash.h ElementTerm(salt, i, bits of element i) over i in [begin, begin + count) of
// `width`-byte elements (1, 2 or 4) at `data` (element 0): lane lo into *lo, lane hi into *hi.
// Equal to hash.h RangeHash; four elements per step, the 64x64->128-bit products from 32-bit
// halves.
void ElementTermSumAvx2(uint64_t salt, const uint8_t* data, int width, uint64_t begin,
                        uint64_t count, uint64_t* lo, uint64_t* hi);

// Where a class walk hands on the changes it has written: fn(ctx, pos, vals, count) with the
// next run of `count` entries of positions[] and values[] (pos and vals point into them), in
// position order: a window's changes, while its elements are in cache. The runs follow one
// another from entry 0; after a walk that returns true they have covered every change. fn may
// write the elements of its run (the walk reads no element of a window it has handed on).
struct WalkSink {
  void (*fn)(void* ctx, const uint64_t* pos, const uint64_t* vals, uint64_t count);
  void* ctx;
};

// The class walk (WalkClasses in internal/context_walk.h) of a chunk of n 2-byte elements at
// `base` with classes bounds[0..k): the same positions, values and result; each window's
// changes handed to `sink` (null: none) once written. `pdep`: a change's element is selected in
// its block's class mask with PDEP (where CpuFastPdep()), else by bytes; the results are the same.
bool ContextWalk16Avx2(const uint16_t* base, uint64_t n, const uint8_t* bounds, int k,
                       const uint64_t* kc, const uint64_t* start_of, const uint64_t* gaps,
                       const uint64_t* vals, uint64_t* positions, uint64_t* values, bool pdep,
                       const WalkSink* sink);

// ContextWalk16Avx2 built for AVX-512 BW (REQUIRES CpuSimd() == kAvx512): the same results.
bool ContextWalk16Avx512(const uint16_t* base, uint64_t n, const uint8_t* bounds, int k,
                         const uint64_t* kc, const uint64_t* start_of, const uint64_t* gaps,
                         const uint64_t* vals, uint64_t* positions, uint64_t* values,
                         const WalkSink* sink);

// The class-local gaps grouped by class (ClassGapsGrouped in internal/context_walk.h) of sorted
// positions[0..k) among n 2-byte elements at `base` with classes bounds[0..nclasses): the same
// gaps and values.
void ContextGaps16Avx2(const uint16_t* base, uint64_t n, const uint8_t* bounds, int nclasses,
                       const uint64_t* positions, const uint64_t* values, uint64_t k,
                       const uint64_t* start_of, uint64_t* gaps, uint64_t* vals);
// ContextGaps16Avx2 built for AVX-512 BW (REQUIRES CpuSimd() == kAvx512): the same results.
void ContextGaps16Avx512(const uint16_t* base, uint64_t n, const uint8_t* bounds, int nclasses,
                         const uint64_t* positions, const uint64_t* values, uint64_t k,
                         const uint64_t* start_of, uint64_t* gaps, uint64_t* vals);

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_INTERNAL_SIMD_H_
