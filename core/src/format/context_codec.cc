// Context-coded chunk records (dcr/context.h, core/FORMAT.md section 2.5): the encoder (class
// choice, models, the rANS stage) and the conversions to and from the plain form. The body's
// decoder is in context_decode.cc.
#include "internal/context_codec.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "dcr/context.h"
#include "dcr/hash.h"
#include "dcr/status_macros.h"
#include "format/context_model.h"
#include "internal/byte_io.h"
#include "internal/chunk_bounds.h"
#include "internal/context_walk.h"
#include "internal/element_ops.h"

namespace dcr {
namespace internal {
namespace {

// ---- varints ----

void PutVarint(std::vector<uint8_t>* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<uint8_t>(v) | 0x80);
    v >>= 7;
  }
  out->push_back(static_cast<uint8_t>(v));
}

// ---- symbols: a value v is symbol v below 16, else its bit length and two bits below the top,
// the remaining low bits raw ----

struct Sym {
  uint8_t sym;
  uint8_t nbits;  // extra raw bits
  uint64_t extra;
};

// Without a branch on v < 16, which the encoder's loops over values would mispredict: the wide
// form is computed for every v (v | 16 has v's top bit when v >= 16, and a valid shift below)
// and selected.
inline Sym SymbolOf(uint64_t v) {
  const int top = 63 - __builtin_clzll(v | 16);  // >= 4
  const int nb = top - 2;
  const bool small = v < 16;
  const uint8_t wide = static_cast<uint8_t>(16 + 4 * (top - 4) + ((v >> nb) & 3));
  return Sym{small ? static_cast<uint8_t>(v) : wide, static_cast<uint8_t>(small ? 0 : nb),
             small ? 0 : v & ((uint64_t{1} << nb) - 1)};
}

// ---- deterministic integer log2 (16 fractional bits): the encoder's cost estimates use no
// floating point, so its choices are identical on every machine ----

uint64_t Log2Fx(uint64_t x) {
  if (x <= 1) return 0;
  const int e = 63 - __builtin_clzll(x);
  uint64_t m = e >= 31 ? x >> (e - 31) : x << (31 - e);  // [2^31, 2^32): 1.31 fixed point
  uint64_t r = static_cast<uint64_t>(e) << 16;
  for (int i = 15; i >= 0; --i) {
    m = (m * m) >> 31;
    if (m >= (uint64_t{1} << 32)) {
      m >>= 1;
      r |= uint64_t{1} << i;
    }
  }
  return r;
}

// x * log2(x) in 1/65536 bits (0 for x <= 1); small x from a table.
uint64_t XLogX(uint64_t x) {
  static const std::vector<uint64_t> table = [] {
    std::vector<uint64_t> t(4096);
    for (uint64_t i = 0; i < t.size(); ++i) t[i] = i * Log2Fx(i);
    return t;
  }();
  return x < table.size() ? table[x] : x * Log2Fx(x);
}

// A model on the wire: varint S (symbols listed, 1..256), then for symbols 0..S-1 a varint
// frequency, where a 0 is followed by a varint count of further zero symbols.
void PutModel(const uint32_t* f, std::vector<uint8_t>* out) {
  int n = kSymbols;
  while (n > 1 && f[n - 1] == 0) --n;
  PutVarint(out, static_cast<uint64_t>(n));
  for (int s = 0; s < n;) {
    if (f[s] != 0) {
      PutVarint(out, f[s]);
      ++s;
      continue;
    }
    int z = 1;
    while (s + z < n && f[s + z] == 0) ++z;
    PutVarint(out, 0);
    PutVarint(out, static_cast<uint64_t>(z - 1));
    s += z;
  }
}

constexpr uint64_t kGeometricOne = 65536;  // the ratio's denominator

// Estimated bits (1/65536 units) of coding symbol counts `cnt` with frequencies `f`: count times
// log2(4096 / f); kInfeasible when a counted symbol has frequency 0.
constexpr uint64_t kInfeasible = ~uint64_t{0};
uint64_t ModelCodeBits(const uint64_t* cnt, const uint32_t* f) {
  uint64_t bits = 0;
  for (int s = 0; s < kSymbols; ++s) {
    if (cnt[s] == 0) continue;
    if (f[s] == 0) return kInfeasible;
    bits += cnt[s] * ((uint64_t{kScaleBits} << 16) - Log2Fx(f[s]));
  }
  return bits;
}
uint64_t ModelBytesBits(uint64_t bytes) { return bytes * (uint64_t{8} << 16); }

// ---- class choice (encoder) ----

struct ClassStats {
  int lo = 0;  // lowest exponent of the class (exponents up to the next class's lo belong to it)
  uint64_t n = 0, k = 0;
  std::vector<uint64_t> hist;  // value symbol counts
  uint64_t cost = 0;           // estimated bits (1/65536 units)
};

// Bytes of a geometric model (LEB128 0, form, offset, ratio): what the class estimate charges for
// a class's gap model.
constexpr uint64_t kGeometricModelBytes = 5;

uint64_t ClassCost(const ClassStats& c) {
  if (c.k == 0) return 0;
  const uint64_t pos = XLogX(c.n) - XLogX(c.k) - XLogX(c.n - c.k);
  uint64_t val = XLogX(c.k);
  uint64_t nz = 0;
  for (uint64_t h : c.hist) {
    if (h == 0) continue;
    val -= XLogX(h);
    ++nz;
  }
  const uint64_t table = (nz + kGeometricModelBytes) * (uint64_t{8} << 16);
  return pos + val + table;
}

ClassStats Merged(const ClassStats& a, const ClassStats& b) {
  ClassStats m;
  m.lo = a.lo;
  m.n = a.n + b.n;
  m.k = a.k + b.k;
  m.hist.assign(std::max(a.hist.size(), b.hist.size()), 0);
  for (size_t i = 0; i < a.hist.size(); ++i) m.hist[i] += a.hist[i];
  for (size_t i = 0; i < b.hist.size(); ++i) m.hist[i] += b.hist[i];
  m.cost = ClassCost(m);
  return m;
}

// Picks at most max_classes (1..kMaxClasses) classes, each a run of exponents, from per-exponent
// element counts (`ne`), change counts (`ke`) and value symbol histograms: adjacent classes are
// merged, the merge that saves the most estimated bits first (the one that costs the fewest when
// none saves any), while one saves any or there are more than max_classes. Writes the classes'
// lowest exponents to bounds[0..K) (bounds[0] = 0) and returns K.
int ChooseClasses(const uint64_t* ne, const uint64_t* ke,
                  const std::vector<std::vector<uint64_t>>& hv, int max_classes, uint8_t* bounds) {
  std::vector<ClassStats> cls;
  for (int e = 0; e < 256; ++e) {
    if (ne[e] == 0 && ke[e] == 0) continue;
    ClassStats c;
    c.lo = cls.empty() ? 0 : e;
    c.n = std::max(ne[e], ke[e]);
    c.k = ke[e];
    c.hist = hv[e];
    c.cost = ClassCost(c);
    cls.push_back(std::move(c));
  }
  if (cls.empty()) {
    bounds[0] = 0;
    return 1;
  }
  // gain[i]: bits saved by merging classes i and i+1 (may be negative).
  auto gain = [&](size_t i) {
    const ClassStats m = Merged(cls[i], cls[i + 1]);
    return static_cast<int64_t>(cls[i].cost + cls[i + 1].cost) - static_cast<int64_t>(m.cost);
  };
  std::vector<int64_t> gains;
  for (size_t i = 0; i + 1 < cls.size(); ++i) gains.push_back(gain(i));
  while (cls.size() > 1) {
    size_t best = 0;
    for (size_t i = 1; i < gains.size(); ++i)
      if (gains[i] > gains[best]) best = i;
    if (gains[best] <= 0 && cls.size() <= static_cast<size_t>(max_classes)) break;
    cls[best] = Merged(cls[best], cls[best + 1]);
    cls.erase(cls.begin() + static_cast<ptrdiff_t>(best) + 1);
    gains.erase(gains.begin() + static_cast<ptrdiff_t>(best));
    if (best < gains.size()) gains[best] = gain(best);
    if (best > 0) gains[best - 1] = gain(best - 1);
  }
  for (size_t i = 0; i < cls.size(); ++i) bounds[i] = static_cast<uint8_t>(cls[i].lo);
  return static_cast<int>(cls.size());
}

// ---- rANS (two interleaved 32-bit states, 16-bit words, 12-bit frequencies) ----

// The encoder's table entry of a symbol of a model: x >= xmax renormalizes; rcp = ceil(2^64 /
// freq) for freq >= 2, so floor(x / freq) = (x * rcp) >> 64 for every x < 2^32 (the error of rcp
// adds less than x * 2^-64 < 2^-32 to x / freq, whose fraction is at most 1 - 1/freq <= 1 - 2^-12).
struct RansEncSym {
  uint32_t freq = 0, cum = 0;
  uint64_t xmax = 0, rcp = 0;
  uint64_t pass = 0;  // all ones for freq 1 (whose quotient is x itself), else 0
};

// Per-thread encoder scratch.
struct EncodeScratch {
  std::vector<uint64_t> ordered, vordered;  // gaps / values in class order
  std::vector<uint8_t> gsym, vsym;          // their symbols
  std::vector<uint32_t> flat_hv;            // value symbol counts per exponent (kept zeroed)
  std::vector<RansEncSym> enc;
  std::vector<uint16_t> words;
};
EncodeScratch& EScratch() {
  thread_local EncodeScratch s;
  return s;
}

// The class choice's sample of the base (ContextSampleStep): counts per context, unscaled. Four
// tables, so that runs of one context do not wait on their own increments.
void SampleContexts(const uint8_t* base, int w, uint64_t n, uint64_t* ne) {
  const uint64_t step = ContextSampleStep(n);
  uint64_t t[4][256] = {};
  uint64_t i = 0;
  for (; i + 3 * step < n; i += 4 * step) {
    ++t[0][ContextOf(base, w, i)];
    ++t[1][ContextOf(base, w, i + step)];
    ++t[2][ContextOf(base, w, i + 2 * step)];
    ++t[3][ContextOf(base, w, i + 3 * step)];
  }
  for (; i < n; i += step) ++t[0][ContextOf(base, w, i)];
  for (int e = 0; e < 256; ++e) ne[e] = t[0][e] + t[1][e] + t[2][e] + t[3][e];
}

// Symbolizes the class-ordered gaps and values of `sc` (sc.gsym, sc.vsym; classes c < K at
// changes [start_of[c], start_of[c + 1])): each class's gap symbol counts into its row of
// `counts`, the raw bits all symbols take into *nbits, and each class's sums of gaps and of
// values into sum[role][c].
// (Through local pointers: the symbol stores are bytes, which may alias anything, so the
// vectors' own pointers would be reloaded from the thread-local scratch at every store. A class's
// gaps mostly have a few symbols, so they are counted in two tables, even and odd changes, that
// a repeated symbol's increments do not wait on each other's stores.)
inline __attribute__((always_inline)) void SymbolizeClasses(EncodeScratch& sc, int K,
                                                            const uint64_t* start_of,
                                                            uint64_t* counts_data,
                                                            uint64_t* nbits_out,
                                                            unsigned __int128 sum[2][kMaxClasses]) {
  uint64_t nbits = 0;
  const uint64_t* __restrict og = sc.ordered.data();
  const uint64_t* __restrict ov = sc.vordered.data();
  uint8_t* __restrict gsym = sc.gsym.data();
  uint8_t* __restrict vsym = sc.vsym.data();
  uint32_t pair[2][kSymbols];
  for (int c = 0; c < K; ++c) {
    std::memset(pair, 0, sizeof(pair));
    unsigned __int128 gs = 0, vs = 0;
    uint64_t cbits = 0;
    uint64_t j = start_of[c];
    const uint64_t end = start_of[c + 1];
    auto one = [&](uint64_t i, uint32_t* __restrict tab) __attribute__((always_inline)) {
      const Sym g = SymbolOf(og[i]);
      const Sym v = SymbolOf(ov[i]);
      gsym[i] = g.sym;
      vsym[i] = v.sym;
      ++tab[g.sym];
      cbits += static_cast<uint64_t>(g.nbits) + v.nbits;
      gs += og[i];
      vs += ov[i];
    };
    for (; j + 2 <= end; j += 2) {
      one(j, pair[0]);
      one(j + 1, pair[1]);
    }
    if (j < end) one(j, pair[0]);
    uint64_t* __restrict row = &counts_data[static_cast<size_t>(c) * kSymbols];
    for (int v = 0; v < kSymbols; ++v) row[v] = uint64_t{pair[0][v]} + pair[1][v];
    nbits += cbits;
    sum[0][c] = gs;
    sum[1][c] = vs;
  }
  *nbits_out = nbits;
}

// The models of the classes with changes (kc[c] > 0), each its gap model then its value model:
// of its counts' table (row role * K + c of `counts`), the geometric law fitted to its values
// (sums sum[role][c]) and the previous model of its role, the one of fewest estimated bits (code
// and model bytes; ties: that order). Writes each model's frequencies into its row of `freq` and
// returns the models' bytes.
std::vector<uint8_t> ChooseModels(const std::vector<uint64_t>& counts, const uint64_t* kc, int K,
                                  const unsigned __int128 sum[2][kMaxClasses],
                                  std::vector<uint32_t>* freq) {
  std::vector<uint8_t> models;
  const uint32_t* prev[2] = {nullptr, nullptr};
  uint32_t gf[kSymbols];
  std::vector<uint8_t> table;
  for (int c = 0; c < K; ++c) {
    if (kc[c] == 0) continue;
    for (int role = 0; role < 2; ++role) {
      const size_t row = static_cast<size_t>(role * K + c) * kSymbols;
      const uint64_t* cnt = &counts[row];
      uint32_t* f = &(*freq)[row];
      Normalize(cnt, kSymbols, f);
      table.clear();
      PutModel(f, &table);
      uint64_t best = ModelCodeBits(cnt, f) + ModelBytesBits(table.size());
      int form = -1;  // -1: the table
      // The geometric law: offset the lowest value's symbol (at most 15), ratio the fitted mean
      // of the values above the offset (no value is below it: values below 16 are their own
      // symbols, larger ones have symbols of 16 and above).
      int lowest = 0;
      while (cnt[lowest] == 0) ++lowest;
      const uint64_t o = std::min<uint64_t>(static_cast<uint64_t>(lowest), kMaxGeometricOffset);
      const unsigned __int128 above = sum[role][c] - static_cast<unsigned __int128>(kc[c]) * o;
      const unsigned __int128 all = above + kc[c];
      const uint64_t r = std::clamp<uint64_t>(
          static_cast<uint64_t>((above * (2 * kGeometricOne) + all) / (2 * all)), 1,
          kGeometricOne - 1);
      GeometricFreqs(o, r, gf);
      const uint64_t geo = ModelCodeBits(cnt, gf);
      if (geo != kInfeasible && geo + ModelBytesBits(kGeometricModelBytes) < best) {
        best = geo + ModelBytesBits(kGeometricModelBytes);
        form = kModelGeometric;
      }
      if (prev[role] != nullptr) {
        const uint64_t rep = ModelCodeBits(cnt, prev[role]);
        if (rep != kInfeasible && rep + ModelBytesBits(2) < best) form = kModelRepeat;
      }
      if (form == -1) {
        models.insert(models.end(), table.begin(), table.end());
      } else if (form == kModelGeometric) {
        std::memcpy(f, gf, sizeof(gf));
        const uint8_t b[5] = {0, kModelGeometric, static_cast<uint8_t>(o), static_cast<uint8_t>(r),
                              static_cast<uint8_t>(r >> 8)};
        models.insert(models.end(), b, b + 5);
      } else {
        std::memcpy(f, prev[role], sizeof(uint32_t) * kSymbols);
        models.push_back(0);
        models.push_back(kModelRepeat);
      }
      prev[role] = f;
    }
  }
  return models;
}

// The raw bits of the symbols (gaps `og` with symbols `gsym`, then values `ov` with symbols
// `vsym`, k of each), `nbits` in all, least significant bit first.
std::vector<uint8_t> PackRawBits(const uint64_t* og, const uint8_t* gsym, const uint64_t* ov,
                                 const uint8_t* vsym, uint64_t k, uint64_t nbits) {
  std::vector<uint8_t> bits;
  // Least significant bit first, without a branch per symbol: the pending bits (fewer than 8
  // after each put) are stored as a whole word each time and the bytes they complete passed
  // over. 8 bytes of slack take the last word's store.
  bits.resize((nbits + 7) / 8 + 8);
  uint8_t* bp = bits.data();
  uint64_t acc = 0;
  uint32_t fill = 0;
  auto put = [&](uint64_t v, uint32_t nb) __attribute__((always_inline)) {  // nb <= 56
    acc |= v << fill;
    fill += nb;
    std::memcpy(bp, &acc, 8);
    const uint32_t done = fill >> 3;  // at most 7
    bp += done;
    acc >>= 8 * done;
    fill &= 7;
  };
  // A symbol's raw bits are the low ExtraBits(symbol) bits of its value (none below 16).
  auto put_all = [&](const uint64_t* __restrict v, const uint8_t* __restrict sym)
      __attribute__((always_inline)) {
    for (uint64_t j = 0; j < k; ++j) {
      const uint32_t nb = kSymbolTables.extra[sym[j]];
      const uint64_t raw = v[j] & ((uint64_t{1} << nb) - 1);
      if (nb > 56) {  // the widest gaps: in two parts
        put(raw & 0xFFFFFFFF, 32);
        put(raw >> 32, nb - 32);
      } else {
        put(raw, nb);
      }
    }
  };
  put_all(og, gsym);
  put_all(ov, vsym);
  bits.resize((nbits + 7) / 8);
  return bits;
}

// rANS of the symbols of `sc` (classes c < K at changes [start_of[c], start_of[c + 1]), tables
// sc.enc), last symbol first: symbol j < k is class-ordered gap j, k + j its value. Leaves the
// words in sc.words (in encoding order) and the two final states in x[0], x[1].
// At most one word per symbol: a state below 2^32 renormalized once is below 2^16 <= xmax.
void RansEncodeSymbols(EncodeScratch& sc, int K, const uint64_t* start_of, uint64_t k,
                       uint32_t x[2]) {
  sc.words.resize(2 * k + 1);
  uint16_t* const words = sc.words.data();
  uint64_t nw = 0;
  uint32_t x0 = kRansLow, x1 = kRansLow;
  auto encode = [&](uint32_t & s, const RansEncSym& e) __attribute__((always_inline)) {
    uint64_t xs = s;
    const uint64_t renorm = xs >= e.xmax ? 1 : 0;
    words[nw] = static_cast<uint16_t>(xs);
    nw += renorm;
    xs >>= renorm << 4;
    const uint64_t q =
        static_cast<uint64_t>((static_cast<unsigned __int128>(xs) * e.rcp) >> 64) + (xs & e.pass);
    s = static_cast<uint32_t>((q << kScaleBits) + (xs - q * e.freq) + e.cum);
  };
  // Symbols off + j for j in [lo, hi) with the table tab, last first, symbol i with state
  // x[i & 1]: two at a time, odd then even.
  auto run = [&](const RansEncSym* tab, const uint8_t* sym, uint64_t lo, uint64_t hi, uint64_t off)
      __attribute__((always_inline)) {
    uint64_t j = hi;
    if (j > lo && ((off + j - 1) & 1) == 0) {
      --j;
      encode(x0, tab[sym[j]]);
    }
    for (; j >= lo + 2; j -= 2) {
      encode(x1, tab[sym[j - 1]]);
      encode(x0, tab[sym[j - 2]]);
    }
    if (j > lo) encode(x1, tab[sym[j - 1]]);
  };
  for (int c = K; c-- > 0;) {
    run(&sc.enc[static_cast<size_t>(K + c) * kSymbols], sc.vsym.data(), start_of[c],
        start_of[c + 1], k);
  }
  for (int c = K; c-- > 0;) {
    run(&sc.enc[static_cast<size_t>(c) * kSymbols], sc.gsym.data(), start_of[c], start_of[c + 1],
        0);
  }
  sc.words.resize(nw);
  x[0] = x0;
  x[1] = x1;
}

}  // namespace

