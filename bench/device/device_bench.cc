// Device benchmarks (Google Benchmark, wall time of synchronous Device calls) on the backend named
// by --device=host|cuda (default cuda; --device_index=N):
//   BM_Copy                  Device::Copy of the dense model, device to device (the reference)
//   BM_Apply/<rate%>         DeviceApplier: pre-decoded chunks of a synthetic AdamW step and of its
//                            inverse applied in place; bytes = the dense model, twice
//   BM_Diff/<rate%>          Device::Diff of every tensor pair (compare, compact, results to host)
//   BM_RangeHash             Device::RangeHash of the whole model
//   BM_Receive/<rate%>/<T>   a DeviceReceiver taking the serialized delta and its inverse as a node
//                            does: chunk records decoded on T host threads, uploaded and applied,
//                            then committed (hash proof); bytes = the payload
// Counters: "ratio" = bandwidth (dense bytes covered per second for BM_Receive) / the device's
// copy bandwidth (the best of 10 copies of the model, measured once in the same process);
// BM_Receive also has "link_ratio" = payload rate / the long link's rate (--long_link_Bps, default
// the long link of the scenario --scenario=PATH names, scenarios/paper/paper-1t-3.yaml under the
// working directory unless given; no ratio when neither gives a rate): >= 1 means the receiver
// keeps up with the payload's arrival on that link at T threads. Every benchmark is skipped with
// the reason when the backend cannot be opened (exit 0); a benchmark that fails on an opened device
// makes the exit status 1 (BM_Receive also verifies the receiver byte for byte).
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/delta.h"
#include "dcr/device.h"
#include "dcr/hash.h"
#include "dcr/receiver.h"
#include "dcr/scenario.h"
#include "dcr/testing/synth.h"
#include "dcr/testing/synth_pair.h"

