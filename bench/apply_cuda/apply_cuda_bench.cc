// GPU receiver benchmarks (Google Benchmark, CUDA-event manual time):
//   BM_Cuda_MemcpyD2D             cudaMemcpy device-to-device of the dense BF16 model (reference)
//   BM_Cuda_Apply/<rate%>         DeviceApplier: pre-decoded canonical chunks of a synthetic AdamW
//                                 step (and its inverse) applied in place; bytes = dense model
//   BM_Cuda_Diff/<rate%>          DeviceDiff (compare + scan + compact, results to the host)
//   BM_Cuda_RangeHash             DeviceRangeHash over the whole model
// counters["ratio"] = bandwidth / cudaMemcpy D2D bandwidth measured in the same run.
// Skips every benchmark (SkipWithError) without a device.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <chrono>
#include <map>
#include <memory>

#include "dcr/cuda_apply.h"
#include "dcr/delta.h"
#include "dcr/hash.h"
#include "dcr/testing/synth.h"

namespace dcr {
namespace {

ModelConfig BenchModel() {  // ~270M parameters: big enough to saturate an H200
  ModelConfig c;
  c.name = "bench-gpu";
  c.vocab = 32000;
  c.hidden = 2048;
  c.layers = 4;
  c.heads = 16;
  c.kv_heads = 4;
  c.head_dim = 128;
  c.intermediate = 5632;
  return c;
}

std::unique_ptr<Checkpoint> ImageOf(const std::vector<TensorView>& views) {
  return std::move(Checkpoint::FromBytes(SafetensorsImage(views))).value();
}

struct Pair {
  std::unique_ptr<Checkpoint> v0, v1;
};

const Pair& Checkpoints(int rate_pct) {
  static std::map<int, Pair> cache;
  auto it = cache.find(rate_pct);
  if (it != cache.end()) return it->second;
  SynthOptions o;
  o.change_rate = rate_pct / 100.0;
  o.steps = 2;
  o.seed = 7;
  auto tr = std::move(SynthTrainer::Create(ModelInventory(BenchModel()), o)).value();
  Pair p;
  p.v0 = ImageOf(tr->Views());
  tr->Step();
  p.v1 = ImageOf(tr->Views());
  return cache[rate_pct] = std::move(p);
}

struct DeviceModel {
  std::vector<void*> ptrs;
  std::vector<cuda::DeviceTensor> tensors;
  uint64_t bytes = 0;
  explicit DeviceModel(const Checkpoint& c) {
    Inventory inv = Inventory::FromCheckpoint(c);
    for (const TensorInfo& t : inv.tensors) {
      void* p = nullptr;
      cudaMalloc(&p, t.nbytes);
      cudaMemcpy(p, c.data(*c.Find(t.name)), t.nbytes, cudaMemcpyHostToDevice);
      ptrs.push_back(p);
      tensors.push_back(cuda::DeviceTensor{p, t.num_elements(), t.width(), TensorSalt(t.name)});
      bytes += t.nbytes;
    }
  }
  ~DeviceModel() {
    for (void* p : ptrs) cudaFree(p);
  }
};

double D2DBandwidth(uint64_t n) {
  void *a = nullptr, *b = nullptr;
  cudaMalloc(&a, n);
  cudaMalloc(&b, n);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  float best = 1e30f;
  for (int i = 0; i < 10; ++i) {
    cudaEventRecord(e0);
    cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    best = std::min(best, ms);
  }
  cudaFree(a);
  cudaFree(b);
  return n / (best / 1e3);
}

std::unique_ptr<DeltaReader> Delta(const Checkpoint& a, const Checkpoint& b) {
  DeltaOptions o;
  DeltaMemorySink sink;
  auto st = BuildDelta(&a, b, o, &sink);
  return std::move(DeltaReader::FromBytes(sink.Release())).value();
}

void BM_Cuda_MemcpyD2D(benchmark::State& state) {
  if (!cuda::DeviceAvailable()) return state.SkipWithError(cuda::DeviceDescription().c_str());
  const uint64_t n = Checkpoints(3).v0->total_tensor_bytes();
  for (auto _ : state) state.SetIterationTime(n / D2DBandwidth(n));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * n);
}

void BM_Cuda_Apply(benchmark::State& state) {
  if (!cuda::DeviceAvailable()) return state.SkipWithError(cuda::DeviceDescription().c_str());
  const Pair& p = Checkpoints(static_cast<int>(state.range(0)));
  DeviceModel dm(*p.v0);
  auto fwd = Delta(*p.v0, *p.v1), back = Delta(*p.v1, *p.v0);
  std::vector<DecodedChunk> cf, cb;
  for (size_t i = 0; i < fwd->num_chunks(); ++i) cf.push_back(std::move(fwd->Decode(i)).value());
  for (size_t i = 0; i < back->num_chunks(); ++i) cb.push_back(std::move(back->Decode(i)).value());
  auto app = cuda::MakeDeviceApplier(dm.tensors, nullptr);
  if (!app.ok()) return state.SkipWithError(app.status().ToString().c_str());
  const double d2d = D2DBandwidth(dm.bytes);
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    for (const auto* v : {&cf, &cb}) {
      for (const DecodedChunk& c : *v) {
        Status s = (*app)->ApplyChunk(c);
        if (!s.ok()) return state.SkipWithError(s.ToString().c_str());
      }
    }
    cudaDeviceSynchronize();
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 2 * dm.bytes);
  state.counters["d2d_GBps"] = d2d / 1e9;
  state.counters["ratio"] = benchmark::Counter(2.0 * dm.bytes / d2d, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_Cuda_Diff(benchmark::State& state) {
  if (!cuda::DeviceAvailable()) return state.SkipWithError(cuda::DeviceDescription().c_str());
  const Pair& p = Checkpoints(static_cast<int>(state.range(0)));
  DeviceModel a(*p.v0), b(*p.v1);
  const double d2d = D2DBandwidth(a.bytes);
  uint64_t changes = 0;
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    changes = 0;
    for (size_t i = 0; i < a.tensors.size(); ++i) {
      auto r = cuda::DeviceDiff(a.ptrs[i], b.ptrs[i], a.tensors[i].num_elements, a.tensors[i].width,
                                ValueMode::kXor, nullptr);
      if (!r.ok()) return state.SkipWithError(r.status().ToString().c_str());
      changes += r->positions.size();
    }
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * a.bytes);
  state.counters["changes"] = static_cast<double>(changes);
  state.counters["ratio"] = benchmark::Counter(a.bytes / d2d, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_Cuda_RangeHash(benchmark::State& state) {
  if (!cuda::DeviceAvailable()) return state.SkipWithError(cuda::DeviceDescription().c_str());
  const Pair& p = Checkpoints(3);
  DeviceModel a(*p.v0);
  const double d2d = D2DBandwidth(a.bytes);
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    for (const auto& t : a.tensors) {
      auto h = cuda::DeviceRangeHash(t.salt, t.data, t.width, 0, t.num_elements, nullptr);
      if (!h.ok()) return state.SkipWithError(h.status().ToString().c_str());
    }
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * a.bytes);
  state.counters["ratio"] = benchmark::Counter(a.bytes / d2d, benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(BM_Cuda_MemcpyD2D)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Cuda_Apply)->Arg(1)->Arg(3)->Arg(5)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Cuda_Diff)->Arg(1)->Arg(3)->Arg(5)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Cuda_RangeHash)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace dcr

BENCHMARK_MAIN();