std::vector<uint8_t> EncodeContextBody(const uint8_t* base, uint64_t n, int w,
                                       const uint64_t* positions, const uint64_t* values,
                                       uint64_t k, const ContextHints& hints, int max_classes) {
  EncodeScratch& sc = EScratch();
  // Element counts per exponent, from the sample (scaled back to the chunk's size).
  uint64_t ne[256] = {}, ke[256] = {};
  if (hints.sample != nullptr) {
    std::memcpy(ne, hints.sample, sizeof(ne));
  } else {
    SampleContexts(base, w, n, ne);
  }
  const uint64_t step = ContextSampleStep(n);
  if (step > 1)
    for (uint64_t& c : ne) c *= step;
  // Value symbol counts per exponent, in a flat table whose used rows are cleared afterwards; the
  // changes per exponent are the sums of its row, over the rows between the lowest and the highest
  // exponent of a change. (Neighbouring changes mostly share an exponent, so a counter of their own
  // would be incremented back to back, each increment waiting on the last one's store.)
  sc.flat_hv.resize(size_t{256} * kSymbols);
  uint32_t* const fhv = sc.flat_hv.data();
  uint32_t lo = 255, hi = 0;
  auto count = [&](uint64_t i, uint32_t e) __attribute__((always_inline)) {
    ++fhv[size_t{e} * kSymbols + SymbolOf(values[i]).sym];
    lo = std::min(lo, e);
    hi = std::max(hi, e);
  };
  if (hints.contexts != nullptr) {
    for (uint64_t i = 0; i < k; ++i) count(i, hints.contexts[i]);
  } else {
    for (uint64_t i = 0; i < k; ++i) count(i, ContextOf(base, w, positions[i]));
  }
  for (uint32_t e = lo; e <= hi; ++e) {
    const uint32_t* row = fhv + static_cast<size_t>(e) * kSymbols;
    uint64_t sum = 0;
    for (int v = 0; v < kSymbols; ++v) sum += row[v];
    ke[e] = sum;
  }
  std::vector<std::vector<uint64_t>> hv(256);
  for (int e = 0; e < 256; ++e) {
    if (ke[e] == 0) continue;
    uint32_t* row = fhv + static_cast<size_t>(e) * kSymbols;
    int top = kSymbols;
    while (top > 0 && row[top - 1] == 0) --top;
    hv[e].assign(row, row + top);
    std::memset(row, 0, sizeof(uint32_t) * kSymbols);
  }
  uint8_t bounds[kMaxClasses] = {};
  const int K = ChooseClasses(ne, ke, hv, std::clamp(max_classes, 1, kMaxClasses), bounds);
  ClassMap map(bounds, K);

  // Changes per class, and the value symbol counts of each class's model, from the exponents'.
  uint64_t kc[kMaxClasses] = {};
  std::vector<uint64_t> counts(static_cast<size_t>(2 * K) * kSymbols, 0);
  for (int e = 0; e < 256; ++e) {
    if (ke[e] == 0) continue;
    const int c = map.ClassOf(static_cast<uint8_t>(e));
    kc[c] += ke[e];
    uint64_t* row = &counts[static_cast<size_t>(K + c) * kSymbols];
    for (size_t s = 0; s < hv[e].size(); ++s) row[s] += hv[e][s];
  }
  uint64_t start_of[kMaxClasses + 1] = {};
  for (int c = 0; c < K; ++c) start_of[c + 1] = start_of[c] + kc[c];
  // The class-local gaps and the values grouped by class, in position order within each
  // (ordered[j]: gap of the class-ordered change j; vordered[j]: its value), block by block over
  // the covered elements.
  sc.ordered.resize(k);
  sc.vordered.resize(k);
  ClassGapsGrouped(base, w, n, map, positions, values, k, start_of, sc.ordered.data(),
                   sc.vordered.data(), CpuSimd());
  // The symbols of the gaps and values, the gap models' counts, the raw bits they take, and each
  // class's sums of gaps and of values (sum[role][c]) for the geometric fits.
  sc.gsym.resize(k);
  sc.vsym.resize(k);
  uint64_t nbits = 0;
  unsigned __int128 sum[2][kMaxClasses] = {};
  SymbolizeClasses(sc, K, start_of, counts.data(), &nbits, sum);
  // The models, for each class with changes its gap model then its value model (ChooseModels).
  std::vector<uint32_t> freq(counts.size(), 0);
  const std::vector<uint8_t> models = ChooseModels(counts, kc, K, sum, &freq);
  // The encoder's per-symbol tables: frequency, start, and the reciprocal that turns the division
  // by the frequency into a multiplication (exact for states < 2^32).
  sc.enc.resize(counts.size());
  for (int m = 0; m < 2 * K; ++m) {
    if (kc[m % K] == 0) continue;
    const size_t row = static_cast<size_t>(m) * kSymbols;
    uint32_t c = 0;
    for (int s = 0; s < kSymbols; ++s) {
      const uint32_t f = freq[row + s];
      RansEncSym& e = sc.enc[row + s];
      e.freq = f;
      e.cum = c;
      e.xmax = static_cast<uint64_t>(f) << (32 - kScaleBits);
      e.rcp = f <= 1
                  ? 0
                  : static_cast<uint64_t>(((static_cast<unsigned __int128>(1) << 64) + f - 1) / f);
      e.pass = f == 1 ? ~uint64_t{0} : 0;
      c += f;
    }
  }

  std::vector<uint8_t> out;
  out.reserve(64 + models.size() + k);
  // positions hash
  {
    const uint64_t h = XXH3_64bits(positions, k * sizeof(uint64_t));
    const uint8_t* b = reinterpret_cast<const uint8_t*>(&h);
    out.insert(out.end(), b, b + 8);
  }
  out.push_back(static_cast<uint8_t>(K));
  for (int c = 1; c < K; ++c) out.push_back(bounds[c]);
  for (int c = 0; c < K; ++c) PutVarint(&out, kc[c]);
  out.insert(out.end(), models.begin(), models.end());
  // The raw bits of the symbol sequence (every class's gaps, then every class's values), in order.
  const std::vector<uint8_t> bits =
      PackRawBits(sc.ordered.data(), sc.gsym.data(), sc.vordered.data(), sc.vsym.data(), k, nbits);
  // rANS, last symbol first (RansEncodeSymbols).
  uint32_t x[2];
  RansEncodeSymbols(sc, K, start_of, k, x);
  const uint64_t rans_size = 8 + 2 * sc.words.size();
  PutVarint(&out, rans_size);
  const size_t r0 = out.size();
  out.resize(r0 + rans_size);
  std::memcpy(out.data() + r0, &x[0], 4);
  std::memcpy(out.data() + r0 + 4, &x[1], 4);
  uint8_t* wp = out.data() + r0 + 8;
  for (size_t i = sc.words.size(); i-- > 0;) {
    std::memcpy(wp, &sc.words[i], 2);
    wp += 2;
  }
  out.insert(out.end(), bits.begin(), bits.end());
  return out;
}

