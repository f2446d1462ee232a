#include "codec_bench.h"

#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "context_pass.h"
#include "dcr/commitment.h"
#include "dcr/context.h"
#include "dcr/hash.h"
#include "dcr/status_macros.h"
#include "dcr/testing/synth.h"
#include "internal/simd.h"

namespace dcr::internal {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double ProcessCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Wall and process-CPU time of one timed region.
struct Span {
  Clock::time_point w0 = Clock::now();
  double c0 = ProcessCpuSeconds();
  Timing Stop() const { return Timing{Seconds(w0, Clock::now()), ProcessCpuSeconds() - c0}; }
};

void KeepBest(Timing* best, const Timing& t) {
  best->wall = std::min(best->wall, t.wall);
  best->cpu = std::min(best->cpu, t.cpu);
}

double BinaryEntropy(double p) {
  if (p <= 0 || p >= 1) return 0;
  return -(p * std::log2(p) + (1 - p) * std::log2(1 - p));
}

StatusOr<std::unique_ptr<Checkpoint>> Image(const TensorView& view) {
  return Checkpoint::FromBytes(SafetensorsImage({view}));
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto p = line.find(':');
      if (p != std::string::npos) return line.substr(p + 2);
    }
  }
  return "unknown";
}

std::string Compiler() {
#if defined(__clang__)
  return std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  return std::string("g++ ") + __VERSION__;
#else
  return "unknown";
#endif
}

// A context-coded chunk as the class pass reads it: its covered base bits and its classes.
struct ClassPassChunk {
  std::vector<uint8_t> bits;
  uint8_t bounds[kContextClassesMax] = {};
  int k = 0;
};

// The context-coded chunks of `cdelta` (a delta of in.base), with the classes their bodies name
// (core/FORMAT.md section 2.5: after the u64 positions hash, K and bounds[1..K-1]).
StatusOr<std::vector<ClassPassChunk>> ClassPassChunks(const CodecBenchInput& in,
                                                      const std::vector<uint8_t>& cdelta) {
  DCR_ASSIGN_OR_RETURN(std::unique_ptr<DeltaReader> reader,
                       DeltaReader::FromBytes(std::vector<uint8_t>(cdelta)));
  const TensorInfo& t = in.base->tensors()[0];
  TensorBuffer tb;
  tb.data = const_cast<uint8_t*>(in.base->data(t));
  tb.num_elements = in.elements;
  tb.width = 2;
  std::vector<ClassPassChunk> out;
  for (size_t i = 0; i < reader->num_chunks(); ++i) {
    size_t header_size = 0, record_size = 0;
    DCR_ASSIGN_OR_RETURN(
        ChunkHeader h,
        ParseChunkHeader(reader->chunk_data(i), reader->chunk_size(i), &header_size, &record_size));
    if (!IsContextCoded(h)) continue;
    const uint8_t* body = reader->chunk_data(i) + header_size;
    const size_t body_size = record_size - header_size;
    ClassPassChunk c;
    c.k = body_size > 8 ? body[8] : 0;
    if (c.k < 1 || c.k > kContextClassesMax || body_size < 9 + static_cast<size_t>(c.k - 1))
      return InternalError("bench codec: a context body without its classes");
    for (int j = 1; j < c.k; ++j) c.bounds[j] = body[8 + j];
    DCR_RETURN_IF_ERROR(GatherCoveredBits(h, {tb}, &c.bits));
    out.push_back(std::move(c));
  }
  return out;
}

// One class pass over every chunk, by the vector build the decoder runs on this CPU; zero time
// and false where it runs the portable walk, which has no separate class pass.
bool ClassPassOnce(const std::vector<ClassPassChunk>& chunks, Timing* t) {
  const Simd simd = CpuSimd();
  if (simd == Simd::kPortable) return false;
  uint64_t sum = 0, members[kContextClassesMax];
  const Span span;
  for (const ClassPassChunk& c : chunks) {
    const auto* base = reinterpret_cast<const uint16_t*>(c.bits.data());
    const uint64_t n = c.bits.size() / 2;
    sum += simd == Simd::kAvx512 ? ContextClassPassAvx512(base, n, c.bounds, c.k, members)
                                 : ContextClassPassAvx2(base, n, c.bounds, c.k, members);
  }
  *t = span.Stop();
  // The passes' results are used, so that no build drops them.
  __asm__ volatile("" : : "r"(sum));
  return true;
}

}  // namespace

