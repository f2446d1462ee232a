// String helpers for trace lines and error messages (internal).
#ifndef DCR_CORE_SRC_INTERNAL_STR_FORMAT_H_
#define DCR_CORE_SRC_INTERNAL_STR_FORMAT_H_

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace dcr::internal {

// printf into a std::string; output past 511 characters is cut off (trace lines are short).
inline std::string Fmt(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline std::string Fmt(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  return buf;
}

// The first eight of `ids`, comma separated, then ", ... (N in all)" when there are more.
inline std::string IdList(const std::vector<uint64_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size() && i < 8; ++i) {
    if (i) s += ", ";
    s += std::to_string(ids[i]);
  }
  if (ids.size() > 8) s += ", ... (" + std::to_string(ids.size()) + " in all)";
  return s;
}

// One visitor from several lambdas, for std::visit over an event or action variant.
template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_INTERNAL_STR_FORMAT_H_