namespace dcr {
namespace {

struct Flags {
  DeviceKind kind = DeviceKind::kCuda;
  int index = 0;
  double long_link_Bps = 0;  // 0 = from `scenario`
  std::string scenario = "scenarios/paper/paper-1t-3.yaml";
};
Flags g_flags;

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The benchmark model: ~270M parameters (540 MB BF16, enough to saturate an H200) on CUDA; an
// eighth of that on the host backend, whose runs are CPU-bound.
ModelConfig BenchModel() {
  ModelConfig c;
  c.name = "bench-device";
  c.vocab = 32000;
  c.hidden = 2048;
  c.layers = 4;
  c.heads = 16;
  c.kv_heads = 4;
  c.head_dim = 128;
  c.intermediate = 5632;
  if (g_flags.kind != DeviceKind::kCuda) {
    c.vocab = 8000;
    c.hidden = 1024;
    c.layers = 2;
    c.heads = 8;
    c.kv_heads = 2;
    c.intermediate = 2816;
  }
  return c;
}

// The opened device, or why not.
struct Opened {
  std::shared_ptr<Device> device;
  std::string error;
};
const Opened& TheDevice() {
  static Opened o = [] {
    Opened r;
    auto d = OpenDevice(g_flags.kind, g_flags.index);
    if (d.ok()) {
      r.device = std::move(d).value();
    } else {
      r.error = d.status().ToString();
    }
    return r;
  }();
  return o;
}

// v0 and v1 (one AdamW step at `rate_pct`) as checkpoint images, written to files for the receiver.
struct Pair {
  std::unique_ptr<Checkpoint> v0, v1;
  std::string v0_path;
  std::vector<uint8_t> forward, inverse;  // serialized deltas v0 -> v1 and v1 -> v0
};
std::string TempDir() {
  static std::string dir = [] {
    const char* t = std::getenv("TMPDIR");
    std::string tmpl =
        std::string(t != nullptr && *t != '\0' ? t : "/tmp") + "/dcr-bench-device.XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (mkdtemp(buf.data()) == nullptr) {
      std::perror("dcr_bench_device: mkdtemp");
      std::exit(1);
    }
    return std::string(buf.data());
  }();
  return dir;
}
std::vector<uint8_t> Serialize(const Checkpoint& a, const Checkpoint& b) {
  DeltaMemorySink sink;
  Status s = BuildDelta(&a, b, DeltaOptions{}, &sink).status();
  if (!s.ok()) {
    std::fprintf(stderr, "dcr_bench_device: BuildDelta: %s\n", s.ToString().c_str());
    std::exit(1);
  }
  return sink.Release();
}
const Pair& Checkpoints(int rate_pct) {
  static std::map<int, Pair> cache;
  auto it = cache.find(rate_pct);
  if (it != cache.end()) return it->second;
  SynthOptions o;
  o.change_rate = rate_pct / 100.0;
  o.steps = 2;
  o.seed = 7;
  testing::SynthImagePair images =
      std::move(testing::SynthStepImages(ModelInventory(BenchModel()), o)).value();
  Pair p;
  std::vector<uint8_t>& img0 = images.before;
  p.v0_path = TempDir() + "/v0-" + std::to_string(rate_pct) + ".safetensors";
  if (FILE* f = std::fopen(p.v0_path.c_str(), "wb")) {
    std::fwrite(img0.data(), 1, img0.size(), f);
    std::fclose(f);
  }
  p.v0 = std::move(Checkpoint::FromBytes(std::move(img0))).value();
  p.v1 = std::move(Checkpoint::FromBytes(std::move(images.after))).value();
  p.forward = Serialize(*p.v0, *p.v1);
  p.inverse = Serialize(*p.v1, *p.v0);
  return cache[rate_pct] = std::move(p);
}

// A checkpoint's tensors in device memory.
struct DeviceModel {
  std::shared_ptr<Device> dev;
  std::vector<DeviceTensor> tensors;
  uint64_t bytes = 0;
  Status status;
  DeviceModel(std::shared_ptr<Device> d, const Checkpoint& c) : dev(std::move(d)) {
    for (const TensorInfo& t : Inventory::FromCheckpoint(c).tensors) {
      auto p = dev->Allocate(t.nbytes);
      if (!p.ok()) {
        status = p.status();
        return;
      }
      tensors.push_back(DeviceTensor{*p, t.num_elements(), t.width(), TensorSalt(t.name)});
      status = dev->Upload(*p, c.data(*c.Find(t.name)), t.nbytes);
      if (!status.ok()) return;
      bytes += t.nbytes;
    }
  }
  ~DeviceModel() {
    for (const DeviceTensor& t : tensors) dev->Free(t.data);
  }
};

// The device's own copy bandwidth over `n` bytes: the best of 10 device-to-device copies.
double CopyBandwidth(Device* dev, uint64_t n) {
  auto a = dev->Allocate(n), b = dev->Allocate(n);
  double best = 1e30;
  if (a.ok() && b.ok()) {
    for (int i = 0; i < 10; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      if (!dev->Copy(*b, *a, n).ok()) break;
      best = std::min(best, Seconds(t0));
    }
  }
  if (a.ok()) dev->Free(*a);
  if (b.ok()) dev->Free(*b);
  return n / best;
}
double ReferenceBandwidth() {
  static double bw =
      CopyBandwidth(TheDevice().device.get(), Checkpoints(3).v0->total_tensor_bytes());
  return bw;
}

double LongLinkRate() {
  if (g_flags.long_link_Bps > 0) return g_flags.long_link_Bps;
  static double rate = [] {
    auto s = LoadScenario(g_flags.scenario);
    if (!s.ok()) {
      std::fprintf(stderr, "dcr_bench_device: no long-link rate (--long_link_Bps): %s\n",
                   s.status().ToString().c_str());
      return 0.0;
    }
    return s->network.long_link.bandwidth_Bps;
  }();
  return rate;
}

// A benchmark that cannot complete on an opened device: reported, and the exit status is 1.
int g_failures = 0;
void Fail(benchmark::State& state, const std::string& why) {
  ++g_failures;
  state.SkipWithError(why.c_str());
}

#define DCR_BENCH_NEED_DEVICE(state) \
  if (!TheDevice().device) return state.SkipWithError(TheDevice().error.c_str())

void BM_Copy(benchmark::State& state) {
  DCR_BENCH_NEED_DEVICE(state);
  Device* dev = TheDevice().device.get();
  const uint64_t n = Checkpoints(3).v0->total_tensor_bytes();
  auto a = dev->Allocate(n), b = dev->Allocate(n);
  if (!a.ok() || !b.ok()) return Fail(state, "cannot allocate two model copies");
  if (Status s = dev->Copy(*b, *a, n); !s.ok()) return Fail(state, s.ToString());  // first touch
  double elapsed = 0;
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    Status s = dev->Copy(*b, *a, n);
    if (!s.ok()) return Fail(state, s.ToString().c_str());
    const double t = Seconds(t0);
    elapsed += t;
    state.SetIterationTime(t);
  }
  dev->Free(*a);
  dev->Free(*b);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * n);
  state.counters["reference_GBps"] = ReferenceBandwidth() / 1e9;
  state.counters["ratio"] =
      static_cast<double>(n) * state.iterations() / elapsed / ReferenceBandwidth();
}

