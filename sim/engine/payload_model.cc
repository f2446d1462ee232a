#include "payload_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "dcr/context.h"
#include "dcr/delta.h"
#include "dcr/dtype.h"
#include "dcr/hash.h"
#include "dcr/status_macros.h"

namespace dcr::sim::internal {
namespace {

// SplitMix64 + Box-Muller: deterministic across standard libraries.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t Next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  double Uniform() { return ((Next() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
  // A standard normal deviate drawn from a fixed table of 2^16 Box-Muller values (fast; the table
  // is the same for every seed, the draws differ).
  float FastNormal() {
    static const std::vector<float> table = [] {
      Rng r(0x7AB1E);
      std::vector<float> t(1 << 16);
      for (float& x : t) x = r.Normal();
      return t;
    }();
    return table[Next() >> 48];
  }
  float Normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u1 = Uniform(), u2 = Uniform();
    double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = static_cast<float>(r * std::sin(2 * M_PI * u2));
    has_spare_ = true;
    return static_cast<float>(r * std::cos(2 * M_PI * u2));
  }

 private:
  uint64_t s_;
  bool has_spare_ = false;
  float spare_ = 0;
};

enum class InitKind { kWeight, kNorm };

std::string ClassName(const std::string& dtype, InitKind kind) {
  return dtype + (kind == InitKind::kNorm ? "/norm" : "/weight");
}

InitKind KindOf(const TensorSpec& t) {
  bool vector = t.shape.size() <= 1;
  bool norm = t.name.find("norm") != std::string::npos;
  return (vector && norm) ? InitKind::kNorm : InitKind::kWeight;
}

struct Trained {
  std::vector<uint64_t> old_bits, new_bits;
};

// The random draws of one class sample: initial masters, persistent gradient directions and the
// fresh noise of every step. They do not depend on the learning rate, so the bisection of
// CalibrateLr draws them once and trains from them at every trial lr (same bits as drawing anew).
struct Draws {
  uint64_t n = 0;
  int steps = 0;
  std::vector<float> w0, persist, noise;  // noise: steps x n
};

Draws MakeDraws(InitKind kind, uint64_t n, const PayloadModelOptions& o, uint64_t class_seed) {
  Rng rng(o.seed * 0x100000001B3ULL ^ class_seed);
  Draws d;
  d.n = n;
  d.steps = o.warmup_steps + 1;
  d.w0.resize(n);
  d.persist.resize(n);
  for (uint64_t i = 0; i < n; ++i) {
    d.w0[i] = kind == InitKind::kNorm ? 1.0f + 0.05f * rng.Normal() : 0.02f * rng.Normal();
    d.persist[i] = rng.Normal();
  }
  d.noise.resize(static_cast<size_t>(d.steps) * n);
  for (float& x : d.noise) x = rng.FastNormal();
  return d;
}

// Trains the sample's masters for warmup + 1 steps at `lr`; returns the stored bits of the last
// two steps.
Trained TrainSample(const Draws& d, DType dtype, double lr, const PayloadModelOptions& o) {
  const uint64_t n = d.n;
  std::vector<float> w = d.w0, m(n, 0.f), v(n, 0.f), grad(n);
  AdamWHyper h;
  h.lr = lr;
  h.grad_snr = o.grad_snr;
  auto store = [&](std::vector<uint64_t>* bits) {
    bits->resize(n);
    for (uint64_t i = 0; i < n; ++i) {
      if (dtype == DType::kBF16) {
        (*bits)[i] = FloatToBF16(w[i]);
      } else {
        uint32_t u;
        std::memcpy(&u, &w[i], 4);
        (*bits)[i] = u;
      }
    }
  };
  Trained t;
  const int total = d.steps;
  for (int step = 1; step <= total; ++step) {
    const float* noise = d.noise.data() + static_cast<size_t>(step - 1) * n;
    for (uint64_t i = 0; i < n; ++i) {
      grad[i] = static_cast<float>(o.grad_snr) * d.persist[i] + noise[i];
    }
    if (step == total) store(&t.old_bits);
    AdamWStep(w.data(), m.data(), v.data(), grad.data(), n, h, step);
  }
  store(&t.new_bits);
  return t;
}

double ChangedFraction(const Trained& t) {
  uint64_t c = 0;
  for (size_t i = 0; i < t.old_bits.size(); ++i) c += t.old_bits[i] != t.new_bits[i];
  return t.old_bits.empty() ? 0 : static_cast<double>(c) / t.old_bits.size();
}

// Calibrates one learning rate so the BF16 weight class changes at `rate` (bisection in log lr).
double CalibrateLr(double rate, const PayloadModelOptions& o) {
  // lr ~ 1e-4 x rate for N(0, 0.02) weights; bracket generously.
  double lo = rate * 1e-6, hi = rate * 1e-2;
  const Draws draws = MakeDraws(InitKind::kWeight, o.calib_elems, o, 0xCA11B);
  for (int it = 0; it < 30; ++it) {
    double mid = std::sqrt(lo * hi);
    Trained t = TrainSample(draws, DType::kBF16, mid, o);
    if (ChangedFraction(t) < rate)
      lo = mid;
    else
      hi = mid;
    if (hi / lo < 1.03) break;
  }
  return std::sqrt(lo * hi);
}

// Length of the safetensors JSON header entry of one tensor (what the delta header carries).
uint64_t JsonEntryBytes(const TensorSpec& t, uint64_t offset) {
  std::string s = "\"" + t.name + "\":{\"dtype\":\"" + t.dtype + "\",\"shape\":[";
  for (size_t i = 0; i < t.shape.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(t.shape[i]);
  }
  s += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + t.nbytes()) +
       "]},";
  return s.size();
}

}  // namespace