StatusOr<CodecBenchInput> MakeCodecBenchInput(uint64_t elements, double rate, uint64_t seed,
                                              int threads) {
  if (elements < 4096) return InvalidArgumentError("bench codec: --elems must be >= 4096");
  TensorSpec spec;
  spec.name = "model.layers.0.mlp.up_proj.weight";
  spec.dtype = "BF16";
  spec.shape = elements % 4096 == 0
                   ? std::vector<int64_t>{static_cast<int64_t>(elements / 4096), 4096}
                   : std::vector<int64_t>{static_cast<int64_t>(elements)};
  SynthOptions o;
  o.change_rate = rate;
  o.seed = seed;
  o.steps = 2;
  o.threads = threads;
  DCR_ASSIGN_OR_RETURN(std::unique_ptr<SynthTrainer> tr, SynthTrainer::Create({spec}, o));
  CodecBenchInput in;
  in.target_rate = rate;
  in.lr = tr->lr();
  in.elements = elements;
  in.dense_bytes = elements * 2;
  DCR_ASSIGN_OR_RETURN(in.base, Image(tr->Views()[0]));
  tr->Step();
  DCR_ASSIGN_OR_RETURN(in.target, Image(tr->Views()[0]));
  tr.reset();
  // Order-0 bound of the XOR delta.
  const uint16_t* a = reinterpret_cast<const uint16_t*>(in.base->data(in.base->tensors()[0]));
  const uint16_t* b = reinterpret_cast<const uint16_t*>(in.target->data(in.target->tensors()[0]));
  std::vector<uint64_t> hist(65536, 0);
  uint64_t k = 0;
  for (uint64_t i = 0; i < elements; ++i) {
    const uint16_t x = a[i] ^ b[i];
    if (x != 0) {
      ++hist[x];
      ++k;
    }
  }
  double value_bits = 0;
  for (uint64_t c : hist)
    if (c > 0) value_bits -= static_cast<double>(c) * std::log2(static_cast<double>(c) / k);
  // bound2: per base exponent e, n_e*H(k_e/n_e) + the entropy of the zigzag ulp values given e.
  {
    std::vector<uint64_t> ne(256, 0), ke(256, 0);
    std::map<std::pair<int, uint16_t>, uint64_t> ulp;
    auto ord = [](uint16_t x) { return static_cast<uint16_t>((x & 0x8000) ? ~x : (x | 0x8000)); };
    for (uint64_t i = 0; i < elements; ++i) {
      const int e = (a[i] >> 7) & 0xFF;
      ++ne[e];
      if (a[i] == b[i]) continue;
      ++ke[e];
      const uint16_t d = static_cast<uint16_t>(ord(b[i]) - ord(a[i]));
      const uint16_t z = static_cast<uint16_t>((d << 1) ^ ((d & 0x8000) ? 0xFFFF : 0));
      ++ulp[{e, z}];
    }
    double b2 = 0;
    for (int e = 0; e < 256; ++e) {
      if (ke[e] > 0)
        b2 += static_cast<double>(ne[e]) * BinaryEntropy(static_cast<double>(ke[e]) / ne[e]);
    }
    for (const auto& [key, c] : ulp) {
      b2 -= static_cast<double>(c) * std::log2(static_cast<double>(c) / ke[key.first]);
    }
    in.bound2_bits = b2;
  }
  in.changed = k;
  in.measured_rate = static_cast<double>(k) / static_cast<double>(elements);
  in.bound0_bits = static_cast<double>(elements) * BinaryEntropy(in.measured_rate) + value_bits;
  in.base_hash = in.base->ContentHash(threads);
  return in;
}