std::vector<uint8_t> SealContextRecord(ChunkHeader h, const std::vector<uint8_t>& body) {
  h.position_mode = PositionMode::kContextV7;
  h.streams.assign(1, StreamInfo{StreamCodec::kRaw, body.size(), body.size()});
  h.compact = true;
  return SealRecord(h, body);
}

std::vector<uint8_t> EncodeContextRecord(const ChunkHeader& h, const uint64_t* positions,
                                         const uint64_t* values, const uint8_t* base,
                                         const ContextHints& hints, int max_classes) {
  return SealContextRecord(h, EncodeContextBody(base, h.num_elements, h.elem_width, positions,
                                                values, h.num_changes, hints, max_classes));
}

}  // namespace internal

namespace {

// The packed bits hash of `k` elements of width w at the positions of `base`.
Hash128 HashAt(const uint8_t* base, int w, const uint64_t* pos, uint64_t k,
               std::vector<uint8_t>* scratch) {
  scratch->resize(k * static_cast<uint64_t>(w));
  for (uint64_t i = 0; i < k; ++i) std::memcpy(scratch->data() + i * w, base + pos[i] * w, w);
  return BytesHash128(scratch->data(), scratch->size());
}

Hash128 HashApplied(const uint8_t* base, int w, ValueMode mode, const uint64_t* pos,
                    const uint64_t* values, uint64_t k, std::vector<uint8_t>* scratch) {
  scratch->resize(k * static_cast<uint64_t>(w));
  for (uint64_t i = 0; i < k; ++i) {
    const uint64_t o = internal::LoadElem(base, w, pos[i]);
    const uint64_t nb = internal::ApplyOp(static_cast<uint8_t>(mode), w, o, values[i]);
    std::memcpy(scratch->data() + i * w, &nb, w);
  }
  return BytesHash128(scratch->data(), scratch->size());
}

}  // namespace