void BM_Apply(benchmark::State& state) {
  DCR_BENCH_NEED_DEVICE(state);
  const Pair& p = Checkpoints(static_cast<int>(state.range(0)));
  DeviceModel dm(TheDevice().device, *p.v0);
  if (!dm.status.ok()) return Fail(state, dm.status.ToString().c_str());
  std::vector<DecodedChunk> chunks;
  for (const auto* bytes : {&p.forward, &p.inverse}) {
    auto r = std::move(DeltaReader::FromBytes(*bytes)).value();
    for (size_t i = 0; i < r->num_chunks(); ++i) chunks.push_back(std::move(r->Decode(i)).value());
  }
  auto app = MakeDeviceApplier(TheDevice().device, dm.tensors);
  const double ref = ReferenceBandwidth();
  double elapsed = 0;
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    for (const DecodedChunk& c : chunks) {
      Status s = app->ApplyChunk(c);
      if (!s.ok()) return Fail(state, s.ToString().c_str());
    }
    const double t = Seconds(t0);
    elapsed += t;
    state.SetIterationTime(t);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 2 * dm.bytes);
  state.counters["ratio"] = 2.0 * dm.bytes * state.iterations() / elapsed / ref;
}

void BM_Diff(benchmark::State& state) {
  DCR_BENCH_NEED_DEVICE(state);
  const Pair& p = Checkpoints(static_cast<int>(state.range(0)));
  DeviceModel a(TheDevice().device, *p.v0), b(TheDevice().device, *p.v1);
  if (!a.status.ok() || !b.status.ok()) return Fail(state, "cannot place both versions");
  const double ref = ReferenceBandwidth();
  uint64_t changes = 0;
  double elapsed = 0;
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    changes = 0;
    for (size_t i = 0; i < a.tensors.size(); ++i) {
      auto r =
          TheDevice().device->Diff(a.tensors[i].data, b.tensors[i].data, a.tensors[i].num_elements,
                                   a.tensors[i].width, ValueMode::kXor);
      if (!r.ok()) return Fail(state, r.status().ToString().c_str());
      changes += r->positions.size();
    }
    const double t = Seconds(t0);
    elapsed += t;
    state.SetIterationTime(t);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * a.bytes);
  state.counters["changes"] = static_cast<double>(changes);
  state.counters["ratio"] = static_cast<double>(a.bytes) * state.iterations() / elapsed / ref;
}

void BM_RangeHash(benchmark::State& state) {
  DCR_BENCH_NEED_DEVICE(state);
  const Pair& p = Checkpoints(3);
  DeviceModel a(TheDevice().device, *p.v0);
  if (!a.status.ok()) return Fail(state, a.status.ToString().c_str());
  const double ref = ReferenceBandwidth();
  double elapsed = 0;
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    for (const DeviceTensor& t : a.tensors) {
      auto h = TheDevice().device->RangeHash(t.salt, t.data, t.width, 0, t.num_elements);
      if (!h.ok()) return Fail(state, h.status().ToString().c_str());
    }
    const double t = Seconds(t0);
    elapsed += t;
    state.SetIterationTime(t);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * a.bytes);
  state.counters["ratio"] = static_cast<double>(a.bytes) * state.iterations() / elapsed / ref;
}

