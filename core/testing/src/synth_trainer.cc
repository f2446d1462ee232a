// The synthetic AdamW trainer: FP32 masters, noisy gradients, BF16 stored weights.
//
// Random numbers are counter-based (a hash of seed, tensor name, stream, step and element index)
// and turned into normals with Box-Muller evaluated by plain float polynomials, so every element's
// trajectory is a pure function of its coordinates. That makes the output independent of threads
// and lets the lr calibration simulate a sample of elements that behaves exactly like the same
// elements of the full run.
#include <unistd.h>

#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <mutex>
#include <new>
#include <thread>

#include "dcr/dtype.h"
#include "dcr/status_macros.h"
#include "dcr/testing/synth.h"

namespace dcr {
namespace {

constexpr uint64_t kPiece = 1024;              // elements per generator/optimizer piece
constexpr uint64_t kItem = uint64_t{1} << 20;  // elements per work item (thread granularity)
constexpr float kGradScale = 1e-3f;
constexpr float kInitStd = 0.02f;
constexpr float kNormStd = 0.05f;

// Stored (BF16 or F32) bytes of all tensors: the unit of the init and step progress.
uint64_t StoredBytes(const std::vector<TensorSpec>& specs) {
  uint64_t bytes = 0;
  for (const TensorSpec& t : specs) bytes += t.nbytes();
  return bytes;
}

enum Stream : uint64_t { kInitStream = 1, kPersistStream = 2, kNoiseStream = 3 };

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// FNV-1a 64 of a name: the tensor's identity in the generator.
uint64_t NameKey(const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

inline uint32_t Mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

inline float FromBits(uint32_t u) { return std::bit_cast<float>(u); }
inline uint32_t ToBits(float f) { return std::bit_cast<uint32_t>(f); }

// Standard normals for elements [idx, idx+n) of one (seed, tensor, stream, step) key.
// REQUIRES: n <= kPiece and the range does not cross a multiple of 2^32.
// The AVX2 clone computes the same bits (no FMA is enabled, so nothing is contracted; +, *, / and
// sqrt are correctly rounded in every ISA).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
void Normals(uint64_t seed, uint64_t name_key, uint64_t stream, uint64_t step, uint64_t idx,
             uint64_t n, float* out) {
  const uint64_t key = SplitMix64(
      seed ^ SplitMix64(name_key ^ SplitMix64((stream << 56) ^ (step << 24) ^ (idx >> 32))));
  const uint32_t ka = static_cast<uint32_t>(key), kb = static_cast<uint32_t>(key >> 32);
  const uint32_t base = static_cast<uint32_t>(idx);
  alignas(64) float r2[kPiece];
  for (uint64_t i = 0; i < n; ++i) {
    const uint32_t h1 = Mix32((base + static_cast<uint32_t>(i)) * 0x9E3779B9U + ka);
    const uint32_t h2 = Mix32(h1 ^ kb);
    const float u1 =
        (static_cast<float>(static_cast<int32_t>(h1 >> 8)) + 0.5f) * (1.0f / 16777216.0f);
    const float u2 = static_cast<float>(static_cast<int32_t>(h2 >> 8)) * (1.0f / 16777216.0f);
    // ln(u1): u1 = 2^e * m, m in [sqrt(1/2), sqrt(2)), ln m = 2 atanh((m-1)/(m+1)).
    const uint32_t ub = ToBits(u1);
    int32_t e = static_cast<int32_t>(ub >> 23) - 127;
    float m = FromBits((ub & 0x7fffffU) | 0x3f800000U);
    const int32_t big = m > 1.41421356f;
    m = m * (1.0f - 0.5f * static_cast<float>(big));
    e += big;
    const float s = (m - 1.0f) / (m + 1.0f), s2 = s * s;
    const float ln_m =
        s * (2.0f + s2 * (0.6666667f + s2 * (0.4f + s2 * (0.2857143f + s2 * 0.2222222f))));
    const float ln_u1 = ln_m + static_cast<float>(e) * 0.69314718f;
    // cos(2 pi u2) with the argument folded to [0, pi/2].
    const float x = u2 - 0.5f;
    float y = std::fabs(x);
    const float flip = y > 0.25f ? 1.0f : 0.0f;
    y = y + flip * (0.5f - 2.0f * y);
    const float t = y * 6.28318531f, t2 = t * t;
    const float c =
        1.0f +
        t2 * (-0.5f +
              t2 * (4.1666668e-2f +
                    t2 * (-1.3888889e-3f +
                          t2 * (2.4801587e-5f + t2 * (-2.7557319e-7f + t2 * 2.0876757e-9f)))));
    r2[i] = -2.0f * ln_u1;
    out[i] = c * (2.0f * flip - 1.0f);
  }
  Eigen::Map<Eigen::ArrayXf> o(out, static_cast<Eigen::Index>(n));
  Eigen::Map<const Eigen::ArrayXf> r(r2, static_cast<Eigen::Index>(n));
  o = r.sqrt() * o;
}

template <typename T>
T* AllocArray(uint64_t n) {
  return new (std::nothrow) T[n == 0 ? 1 : n];
}

// One contiguous range of one tensor with its optimizer state.
struct Lane {
  size_t tensor = 0;
  uint64_t begin = 0;  // first canonical element index
  uint64_t n = 0;
  float* master = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  float* persist = nullptr;
  uint16_t* bf16 = nullptr;  // null for F32 tensors
};

struct TensorKind {
  uint64_t name_key = 0;
  bool bf16 = true;
  bool norm = false;
};

struct Sim {
  uint64_t seed = 1;
  float snr = 0.1f;
  AdamWHyper hyper;
};

void InitLane(const Sim& sim, const TensorKind& k, const Lane& l) {
  for (uint64_t off = 0; off < l.n;) {
    const uint64_t idx = l.begin + off;
    const uint64_t len = std::min(kPiece - idx % kPiece, l.n - off);
    Normals(sim.seed, k.name_key, kInitStream, 0, idx, len, l.master + off);
    Normals(sim.seed, k.name_key, kPersistStream, 0, idx, len, l.persist + off);
    const float scale = k.norm ? kNormStd : kInitStd, shift = k.norm ? 1.0f : 0.0f;
    for (uint64_t i = 0; i < len; ++i) {
      l.master[off + i] = shift + scale * l.master[off + i];
      l.m[off + i] = 0.0f;
      l.v[off + i] = 0.0f;
    }
    if (l.bf16) FloatsToBF16(l.master + off, l.bf16 + off, len);
    off += len;  // pieces stop at multiples of kPiece
  }
}

// One optimizer step `t` on a lane; returns how many BF16 elements changed bits.
uint64_t StepLane(const Sim& sim, const TensorKind& k, const Lane& l, int64_t t) {
  alignas(64) float grad[kPiece];
  alignas(64) uint16_t out[kPiece];
  uint64_t changed = 0;
  const float snr = sim.snr;
  for (uint64_t off = 0; off < l.n;) {
    const uint64_t idx = l.begin + off;
    const uint64_t len = std::min(kPiece - idx % kPiece, l.n - off);
    Normals(sim.seed, k.name_key, kNoiseStream, static_cast<uint64_t>(t), idx, len, grad);
    for (uint64_t i = 0; i < len; ++i) grad[i] = kGradScale * (snr * l.persist[off + i] + grad[i]);
    AdamWStep(l.master + off, l.m + off, l.v + off, grad, len, sim.hyper, t);
    if (l.bf16) {
      FloatsToBF16(l.master + off, out, len);
      uint64_t c = 0;
      for (uint64_t i = 0; i < len; ++i) c += out[i] != l.bf16[off + i];
      std::memcpy(l.bf16 + off, out, len * sizeof(uint16_t));
      changed += c;
    }
    off += len;
  }
  return changed;
}

// Runs fn(i) for i in [0, n) on up to `threads` threads; fn must be safe to run concurrently.
template <typename Fn>
void ParallelFor(size_t n, int threads, const Fn& fn) {
  size_t workers = threads > 0 ? static_cast<size_t>(threads)
                               : std::max<size_t>(1, std::thread::hardware_concurrency());
  workers = std::min(workers, n);
  if (workers <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) fn(i);
  };
  std::vector<std::thread> pool;
  for (size_t w = 1; w < workers; ++w) {
    try {
      pool.emplace_back(work);
    } catch (...) {
      break;  // fewer threads; the output does not depend on them
    }
  }
  work();
  for (auto& th : pool) th.join();
}

// Owns arrays for a set of lanes.
struct LaneSet {
  std::vector<Lane> lanes;
  std::vector<std::unique_ptr<float[]>> floats;
  std::vector<std::unique_ptr<uint16_t[]>> halves;