Status CheckContextClasses(int classes) {
  if (classes >= 1 && classes <= kContextClassesMax) return Status::OK();
  return InvalidArgumentError("context classes " + std::to_string(classes) +
                              ": a context-coded chunk has 1 to " +
                              std::to_string(kContextClassesMax) + " exponent classes");
}

bool ContextCodable(const ChunkHeader& h) {
  return IsRelative(h.value_mode) &&
         (h.elem_width == 2 || h.elem_width == 4 || h.elem_width == 8) && h.num_changes > 0 &&
         h.num_changes < h.num_elements;
}

StatusOr<std::vector<uint8_t>> EncodeContextChunk(const uint8_t* plain, size_t size,
                                                  const uint8_t* base, size_t base_size,
                                                  int max_classes) {
  DCR_RETURN_IF_ERROR(CheckContextClasses(max_classes));
  thread_local DecodedChunk dc;
  DCR_RETURN_IF_ERROR(DecodeChunkInto(plain, size, &dc));
  const ChunkHeader& h = dc.header;
  if (IsContextCoded(h)) return InvalidArgumentError("chunk is context-coded already");
  if (!ContextCodable(h)) {
    return InvalidArgumentError("chunk " + std::to_string(h.chunk_id) +
                                " has no context-coded form (absolute values, 1-byte elements, "
                                "no change or every element changed)");
  }
  if (base_size != h.num_elements * h.elem_width) {
    return InvalidArgumentError("base bits of " + std::to_string(base_size) +
                                " bytes for a chunk of " + std::to_string(h.num_elements) +
                                " elements of " + std::to_string(h.elem_width) + " bytes");
  }
  thread_local std::vector<uint8_t> scratch;
  if (HashAt(base, h.elem_width, dc.positions.data(), h.num_changes, &scratch) !=
      h.base_change_hash) {
    return FailedPreconditionError("chunk " + std::to_string(h.chunk_id) +
                                   ": the base bits given differ from the chunk's base");
  }
  return internal::EncodeContextRecord(h, dc.positions.data(), dc.values.data(), base, {},
                                       max_classes);
}

