// The codec benchmark shared by `dcr bench codec` and the Google Benchmark binary dcr_bench_codec.
//
// Data: one BF16 tensor trained by the synthetic AdamW trainer (dcr/testing/synth.h) at a
// calibrated change rate; base = the checkpoint after warm-up, target = one optimizer step later.
// Measured on one core, in one run, on the same buffers, for the plain delta and for the
// context-coded one (DeltaOptions::context_coding; its size against bound2, the
// exponent-conditioned bound):
//   encode        BuildDelta(base, target) into memory, threads = 1; the base's content hash is
//                 passed as known (a trainer holds its committed version's hash, hash.h is
//                 additive), the target range hashes and everything else are timed.
//   decode+apply  DeltaReader over the delta bytes, then BufferApplier::ApplyRecord (decode and
//                 apply, as the offline refit and the receivers do) for every chunk onto a copy of
//                 the base (reset outside the timed region); the result is
//                 compared with the target byte for byte after every repetition.
//   memcpy        std::memcpy of the dense tensor bytes between two pre-faulted buffers.
// Bandwidths are bytes of dense tensor per second; each figure is the best of `reps` repetitions.
// The primary figures use process CPU time (bandwidth per core: on a shared, loaded machine wall
// time mostly measures the scheduler); wall-time figures are reported beside them. On a quiet
// machine both agree.
//
// Thread safety: functions are thread-compatible; run one benchmark at a time.
#ifndef DCR_BENCH_LIB_CODEC_BENCH_H_
#define DCR_BENCH_LIB_CODEC_BENCH_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dcr/apply.h"
#include "dcr/checkpoint.h"
#include "dcr/delta.h"
#include "dcr/statusor.h"

namespace dcr::internal {

// Seconds of one timed region.
struct Timing {
  double wall = 1e30;
  double cpu = 1e30;  // process CPU time (all threads)
};

// A base/target pair of one BF16 tensor.
struct CodecBenchInput {
  double target_rate = 0;    // requested change rate
  double measured_rate = 0;  // changed / elements of this pair
  double lr = 0;             // calibrated learning rate
  uint64_t elements = 0;
  uint64_t changed = 0;
  uint64_t dense_bytes = 0;
  double bound0_bits = 0;  // n*H(p) + k*H(XOR value)
  // Positions and zigzag ulp values conditioned on the base element's exponent:
  // sum_e n_e*H(k_e/n_e) + k*H(ulp value | e).
  double bound2_bits = 0;
  std::unique_ptr<Checkpoint> base;
  std::unique_ptr<Checkpoint> target;
  Hash128 base_hash;
};

// Trains one tensor of `elements` BF16 values (shape [elements / 4096, 4096] when divisible) to
// `rate` and returns step0 / step1. Deterministic in (elements, rate, seed).
StatusOr<CodecBenchInput> MakeCodecBenchInput(uint64_t elements, double rate, uint64_t seed,
                                              int threads);

// The options the benchmark encodes with (threads = 1, the base hash passed as known; context
// coding with `context`, at most `context_classes` classes per chunk).
DeltaOptions CodecBenchDeltaOptions(const CodecBenchInput& in, bool context = false,
                                    int context_classes = kContextClassesMax);

// Encodes once into `delta` (context-coded with `context`, at most `context_classes` classes per
// chunk); returns the time spent in BuildDelta.
StatusOr<Timing> CodecBenchEncode(const CodecBenchInput& in, std::vector<uint8_t>* delta,
                                  bool context = false, int context_classes = kContextClassesMax);

// Decode+apply of a delta onto a reusable copy of the base.
class CodecBenchApplier {
 public:
  static StatusOr<std::unique_ptr<CodecBenchApplier>> Create(const CodecBenchInput& in,
                                                             std::vector<uint8_t> delta);
  // Restores the base bytes (not timed).
  void Reset();
  // Parses the delta and applies every chunk (timed by the caller); single thread.
  Status Run();
  // kDataLoss naming the first differing byte if the buffer is not the target.
  Status Verify() const;

 private:
  const CodecBenchInput* in_ = nullptr;
  std::vector<uint8_t> delta_;
  std::vector<uint8_t> buffer_;
};

// The memcpy reference: `bytes` bytes copied between two buffers allocated and pre-faulted once.
class CodecBenchMemcpy {
 public:
  explicit CodecBenchMemcpy(uint64_t bytes) : src_(bytes, 1), dst_(bytes, 0) {}
  // Times one copy.
  Timing Once();