DeltaOptions CodecBenchDeltaOptions(const CodecBenchInput& in, bool context, int context_classes) {
  DeltaOptions o;
  o.threads = 1;
  o.known_base_hash = in.base_hash;
  o.context_coding = context;
  o.context_classes = context_classes;
  return o;
}

StatusOr<Timing> CodecBenchEncode(const CodecBenchInput& in, std::vector<uint8_t>* delta,
                                  bool context, int context_classes) {
  DeltaMemorySink sink;
  const DeltaOptions o = CodecBenchDeltaOptions(in, context, context_classes);
  const Span span;
  DCR_ASSIGN_OR_RETURN(DeltaStats st, BuildDelta(in.base.get(), *in.target, o, &sink));
  const Timing t = span.Stop();
  if (st.changed != in.changed)
    return InternalError("bench codec: BuildDelta counted " + std::to_string(st.changed) +
                         " changes, the data has " + std::to_string(in.changed));
  *delta = sink.Release();
  return t;
}

StatusOr<std::unique_ptr<CodecBenchApplier>> CodecBenchApplier::Create(const CodecBenchInput& in,
                                                                       std::vector<uint8_t> delta) {
  std::unique_ptr<CodecBenchApplier> a(new CodecBenchApplier());
  a->in_ = &in;
  a->delta_ = std::move(delta);
  a->buffer_.resize(in.dense_bytes);
  a->Reset();
  return a;
}

void CodecBenchApplier::Reset() {
  const TensorInfo& t = in_->base->tensors()[0];
  std::memcpy(buffer_.data(), in_->base->data(t), buffer_.size());
}

Status CodecBenchApplier::Run() {
  DCR_ASSIGN_OR_RETURN(std::unique_ptr<DeltaReader> reader,
                       DeltaReader::FromBytes(std::vector<uint8_t>(delta_)));
  const Inventory& inv = reader->inventory();
  if (inv.tensors.size() != 1) return InternalError("bench codec: expected one tensor");
  TensorBuffer tb;
  tb.data = buffer_.data();
  tb.num_elements = in_->elements;
  tb.width = 2;
  tb.salt = inv.salts[0];
  BufferApplier applier({tb});
  for (size_t i = 0; i < reader->num_chunks(); ++i) {
    DCR_RETURN_IF_ERROR(applier.ApplyRecord(reader->chunk_data(i), reader->chunk_size(i)));
  }
  return Status::OK();
}

Status CodecBenchApplier::Verify() const {
  const TensorInfo& t = in_->target->tensors()[0];
  const uint8_t* want = in_->target->data(t);
  if (std::memcmp(buffer_.data(), want, buffer_.size()) == 0) return Status::OK();
  for (size_t i = 0; i < buffer_.size(); ++i)
    if (buffer_[i] != want[i])
      return DataLossError("bench codec: decode+apply result differs from the target at byte " +
                           std::to_string(i));
  return Status::OK();
}

Timing CodecBenchMemcpy::Once() {
  const Span span;
  std::memcpy(dst_.data(), src_.data(), src_.size());
  const Timing t = span.Stop();
  // Keep the copy observable.
  src_[copies_ % src_.size()] = dst_[(copies_ * 7919) % dst_.size()];
  ++copies_;
  return t;
}

