// BM_Train_RankDelta: per-rank delta construction (diff of the owned shard slices, projection to
// canonical chunks, encoding) on one core, over every work unit of a layout in turn, for one
// AdamW step at ~3% BF16 change rate. Reports the shard bytes scanned per second, memcpy of the
// same bytes measured in the same run (ratio = construction / memcpy), and the affine shares of
// canonical elements and of changes. Times are the thread's CPU time (the machine is shared).
#include <benchmark/benchmark.h>
#include <time.h>

#include <chrono>
#include <cstring>
#include <map>
#include <memory>

#include "dcr/testing/reference_trainer.h"
#include "dcr/train.h"

namespace dcr {
namespace {

struct Fixture {
  std::shared_ptr<const TrainStructure> s;
  std::shared_ptr<const Exporter> ex;
  std::shared_ptr<const LayoutMap> map;
  std::unique_ptr<TrainDeltaBuilder> builder;
  ShardSet prev, next;
  TrainDeltaStats step;  // the merged step (for shares)
  std::string error;
};

struct Case {
  const char* preset;  // a preset name, or "dense-38m" / "moe-30m" (defined below)
  const char* layout;
};

const Case kCases[] = {
    {"tiny", "tp=2,pp=2,dp=2,dist_opt=1"},
    {"tiny-moe", "tp=2,pp=2,ep=2,dp=2,dist_opt=1"},
    {"dense-38m", "tp=4,pp=2,dp=2,dist_opt=1"},
    {"moe-30m", "tp=2,pp=2,ep=4,dp=2,dist_opt=1"},
};

StatusOr<ModelConfig> Config(const std::string& name) {
  if (name == "dense-38m" || name == "moe-30m") {
    // Llama-style and Qwen3-MoE-style models of a size that fits the bench machine's memory
    // (map discovery and the optimizer state need ~40 bytes per parameter).
    ModelConfig c;
    c.name = name;
    c.vocab = 8192;
    c.hidden = name == "dense-38m" ? 768 : 512;
    c.layers = 4;
    c.heads = name == "dense-38m" ? 12 : 8;
    c.kv_heads = 4;
    c.head_dim = 64;
    c.intermediate = name == "dense-38m" ? 2048 : 1536;
    if (name == "moe-30m") {
      c.experts = 16;
      c.moe_intermediate = 256;
      c.experts_per_token = 2;
      c.first_dense_layers = 1;
      c.qk_norm = true;
    }
    return c;
  }
  return GetPreset(name);
}

// CPU time of the calling thread: the bench machine is shared, wall time is not ours alone.
double ThreadSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

Fixture* Get(int i) {
  static std::map<int, std::unique_ptr<Fixture>> cache;
  auto it = cache.find(i);
  if (it != cache.end()) return it->second.get();
  auto f = std::make_unique<Fixture>();
  const Case& c = kCases[i];
  auto run = [&]() -> Status {
    auto cfg = Config(c.preset);
    if (!cfg.ok()) return cfg.status();
    ModelConfig m = *cfg;
    auto l = TrainLayout::Parse(c.layout);
    if (!l.ok()) return l.status();
    auto s = TrainStructure::Create(m, *l);
    if (!s.ok()) return s.status();
    f->s = *s;
    f->ex = std::make_shared<ReferenceExporter>(f->s);
    auto map = LayoutMap::Discover(*f->ex, 0);
    if (!map.ok()) return map.status();
    f->map = *map;
    TrainOptions to;
    to.seed = 7;
    auto state = TrainState::Create(f->s, to);
    if (!state.ok()) return state.status();
    f->prev = (*state)->shards();
    (*state)->Step();
    f->next = (*state)->shards();
    TrainDeltaOptions o;
    o.threads = 1;
    auto b = TrainDeltaBuilder::Create(f->s, f->map, f->ex, f->prev, o);
    if (!b.ok()) return b.status();
    f->builder = std::move(*b);
    // One merged step for the shares (then a fresh builder at the base version for timing).
    DeltaMemorySink sink;
    auto st = f->builder->BuildStep(f->prev, f->next, &sink);
    if (!st.ok()) return st.status();
    f->step = *st;
    auto b2 = TrainDeltaBuilder::Create(f->s, f->map, f->ex, f->prev, o);
    if (!b2.ok()) return b2.status();
    f->builder = std::move(*b2);
    return Status::OK();
  };
  Status st = run();
  if (!st.ok()) f->error = st.ToString();
  Fixture* out = f.get();
  cache[i] = std::move(f);
  return out;
}

void BM_Train_RankDelta(benchmark::State& state) {
  Fixture* f = Get(static_cast<int>(state.range(0)));
  if (!f->error.empty()) {
    state.SkipWithError(f->error.c_str());
    return;
  }
  const int units = f->builder->num_units();
  std::vector<uint8_t> dst(f->s->total_shard_bytes());
  double t_build = 0, t_copy = 0;
  uint64_t bytes = 0, changes = 0;
  for (auto _ : state) {
    uint64_t it_bytes = 0;
    const double a = ThreadSeconds();
    for (int u = 0; u < units; ++u) {
      const int r = u / f->s->layout().dp;
      auto d = f->builder->BuildUnit(u, f->prev.buffers[r], f->next.buffers[r]);
      if (!d.ok()) {
        state.SkipWithError(d.status().ToString().c_str());
        return;
      }
      it_bytes += d->scanned_bytes;
      changes += d->changes;
      benchmark::DoNotOptimize(d->chunks.data());
    }
    const double b = ThreadSeconds();
    // memcpy of the same number of shard bytes (the new shards, rank by rank).
    uint64_t left = it_bytes, off = 0;
    for (size_t r = 0; r < f->next.buffers.size() && left > 0; ++r) {
      for (const auto& buf : f->next.buffers[r]) {
        const uint64_t n = std::min<uint64_t>(left, buf.size());
        std::memcpy(dst.data() + (off % (dst.size() - n + 1)), buf.data(), n);
        off += n;
        left -= n;
        if (left == 0) break;
      }
    }
    benchmark::ClobberMemory();
    const double c = ThreadSeconds();
    t_build += b - a;
    t_copy += c - b;
    bytes += it_bytes;
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  state.counters["GBps"] = bytes / t_build / 1e9;
  state.counters["memcpy_GBps"] = bytes / t_copy / 1e9;
  state.counters["ratio"] = t_copy / t_build;
  state.counters["shard_MB"] = f->s->total_shard_bytes() / 1e6;
  state.counters["units"] = units;
  state.counters["affine_elem_share"] = f->map->stats().affine_share();
  state.counters["affine_change_share"] = f->step.affine_change_share();
  state.counters["change_rate"] =
      double(f->step.affine_changes + f->step.residual_changes) / f->step.canonical_elements;
  state.SetLabel(std::string(kCases[state.range(0)].preset) + " " + kCases[state.range(0)].layout);
}
BENCHMARK(BM_Train_RankDelta)->DenseRange(0, 3)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace dcr

BENCHMARK_MAIN();
