// dcr_bench_codec: BM_Codec_Encode, BM_Codec_DecodeApply and BM_Memcpy on the same data.
//
// Argument = change rate in percent (1, 3, 5). Tensor size: DCR_BENCH_ELEMS (default 2^24 BF16
// elements). Data: the synthetic AdamW trainer (dcr/testing/synth.h), seed 1, step0 -> step1,
// generated once per rate. Bytes processed = dense tensor bytes; counters: ratio (dense / delta),
// vs_bound0 (delta / order-0 bound), change_rate (measured). Use --benchmark_format=json for JSON.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "codec_bench.h"

namespace {

using dcr::internal::CodecBenchInput;

uint64_t Elements() {
  const char* e = std::getenv("DCR_BENCH_ELEMS");
  return e ? std::strtoull(e, nullptr, 10) : (uint64_t{1} << 24);
}

struct Fixture {
  CodecBenchInput input;
  std::vector<uint8_t> delta;
};

// One fixture per rate, built on first use and kept for all benchmarks.
Fixture* Get(benchmark::State& state) {
  static std::map<int64_t, std::unique_ptr<Fixture>> cache;
  const int64_t pct = state.range(0);
  auto it = cache.find(pct);
  if (it != cache.end()) return it->second.get();
  auto in = dcr::internal::MakeCodecBenchInput(Elements(), static_cast<double>(pct) / 100.0, 1, 0);
  if (!in.ok()) {
    state.SkipWithError(in.status().ToString().c_str());
    return nullptr;
  }
  auto f = std::make_unique<Fixture>();
  f->input = std::move(in).value();
  auto s = dcr::internal::CodecBenchEncode(f->input, &f->delta);
  if (!s.ok()) {
    state.SkipWithError(s.status().ToString().c_str());
    return nullptr;
  }
  Fixture* raw = f.get();
  cache[pct] = std::move(f);
  return raw;
}

void SetCounters(benchmark::State& state, const Fixture& f) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(f.input.dense_bytes));
  state.counters["ratio"] = static_cast<double>(f.input.dense_bytes) / f.delta.size();
  state.counters["vs_bound0"] = f.delta.size() * 8.0 / f.input.bound0_bits;
  state.counters["change_rate"] = f.input.measured_rate;
}

void BM_Codec_Encode(benchmark::State& state) {
  Fixture* f = Get(state);
  if (f == nullptr) return;
  std::vector<uint8_t> delta;
  for (auto _ : state) {
    auto s = dcr::internal::CodecBenchEncode(f->input, &delta);
    if (!s.ok()) {
      state.SkipWithError(s.status().ToString().c_str());
      return;
    }
    benchmark::DoNotOptimize(delta.data());
  }
  SetCounters(state, *f);
}

void BM_Codec_DecodeApply(benchmark::State& state) {
  Fixture* f = Get(state);
  if (f == nullptr) return;
  auto ap = dcr::internal::CodecBenchApplier::Create(f->input, f->delta);
  if (!ap.ok()) {
    state.SkipWithError(ap.status().ToString().c_str());
    return;
  }
  for (auto _ : state) {
    state.PauseTiming();
    ap.value()->Reset();
    state.ResumeTiming();
    dcr::Status s = ap.value()->Run();
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
  }
  dcr::Status v = ap.value()->Verify();
  if (!v.ok()) {
    state.SkipWithError(v.ToString().c_str());
    return;
  }
  SetCounters(state, *f);
}

void BM_Memcpy(benchmark::State& state) {
  const uint64_t bytes = Elements() * 2;
  std::vector<uint8_t> src(bytes, 1), dst(bytes, 0);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
}

BENCHMARK(BM_Codec_Encode)->Arg(1)->Arg(3)->Arg(5)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Codec_DecodeApply)->Arg(1)->Arg(3)->Arg(5)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Memcpy)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
