// Receiver-side benchmarks (Google Benchmark):
//   BM_Runtime_ApplyDecoded/<rate%>   in-place apply of pre-decoded canonical chunks into a TP=2
//                                     BF16 serving replica (bit-preserving scatter + converted
//                                     re-loads + incremental version hash); bytes = dense BF16
//                                     model
//   BM_Runtime_DecodeApply/<rate%>    same, decoding every chunk (zstd) inside the timed loop
//   BM_Memcpy                         memcpy of the dense model bytes (the reference)
//   BM_Runtime_BytesSent/<rate%>      bytes on the wire: canonical delta (BF16 serving, one stream
//                                     for all ranks) vs FP8 serving-space deltas (sum over the TP
//                                     ranks of one replica); Iterations(1), counters only
// Every timed benchmark also measures memcpy of the same bytes in the same run and reports
// counters["ratio"] = its bandwidth / memcpy bandwidth. Data: the project's synthetic AdamW trainer
// (BF16 weights, lr calibrated to the change rate), a Llama-shaped model of ~29M parameters
// (8 layers of hidden 512 and a 4096 vocab, so that the FP8-quantized linear weights dominate).
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstring>
#include <map>
#include <memory>

#include "dcr/copy_interposers.h"  // this binary records loads
#include "dcr/delta.h"
#include "dcr/runtime.h"
#include "dcr/testing/reference_loader.h"
#include "dcr/testing/synth.h"
#include "dcr/testing/synth_pair.h"

