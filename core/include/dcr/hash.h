// Content hashes of checkpoint versions.
//
// A version's content hash is *additive*: the 128-bit sum (two independent 64-bit lanes, each mod
// 2^64) of one term per element, ElementTerm(tensor salt, canonical element index, element bits),
// plus one term per tensor for its identity (name, dtype, shape). Because it is a sum over
// elements, it can be computed over any partition (training ranks, chunks, serving shards) and
// updated incrementally from changes alone:
//     hash(target) = hash(base) - sum(term(old bits)) + sum(term(new bits))   over changed
//     elements.
// This lets a trainer that never holds the whole checkpoint, and a receiver that only touches
// changed elements, prove the version they hold. A full scan is needed only for a first version.
// (Chunks also carry a plain XXH3-128 of their covered target bytes: RangeBytesHash.)
//
// Thread safety: pure functions.
#ifndef DCR_CORE_INCLUDE_DCR_HASH_H_
#define DCR_CORE_INCLUDE_DCR_HASH_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/dtype.h"
#include "dcr/statusor.h"

namespace dcr {

class Device;  // dcr/device.h

// Salt of a tensor: XXH3-64 of its name.
uint64_t TensorSalt(std::string_view name);

// One element's contribution. `bits` holds the element's bytes little-endian, zero-extended.
// Always inlined: encoders and the content hash call it once or twice per element in hot loops.
// Each lane folds one 64x64->128-bit product of the element's key (salt, index) and its bits,
// each side offset by a lane constant: (lo ^ hi) of (key ^ Ka) * (bits ^ Kb). The fold is not
// linear in either operand, so changes do not cancel in the sum; one multiply per lane (format
// version 2; version 1 used two 64-bit finalizers per lane, twice the encoder's cost per change).
__attribute__((always_inline)) inline Hash128 ElementTerm(uint64_t salt, uint64_t index,
                                                          uint64_t bits) {
  const uint64_t k = salt ^ (index * 0x9E3779B97F4A7C15ULL);
  const unsigned __int128 pa =
      static_cast<unsigned __int128>(k ^ 0xA0761D6478BD642FULL) * (bits ^ 0xE7037ED1A0B428DBULL);
  const unsigned __int128 pb =
      static_cast<unsigned __int128>(k ^ 0x8EBC6AF09C88C6E3ULL) * (bits ^ 0x589965CC75374CC3ULL);
  return Hash128{static_cast<uint64_t>(pa) ^ static_cast<uint64_t>(pa >> 64),
                 static_cast<uint64_t>(pb) ^ static_cast<uint64_t>(pb >> 64)};
}

inline void HashAdd(Hash128* acc, const Hash128& t) {
  acc->lo += t.lo;
  acc->hi += t.hi;
}
inline void HashSub(Hash128* acc, const Hash128& t) {
  acc->lo -= t.lo;
  acc->hi -= t.hi;
}

// Reads element `i` (width 1/2/4/8 bytes) from `data` as zero-extended little-endian bits.
uint64_t LoadBits(const uint8_t* data, int width, uint64_t i);

// Identity term of a tensor (name, dtype name, shape).
Hash128 TensorIdentityTerm(std::string_view name, std::string_view dtype_name,
                           const std::vector<int64_t>& shape);

// Sum of element terms for elements [begin, begin+count) of a tensor whose bytes start at `data`
// (element 0); four elements per step with AVX2 for widths 1, 2 and 4 where the CPU has it (the
// same sum). Hash of a whole tensor = identity term + RangeHash(0, n).
Hash128 RangeHash(uint64_t salt, const uint8_t* data, int width, uint64_t begin, uint64_t count);

// Content hash of a set of tensors: sum of identity terms and element terms, computed with
// `threads` workers (0 = hardware concurrency). Result independent of `threads`.
Hash128 ContentHashOf(const std::vector<TensorView>& tensors, int threads);
// The same for tensors in the memory of `device` (dcr/device.h): each view's `data` is a device
// address, and the element terms are Device::RangeHash of groups of elements, `threads` groups at
// a time. Errors: the device's, naming the tensor and the device.
StatusOr<Hash128> DeviceContentHashOf(Device* device, const std::vector<TensorView>& tensors,
                                      int threads);

// XXH3-128 of bytes (the chunk range hash).
Hash128 BytesHash128(const void* data, size_t size);

// XXH3-128 of `k` element bit patterns packed as `width` little-endian bytes each: the chunk's
// base_change_hash / target_change_hash. Receivers gather the bits at the changed positions and
// compare; fast (no per-element mixing).
Hash128 PackedBitsHash(const uint64_t* bits, size_t k, int width);

}  // namespace dcr

#endif  // DCR_CORE_INCLUDE_DCR_HASH_H_