Status DecodeContextChunkInto(const uint8_t* record, size_t size, const uint8_t* base,
                              size_t base_size, DecodedChunk* out) {
  return internal::DecodeContextRecord(record, size, base, base_size, out, true);
}

Status internal::DecodeContextRecord(const uint8_t* record, size_t size, const uint8_t* base,
                                     size_t base_size, DecodedChunk* out, bool verify_hashes,
                                     const WalkSink* sink) {
  size_t hsize = 0, rsize = 0;
  DCR_ASSIGN_OR_RETURN(out->header, ParseChunkHeader(record, size, &hsize, &rsize));
  const ChunkHeader& h = out->header;
  const std::string id = "chunk " + std::to_string(h.chunk_id);
  if (!IsContextCoded(h)) return InvalidArgumentError(id + " is not context-coded");
  if (base_size != h.num_elements * h.elem_width) {
    return InvalidArgumentError(id + ": base bits of " + std::to_string(base_size) +
                                " bytes, the chunk covers " + std::to_string(h.num_elements) +
                                " elements of " + std::to_string(h.elem_width) + " bytes");
  }
  const uint8_t* body = record + hsize;
  const size_t body_size = rsize - hsize;
  if (XXH3_64bits(body, body_size) != h.payload_checksum) {
    return DataLossError(id + ": payload checksum mismatch");
  }
  const uint64_t k = h.num_changes;
  out->positions.resize(k);
  out->values.resize(k);
  DCR_RETURN_IF_ERROR(internal::DecodeContextBody(h, body, body_size, base, out->positions.data(),
                                                  out->values.data(), sink));
  if (!verify_hashes) return Status::OK();
  thread_local std::vector<uint8_t> scratch;
  if (HashAt(base, h.elem_width, out->positions.data(), k, &scratch) != h.base_change_hash) {
    return FailedPreconditionError(id +
                                   ": current bits differ from the delta's base (wrong base, "
                                   "or the chunk was already applied)");
  }
  if (HashApplied(base, h.elem_width, h.value_mode, out->positions.data(), out->values.data(), k,
                  &scratch) != h.target_change_hash) {
    return DataLossError(id + ": decoded values do not produce the target bits");
  }
  return Status::OK();
}

