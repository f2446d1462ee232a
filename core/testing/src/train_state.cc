// The reference training state: rank shards with FP32 masters stepped by AdamW.
#include <cmath>
#include <cstring>

#include "dcr/status_macros.h"
#include "dcr/testing/reference_trainer.h"
#include "dcr/testing/synth.h"
#include "dcr/train.h"
#include "train/train_internal.h"

namespace dcr {

namespace {

// Approximately standard normal from a 64-bit hash (Irwin-Hall of four 16-bit uniforms): plain
// integer and float arithmetic, so the bytes never depend on libm.
inline float Normal(uint64_t h) {
  const float sum =
      static_cast<float>((h & 0xFFFF) + ((h >> 16) & 0xFFFF) + ((h >> 32) & 0xFFFF) + (h >> 48));
  return (sum - 2.0f * 65535.0f) * (1.7320508f / 65535.0f);
}

inline uint64_t Counter(uint64_t key, uint64_t i, uint64_t salt) {
  return internal::Mix64(key ^ internal::Mix64(i * 0xD1B54A32D192ED03ULL + salt));
}

bool IsNormLike(const std::string& name) { return name.find("norm") != std::string::npos; }

}  // namespace

struct TrainState::Opt {
  // Per [rank][buffer]: masters and moments over the whole buffer (padding stays 0).
  std::vector<std::vector<std::vector<float>>> master, m, v;
};

TrainState::~TrainState() = default;

StatusOr<std::unique_ptr<TrainState>> TrainState::Create(std::shared_ptr<const TrainStructure> s,
                                                         const TrainOptions& options) {
  if (options.change_rate <= 0 || options.change_rate >= 1) {
    return InvalidArgumentError("train: change_rate must be in (0, 1)");
  }
  if (options.warmup_steps < 0) return InvalidArgumentError("train: warmup_steps must be >= 0");
  auto st = std::unique_ptr<TrainState>(new TrainState());
  st->s_ = s;
  st->options_ = options;
  st->shards_ = ShardSet::Zeros(*s);
  st->opt_ = std::make_unique<Opt>();
  Opt& o = *st->opt_;
  const auto& ranks = s->ranks();
  o.master.resize(ranks.size());
  o.m.resize(ranks.size());
  o.v.resize(ranks.size());
  for (size_t r = 0; r < ranks.size(); ++r) {
    for (const auto& b : ranks[r].buffers) {
      o.master[r].emplace_back(b.numel, 0.0f);
      o.m[r].emplace_back(b.numel, 0.0f);
      o.v[r].emplace_back(b.numel, 0.0f);
    }
  }
  // Initialization: matrices N(0, 0.02), norms and folded scales 1 + N(0, 0.05).
  struct Item {
    size_t r;
    size_t p;
  };
  std::vector<Item> items;
  for (size_t r = 0; r < ranks.size(); ++r) {
    for (size_t p = 0; p < ranks[r].params.size(); ++p) items.push_back({r, p});
  }
  internal::ParallelForEach(items.size(), options.threads, [&](uint64_t k) {
    const LocalParam& p = ranks[items[k].r].params[items[k].p];
    const bool one = IsNormLike(p.name) || p.name.find("output_scale") != std::string::npos;
    const uint64_t key = p.key ^ options.seed * 0x9E3779B97F4A7C15ULL;
    float* m = o.master[items[k].r][p.buffer].data() + p.offset;
    for (uint64_t i = 0; i < p.numel; ++i) {
      const float z = Normal(Counter(key, i, 0x1111));
      m[i] = one ? 1.0f + 0.05f * z : 0.02f * z;
    }
  });
  st->lr_ = options.lr > 0 ? options.lr : 1e-5;
  st->t_ = 0;
  for (int i = 0; i < options.warmup_steps; ++i) st->StepImpl(st->lr_, nullptr);
  if (options.warmup_steps == 0) st->StepImpl(0.0, nullptr);  // writes the initial bits
  if (options.lr <= 0) {
    // Calibrate: the BF16 change rate grows about linearly with lr at small rates.
    for (int it = 0; it < 3; ++it) {
      TrainState probe;
      probe.s_ = s;
      probe.options_ = options;
      probe.shards_ = st->shards_;
      probe.opt_ = std::make_unique<Opt>(*st->opt_);
      probe.t_ = st->t_;
      probe.StepImpl(st->lr_, nullptr);
      uint64_t changed = 0, total = 0;
      for (size_t r = 0; r < ranks.size(); ++r) {
        for (size_t b = 0; b < ranks[r].buffers.size(); ++b) {
          if (ranks[r].buffers[b].dtype != DType::kBF16) continue;
          const auto& x = st->shards_.buffers[r][b];
          const auto& y = probe.shards_.buffers[r][b];
          for (size_t i = 0; i + 1 < x.size(); i += 2) {
            changed += (x[i] != y[i] || x[i + 1] != y[i + 1]) ? 1 : 0;
          }
          total += x.size() / 2;
        }
      }
      const double rate = total ? double(changed) / double(total) : 0;
      if (rate <= 0) {
        st->lr_ *= 10;
        continue;
      }
      st->lr_ *= options.change_rate / rate;
    }
  }
  return st;
}

void TrainState::Step(const std::function<bool(const LocalParam&)>& filter) {
  StepImpl(lr_, filter);
}

void TrainState::StepImpl(double lr, const std::function<bool(const LocalParam&)>& filter) {
  ++t_;
  const auto& ranks = s_->ranks();
  Opt& o = *opt_;
  AdamWHyper h = options_.hyper;
  h.lr = lr;
  const float snr = static_cast<float>(h.grad_snr);
  struct Item {
    size_t r;
    size_t p;
  };
  std::vector<Item> items;
  for (size_t r = 0; r < ranks.size(); ++r) {
    for (size_t p = 0; p < ranks[r].params.size(); ++p) {
      if (!filter || filter(ranks[r].params[p])) items.push_back({r, p});
    }
  }
  const int64_t step = t_;
  internal::ParallelForEach(items.size(), options_.threads, [&](uint64_t k) {
    const size_t r = items[k].r;
    const LocalParam& p = ranks[r].params[items[k].p];
    const uint64_t key = p.key ^ options_.seed * 0x9E3779B97F4A7C15ULL;
    float* master = o.master[r][p.buffer].data() + p.offset;
    float* m = o.m[r][p.buffer].data() + p.offset;
    float* v = o.v[r][p.buffer].data() + p.offset;
    std::vector<float> grad(p.numel);
    for (uint64_t i = 0; i < p.numel; ++i) {
      grad[i] = 1e-3f * (snr * Normal(Counter(key, i, 0x2222)) +
                         Normal(Counter(key, i, 0x3333 + static_cast<uint64_t>(step) * 7919)));
    }
    if (lr > 0) AdamWStep(master, m, v, grad.data(), p.numel, h, step);
    const BufferSpec& b = ranks[r].buffers[p.buffer];
    uint8_t* out = shards_.buffers[r][p.buffer].data() + p.offset * b.width();
    if (b.dtype == DType::kBF16) {
      FloatsToBF16(master, reinterpret_cast<uint16_t*>(out), p.numel);
    } else {
      std::memcpy(out, master, p.numel * 4);
    }
  });
}

}  // namespace dcr