StatusOr<CodecBenchReport> RunCodecBench(const CodecBenchConfig& config,
                                         const std::function<void(const std::string&)>& log) {
  if (config.reps < 1) return InvalidArgumentError("bench codec: --reps must be >= 1");
  if (config.rates.empty()) return InvalidArgumentError("bench codec: no change rates");
  DCR_RETURN_IF_ERROR(CheckContextClasses(config.context_classes));
  CodecBenchReport rep;
  rep.config = config;
  rep.cpu = CpuModel();
  rep.cores = static_cast<int>(std::thread::hardware_concurrency());
  rep.compiler = Compiler();
  switch (internal::CpuSimd()) {
    case internal::Simd::kPortable:
      rep.simd = "portable";
      break;
    case internal::Simd::kAvx2:
      rep.simd = internal::CpuFastPdep() ? "avx2+pdep" : "avx2";
      break;
    case internal::Simd::kAvx512:
      rep.simd = "avx512";
      break;
  }
  const uint64_t dense = config.elements * 2;
  // memcpy is measured before and between the codec runs; the best of all is the reference.
  CodecBenchMemcpy copy(dense);
  Timing memcpy_best;
  for (int r = 0; r < config.reps; ++r) KeepBest(&memcpy_best, copy.Once());
  Timing commitment_best;
  for (double rate : config.rates) {
    char buf[256];
    std::snprintf(buf, sizeof(buf), "bench codec: training %llu elements to %.2f%% change",
                  static_cast<unsigned long long>(config.elements), 100 * rate);
    if (log) log(buf);
    DCR_ASSIGN_OR_RETURN(CodecBenchInput in, MakeCodecBenchInput(config.elements, rate, config.seed,
                                                                 config.data_threads));
    std::vector<uint8_t> delta, cdelta;
    Timing enc_best, dec_best, cenc_best, cdec_best;
    DCR_ASSIGN_OR_RETURN(Timing first, CodecBenchEncode(in, &delta));
    KeepBest(&enc_best, first);
    DCR_ASSIGN_OR_RETURN(Timing cfirst,
                         CodecBenchEncode(in, &cdelta, true, config.context_classes));
    KeepBest(&cenc_best, cfirst);
    const uint64_t payload = delta.size();
    const uint64_t cpayload = cdelta.size();
    DCR_ASSIGN_OR_RETURN(std::unique_ptr<CodecBenchApplier> ap,
                         CodecBenchApplier::Create(in, delta));
    DCR_ASSIGN_OR_RETURN(std::vector<ClassPassChunk> pass_chunks, ClassPassChunks(in, cdelta));
    DCR_ASSIGN_OR_RETURN(std::unique_ptr<CodecBenchApplier> cap,
                         CodecBenchApplier::Create(in, cdelta));
    Timing pass_best;
    bool pass_measured = false;
    // Repetitions interleave encode, decode+apply and memcpy, so the best of each is drawn from
    // the same stretch of time: on a shared machine other tenants' bursts last longer than one
    // phase of 15 back-to-back repetitions (~0.1 s for decode+apply), and measuring each phase in
    // its own stretch skewed the ratios by whichever phase met a burst.
    for (int r = 0; r < config.reps; ++r) {
      if (r > 0) {
        std::vector<uint8_t> again;
        DCR_ASSIGN_OR_RETURN(Timing t, CodecBenchEncode(in, &again));
        if (again != delta)
          return InternalError("bench codec: encoder output changed between runs");
        KeepBest(&enc_best, t);
      }
      ap->Reset();
      const Span span;
      DCR_RETURN_IF_ERROR(ap->Run());
      const Timing t = span.Stop();
      DCR_RETURN_IF_ERROR(ap->Verify());
      KeepBest(&dec_best, t);
      KeepBest(&memcpy_best, copy.Once());
      if (r > 0) {
        std::vector<uint8_t> again;
        DCR_ASSIGN_OR_RETURN(Timing ct, CodecBenchEncode(in, &again, true, config.context_classes));
        if (again != cdelta)
          return InternalError("bench codec: context encoder output changed between runs");
        KeepBest(&cenc_best, ct);
      }
      cap->Reset();
      const Span cspan;
      DCR_RETURN_IF_ERROR(cap->Run());
      const Timing ct = cspan.Stop();
      DCR_RETURN_IF_ERROR(cap->Verify());
      KeepBest(&cdec_best, ct);
      Timing pt;
      if (ClassPassOnce(pass_chunks, &pt)) {
        pass_measured = true;
        KeepBest(&pass_best, pt);
      }
      KeepBest(&memcpy_best, copy.Once());
    }
    // The commitment of the target, as a sender or a receiver computes it per version.
    {
      std::vector<TensorView> views;
      for (const TensorInfo& t : in.target->tensors()) {
        views.push_back(TensorView{t.name, t.dtype_name, t.shape, in.target->data(t), t.nbytes});
      }
      for (int k = 0; k < std::min(config.reps, 5); ++k) {
        const Span span;
        DCR_ASSIGN_OR_RETURN(Commitment c, CommitmentOf(views, 1));
        KeepBest(&commitment_best, span.Stop());
      }
    }
    CodecRateResult r;
    r.change_rate = rate;
    r.measured_change_rate = in.measured_rate;
    r.lr = in.lr;
    r.elements = in.elements;
    r.changed = in.changed;
    r.dense_bytes = dense;
    r.payload_bytes = payload;
    r.bound0_bytes = in.bound0_bits / 8;
    r.ratio_vs_dense = static_cast<double>(dense) / static_cast<double>(payload);
    r.ratio_vs_bound0 = static_cast<double>(payload) / r.bound0_bytes;
    r.bound0_vs_dense = static_cast<double>(dense) / r.bound0_bytes;
    r.encode_bytes_per_s = static_cast<double>(dense) / enc_best.cpu;
    r.decode_apply_bytes_per_s = static_cast<double>(dense) / dec_best.cpu;
    r.encode_wall_bytes_per_s = static_cast<double>(dense) / enc_best.wall;
    r.decode_apply_wall_bytes_per_s = static_cast<double>(dense) / dec_best.wall;
    r.bound2_bytes = in.bound2_bits / 8;
    r.context_payload_bytes = cpayload;
    r.context_ratio_vs_dense = static_cast<double>(dense) / static_cast<double>(cpayload);
    r.context_ratio_vs_bound2 = static_cast<double>(cpayload) / r.bound2_bytes;
    r.context_encode_bytes_per_s = static_cast<double>(dense) / cenc_best.cpu;
    r.context_decode_apply_bytes_per_s = static_cast<double>(dense) / cdec_best.cpu;
    r.context_encode_wall_bytes_per_s = static_cast<double>(dense) / cenc_best.wall;
    r.context_decode_apply_wall_bytes_per_s = static_cast<double>(dense) / cdec_best.wall;
    if (pass_measured) {
      // Per byte of base it read: the chunks whose context form the encoder kept.
      uint64_t covered = 0;
      for (const ClassPassChunk& c : pass_chunks) covered += c.bits.size();
      r.context_class_pass_bytes_per_s = static_cast<double>(covered) / pass_best.cpu;
    }
    rep.rates.push_back(r);
    std::snprintf(buf, sizeof(buf),
                  "bench codec: %.2f%% (measured %.3f%%): %.1fx dense, %.3fx bound0, encode %.2f "
                  "GB/s, decode+apply %.2f GB/s; context-coded %.1fx dense, %.3fx bound2, encode "
                  "%.2f GB/s, decode+apply %.2f GB/s",
                  100 * rate, 100 * in.measured_rate, r.ratio_vs_dense, r.ratio_vs_bound0,
                  r.encode_bytes_per_s / 1e9, r.decode_apply_bytes_per_s / 1e9,
                  r.context_ratio_vs_dense, r.context_ratio_vs_bound2,
                  r.context_encode_bytes_per_s / 1e9, r.context_decode_apply_bytes_per_s / 1e9);
    if (log) log(buf);
  }
  rep.memcpy_bytes_per_s = static_cast<double>(dense) / memcpy_best.cpu;
  rep.memcpy_wall_bytes_per_s = static_cast<double>(dense) / memcpy_best.wall;
  rep.commitment_bytes_per_s = static_cast<double>(dense) / commitment_best.cpu;
  rep.commitment_wall_bytes_per_s = static_cast<double>(dense) / commitment_best.wall;
  double load[1] = {0};
  if (getloadavg(load, 1) == 1) rep.load_average = load[0];
  for (auto& r : rep.rates) {
    r.encode_vs_memcpy = r.encode_bytes_per_s / rep.memcpy_bytes_per_s;
    r.decode_apply_vs_memcpy = r.decode_apply_bytes_per_s / rep.memcpy_bytes_per_s;
    r.context_encode_vs_memcpy = r.context_encode_bytes_per_s / rep.memcpy_bytes_per_s;
    r.context_decode_apply_vs_memcpy = r.context_decode_apply_bytes_per_s / rep.memcpy_bytes_per_s;
    r.context_class_pass_vs_memcpy = r.context_class_pass_bytes_per_s / rep.memcpy_bytes_per_s;
  }
  return rep;
}