// Applies the serialized delta `bytes` to `r` as a node does: Begin, records on `threads`
// threads (each takes the next record), Commit.
Status Receive(const std::vector<uint8_t>& bytes, Receiver* r, int threads) {
  auto reader_or = DeltaReader::FromBytes(bytes);
  if (!reader_or.ok()) return reader_or.status();
  const DeltaReader& reader = **reader_or;
  if (Status s = BeginDelta(reader, r); !s.ok()) return s;
  std::atomic<size_t> next{0};
  std::vector<Status> errors(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (size_t i; (i = next.fetch_add(1)) < reader.num_chunks();) {
        Status s = r->ApplyRecord(reader.chunk_data(i), reader.chunk_size(i));
        if (!s.ok()) {
          errors[t] = s;
          return;
        }
      }
    });
  }
  for (auto& th : pool) th.join();
  for (const Status& s : errors) {
    if (!s.ok()) return s;
  }
  return CommitDelta(reader, r);
}

void BM_Receive(benchmark::State& state) {
  DCR_BENCH_NEED_DEVICE(state);
  const Pair& p = Checkpoints(static_cast<int>(state.range(0)));
  const int threads = static_cast<int>(state.range(1));
  auto r = MakeDeviceReceiver(TheDevice().device, p.v0_path);
  if (!r.ok()) return Fail(state, r.status().ToString().c_str());
  const double payload = static_cast<double>(p.forward.size() + p.inverse.size());
  double elapsed = 0;
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    for (const auto* bytes : {&p.forward, &p.inverse}) {
      Status s = Receive(*bytes, r->get(), threads);
      if (!s.ok()) return Fail(state, s.ToString().c_str());
    }
    const double t = Seconds(t0);
    elapsed += t;
    state.SetIterationTime(t);
  }
  // Bit-exact after an even number of steps: the receiver holds v0 again.
  if (Status v = (*r)->Verify(*p.v0); !v.ok()) return Fail(state, v.ToString().c_str());
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * payload));
  const double link = LongLinkRate();
  if (link > 0) {
    state.counters["link_ratio"] = payload * state.iterations() / elapsed / link;
  }
  state.counters["long_link_MBps"] = link / 1e6;
  // The dense model covered per second (twice per iteration), against the device's copy rate.
  state.counters["ratio"] =
      2.0 * p.v0->total_tensor_bytes() * state.iterations() / elapsed / ReferenceBandwidth();
}

BENCHMARK(BM_Copy)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Apply)->Arg(1)->Arg(3)->Arg(5)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Diff)->Arg(1)->Arg(3)->Arg(5)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_RangeHash)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Receive)
    ->ArgsProduct({{3}, {1, 2, 4, 8, 16}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// Takes this benchmark's own flags out of argv (Google Benchmark refuses flags it does not know).
bool ParseOwnFlags(int* argc, char** argv) {
  int out = 1;
  for (int i = 1; i < *argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* name) -> const char* {
      const size_t n = std::strlen(name);
      return a.compare(0, n, name) == 0 ? argv[i] + n : nullptr;
    };
    if (const char* v = value("--device=")) {
      auto k = ParseDeviceKind(v);
      if (!k.ok() || *k == DeviceKind::kCpu) {
        std::fprintf(stderr, "--device: host or cuda, not '%s'\n", v);
        return false;
      }
      g_flags.kind = *k;
    } else if (const char* v = value("--device_index=")) {
      g_flags.index = std::atoi(v);
    } else if (const char* v = value("--long_link_Bps=")) {
      g_flags.long_link_Bps = std::atof(v);
    } else if (const char* v = value("--scenario=")) {
      g_flags.scenario = v;
    } else {
      argv[out++] = argv[i];
    }
  }
  *argc = out;
  return true;
}

}  // namespace
}  // namespace dcr

int main(int argc, char** argv) {
  if (!dcr::ParseOwnFlags(&argc, argv)) return 2;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  benchmark::AddCustomContext(
      "device", dcr::TheDevice().device ? dcr::TheDevice().device->name() : dcr::TheDevice().error);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  std::error_code ignored;
  std::filesystem::remove_all(dcr::TempDir(), ignored);
  return dcr::g_failures == 0 ? 0 : 1;
}
