// The synthetic AdamW trainer (a fixture): produces consecutive checkpoints of a preset
// (dcr/model.h) at a requested change rate, for tests, benchmarks, `dcr synth` and the simulator's
// payload model. Also the AdamW step and the BF16 conversions the reference training state uses.
//
// Thread safety: SynthTrainer is thread-compatible; the functions are pure.
#ifndef DCR_CORE_TESTING_INCLUDE_DCR_TESTING_SYNTH_H_
#define DCR_CORE_TESTING_INCLUDE_DCR_TESTING_SYNTH_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/model.h"
#include "dcr/status.h"
#include "dcr/statusor.h"

namespace dcr {

struct AdamWHyper {
  double lr = 1e-6;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  double grad_snr = 0.1;  // signal-to-noise of the gradients (persistent part vs noise)
};

// One AdamW step (decoupled weight decay, bias correction) on FP32 masters; `step` is 1-based.
// Shared by the synthetic trainer and the training-side reference state.
void AdamWStep(float* master, float* m, float* v, const float* grad, uint64_t n,
               const AdamWHyper& h, int64_t step);
// Round-to-nearest-even FP32 -> BF16 bits (NaN kept quiet).
uint16_t FloatToBF16(float f);
float BF16ToFloat(uint16_t b);
// Bulk form of FloatToBF16 (vectorizable); `out[i] = FloatToBF16(in[i])`.
void FloatsToBF16(const float* in, uint16_t* out, uint64_t n);

struct SynthOptions {
  std::string preset = "tiny";
  int64_t depth_div = 1, width_div = 1, expert_div = 1;
  uint64_t seed = 1;
  int steps = 2;              // checkpoints written: step0 .. step{steps-1}
  double change_rate = 0.03;  // target fraction of BF16 elements whose bits change per step
  double lr = 0;              // 0 = calibrate to change_rate
  int warmup_steps = 10;      // optimizer steps before step0 (leaves the first-step spike behind)
  int threads = 0;            // 0 = hardware concurrency; never changes the output
  double grad_snr = 0.1;      // std of the persistent gradient part / std of the per-step noise
  // 0: each step is one file stepK.safetensors. Otherwise each step is a Hugging Face shard
  // directory stepK/ written by WriteShardedCheckpoint with this many bytes per shard at most.
  uint64_t shard_bytes = 0;
  // Elements simulated per lr-calibration probe (contiguous runs spread over the BF16 tensors);
  // a model with fewer BF16 elements is calibrated on all of them. Default 2^17.
  uint64_t calibration_sample = uint64_t{1} << 17;
};

// Progress callback: (done, total, phase). Phases "init" and "step" count the stored bytes of the
// tensors processed; "calibrate" and "warmup" count iterations; "wrote PATH ..." counts
// checkpoints written. Calls are serialized (never concurrent) but may come from worker threads.
using ProgressFn = std::function<void(uint64_t, uint64_t, const std::string&)>;

// The in-memory synthetic trainer behind SynthesizeCheckpoints (also used by benches and the
// training-side reference state). Every tensor has FP32 masters with AdamW state (m, v) and a
// persistent gradient direction; its stored form is BF16 (round-to-nearest-even of the master) or
// F32 (the master itself). Initialization: matrices N(0, 0.02); 1-D tensors whose name contains
// "norm" 1 + N(0, 0.05); other 1-D tensors (biases) N(0, 0.02). Gradient at optimizer step t:
// 1e-3 * (grad_snr * p + n_t), p and n_t standard normals. All random numbers come from a
// counter-based generator keyed by (seed, tensor name, element index, step), computed with plain
// IEEE float operations, so the bytes depend only on (tensors, options): never on threads, on
// the calibration sample, or on the machine's libm.
//
// Thread safety: thread-compatible (one caller at a time); uses its own worker threads.
class SynthTrainer {
 public:
  // Allocates state (18 bytes per BF16 element), calibrates lr when options.lr == 0 (bisection on
  // a deterministic sample, so that the mean BF16 change rate over the transitions
  // step0 -> step{steps-1} hits options.change_rate), initializes and runs options.warmup_steps
  // optimizer steps. Errors: kInvalidArgument for a dtype other than BF16/F32, an empty or
  // non-positive shape, change_rate outside (0, 1), steps < 1; kResourceExhausted if the state
  // cannot be allocated; kFailedPrecondition if no lr in [1e-12, 1] reaches the rate.
  static StatusOr<std::unique_ptr<SynthTrainer>> Create(std::vector<TensorSpec> tensors,
                                                        const SynthOptions& options,
                                                        const ProgressFn& progress = nullptr);
  ~SynthTrainer();
  SynthTrainer(const SynthTrainer&) = delete;
  SynthTrainer& operator=(const SynthTrainer&) = delete;

  // One optimizer step on every tensor; updates the stored bytes and the change counters.
  void Step(const ProgressFn& progress = nullptr);

  double lr() const { return lr_; }
  // Optimizer steps taken so far (warm-up included).
  int64_t optimizer_steps() const { return t_; }
  const std::vector<TensorSpec>& tensors() const { return specs_; }
  // Stored bytes of tensor i (nbytes() of its spec).
  const uint8_t* data(size_t i) const;
  // Views of the stored tensors (for WriteSafetensors); valid until the next Step.
  std::vector<TensorView> Views() const;
  // BF16 elements whose stored bits changed in the last Step, and all BF16 elements.
  uint64_t last_changed() const { return last_changed_; }
  uint64_t bf16_elements() const { return bf16_elements_; }

  struct State;  // internal

 private:
  SynthTrainer() = default;
  std::vector<TensorSpec> specs_;
  std::unique_ptr<State> state_;
  SynthOptions options_;
  double lr_ = 0;
  int64_t t_ = 0;
  uint64_t last_changed_ = 0;
  uint64_t bf16_elements_ = 0;
};

// Writes `steps` consecutive checkpoints step{k}.safetensors into `out_dir`; returns their paths.
StatusOr<std::vector<std::string>> SynthesizeCheckpoints(const SynthOptions& options,
                                                         const std::string& out_dir,
                                                         const ProgressFn& progress = nullptr);

}  // namespace dcr

#endif  // DCR_CORE_TESTING_INCLUDE_DCR_TESTING_SYNTH_H_