std::string CodecBenchJson(const CodecBenchReport& rep, const std::string& commit) {
  nlohmann::ordered_json j;
  j["bench"] = "codec";
  j["device"] = rep.cpu;
  j["cores"] = 1;
  j["machine"] = {{"cpu", rep.cpu}, {"cores", rep.cores}};
  j["compiler"] = rep.compiler;
  j["simd"] = rep.simd;
  if (!commit.empty()) j["commit"] = commit;
  j["data"] =
      "one BF16 tensor, synthetic AdamW (dcr synth trainer: FP32 masters N(0,0.02), grad SNR 0.1, "
      "10 warm-up steps, lr calibrated per rate), base = step0, target = step1";
  j["elements"] = rep.config.elements;
  j["reps"] = rep.config.reps;
  j["seed"] = rep.config.seed;
  j["context_classes"] = rep.config.context_classes;
  j["threads"] = 1;
  j["timing"] =
      "best of reps; *_bytes_per_s from process CPU time (per-core bandwidth, robust to other "
      "jobs on a shared machine), *_wall_bytes_per_s from wall time";
  j["load_average"] = rep.load_average;
  j["memcpy_bytes_per_s"] = rep.memcpy_bytes_per_s;
  j["memcpy_wall_bytes_per_s"] = rep.memcpy_wall_bytes_per_s;
  j["commitment_bytes_per_s"] = rep.commitment_bytes_per_s;
  j["commitment_wall_bytes_per_s"] = rep.commitment_wall_bytes_per_s;
  nlohmann::ordered_json arr = nlohmann::ordered_json::array();
  for (const auto& r : rep.rates) {
    nlohmann::ordered_json e;
    e["change_rate"] = r.change_rate;
    e["measured_change_rate"] = r.measured_change_rate;
    e["lr"] = r.lr;
    e["elements"] = r.elements;
    e["changed"] = r.changed;
    e["dense_bytes"] = r.dense_bytes;
    e["payload_bytes"] = r.payload_bytes;
    e["bound0_bytes"] = r.bound0_bytes;
    e["ratio_vs_dense"] = r.ratio_vs_dense;
    e["ratio_vs_bound0"] = r.ratio_vs_bound0;
    e["bound0_vs_dense"] = r.bound0_vs_dense;
    e["encode_bytes_per_s"] = r.encode_bytes_per_s;
    e["decode_apply_bytes_per_s"] = r.decode_apply_bytes_per_s;
    e["encode_wall_bytes_per_s"] = r.encode_wall_bytes_per_s;
    e["decode_apply_wall_bytes_per_s"] = r.decode_apply_wall_bytes_per_s;
    e["encode_vs_memcpy"] = r.encode_vs_memcpy;
    e["decode_apply_vs_memcpy"] = r.decode_apply_vs_memcpy;
    e["bound2_bytes"] = r.bound2_bytes;
    e["context_payload_bytes"] = r.context_payload_bytes;
    e["context_ratio_vs_dense"] = r.context_ratio_vs_dense;
    e["context_ratio_vs_bound2"] = r.context_ratio_vs_bound2;
    e["context_encode_bytes_per_s"] = r.context_encode_bytes_per_s;
    e["context_decode_apply_bytes_per_s"] = r.context_decode_apply_bytes_per_s;
    e["context_encode_wall_bytes_per_s"] = r.context_encode_wall_bytes_per_s;
    e["context_decode_apply_wall_bytes_per_s"] = r.context_decode_apply_wall_bytes_per_s;
    e["context_encode_vs_memcpy"] = r.context_encode_vs_memcpy;
    e["context_decode_apply_vs_memcpy"] = r.context_decode_apply_vs_memcpy;
    e["context_class_pass_bytes_per_s"] = r.context_class_pass_bytes_per_s;
    e["context_class_pass_vs_memcpy"] = r.context_class_pass_vs_memcpy;
    arr.push_back(e);
  }
  j["rates"] = arr;
  return j.dump(2) + "\n";
}

