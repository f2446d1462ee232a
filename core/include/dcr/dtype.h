// Element types of checkpoint tensors (the safetensors dtype strings) and their widths.
//
// dcr treats every tensor as an array of fixed-width bit patterns: the codec never interprets
// values except through the ordered-integer map below (used for ulp differences, which are as
// exact as XOR). Unknown dtypes are carried bit-for-bit as 1-byte elements.
//
// Thread safety: pure functions.
#ifndef DCR_CORE_INCLUDE_DCR_DTYPE_H_
#define DCR_CORE_INCLUDE_DCR_DTYPE_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace dcr {

// Pinned values: they appear in the delta format.
enum class DType : uint8_t {
  kUnknown = 0,  // carried as raw bytes (element width 1)
  kBool = 1,
  kU8 = 2,
  kI8 = 3,
  kU16 = 4,
  kI16 = 5,
  kU32 = 6,
  kI32 = 7,
  kU64 = 8,
  kI64 = 9,
  kF16 = 10,
  kBF16 = 11,
  kF32 = 12,
  kF64 = 13,
  kF8E4M3 = 14,
  kF8E5M2 = 15,
};

// Parses a safetensors dtype string ("BF16", "F8_E4M3", ...). Unknown strings give kUnknown.
DType DTypeFromName(std::string_view name);
// The safetensors name; "UNKNOWN" for kUnknown (callers keep the original string).
std::string_view DTypeName(DType dtype);
// Element width in bytes: 1, 2, 4 or 8 (1 for kUnknown and kBool).
int DTypeWidth(DType dtype);
// True for IEEE-like sign-magnitude floats (F16, BF16, F32, F64, F8 variants).
bool DTypeIsFloat(DType dtype);

}  // namespace dcr

#endif  // DCR_CORE_INCLUDE_DCR_DTYPE_H_
