// Per-element value operations of the delta format, shared by every Applier (CPU BufferApplier,
// the serving runtime, the CUDA kernels) and by encoders.
//
// Everything here is a pure inline function on zero-extended little-endian element bits of width
// 1, 2, 4 or 8 bytes, compiled as __host__ __device__ under nvcc (DCR_HOST_DEVICE), so the CPU
// unit tests exercise the exact code the GPU runs.
//
// Value modes (format.h / core/FORMAT.md):
//   kXor      value = old ^ new                         new = old ^ value
//   kUlpDelta value = zigzag(ord(new) - ord(old))        new = unord(ord(old) + unzigzag(value))
//             all arithmetic mod 2^(8*width)
//   kAbsolute value = new                                new = value
// ord is the order-preserving map of sign-magnitude floats onto unsigned integers of the same
// width:   ord(b) = b has sign bit ? ~b : b | sign.
// It depends only on the width (a chunk carries the width, not the dtype), so it is applied to
// every element of a ulp-mode chunk, integers included; it is a bijection, hence exact for any
// bits: NaN payloads, Inf, -0 and subnormals round-trip. Adjacent floats differ by 1 in ord, and
// -0/+0 are adjacent (0x7FFF.. and 0x8000..), so small float steps give small zigzag values.
//
// Thread safety: pure functions.
#ifndef DCR_CORE_SRC_INTERNAL_ELEMENT_OPS_H_
#define DCR_CORE_SRC_INTERNAL_ELEMENT_OPS_H_

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define DCR_HOST_DEVICE __host__ __device__
#else
// Forced inline on the CPU: these run once per change in the appliers' and encoders' hot loops,
// and g++ kept UlpApply out of line there (a call per change, ~12% of decode+apply at 3%).
#define DCR_HOST_DEVICE __attribute__((always_inline))
#endif