  Status Add(size_t tensor, uint64_t begin, uint64_t n, bool bf16) {
    Lane l;
    l.tensor = tensor;
    l.begin = begin;
    l.n = n;
    float* arrays[4];
    for (auto& a : arrays) {
      a = AllocArray<float>(n);
      if (a == nullptr) return Status(StatusCode::kResourceExhausted, "synth: out of memory");
      floats.emplace_back(a);
    }
    l.master = arrays[0];
    l.m = arrays[1];
    l.v = arrays[2];
    l.persist = arrays[3];
    if (bf16) {
      l.bf16 = AllocArray<uint16_t>(n);
      if (l.bf16 == nullptr) return Status(StatusCode::kResourceExhausted, "synth: out of memory");
      halves.emplace_back(l.bf16);
    }
    lanes.push_back(l);
    return Status::OK();
  }
};

}  // namespace

struct SynthTrainer::State {
  Sim sim;
  std::vector<TensorKind> kinds;
  LaneSet set;                                     // one lane per tensor (whole tensor)
  std::vector<std::pair<size_t, uint64_t>> items;  // (lane, begin offset) work items
};

namespace {

// Mean BF16 change rate of the sample over the transitions after warm-up, at learning rate lr.
double SampleRate(const Sim& base, const std::vector<TensorKind>& kinds, const LaneSet& sample,
                  double lr, int warmup, int transitions, int threads) {
  Sim sim = base;
  sim.hyper.lr = lr;
  std::vector<uint64_t> changed(sample.lanes.size(), 0);
  ParallelFor(sample.lanes.size(), threads, [&](size_t i) {
    const Lane& l = sample.lanes[i];
    const TensorKind& k = kinds[l.tensor];
    InitLane(sim, k, l);
    uint64_t c = 0;
    for (int t = 1; t <= warmup + transitions; ++t) {
      uint64_t ch = StepLane(sim, k, l, t);
      if (t > warmup) c += ch;
    }
    changed[i] = c;
  });
  uint64_t total = 0, elems = 0;
  for (size_t i = 0; i < sample.lanes.size(); ++i) {
    total += changed[i];
    elems += sample.lanes[i].n;
  }
  return elems == 0 ? 0.0
                    : static_cast<double>(total) /
                          (static_cast<double>(elems) * static_cast<double>(transitions));
}

}  // namespace

SynthTrainer::~SynthTrainer() = default;

StatusOr<std::unique_ptr<SynthTrainer>> SynthTrainer::Create(std::vector<TensorSpec> tensors,
                                                             const SynthOptions& options,
                                                             const ProgressFn& progress) {
  if (tensors.empty()) return InvalidArgumentError("synth: no tensors");
  if (options.steps < 1) return InvalidArgumentError("synth: steps must be >= 1");
  if (options.warmup_steps < 0) return InvalidArgumentError("synth: warmup_steps must be >= 0");
  if (options.lr < 0) return InvalidArgumentError("synth: lr must be >= 0");
  if (options.lr == 0 && !(options.change_rate > 0 && options.change_rate < 1))
    return InvalidArgumentError("synth: change_rate must be in (0, 1), got " +
                                std::to_string(options.change_rate));
  std::unique_ptr<SynthTrainer> tr(new SynthTrainer());
  tr->options_ = options;
  tr->state_ = std::make_unique<State>();
  State& st = *tr->state_;
  st.sim.seed = options.seed;
  st.sim.snr = static_cast<float>(options.grad_snr);
  for (const auto& t : tensors) {
    TensorKind k;
    k.name_key = NameKey(t.name);
    if (t.dtype == "BF16") {
      k.bf16 = true;
    } else if (t.dtype == "F32") {
      k.bf16 = false;
    } else {
      return InvalidArgumentError("synth: tensor '" + t.name + "' has dtype " + t.dtype +
                                  " (only BF16 and F32 are trained)");
    }
    if (t.shape.empty()) return InvalidArgumentError("synth: tensor '" + t.name + "' is a scalar");
    for (int64_t d : t.shape)
      if (d <= 0)
        return InvalidArgumentError("synth: tensor '" + t.name + "' has a non-positive dimension");
    k.norm = t.shape.size() == 1 && t.name.find("norm") != std::string::npos;
    st.kinds.push_back(k);
    if (k.bf16) tr->bf16_elements_ += t.num_elements();
  }
  tr->specs_ = std::move(tensors);
  // Refuse up front what cannot fit (overcommit would only fail later, in the OOM killer).
  {
    uint64_t need = 0;
    for (size_t i = 0; i < tr->specs_.size(); ++i)
      need += tr->specs_[i].num_elements() * (st.kinds[i].bf16 ? 18 : 16);
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) {
      const double phys = static_cast<double>(pages) * static_cast<double>(page);
      if (static_cast<double>(need) > 0.8 * phys)
        return Status(StatusCode::kResourceExhausted,
                      "synth: trainer state needs " + std::to_string(need >> 20) +
                          " MiB (18 bytes per BF16 element), more than 80% of this machine's " +
                          std::to_string(static_cast<uint64_t>(phys) >> 20) +
                          " MiB; materialize a scaled variant (depth/width/expert divisors)");
    }
  }
  const int transitions = std::max(1, options.steps - 1);