 private:
  std::vector<uint8_t> src_, dst_;
  uint64_t copies_ = 0;
};

struct CodecRateResult {
  double change_rate = 0;  // requested
  double measured_change_rate = 0;
  double lr = 0;
  uint64_t elements = 0;
  uint64_t changed = 0;
  uint64_t dense_bytes = 0;
  uint64_t payload_bytes = 0;
  double bound0_bytes = 0;
  double ratio_vs_dense = 0;   // dense / payload
  double ratio_vs_bound0 = 0;  // payload / bound0 (>= 1 in practice; 1.10 = 10% above)
  double bound0_vs_dense = 0;  // dense / bound0
  double encode_bytes_per_s = 0;
  double decode_apply_bytes_per_s = 0;
  double encode_wall_bytes_per_s = 0;
  double decode_apply_wall_bytes_per_s = 0;
  double encode_vs_memcpy = 0;
  double decode_apply_vs_memcpy = 0;
  // The same pair context-coded (DeltaOptions::context_coding, format version 8).
  double bound2_bytes = 0;
  uint64_t context_payload_bytes = 0;
  double context_ratio_vs_dense = 0;
  double context_ratio_vs_bound2 = 0;  // context payload / bound2
  double context_encode_bytes_per_s = 0;
  double context_decode_apply_bytes_per_s = 0;
  double context_encode_wall_bytes_per_s = 0;
  double context_decode_apply_wall_bytes_per_s = 0;
  double context_encode_vs_memcpy = 0;
  double context_decode_apply_vs_memcpy = 0;
  // The class pass alone (context_pass.h) over the context-coded chunks, per byte of base it
  // reads; 0 where the CPU runs the portable walk.
  double context_class_pass_bytes_per_s = 0;
  double context_class_pass_vs_memcpy = 0;
};

struct CodecBenchConfig {
  uint64_t elements = uint64_t{1} << 24;
  // Best of 40: each repetition takes ~30 ms per rate, and on a shared machine the best of 15
  // still moved by up to 1.5x between runs (other tenants' bursts outlast a short run).
  int reps = 40;
  uint64_t seed = 1;
  std::vector<double> rates = {0.01, 0.03, 0.05};
  int data_threads = 0;  // threads for generating the data (never for the timed parts)
  // DeltaOptions::context_classes of the context-coded runs.
  int context_classes = kContextClassesMax;
};

struct CodecBenchReport {
  CodecBenchConfig config;
  double memcpy_bytes_per_s = 0;
  double memcpy_wall_bytes_per_s = 0;
  // The commitment of a version (dcr/commitment.h: CommitmentOf, one thread) over each rate's
  // target, best of all: tensor bytes per second of CPU time (per core) and of wall time.
  double commitment_bytes_per_s = 0;
  double commitment_wall_bytes_per_s = 0;
  double load_average = 0;  // 1-minute load average at the end of the run
  std::vector<CodecRateResult> rates;
  std::string cpu;
  int cores = 0;
  std::string compiler;
  std::string simd;  // the vector build the codec ran: "portable", "avx2" (with "+pdep" where
                     // CpuFastPdep()) or "avx512"
};

// Runs the whole benchmark. `log` (may be null) receives progress lines.
StatusOr<CodecBenchReport> RunCodecBench(const CodecBenchConfig& config,
                                         const std::function<void(const std::string&)>& log);

// The calibration JSON (also read by the simulator): memcpy_bytes_per_s, commitment_bytes_per_s
// (and their *_wall_* variants), rates[...], machine,
// compiler, commit (when non-empty).
std::string CodecBenchJson(const CodecBenchReport& report, const std::string& commit);
// A Markdown table of the report.
std::string CodecBenchTable(const CodecBenchReport& report);

// Checks a report against a thresholds file (bench/thresholds.json, section "codec"). Size ratios
// are compared as they are (deterministic); speed ratios are multiplied by the file's
// "speed_margin" first. Appends one line per check to `lines`. Returns OK when all pass,
// kFailedPrecondition listing the failures otherwise, kInvalidArgument for a malformed file.
Status CheckCodecThresholds(const CodecBenchReport& report, const std::string& thresholds_json,
                            std::vector<std::string>* lines);

}  // namespace dcr::internal

#endif  // DCR_BENCH_LIB_CODEC_BENCH_H_
