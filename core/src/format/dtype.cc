#include "dcr/dtype.h"

#include <array>
#include <utility>

namespace dcr {
namespace {
constexpr std::array<std::pair<std::string_view, DType>, 15> kNames = {{
    {"BOOL", DType::kBool},
    {"U8", DType::kU8},
    {"I8", DType::kI8},
    {"U16", DType::kU16},
    {"I16", DType::kI16},
    {"U32", DType::kU32},
    {"I32", DType::kI32},
    {"U64", DType::kU64},
    {"I64", DType::kI64},
    {"F16", DType::kF16},
    {"BF16", DType::kBF16},
    {"F32", DType::kF32},
    {"F64", DType::kF64},
    {"F8_E4M3", DType::kF8E4M3},
    {"F8_E5M2", DType::kF8E5M2},
}};
}  // namespace

DType DTypeFromName(std::string_view name) {
  for (const auto& [n, d] : kNames)
    if (n == name) return d;
  return DType::kUnknown;
}

std::string_view DTypeName(DType dtype) {
  for (const auto& [n, d] : kNames)
    if (d == dtype) return n;
  return "UNKNOWN";
}

int DTypeWidth(DType dtype) {
  switch (dtype) {
    case DType::kU16:
    case DType::kI16:
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kU32:
    case DType::kI32:
    case DType::kF32:
      return 4;
    case DType::kU64:
    case DType::kI64:
    case DType::kF64:
      return 8;
    default:
      return 1;
  }
}

bool DTypeIsFloat(DType dtype) {
  switch (dtype) {
    case DType::kF16:
    case DType::kBF16:
    case DType::kF32:
    case DType::kF64:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
      return true;
    default:
      return false;
  }
}

}  // namespace dcr