StatusOr<PayloadModel> MeasurePayload(const ModelConfig& cfg, double change_rate,
                                      const PayloadModelOptions& o) {
  if (!(change_rate > 0 && change_rate < 1)) {
    return InvalidArgumentError("change_rate: must be in (0, 1), got " +
                                std::to_string(change_rate));
  }
  PayloadModel pm;
  pm.preset = cfg.name;
  pm.change_rate = change_rate;
  std::vector<TensorSpec> inv = ModelInventory(cfg);
  struct Acc {
    DType dtype;
    InitKind kind;
    uint64_t elements = 0, tensors = 0;
    double dense = 0;
  };
  std::map<std::string, Acc> classes;  // ordered: deterministic
  uint64_t offset = 0;
  uint64_t small_elems_by_width[9] = {0};
  for (const TensorSpec& t : inv) {
    DType d = DTypeFromName(t.dtype);
    if (d != DType::kBF16 && d != DType::kF32) {
      return UnimplementedError("payload model: tensor '" + t.name + "' has dtype " + t.dtype +
                                "; the sampler trains BF16 and F32 only");
    }
    InitKind k = KindOf(t);
    Acc& a = classes[ClassName(t.dtype, k)];
    a.dtype = d;
    a.kind = k;
    a.elements += t.num_elements();
    a.tensors += 1;
    a.dense += static_cast<double>(t.nbytes());
    pm.elements += t.num_elements();
    pm.tensors += 1;
    pm.dense_bytes += static_cast<double>(t.nbytes());
    pm.header_bytes += static_cast<double>(JsonEntryBytes(t, offset));
    offset += t.nbytes();
    DeltaOptions dopt;
    if (t.num_elements() >= dopt.small_tensor_elems) {
      pm.grid_chunks += (t.num_elements() + o.chunk_elems - 1) / o.chunk_elems;
    } else {
      small_elems_by_width[DTypeWidth(d)] += t.num_elements();
    }
  }
  for (uint64_t e : small_elems_by_width) pm.grid_chunks += (e + o.chunk_elems - 1) / o.chunk_elems;

  pm.lr = CalibrateLr(change_rate, o);
  double payload = 0, changed = 0, context_payload = 0;
  uint64_t class_seed = 1;
  for (auto& [name, a] : classes) {
    ClassPayload cp;
    cp.name = name;
    cp.dtype = std::string(DTypeName(a.dtype));
    cp.elements = a.elements;
    cp.tensors = a.tensors;
    cp.dense_bytes = a.dense;
    cp.sample_elems = std::min<uint64_t>(o.sample_elems, a.elements);
    Trained t = TrainSample(MakeDraws(a.kind, cp.sample_elems, o, class_seed++), a.dtype, pm.lr, o);
    ChunkChanges ch;
    ch.chunk_id = 0;
    ch.width = static_cast<uint8_t>(DTypeWidth(a.dtype));
    ch.segments = {Segment::Range(0, 0, cp.sample_elems)};
    ch.num_elements = cp.sample_elems;
    uint64_t salt = TensorSalt(name);
    for (uint64_t i = 0; i < cp.sample_elems; ++i) {
      HashAdd(&ch.target_range_hash, ElementTerm(salt, i, t.new_bits[i]));
      if (t.old_bits[i] != t.new_bits[i]) {
        ch.positions.push_back(i);
        ch.old_bits.push_back(t.old_bits[i]);
        ch.new_bits.push_back(t.new_bits[i]);
      }
    }
    cp.measured_rate = static_cast<double>(ch.positions.size()) / cp.sample_elems;
    DCR_ASSIGN_OR_RETURN(
        std::vector<uint8_t> bytes,
        EncodeChunk(ch, ChooseValueMode(ValuePolicy::kAuto, a.dtype), {salt}, o.zstd_level));
    cp.bytes_per_element = static_cast<double>(bytes.size()) / cp.sample_elems;
    cp.payload_bytes = cp.bytes_per_element * cp.elements;
    payload += cp.payload_bytes;
    // The context-coded record, against the sample's base bits (elem_width bytes each, little
    // endian); the plain one where that is not smaller or the chunk has no context form.
    const size_t width = DTypeWidth(a.dtype);
    std::vector<uint8_t> base(cp.sample_elems * width);
    for (uint64_t i = 0; i < cp.sample_elems; ++i) {
      for (size_t b = 0; b < width; ++b) base[i * width + b] = (t.old_bits[i] >> (8 * b)) & 0xFF;
    }
    size_t context_size = bytes.size();
    auto ctx =
        EncodeContextChunk(bytes.data(), bytes.size(), base.data(), base.size(), o.context_classes);
    if (ctx.ok()) {
      context_size = std::min(context_size, ctx->size());
    } else if (!ctx.status().IsInvalidArgument()) {  // not codable: stays plain
      return ctx.status().WithContext("payload model: context form of " + name);
    }
    cp.context_bytes_per_element = static_cast<double>(context_size) / cp.sample_elems;
    cp.context_payload_bytes = cp.context_bytes_per_element * cp.elements;
    context_payload += cp.context_payload_bytes;
    changed += cp.measured_rate * cp.elements;
    pm.classes.push_back(cp);
  }
  pm.measured_rate = pm.elements ? changed / pm.elements : 0;
  // Header: fixed fields plus the verbatim inventory JSON; trailer: one table entry per chunk.
  pm.header_bytes += 256;
  double trailer = 64.0 + 40.0 * static_cast<double>(pm.grid_chunks);
  pm.delta_bytes = pm.header_bytes + payload + trailer;
  pm.context_delta_bytes = pm.header_bytes + context_payload + trailer;
  return pm;
}

}  // namespace dcr::sim::internal