namespace dcr {
namespace {

ModelConfig BenchModel() {
  ModelConfig c;
  c.name = "bench-llama";
  c.vocab = 4096;
  c.hidden = 512;
  c.layers = 8;
  c.heads = 8;
  c.kv_heads = 4;
  c.head_dim = 64;
  c.intermediate = 1536;
  return c;
}

ServingConfig Serving(bool fp8) {
  ServingConfig s;
  s.model = BenchModel();
  s.tp = 2;
  s.fp8 = fp8;
  s.fp8_block = 128;
  return s;
}

std::unique_ptr<Checkpoint> ImageOf(std::vector<uint8_t> image) {
  auto c = Checkpoint::FromBytes(std::move(image));
  return c.ok() ? std::move(c).value() : nullptr;
}

struct Pair {
  std::unique_ptr<Checkpoint> v0, v1;
};

// v0 and v1 = one AdamW step apart at the requested change rate (cached per rate).
const Pair& Checkpoints(int rate_pct) {
  static std::map<int, Pair> cache;
  auto it = cache.find(rate_pct);
  if (it != cache.end()) return it->second;
  SynthOptions o;
  o.change_rate = rate_pct / 100.0;
  o.steps = 2;
  o.seed = 7;
  o.threads = 1;
  auto images = testing::SynthStepImages(ModelInventory(BenchModel()), o);
  if (!images.ok()) {
    std::fprintf(stderr, "synth: %s\n", images.status().ToString().c_str());
    std::abort();
  }
  Pair p;
  p.v0 = ImageOf(std::move(images->before));
  p.v1 = ImageOf(std::move(images->after));
  return cache[rate_pct] = std::move(p);
}

std::unique_ptr<DeltaReader> Delta(const Checkpoint& a, const Checkpoint& b, uint64_t av,
                                   uint64_t bv) {
  DeltaOptions o;
  o.threads = 1;
  o.base_version = av;
  o.target_version = bv;
  DeltaMemorySink sink;
  auto st = BuildDelta(&a, b, o, &sink);
  if (!st.ok()) std::abort();
  return std::move(DeltaReader::FromBytes(sink.Release())).value();
}

// memcpy bandwidth (bytes/s) over `n` bytes, best of a few runs.
double MemcpyBandwidth(uint64_t n) {
  std::vector<uint8_t> a(n, 1), b(n, 2);
  double best = 0;
  for (int i = 0; i < 5; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    std::memcpy(b.data(), a.data(), n);
    benchmark::ClobberMemory();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, n / s);
  }
  return best;
}

void ApplyBench(benchmark::State& state, bool decode) {
  const int rate = static_cast<int>(state.range(0));
  const Pair& p = Checkpoints(rate);
  const ServingConfig cfg = Serving(false);
  auto rep = ServingReplica::Create(cfg.tp, ReferenceLoaderFactory(cfg), *p.v0, 0);
  if (!rep.ok()) {
    state.SkipWithError(rep.status().ToString().c_str());
    return;
  }
  auto fwd = Delta(*p.v0, *p.v1, 0, 1), back = Delta(*p.v1, *p.v0, 1, 2);
  std::vector<DecodedChunk> cf, cb;
  for (size_t i = 0; i < fwd->num_chunks(); ++i) cf.push_back(std::move(fwd->Decode(i)).value());
  for (size_t i = 0; i < back->num_chunks(); ++i) cb.push_back(std::move(back->Decode(i)).value());
  const uint64_t dense = p.v0->total_tensor_bytes();
  const double memcpy_bw = MemcpyBandwidth(dense);
  uint64_t changes = 0;
  for (const auto& c : cf) changes += c.header.num_changes;
  for (auto _ : state) {
    for (int dir = 0; dir < 2; ++dir) {
      const DeltaReader& d = dir == 0 ? *fwd : *back;
      const auto& pre = dir == 0 ? cf : cb;
      Status s = BeginDelta(d, rep->get());
      for (size_t i = 0; s.ok() && i < d.num_chunks(); ++i) {
        if (decode) {
          s = (*rep)->ApplyRecord(d.chunk_data(i), d.chunk_size(i));
        } else {
          s = (*rep)->ApplyDecoded(pre[i]);
        }
      }
      if (s.ok()) s = CommitDelta(d, rep->get());
      if (!s.ok()) {
        state.SkipWithError(s.ToString().c_str());
        return;
      }
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 2 * dense);
  state.counters["dense_MB"] = dense / 1e6;
  state.counters["changes"] = static_cast<double>(changes);
  state.counters["memcpy_GBps"] = memcpy_bw / 1e9;
  state.counters["ratio"] =
      benchmark::Counter(2.0 * dense / memcpy_bw, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_Runtime_ApplyDecoded(benchmark::State& state) { ApplyBench(state, false); }
void BM_Runtime_DecodeApply(benchmark::State& state) { ApplyBench(state, true); }

void BM_Memcpy(benchmark::State& state) {
  const uint64_t n = Checkpoints(3).v0->total_tensor_bytes();
  std::vector<uint8_t> a(n, 1), b(n, 2);
  for (auto _ : state) {
    std::memcpy(b.data(), a.data(), n);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * n);
}

void BM_Runtime_BytesSent(benchmark::State& state) {
  const int rate = static_cast<int>(state.range(0));
  const Pair& p = Checkpoints(rate);
  uint64_t bf16 = 0, fp8 = 0, fp8_dense = 0, changed = 0;
  for (auto _ : state) {
    DeltaOptions o;
    o.threads = 1;
    DeltaMemorySink canon;
    auto st = BuildDelta(p.v0.get(), *p.v1, o, &canon);
    if (!st.ok()) {
      state.SkipWithError(st.status().ToString().c_str());
      return;
    }
    bf16 = canon.bytes().size();
    changed = st->changed;
    const ServingConfig cfg = Serving(true);
    fp8 = fp8_dense = 0;
    for (int r = 0; r < cfg.tp; ++r) {
      DeltaMemorySink sink;
      auto s2 = BuildServingDelta(*p.v0, *p.v1, ReferenceLoaderFactory(cfg), r, o, &sink);
      if (!s2.ok()) {
        state.SkipWithError(s2.status().ToString().c_str());
        return;
      }
      fp8 += sink.bytes().size();
      fp8_dense += s2->dense_bytes;
    }
  }
  state.counters["bf16_delta_MB"] = bf16 / 1e6;
  state.counters["fp8_delta_MB"] = fp8 / 1e6;
  state.counters["fp8_over_bf16"] = static_cast<double>(fp8) / bf16;
  state.counters["bf16_dense_MB"] = p.v0->total_tensor_bytes() / 1e6;
  state.counters["fp8_storage_MB"] = fp8_dense / 1e6;
  state.counters["canonical_change_rate"] =
      static_cast<double>(changed) / (p.v0->total_tensor_bytes() / 2);
}

BENCHMARK(BM_Memcpy)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Runtime_ApplyDecoded)
    ->Arg(1)
    ->Arg(3)
    ->Arg(5)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Runtime_DecodeApply)
    ->Arg(1)
    ->Arg(3)
    ->Arg(5)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Runtime_BytesSent)
    ->Arg(1)
    ->Arg(3)
    ->Arg(5)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace dcr

BENCHMARK_MAIN();
