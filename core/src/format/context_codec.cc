// Context-coded chunk records (dcr/context.h, core/FORMAT.md section 2.5): the body's models,
// the rANS stage, the class walk over the base exponents, and the conversions to and from the
// plain form.
#include "dcr/context.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "dcr/hash.h"
#include "dcr/status_macros.h"
#include "internal/byte_io.h"
#include "internal/chunk_bounds.h"
#include "internal/context_codec.h"
#include "internal/context_walk.h"
#include "internal/element_ops.h"

namespace dcr {
namespace internal {
namespace {

constexpr int kScaleBits = 12;
constexpr uint32_t kScale = 1u << kScaleBits;
constexpr uint32_t kRansLow = 1u << 16;  // states live in [kRansLow, 2^32)
constexpr int kMaxClasses = kMaxContextClasses;
constexpr int kSymbols = 256;

// ---- varints ----

void PutVarint(std::vector<uint8_t>* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<uint8_t>(v) | 0x80);
    v >>= 7;
  }
  out->push_back(static_cast<uint8_t>(v));
}

// Reads a LEB128 u64 from [*p, end): false on truncation or more than 64 bits.
bool GetVarint(const uint8_t** p, const uint8_t* end, uint64_t* v) {
  uint64_t r = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (*p >= end) return false;
    const uint8_t b = *(*p)++;
    if (shift == 63 && (b & 0x7E) != 0) return false;
    r |= static_cast<uint64_t>(b & 0x7F) << shift;
    if ((b & 0x80) == 0) {
      *v = r;
      return true;
    }
  }
  return false;
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

// The extra bit count of a symbol, and its value from them.
constexpr int ExtraBits(uint8_t sym) { return sym < 16 ? 0 : (sym - 16) / 4 + 2; }
constexpr uint64_t ValueOf(uint8_t sym, uint64_t extra) {
  if (sym < 16) return sym;
  const int top = (sym - 16) / 4 + 4;
  const uint64_t m = (sym - 16) % 4;
  return (uint64_t{1} << top) | (m << (top - 2)) | extra;
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

// ---- frequency tables ----

// Normalizes counts (c[s], not all zero) to frequencies summing to kScale, every counted symbol
// at least 1: proportional shares rounded down, then the remainder handed out (or taken back) one
// at a time where it costs the fewest bits (largest count per frequency; comparisons in integers).
void Normalize(const uint64_t* c, int nsym, uint32_t* f) {
  uint64_t total = 0;
  for (int s = 0; s < nsym; ++s) total += c[s];
  int64_t sum = 0;
  for (int s = 0; s < nsym; ++s) {
    if (c[s] == 0) {
      f[s] = 0;
      continue;
    }
    const uint64_t share = static_cast<uint64_t>((static_cast<unsigned __int128>(c[s]) * kScale) / total);
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

// A decoding table: for every slot of the 4096, its symbol, the slot's offset from the symbol's
// first slot and the symbol's frequency minus one, packed as sym | offset << 8 | (freq - 1) << 20,
// so that one load gives a state's next value and one shift the multiplier of the update
// (RansNext). `max_bits`: the most raw bits a
// listed symbol has; `max_value`: the largest value a listed symbol can stand for.
struct DecodeModel {
  uint32_t slot[kScale];
  int max_bits = 0;
  uint64_t max_value = 0;
};

// Fills a decoding table from frequencies f[0..256) that sum to kScale.
void FillDecodeModel(const uint32_t* f, DecodeModel* m) {
  uint32_t c = 0;
  m->max_bits = 0;
  m->max_value = 0;
  for (int s = 0; s < kSymbols; ++s) {
    if (f[s] == 0) continue;
    const uint32_t head = static_cast<uint32_t>(s) | (f[s] - 1) << 20;
    uint32_t* slot = m->slot + c;
    for (uint32_t j = 0; j < f[s]; ++j) slot[j] = head | j << 8;
    c += f[s];
    // Symbols ascend, so the last listed one has the most raw bits and the largest values.
    const int nb = ExtraBits(static_cast<uint8_t>(s));
    m->max_bits = nb;
    m->max_value = ValueOf(static_cast<uint8_t>(s), nb == 0 ? 0 : (uint64_t{1} << nb) - 1);
  }
}

const char* ParseModel(const uint8_t** p, const uint8_t* end, DecodeModel* m) {
  uint64_t n;
  if (!GetVarint(p, end, &n) || n < 1 || n > kSymbols) return "bad model size";
  uint32_t f[kSymbols] = {};
  uint64_t sum = 0;
  for (uint64_t s = 0; s < n;) {
    uint64_t v;
    if (!GetVarint(p, end, &v)) return "truncated model";
    if (v > 0) {
      if (v > kScale) return "model frequency out of range";
      f[s++] = static_cast<uint32_t>(v);
      sum += v;
      continue;
    }
    uint64_t z;
    if (!GetVarint(p, end, &z) || z >= n - s) return "bad zero run in a model";
    s += z + 1;
  }
  if (sum != kScale) return "model frequencies do not sum to 4096";
  FillDecodeModel(f, m);
  return nullptr;
}

// ---- models of a version-7 body: a table, a geometric law, or the previous model's table ----

// Model forms after the leading LEB128 0 of a version-7 model (FORMAT.md section 2.5).
constexpr uint8_t kModelGeometric = 0;
constexpr uint8_t kModelRepeat = 1;
constexpr uint64_t kMaxGeometricOffset = 15;
constexpr uint64_t kGeometricOne = 65536;  // the ratio's denominator

// The frequencies of the geometric law of offset o and ratio r / 65536 (0 < r < 65536): value v
// has weight q^(v - o) (1 - q) for v >= o, none below; a symbol's weight is that of its values,
// the tail of q in 32-bit fixed point, each step rounded down, so that the weights are identical
// on every machine; then normalized like counts.
void GeometricFreqs(uint64_t o, uint64_t r, uint32_t* f) {
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

// A model of a version-7 body: an explicit table (as version 6's), or LEB128 0 and a form byte:
// kModelGeometric with u8 offset and u16 ratio, or kModelRepeat (the table of `prev`, the
// previous model of the same role; null for the first).
const char* ParseModelV7(const uint8_t** p, const uint8_t* end, const DecodeModel* prev,
                         DecodeModel* m) {
  const uint8_t* q = *p;
  uint64_t n;
  if (!GetVarint(&q, end, &n)) return "bad model size";
  if (n != 0) return ParseModel(p, end, m);
  *p = q;
  if (*p >= end) return "truncated model";
  const uint8_t form = *(*p)++;
  if (form == kModelRepeat) {
    if (prev == nullptr) return "repeated model without a previous one";
    if (prev != m) std::memcpy(m, prev, sizeof(DecodeModel));
    return nullptr;
  }
  if (form != kModelGeometric) return "unknown model form";
  if (end - *p < 3) return "truncated model";
  const uint64_t o = (*p)[0];
  const uint64_t r = (*p)[1] | static_cast<uint64_t>((*p)[2]) << 8;
  *p += 3;
  if (o > kMaxGeometricOffset || r == 0) return "bad geometric model";
  uint32_t f[kSymbols];
  GeometricFreqs(o, r, f);
  FillDecodeModel(f, m);
  return nullptr;
}

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

// ---- raw bits, least significant first ----

class BitReader {
 public:
  BitReader(const uint8_t* p, size_t size) : p_(p), size_(size), limit_(uint64_t{8} * size) {}
  // n in [1, 61]. False past the end.
  __attribute__((always_inline)) bool Get(int n, uint64_t* v) {
    if (pos_ + static_cast<uint64_t>(n) > limit_) return false;
    const size_t byte = pos_ >> 3;
    const int shift = static_cast<int>(pos_ & 7);
    uint64_t w = 0;
    if (byte + 8 <= size_) {
      std::memcpy(&w, p_ + byte, 8);
    } else {
      std::memcpy(&w, p_ + byte, size_ - byte);
    }
    uint64_t r = w >> shift;
    if (n + shift > 64) {  // the bits run into a ninth byte (n > 56)
      r |= static_cast<uint64_t>(p_[byte + 8]) << (64 - shift);
    }
    *v = r & ((uint64_t{1} << n) - 1);
    pos_ += static_cast<uint64_t>(n);
    return true;
  }
  // The most bits one unchecked read takes: an 8-byte load at the bit position's byte.
  static constexpr int kMaxUnchecked = 56;
  // The stream, the bit position, and its end. An unchecked read at a position up to the end
  // loads 8 bytes from the position's byte: REQUIRES 8 readable bytes past the stream's end.
  const uint8_t* data() const { return p_; }
  uint64_t pos() const { return pos_; }
  void set_pos(uint64_t pos) { pos_ = pos; }
  uint64_t limit() const { return limit_; }
  bool Done() const {
    if ((pos_ + 7) / 8 != size_) return false;
    if ((pos_ & 7) == 0) return true;
    return (p_[size_ - 1] >> (pos_ & 7)) == 0;
  }

 private:
  const uint8_t* p_;
  size_t size_;
  uint64_t limit_;
  uint64_t pos_ = 0;
};

// The value symbols' raw bit counts and the values of their raw bits all zero (ValueOf(s, 0)).
struct SymbolTables {
  uint8_t extra[kSymbols];
  uint64_t base[kSymbols];
};
constexpr SymbolTables MakeSymbolTables() {
  SymbolTables t{};
  for (int s = 0; s < kSymbols; ++s) {
    t.extra[s] = static_cast<uint8_t>(ExtraBits(static_cast<uint8_t>(s)));
    t.base[s] = ValueOf(static_cast<uint8_t>(s), 0);
  }
  return t;
}
constexpr SymbolTables kSymbolTables = MakeSymbolTables();

// The decoder's position in the rANS words [rp, rend) and the raw bits.
struct SymbolReader {
  uint32_t x[2];
  const uint8_t* rp;
  const uint8_t* rend;
  BitReader bits;
};

// A state's value after decoding the symbol of its slot entry e = m.slot[s & (kScale - 1)]:
// freq * (s >> 12) + offset, written as (freq - 1) * q + (q + offset) so that only a shift of
// the loaded entry stands between the load and the multiply (q + offset is summed meanwhile).
__attribute__((always_inline)) inline uint32_t RansNext(uint32_t e, uint32_t s) {
  const uint32_t q = s >> kScaleBits;
  return (e >> 20) * q + (q + ((e >> 8) & (kScale - 1)));
}

// Symbols decoded between the checks of the fast path.
constexpr uint64_t kDecodeBatch = 32;

// One symbol with state s, every read checked against the ends of the streams: false and *err
// on a short stream or a value above vmax.
bool DecodeSymbolChecked(const DecodeModel& m, uint32_t* state, SymbolReader* r, uint64_t vmax,
                         uint64_t* dst, const char** err) {
  uint32_t s = *state;
  const uint32_t e = m.slot[s & (kScale - 1)];
  const uint32_t sym = e & 0xFF;
  s = RansNext(e, s);
  if (s < kRansLow) {
    if (r->rend - r->rp < 2) {
      *err = "rANS stream ends early";
      return false;
    }
    uint16_t wd;
    std::memcpy(&wd, r->rp, 2);
    r->rp += 2;
    s = (s << 16) | wd;
  }
  *state = s;
  uint64_t v = sym;
  if (sym >= 16) {
    uint64_t extra;
    if (!r->bits.Get(ExtraBits(static_cast<uint8_t>(sym)), &extra)) {
      *err = "raw bits end early";
      return false;
    }
    v = ValueOf(static_cast<uint8_t>(sym), extra);
    if (v > vmax) {
      *err = "value wider than the element";
      return false;
    }
  }
  *dst = v;
  return true;
}

// Decodes `count` symbols of model m into dst[0..count): symbol j with state x[(phase + j) & 1].
// Returns null, or what is wrong with the streams.
const char* DecodeRun(const DecodeModel& m, uint64_t* __restrict dst, uint64_t count,
                      uint64_t vmax, int phase, SymbolReader* r) {
  uint32_t a = r->x[phase], b = r->x[phase ^ 1];
  uint64_t j = 0;
  // Batches whose reads cannot pass either end: states, stream pointers and the bit position in
  // registers, no branch on the data. The checked loop takes the rest (the streams' ends, and
  // models with symbols wider than the element or than one unchecked read).
  if (m.max_bits <= BitReader::kMaxUnchecked && m.max_value <= vmax && count >= kDecodeBatch) {
    const uint64_t batch_bits = kDecodeBatch * static_cast<uint64_t>(m.max_bits);
    const uint32_t* const slots = m.slot;
    const uint8_t* rp = r->rp;
    const uint8_t* const rend = r->rend;
    const uint8_t* const bits = r->bits.data();
    uint64_t pos = r->bits.pos();
    const uint64_t pos_limit = r->bits.limit();
    auto value = [&](uint32_t e, uint64_t* out) __attribute__((always_inline)) {
      const uint32_t sym = e & 0xFF;
      uint64_t word;
      std::memcpy(&word, bits + (pos >> 3), 8);
      const int nb = kSymbolTables.extra[sym];
      *out = kSymbolTables.base[sym] + ((word >> (pos & 7)) & ((uint64_t{1} << nb) - 1));
      pos += static_cast<uint64_t>(nb);
    };
    // A pair of symbols (state a, then b) per step. Both renormalization words come from one
    // 4-byte load at rp (b's is the second when a took the first), so that b's word waits for
    // a's decision by a select, not by a load; the states are selected (cmov), not shifted by a
    // computed amount, so the state's chain is load, shift, multiply, add, compare, select.
    while (count - j >= kDecodeBatch && static_cast<uint64_t>(rend - rp) >= 2 * kDecodeBatch &&
           pos + batch_bits <= pos_limit) {
      for (uint64_t e = j + kDecodeBatch; j < e; j += 2) {
        const uint32_t ea = slots[a & (kScale - 1)];
        const uint32_t eb = slots[b & (kScale - 1)];
        const uint32_t na = RansNext(ea, a);
        const uint32_t nb = RansNext(eb, b);
        uint32_t pair;
        std::memcpy(&pair, rp, 4);
        const bool ra = na < kRansLow;
        const bool rb = nb < kRansLow;
        const uint32_t wa = pair & 0xFFFF;
        const uint32_t wb = ra ? pair >> 16 : wa;
        a = ra ? (na << 16) | wa : na;
        b = rb ? (nb << 16) | wb : nb;
        rp += 2 * (static_cast<uint32_t>(ra) + static_cast<uint32_t>(rb));
        value(ea, &dst[j]);
        value(eb, &dst[j + 1]);
      }
    }
    r->rp = rp;
    r->bits.set_pos(pos);
  }
  const char* err = nullptr;
  for (; j < count; ++j) {
    if (!DecodeSymbolChecked(m, (j & 1) == 0 ? &a : &b, r, vmax, &dst[j], &err)) return err;
  }
  r->x[phase] = a;
  r->x[phase ^ 1] = b;
  return nullptr;
}

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
  std::vector<uint32_t> flat_hv;       // value symbol counts per exponent (kept zeroed)
  std::vector<RansEncSym> enc;
  std::vector<uint16_t> words;
};
EncodeScratch& EScratch() {
  thread_local EncodeScratch s;
  return s;
}

struct DecodeScratch {
  DecodeModel models[2 * kMaxClasses];
  std::vector<uint64_t> gaps, vals;
  std::vector<uint8_t> bits;
};
DecodeScratch& DScratch() {
  thread_local DecodeScratch s;
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
  // (Through local pointers: the symbol stores are bytes, which may alias anything, so the
  // vectors' own pointers would be reloaded from the thread-local scratch at every store. A class's
  // gaps mostly have a few symbols, so they are counted in two tables, even and odd changes, that
  // a repeated symbol's increments do not wait on each other's stores.)
  sc.gsym.resize(k);
  sc.vsym.resize(k);
  uint64_t nbits = 0;
  unsigned __int128 sum[2][kMaxClasses] = {};
  {
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
      uint64_t* __restrict row = &counts[static_cast<size_t>(c) * kSymbols];
      for (int v = 0; v < kSymbols; ++v) row[v] = uint64_t{pair[0][v]} + pair[1][v];
      nbits += cbits;
      sum[0][c] = gs;
      sum[1][c] = vs;
    }
  }
  // The models, for each class with changes its gap model then its value model: of its counts'
  // table, the geometric law fitted to its values and the previous model of its role, the one of
  // fewest estimated bits (code and model bytes; ties: that order).
  std::vector<uint32_t> freq(counts.size(), 0);
  std::vector<uint8_t> models;
  {
    const uint32_t* prev[2] = {nullptr, nullptr};
    uint32_t gf[kSymbols];
    std::vector<uint8_t> table;
    for (int c = 0; c < K; ++c) {
      if (kc[c] == 0) continue;
      for (int role = 0; role < 2; ++role) {
        const size_t row = static_cast<size_t>(role * K + c) * kSymbols;
        const uint64_t* cnt = &counts[row];
        uint32_t* f = &freq[row];
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
  }
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
      e.rcp = f <= 1 ? 0
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
  std::vector<uint8_t> bits;
  {
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
    put_all(sc.ordered.data(), sc.gsym.data());
    put_all(sc.vordered.data(), sc.vsym.data());
    bits.resize((nbits + 7) / 8);
  }
  // rANS, last symbol first: symbol j < k is class-ordered gap j, k + j its value.
  // At most one word per symbol: a state below 2^32 renormalized once is below 2^16 <= xmax.
  sc.words.resize(2 * k + 1);
  uint16_t* const words = sc.words.data();
  uint64_t nw = 0;
  uint32_t x0 = kRansLow, x1 = kRansLow;
  auto encode = [&](uint32_t& s, const RansEncSym& e) __attribute__((always_inline)) {
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
  auto run = [&](const RansEncSym* tab, const uint8_t* sym, uint64_t lo, uint64_t hi,
                 uint64_t off) __attribute__((always_inline)) {
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
    run(&sc.enc[static_cast<size_t>(c) * kSymbols], sc.gsym.data(), start_of[c], start_of[c + 1], 0);
  }
  sc.words.resize(nw);
  const uint32_t x[2] = {x0, x1};
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

Status DecodeContextBody(const ChunkHeader& h, const uint8_t* body, size_t body_size,
                         const uint8_t* base, uint64_t* positions, uint64_t* values,
                         const WalkSink* sink) {
  const std::string id = "chunk " + std::to_string(h.chunk_id);
  auto bad = [&](const char* what) { return DataLossError(id + ": context body: " + what); };
  const int w = h.elem_width;
  const uint64_t n = h.num_elements;
  const uint64_t k = h.num_changes;
  const uint8_t* p = body;
  const uint8_t* const end = body + body_size;
  if (body_size < 9) return bad("truncated");
  uint64_t want_hash;
  std::memcpy(&want_hash, p, 8);
  p += 8;
  const int K = *p++;
  if (K < 1 || K > kMaxClasses) return bad("bad class count");
  uint8_t bounds[kMaxClasses] = {0};
  if (end - p < K - 1) return bad("truncated");
  for (int c = 1; c < K; ++c) {
    bounds[c] = *p++;
    if (bounds[c] <= bounds[c - 1]) return bad("class bounds not increasing");
  }
  uint64_t kc[kMaxClasses] = {};
  uint64_t total = 0;
  for (int c = 0; c < K; ++c) {
    if (!GetVarint(&p, end, &kc[c])) return bad("truncated class counts");
    if (kc[c] > k - total) return bad("class change counts exceed num_changes");
    total += kc[c];
  }
  if (total != k) return bad("class change counts differ from num_changes");
  DecodeScratch& sc = DScratch();
  const bool v7 = h.position_mode == PositionMode::kContextV7;
  const DecodeModel* prev[2] = {nullptr, nullptr};  // the previous gap and value model
  for (int c = 0; c < K; ++c) {
    if (kc[c] == 0) continue;
    for (int role = 0; role < 2; ++role) {
      DecodeModel* m = &sc.models[role * K + c];
      if (const char* e = v7 ? ParseModelV7(&p, end, prev[role], m) : ParseModel(&p, end, m)) {
        return bad(e);
      }
      prev[role] = m;
    }
  }
  uint64_t rans_size;
  if (!GetVarint(&p, end, &rans_size) || rans_size < 8 || rans_size % 2 != 0 ||
      rans_size > static_cast<uint64_t>(end - p)) {
    return bad("bad rANS stream size");
  }
  const uint8_t* rp = p;
  const uint8_t* const rend = p + rans_size;
  uint32_t x[2];
  std::memcpy(&x[0], rp, 4);
  std::memcpy(&x[1], rp + 4, 4);
  rp += 8;
  if (x[0] < kRansLow || x[1] < kRansLow) return bad("bad rANS state");
  // The symbol sequence, class by class (gaps, then values). Symbol i is decoded with state
  // x[i & 1]; symbols come in pairs, so the states alternate within each run.
  // The raw bits copied with 8 zero bytes after them, for the decoder's unchecked 8-byte loads.
  const size_t bits_size = static_cast<size_t>(end - rend);
  sc.bits.resize(bits_size + 8);
  std::memcpy(sc.bits.data(), rend, bits_size);
  std::memset(sc.bits.data() + bits_size, 0, 8);
  SymbolReader sr{{x[0], x[1]}, rp, rend, BitReader(sc.bits.data(), bits_size)};
  uint64_t i = 0;
  sc.gaps.resize(k);
  sc.vals.resize(k);
  uint64_t start_of[kMaxClasses + 1] = {};
  for (int c = 0; c < K; ++c) start_of[c + 1] = start_of[c] + kc[c];
  for (int c = 0; c < K; ++c) {
    if (const char* e = DecodeRun(sc.models[c], &sc.gaps[start_of[c]], kc[c], ~uint64_t{0},
                                  static_cast<int>(i & 1), &sr)) {
      return bad(e);
    }
    i += kc[c];
  }
  const uint64_t vmask = WidthMask(w);
  for (int c = 0; c < K; ++c) {
    if (const char* e = DecodeRun(sc.models[K + c], &sc.vals[start_of[c]], kc[c], vmask,
                                  static_cast<int>(i & 1), &sr)) {
      return bad(e);
    }
    i += kc[c];
  }
  if (sr.x[0] != kRansLow || sr.x[1] != kRansLow || sr.rp != rend) {
    return bad("rANS stream does not end");
  }
  if (!sr.bits.Done()) return bad("trailing raw bits");
  // The walk: positions from the class-local gaps and the base exponents.
  ClassMap map(bounds, K);
  if (!WalkClasses(base, w, n, map, kc, start_of, sc.gaps.data(), sc.vals.data(), positions,
                   values, CpuSimd(), sink)) {
    return FailedPreconditionError(id + ": context-coded changes do not fit these base bits "
                                        "(wrong base, or the chunk was already applied)");
  }
  if (XXH3_64bits(positions, k * sizeof(uint64_t)) != want_hash) {
    return FailedPreconditionError(id + ": context-coded positions differ from the encoder's "
                                        "(wrong base, or the chunk was already applied)");
  }
  return Status::OK();
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
  return IsRelative(h.value_mode) && (h.elem_width == 2 || h.elem_width == 4 || h.elem_width == 8) &&
         h.num_changes > 0 && h.num_changes < h.num_elements;
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
    return InvalidArgumentError("base bits of " + std::to_string(base_size) + " bytes for a chunk of " +
                                std::to_string(h.num_elements) + " elements of " +
                                std::to_string(h.elem_width) + " bytes");
  }
  thread_local std::vector<uint8_t> scratch;
  if (HashAt(base, h.elem_width, dc.positions.data(), h.num_changes, &scratch) != h.base_change_hash) {
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
    return FailedPreconditionError(id + ": current bits differ from the delta's base (wrong base, "
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
      return DataLossError("chunk " + std::to_string(h.chunk_id) + ": element width differs from the tensor's");
    }
    int64_t lo = static_cast<int64_t>(sg.offset), hi = lo;
    for (uint32_t d = 0; d < sg.ndim; ++d) {
      const int64_t span = static_cast<int64_t>(sg.count[d] - 1) * sg.stride[d];
      if (span < 0) lo += span; else hi += span;
    }
    const uint64_t m = sg.num_elements();
    if (lo < 0 || static_cast<uint64_t>(hi) >= tb.num_elements || covered + m > h.num_elements) {
      return DataLossError("chunk " + std::to_string(h.chunk_id) + ": segment outside its tensor's elements");
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
    return DataLossError("chunk " + std::to_string(h.chunk_id) + ": segments do not cover num_elements");
  }
  return Status::OK();
}

}  // namespace dcr