std::string CodecBenchTable(const CodecBenchReport& rep) {
  std::string out;
  char buf[512];
  std::snprintf(
      buf, sizeof(buf),
      "codec bench: %llu BF16 elements (%.1f MiB), best of %d, one core; memcpy %.2f "
      "GB/s (CPU time; wall %.2f GB/s, load average %.1f)\n%s, %d cores, %s, vector build %s\n\n",
      static_cast<unsigned long long>(rep.config.elements),
      static_cast<double>(rep.config.elements) * 2 / (1 << 20), rep.config.reps,
      rep.memcpy_bytes_per_s / 1e9, rep.memcpy_wall_bytes_per_s / 1e9, rep.load_average,
      rep.cpu.c_str(), rep.cores, rep.compiler.c_str(), rep.simd.c_str());
  out += buf;
  out +=
      "| change | measured | ratio vs dense | size / bound0 | bound0 vs dense | encode GB/s | "
      "encode / memcpy | decode+apply GB/s | decode+apply / memcpy |\n"
      "|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : rep.rates) {
    std::snprintf(buf, sizeof(buf),
                  "| %.0f%% | %.3f%% | %.1fx | %.3f | %.1fx | %.2f | %.2fx | %.2f | %.2fx |\n",
                  100 * r.change_rate, 100 * r.measured_change_rate, r.ratio_vs_dense,
                  r.ratio_vs_bound0, r.bound0_vs_dense, r.encode_bytes_per_s / 1e9,
                  r.encode_vs_memcpy, r.decode_apply_bytes_per_s / 1e9, r.decode_apply_vs_memcpy);
    out += buf;
  }
  std::snprintf(buf, sizeof(buf), "\ncontext-coded (format version 8, at most %d classes):\n\n",
                rep.config.context_classes);
  out += buf;
  out +=
      "| change | ratio vs dense | size / bound2 | bound2 vs dense | encode GB/s | encode / memcpy "
      "| decode+apply GB/s | decode+apply / memcpy | class pass / memcpy |\n"
      "|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : rep.rates) {
    char pass[32] = "n/a";
    if (r.context_class_pass_bytes_per_s > 0)
      std::snprintf(pass, sizeof(pass), "%.2fx", r.context_class_pass_vs_memcpy);
    std::snprintf(buf, sizeof(buf),
                  "| %.0f%% | %.1fx | %.3f | %.1fx | %.2f | %.2fx | %.2f | %.2fx | %s |\n",
                  100 * r.change_rate, r.context_ratio_vs_dense, r.context_ratio_vs_bound2,
                  static_cast<double>(r.dense_bytes) / r.bound2_bytes,
                  r.context_encode_bytes_per_s / 1e9, r.context_encode_vs_memcpy,
                  r.context_decode_apply_bytes_per_s / 1e9, r.context_decode_apply_vs_memcpy, pass);
    out += buf;
  }
  out +=
      "\nclass pass: the part of context decoding that every covered element pays whatever the "
      "changes (each block's class masks and counts), by the decoder's own code, alone.\n";
  return out;
}