  // ---- lr calibration on a deterministic sample ----
  tr->lr_ = options.lr;
  if (tr->lr_ == 0) {
    if (tr->bf16_elements_ == 0)
      return InvalidArgumentError("synth: no BF16 tensor to calibrate on");
    LaneSet sample;
    const uint64_t want = std::max<uint64_t>(1024, options.calibration_sample);
    const uint64_t total = tr->bf16_elements_;
    if (total <= want) {
      for (size_t i = 0; i < tr->specs_.size(); ++i) {
        if (!st.kinds[i].bf16) continue;
        const uint64_t n = tr->specs_[i].num_elements();
        for (uint64_t b = 0; b < n; b += kItem)
          DCR_RETURN_IF_ERROR(sample.Add(i, b, std::min(kItem, n - b), true));
      }
    } else {
      // Systematic sample: R runs of L elements at evenly spaced points of the BF16 element space.
      constexpr uint64_t kRun = 512;
      const uint64_t runs = (want + kRun - 1) / kRun;
      size_t ti = 0;
      uint64_t tensor_start = 0;  // global offset of tensor ti among BF16 elements
      for (uint64_t r = 0; r < runs; ++r) {
        const uint64_t g =
            static_cast<uint64_t>((static_cast<double>(r) + 0.5) * static_cast<double>(total) /
                                  static_cast<double>(runs));
        while (ti < tr->specs_.size() &&
               (!st.kinds[ti].bf16 || g >= tensor_start + tr->specs_[ti].num_elements())) {
          if (st.kinds[ti].bf16) tensor_start += tr->specs_[ti].num_elements();
          ++ti;
        }
        if (ti >= tr->specs_.size()) break;
        const uint64_t n = tr->specs_[ti].num_elements();
        uint64_t local = g - tensor_start;
        const uint64_t len = std::min(kRun, n);
        if (local + len > n) local = n - len;
        DCR_RETURN_IF_ERROR(sample.Add(ti, local, len, true));
      }
    }
    double lo = 1e-12, hi = 1.0;
    const double target = options.change_rate;
    auto rate = [&](double lr) {
      return SampleRate(st.sim, st.kinds, sample, lr, options.warmup_steps, transitions,
                        options.threads);
    };
    if (rate(hi) < target)
      return FailedPreconditionError("synth: no learning rate up to 1 reaches change rate " +
                                     std::to_string(target));
    const int kMaxIter = 48;
    for (int it = 0; it < kMaxIter && hi / lo > 1.0005; ++it) {
      const double mid = std::sqrt(lo * hi);
      if (rate(mid) < target) {
        lo = mid;
      } else {
        hi = mid;
      }
      if (progress) progress(static_cast<uint64_t>(it + 1), kMaxIter, "calibrate");
    }
    tr->lr_ = std::sqrt(lo * hi);
    if (progress) progress(kMaxIter, kMaxIter, "calibrate");
  }
  st.sim.hyper.lr = tr->lr_;

