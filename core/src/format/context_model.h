// Internal: the entropy-coding pieces both halves of the context codec use (context_codec.cc
// encodes, context_decode.cc decodes; core/FORMAT.md section 2.5): the rANS scale, the symbols
// of a value, frequency normalization, the version-7 model forms and the symbol tables.
//
// Thread safety: constants and pure functions.
#ifndef DCR_CORE_SRC_FORMAT_CONTEXT_MODEL_H_
#define DCR_CORE_SRC_FORMAT_CONTEXT_MODEL_H_

#include <cstdint>

#include "internal/context_walk.h"

namespace dcr::internal {

inline constexpr int kScaleBits = 12;
inline constexpr uint32_t kScale = 1u << kScaleBits;
inline constexpr uint32_t kRansLow = 1u << 16;  // states live in [kRansLow, 2^32)
inline constexpr int kMaxClasses = kMaxContextClasses;
inline constexpr int kSymbols = 256;

// The extra bit count of a symbol, and its value from them.
inline constexpr int ExtraBits(uint8_t sym) { return sym < 16 ? 0 : (sym - 16) / 4 + 2; }
inline constexpr uint64_t ValueOf(uint8_t sym, uint64_t extra) {
  if (sym < 16) return sym;
  const int top = (sym - 16) / 4 + 4;
  const uint64_t m = (sym - 16) % 4;
  return (uint64_t{1} << top) | (m << (top - 2)) | extra;
}

// ---- frequency tables ----

// Normalizes counts (c[s], not all zero) to frequencies summing to kScale, every counted symbol
// at least 1: proportional shares rounded down, then the remainder handed out (or taken back) one
// at a time where it costs the fewest bits (largest count per frequency; comparisons in integers).
inline void Normalize(const uint64_t* c, int nsym, uint32_t* f) {
  uint64_t total = 0;
  for (int s = 0; s < nsym; ++s) total += c[s];
  int64_t sum = 0;
  for (int s = 0; s < nsym; ++s) {
    if (c[s] == 0) {
      f[s] = 0;
      continue;
    }
    const uint64_t share =
        static_cast<uint64_t>((static_cast<unsigned __int128>(c[s]) * kScale) / total);
    f[s] = static_cast<uint32_t>(std::max<uint64_t>(1, share));
    sum += f[s];
  }
  while (sum < static_cast<int64_t>(kScale)) {
    int best = -1;
    for (int s = 0; s < nsym; ++s) {
      if (c[s] == 0) continue;
      // c[s] / f[s] largest: c[s] * f[best] > c[best] * f[s].
      if (best < 0 || static_cast<unsigned __int128>(c[s]) * f[best] >
                          static_cast<unsigned __int128>(c[best]) * f[s]) {
        best = s;
      }
    }
    ++f[best];
    ++sum;
  }
  while (sum > static_cast<int64_t>(kScale)) {
    int best = -1;
    for (int s = 0; s < nsym; ++s) {
      if (f[s] <= 1) continue;
      // c[s] / (f[s] - 1) smallest.
      if (best < 0 || static_cast<unsigned __int128>(c[s]) * (f[best] - 1) <
                          static_cast<unsigned __int128>(c[best]) * (f[s] - 1)) {
        best = s;
      }
    }
    --f[best];
    --sum;
  }
}

// ---- models of a version-7 body: a table, a geometric law, or the previous model's table ----

// Model forms after the leading LEB128 0 of a version-7 model (FORMAT.md section 2.5).
inline constexpr uint8_t kModelGeometric = 0;
inline constexpr uint8_t kModelRepeat = 1;
inline constexpr uint64_t kMaxGeometricOffset = 15;
// The frequencies of the geometric law of offset o and ratio r / 65536 (0 < r < 65536): value v
// has weight q^(v - o) (1 - q) for v >= o, none below; a symbol's weight is that of its values,
// the tail of q in 32-bit fixed point, each step rounded down, so that the weights are identical
// on every machine; then normalized like counts.
inline void GeometricFreqs(uint64_t o, uint64_t r, uint32_t* f) {
  uint64_t qp[62];  // q^(2^j) in 0.32 fixed point
  qp[0] = r << 16;
  for (int j = 1; j < 62; ++j) qp[j] = (qp[j - 1] * qp[j - 1]) >> 32;
  uint64_t w[kSymbols] = {};
  uint64_t tail = uint64_t{1} << 32;  // q^(v - o) at the symbol's lowest value v
  for (int s = static_cast<int>(o); s < kSymbols && tail != 0; ++s) {
    const int j = s < 16 ? 0 : ExtraBits(static_cast<uint8_t>(s));  // the symbol holds 2^j values
    const uint64_t next = (tail * qp[j]) >> 32;
    w[s] = tail - next;
    tail = next;
  }
  Normalize(w, kSymbols, f);
}

// The value symbols' raw bit counts and the values of their raw bits all zero (ValueOf(s, 0)).
struct SymbolTables {
  uint8_t extra[kSymbols];
  uint64_t base[kSymbols];
};
inline constexpr SymbolTables MakeSymbolTables() {
  SymbolTables t{};
  for (int s = 0; s < kSymbols; ++s) {
    t.extra[s] = static_cast<uint8_t>(ExtraBits(static_cast<uint8_t>(s)));
    t.base[s] = ValueOf(static_cast<uint8_t>(s), 0);
  }
  return t;
}
inline constexpr SymbolTables kSymbolTables = MakeSymbolTables();

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_FORMAT_CONTEXT_MODEL_H_