Status CheckCodecThresholds(const CodecBenchReport& rep, const std::string& text,
                            std::vector<std::string>* lines) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("codec") || !j["codec"].is_object())
    return InvalidArgumentError("thresholds: not a JSON object with a 'codec' section");
  const nlohmann::json& c = j["codec"];
  double margin = 1.0;
  if (c.contains("speed_margin")) {
    if (!c["speed_margin"].is_number() || c["speed_margin"].get<double>() <= 0 ||
        c["speed_margin"].get<double>() > 1)
      return InvalidArgumentError("thresholds: codec.speed_margin must be a number in (0, 1]");
    margin = c["speed_margin"].get<double>();
  }
  if (!c.contains("rates") || !c["rates"].is_array() || c["rates"].empty())
    return InvalidArgumentError("thresholds: codec.rates must be a non-empty array");
  std::string failures;
  char buf[256];
  for (size_t i = 0; i < c["rates"].size(); ++i) {
    const nlohmann::json& t = c["rates"][i];
    const std::string where = "codec.rates[" + std::to_string(i) + "]";
    if (!t.is_object() || !t.contains("change_rate") || !t["change_rate"].is_number())
      return InvalidArgumentError("thresholds: " + where + ".change_rate missing");
    const double rate = t["change_rate"].get<double>();
    const CodecRateResult* r = nullptr;
    for (const auto& x : rep.rates)
      if (std::fabs(x.change_rate - rate) < 1e-9) r = &x;
    if (r == nullptr) {
      failures += " " + where + ": rate not measured;";
      continue;
    }
    struct Rule {
      const char* key;
      bool is_min;
      bool speed;
      double value;
    };
    const Rule rules[] = {
        {"min_ratio_vs_dense", true, false, r->ratio_vs_dense},
        {"max_ratio_vs_bound0", false, false, r->ratio_vs_bound0},
        {"min_encode_vs_memcpy", true, true, r->encode_vs_memcpy},
        {"min_decode_apply_vs_memcpy", true, true, r->decode_apply_vs_memcpy},
        {"min_context_ratio_vs_dense", true, false, r->context_ratio_vs_dense},
        {"max_context_ratio_vs_bound2", false, false, r->context_ratio_vs_bound2},
        {"min_context_encode_vs_memcpy", true, true, r->context_encode_vs_memcpy},
        {"min_context_decode_apply_vs_memcpy", true, true, r->context_decode_apply_vs_memcpy},
    };
    // goal_* keys are the targets: reported, never gating (the min_* keys are the
    // regression floors CI gates on).
    const Rule goals[] = {
        {"goal_encode_vs_memcpy", true, true, r->encode_vs_memcpy},
        {"goal_decode_apply_vs_memcpy", true, true, r->decode_apply_vs_memcpy},
        {"goal_context_encode_vs_memcpy", true, true, r->context_encode_vs_memcpy},
        {"goal_context_decode_apply_vs_memcpy", true, true, r->context_decode_apply_vs_memcpy},
    };
    for (const Rule& g : goals) {
      if (!t.contains(g.key) || !t[g.key].is_number()) continue;
      const double want = t[g.key].get<double>();
      std::snprintf(buf, sizeof(buf), "%s %.0f%% %s: %.3f vs goal %.3f (not gating)",
                    g.value >= want ? "GOAL MET " : "GOAL OPEN", 100 * rate, g.key, g.value, want);
      if (lines) lines->push_back(buf);
    }
    for (const Rule& rule : rules) {
      if (!t.contains(rule.key)) continue;
      if (!t[rule.key].is_number())
        return InvalidArgumentError("thresholds: " + where + "." + rule.key + " is not a number");
      const double want = t[rule.key].get<double>();
      const double limit = rule.speed ? want * margin : want;
      const bool ok = rule.is_min ? rule.value >= limit : rule.value <= limit;
      std::snprintf(buf, sizeof(buf), "%s %.0f%% %s: %.3f %s %.3f%s", ok ? "PASS" : "FAIL",
                    100 * rate, rule.key, rule.value, rule.is_min ? ">=" : "<=", limit,
                    rule.speed ? " (threshold x speed_margin)" : "");
      if (lines) lines->push_back(buf);
      if (!ok) failures += std::string(" ") + buf + ";";
    }
  }
  if (!failures.empty()) return FailedPreconditionError("codec thresholds not met:" + failures);
  return Status::OK();
}

}  // namespace dcr::internal