  // ---- state allocation: one lane per tensor, work items of kItem elements ----
  for (size_t i = 0; i < tr->specs_.size(); ++i) {
    DCR_RETURN_IF_ERROR(st.set.Add(i, 0, tr->specs_[i].num_elements(), st.kinds[i].bf16));
    for (uint64_t b = 0; b < tr->specs_[i].num_elements(); b += kItem) st.items.emplace_back(i, b);
  }
  std::mutex mu;
  uint64_t done = 0;
  const uint64_t total_bytes = StoredBytes(tr->specs_);
  if (progress) progress(0, total_bytes, "init");
  ParallelFor(st.items.size(), options.threads, [&](size_t w) {
    Lane l = st.set.lanes[st.items[w].first];
    const uint64_t off = st.items[w].second;
    Lane sub = l;
    sub.begin = off;
    sub.n = std::min(kItem, l.n - off);
    sub.master += off;
    sub.m += off;
    sub.v += off;
    sub.persist += off;
    if (sub.bf16) sub.bf16 += off;
    InitLane(st.sim, st.kinds[l.tensor], sub);
    if (progress) {
      std::lock_guard<std::mutex> lock(mu);
      done += sub.n * (sub.bf16 ? sizeof(uint16_t) : sizeof(float));
      progress(done, total_bytes, "init");
    }
  });
  for (int w = 0; w < options.warmup_steps; ++w) {
    tr->Step(nullptr);
    if (progress)
      progress(static_cast<uint64_t>(w + 1), static_cast<uint64_t>(options.warmup_steps), "warmup");
  }
  tr->last_changed_ = 0;
  return tr;
}