namespace dcr {
namespace internal {

// Value modes as plain integers (the pinned values of dcr::ValueMode), so device code needs no
// public header.
inline constexpr uint8_t kOpXor = 0;
inline constexpr uint8_t kOpUlpDelta = 1;
inline constexpr uint8_t kOpAbsolute = 2;

// All-ones mask of an element of `width` bytes (1, 2, 4, 8).
DCR_HOST_DEVICE inline uint64_t WidthMask(int width) {
  return width >= 8 ? ~uint64_t{0} : ((uint64_t{1} << (8 * width)) - 1);
}
DCR_HOST_DEVICE inline uint64_t SignBit(int width) { return uint64_t{1} << (8 * width - 1); }

// Order-preserving integer of sign-magnitude bits, and its inverse. Branch-free: the sign of a
// changed weight is a coin flip, and a branch on it mispredicted about once per change (two per
// change in the ulp encoder and applier, most of their per-change time).
//   Ord:   negative -> ~bits (flip all), non-negative -> bits | sign (flip the sign bit)
//   Unord: sign set -> o & ~sign (flip the sign bit), clear -> ~o (flip all)
DCR_HOST_DEVICE inline uint64_t Ord(uint64_t bits, int width) {
  const uint64_t mask = WidthMask(width);
  bits &= mask;
  const uint64_t neg = uint64_t{0} - ((bits >> (8 * width - 1)) & 1);  // all ones if negative
  return bits ^ (SignBit(width) | (neg & mask));
}
DCR_HOST_DEVICE inline uint64_t Unord(uint64_t o, int width) {
  const uint64_t mask = WidthMask(width);
  o &= mask;
  const uint64_t set = (o >> (8 * width - 1)) & 1;
  return o ^ (SignBit(width) | ((set - 1) & mask));  // set - 1: all ones when the sign is clear
}

// Zigzag of a width-byte two's complement difference (given mod 2^(8w)), and its inverse.
DCR_HOST_DEVICE inline uint64_t ZigZag(uint64_t diff, int width) {
  const uint64_t mask = WidthMask(width);
  diff &= mask;
  const uint64_t neg = (uint64_t{0} - ((diff >> (8 * width - 1)) & 1)) & mask;  // sign, spread
  return ((diff << 1) ^ neg) & mask;
}
DCR_HOST_DEVICE inline uint64_t UnZigZag(uint64_t z, int width) {
  const uint64_t mask = WidthMask(width);
  z &= mask;
  return ((z >> 1) ^ (uint64_t{0} - (z & 1))) & mask;
}

// Encoder side: the value that turns `old_bits` into `new_bits` under a mode.
DCR_HOST_DEVICE inline uint64_t XorValue(uint64_t old_bits, uint64_t new_bits) {
  return old_bits ^ new_bits;
}
DCR_HOST_DEVICE inline uint64_t UlpValue(uint64_t old_bits, uint64_t new_bits, int width) {
  return ZigZag(Ord(new_bits, width) - Ord(old_bits, width), width);
}
DCR_HOST_DEVICE inline uint64_t EncodeValue(uint8_t mode, int width, uint64_t old_bits,
                                            uint64_t new_bits) {
  switch (mode) {
    case kOpXor:
      return XorValue(old_bits, new_bits) & WidthMask(width);
    case kOpUlpDelta:
      return UlpValue(old_bits, new_bits, width);
    default:
      return new_bits & WidthMask(width);
  }
}

// Receiver side: the new bits from the current bits and a decoded value.
DCR_HOST_DEVICE inline uint64_t XorApply(uint64_t old_bits, uint64_t value, int width) {
  return (old_bits ^ value) & WidthMask(width);
}
DCR_HOST_DEVICE inline uint64_t UlpApply(uint64_t old_bits, uint64_t value, int width) {
  return Unord((Ord(old_bits, width) + UnZigZag(value, width)) & WidthMask(width), width);
}
DCR_HOST_DEVICE inline uint64_t ApplyOp(uint8_t mode, int width, uint64_t old_bits,
                                        uint64_t value) {
  switch (mode) {
    case kOpXor:
      return XorApply(old_bits, value, width);
    case kOpUlpDelta:
      return UlpApply(old_bits, value, width);
    default:
      return value & WidthMask(width);
  }
}

// The bits before a relative change, from the bits after it and its value: each relative op is
// a bijection of the element for a given value, so UndoOp(m, w, ApplyOp(m, w, o, v), v) == o
// for every o and v. Absolute overwrites cannot be undone this way (kOpAbsolute: REQUIRES not).
DCR_HOST_DEVICE inline uint64_t UndoOp(uint8_t mode, int width, uint64_t new_bits, uint64_t value) {
  if (mode == kOpXor) return XorApply(new_bits, value, width);
  return Unord((Ord(new_bits, width) - UnZigZag(value, width)) & WidthMask(width), width);
}

// Element `i` of a little-endian array of `width`-byte elements, zero-extended (no alignment
// requirement on the host; on the device the caller guarantees natural alignment).
DCR_HOST_DEVICE inline uint64_t LoadElem(const uint8_t* data, int width, uint64_t i) {
#if defined(__CUDA_ARCH__)
  switch (width) {
    case 1:
      return data[i];
    case 2:
      return reinterpret_cast<const uint16_t*>(data)[i];
    case 4:
      return reinterpret_cast<const uint32_t*>(data)[i];
    default:
      return reinterpret_cast<const unsigned long long*>(data)[i];
  }
#else
  switch (width) {
    case 1:
      return data[i];
    case 2: {
      uint16_t v;
      std::memcpy(&v, data + 2 * i, 2);
      return v;
    }
    case 4: {
      uint32_t v;
      std::memcpy(&v, data + 4 * i, 4);
      return v;
    }
    default: {
      uint64_t v;
      std::memcpy(&v, data + 8 * i, 8);
      return v;
    }
  }
#endif
}
DCR_HOST_DEVICE inline void StoreElem(uint8_t* data, int width, uint64_t i, uint64_t bits) {
#if defined(__CUDA_ARCH__)
  switch (width) {
    case 1:
      data[i] = static_cast<uint8_t>(bits);
      break;
    case 2:
      reinterpret_cast<uint16_t*>(data)[i] = static_cast<uint16_t>(bits);
      break;
    case 4:
      reinterpret_cast<uint32_t*>(data)[i] = static_cast<uint32_t>(bits);
      break;
    default:
      reinterpret_cast<unsigned long long*>(data)[i] = bits;
      break;
  }
#else
  switch (width) {
    case 1:
      data[i] = static_cast<uint8_t>(bits);
      break;
    case 2: {
      uint16_t v = static_cast<uint16_t>(bits);
      std::memcpy(data + 2 * i, &v, 2);
      break;
    }
    case 4: {
      uint32_t v = static_cast<uint32_t>(bits);
      std::memcpy(data + 4 * i, &v, 4);
      break;
    }
    default:
      std::memcpy(data + 8 * i, &bits, 8);
      break;
  }
#endif
}

// The additive hash's element term (hash.h ElementTerm), as two lanes, for device code. Must stay
// identical to dcr::ElementTerm (element_ops_test checks it).
DCR_HOST_DEVICE inline void ElementTermLanes(uint64_t salt, uint64_t index, uint64_t bits,
                                             uint64_t* lo, uint64_t* hi) {
  const uint64_t k = salt ^ (index * 0x9E3779B97F4A7C15ULL);
  const uint64_t xa = k ^ 0xA0761D6478BD642FULL, ya = bits ^ 0xE7037ED1A0B428DBULL;
  const uint64_t xb = k ^ 0x8EBC6AF09C88C6E3ULL, yb = bits ^ 0x589965CC75374CC3ULL;
#if defined(__CUDA_ARCH__)
  *lo = (xa * ya) ^ __umul64hi(xa, ya);
  *hi = (xb * yb) ^ __umul64hi(xb, yb);
#else
  const unsigned __int128 pa = static_cast<unsigned __int128>(xa) * ya;
  const unsigned __int128 pb = static_cast<unsigned __int128>(xb) * yb;
  *lo = static_cast<uint64_t>(pa) ^ static_cast<uint64_t>(pa >> 64);
  *hi = static_cast<uint64_t>(pb) ^ static_cast<uint64_t>(pb >> 64);
#endif
}

}  // namespace internal
}  // namespace dcr

#endif  // DCR_CORE_SRC_INTERNAL_ELEMENT_OPS_H_
