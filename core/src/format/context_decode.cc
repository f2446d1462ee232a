// The decoder of context-coded chunk bodies (context_codec.h, core/FORMAT.md section 2.5): the
// models, the rANS stage and the class walk over the base exponents.
#include <xxhash.h>

#include <cstring>

#include "dcr/status_macros.h"
#include "format/context_model.h"
#include "internal/byte_io.h"
#include "internal/context_codec.h"
#include "internal/context_walk.h"
#include "internal/element_ops.h"

namespace dcr {
namespace internal {
namespace {

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
const char* DecodeRun(const DecodeModel& m, uint64_t* __restrict dst, uint64_t count, uint64_t vmax,
                      int phase, SymbolReader* r) {
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
    auto value = [&](uint32_t e, uint64_t * out) __attribute__((always_inline)) {
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

struct DecodeScratch {
  DecodeModel models[2 * kMaxClasses];
  std::vector<uint64_t> gaps, vals;
  std::vector<uint8_t> bits;
};
DecodeScratch& DScratch() {
  thread_local DecodeScratch s;
  return s;
}

}  // namespace

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
  if (!WalkClasses(base, w, n, map, kc, start_of, sc.gaps.data(), sc.vals.data(), positions, values,
                   CpuSimd(), sink)) {
    return FailedPreconditionError(id +
                                   ": context-coded changes do not fit these base bits "
                                   "(wrong base, or the chunk was already applied)");
  }
  if (XXH3_64bits(positions, k * sizeof(uint64_t)) != want_hash) {
    return FailedPreconditionError(id +
                                   ": context-coded positions differ from the encoder's "
                                   "(wrong base, or the chunk was already applied)");
  }
  return Status::OK();
}

}  // namespace internal
}  // namespace dcr