void SynthTrainer::Step(const ProgressFn& progress) {
  State& st = *state_;
  ++t_;
  std::vector<uint64_t> changed(st.items.size(), 0);
  std::mutex mu;
  uint64_t done = 0;
  const uint64_t total_bytes = StoredBytes(specs_);
  if (progress) progress(0, total_bytes, "step");
  ParallelFor(st.items.size(), options_.threads, [&](size_t w) {
    const Lane& l = st.set.lanes[st.items[w].first];
    const uint64_t off = st.items[w].second;
    Lane sub = l;
    sub.begin = off;
    sub.n = std::min(kItem, l.n - off);
    sub.master += off;
    sub.m += off;
    sub.v += off;
    sub.persist += off;
    if (sub.bf16) sub.bf16 += off;
    changed[w] = StepLane(st.sim, st.kinds[l.tensor], sub, t_);
    if (progress) {
      std::lock_guard<std::mutex> lock(mu);
      done += sub.n * (sub.bf16 ? sizeof(uint16_t) : sizeof(float));
      progress(done, total_bytes, "step");
    }
  });
  last_changed_ = 0;
  for (uint64_t c : changed) last_changed_ += c;
}

const uint8_t* SynthTrainer::data(size_t i) const {
  const Lane& l = state_->set.lanes[i];
  return l.bf16 ? reinterpret_cast<const uint8_t*>(l.bf16)
                : reinterpret_cast<const uint8_t*>(l.master);
}

std::vector<TensorView> SynthTrainer::Views() const {
  std::vector<TensorView> views;
  views.reserve(specs_.size());
  for (size_t i = 0; i < specs_.size(); ++i) {
    TensorView v;
    v.name = specs_[i].name;
    v.dtype_name = specs_[i].dtype;
    v.shape = specs_[i].shape;
    v.data = data(i);
    v.nbytes = specs_[i].nbytes();
    views.push_back(std::move(v));
  }
  return views;
}

}  // namespace dcr