StatusOr<std::vector<uint8_t>> ContextChunkToPlain(const uint8_t* record, size_t size,
                                                   const uint8_t* base, size_t base_size,
                                                   int zstd_level) {
  thread_local DecodedChunk dc;
  DCR_RETURN_IF_ERROR(DecodeContextChunkInto(record, size, base, base_size, &dc));
  return internal::EncodePlainRecord(dc.header, dc.positions.data(), dc.values.data(), zstd_level);
}

Status GatherCoveredBits(const ChunkHeader& h, const std::vector<TensorBuffer>& tensors,
                         std::vector<uint8_t>* out) {
  const int w = h.elem_width;
  // The segments fit the tensors before the bits are allocated (num_elements is the header's).
  DCR_RETURN_IF_ERROR(internal::CheckChunkBounds(h, tensors));
  out->resize(h.num_elements * static_cast<uint64_t>(w));
  uint8_t* p = out->data();
  uint64_t covered = 0;
  for (const Segment& sg : h.segments) {
    if (sg.tensor_index >= tensors.size()) {
      return DataLossError("chunk " + std::to_string(h.chunk_id) + ": tensor index out of range");
    }
    const TensorBuffer& tb = tensors[sg.tensor_index];
    if (tb.width != w) {
      return DataLossError("chunk " + std::to_string(h.chunk_id) +
                           ": element width differs from the tensor's");
    }
    int64_t lo = static_cast<int64_t>(sg.offset), hi = lo;
    for (uint32_t d = 0; d < sg.ndim; ++d) {
      const int64_t span = static_cast<int64_t>(sg.count[d] - 1) * sg.stride[d];
      if (span < 0)
        lo += span;
      else
        hi += span;
    }
    const uint64_t m = sg.num_elements();
    if (lo < 0 || static_cast<uint64_t>(hi) >= tb.num_elements || covered + m > h.num_elements) {
      return DataLossError("chunk " + std::to_string(h.chunk_id) +
                           ": segment outside its tensor's elements");
    }
    if (sg.IsContiguous()) {
      std::memcpy(p, tb.data + sg.offset * w, m * w);
    } else {
      for (uint64_t i = 0; i < m; ++i) std::memcpy(p + i * w, tb.data + sg.ElementAt(i) * w, w);
    }
    p += m * w;
    covered += m;
  }
  if (covered != h.num_elements) {
    return DataLossError("chunk " + std::to_string(h.chunk_id) +
                         ": segments do not cover num_elements");
  }
  return Status::OK();
}

}  // namespace dcr
