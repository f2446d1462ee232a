// libFuzzer target: bytes -> ParseSums. Parsing must never crash; a text it accepts formats to one
// it accepts again, with the same sums.
#include <string_view>

#include "dcr/sums.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto s = dcr::ParseSums(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!s.ok()) return 0;
  const std::string text = dcr::FormatSums(*s);
  const auto again = dcr::ParseSums(text);
  if (!again.ok() || dcr::FormatSums(*again) != text) __builtin_trap();
  return 0;
}
