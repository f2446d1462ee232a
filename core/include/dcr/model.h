// Model presets: tensor inventories of public architectures, and the synthetic AdamW trainer that
// produces consecutive checkpoints at a requested change rate.
//
// Tensor naming follows Hugging Face Llama/Qwen/DeepSeek conventions, e.g.
//   model.embed_tokens.weight [vocab, hidden]
//   model.layers.{i}.input_layernorm.weight [hidden]
//   model.layers.{i}.self_attn.{q,k,v,o}_proj.weight
//   model.layers.{i}.mlp.{gate,up,down}_proj.weight                  (dense layers)
//   model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight      (MoE layers)
//   model.layers.{i}.mlp.shared_experts.{gate,up,down}_proj.weight   (MoE with shared experts)
//   model.layers.{i}.mlp.gate.weight [n_experts, hidden]             (router)
//   model.norm.weight, lm_head.weight (absent when tied)
// Qwen3 adds self_attn.{q,k}_norm.weight [head_dim]. DeepSeek-V3 / Kimi-K2 use multi-head latent
// attention instead of q/k/v_proj:
//   self_attn.q_a_proj.weight [q_lora_rank, hidden], self_attn.q_a_layernorm.weight [q_lora_rank]
//   self_attn.q_b_proj.weight [heads * (qk_nope_head_dim + qk_rope_head_dim), q_lora_rank]
//   self_attn.kv_a_proj_with_mqa.weight [kv_lora_rank + qk_rope_head_dim, hidden]
//   self_attn.kv_a_layernorm.weight [kv_lora_rank]
//   self_attn.kv_b_proj.weight [heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank]
//   self_attn.o_proj.weight [hidden, heads * v_head_dim]
// and a router bias mlp.gate.e_score_correction_bias [experts] (F32).
// Shapes are [out_features, in_features] as in HF. dtype BF16 unless stated: the inventories are
// those of the BF16 checkpoints a trainer exports (DeepSeek-V3 and Kimi-K2 are published in FP8
// with weight_scale_inv tensors; their BF16 conversions have exactly the tensors listed here).
// The multi-token-prediction layer of DeepSeek-V3 (model.layers.61, 14B) is not part of the
// 671B model and is left out.
//
// Thread safety: pure functions / value types.
#ifndef DCR_CORE_INCLUDE_DCR_MODEL_H_
#define DCR_CORE_INCLUDE_DCR_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/status.h"
#include "dcr/statusor.h"

namespace dcr {

struct ModelConfig {
  std::string name;  // preset name, e.g. "tiny", "llama3-70b", "kimi-k2-1t"
  int64_t vocab = 0;
  int64_t hidden = 0;
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;       // usually hidden / heads
  int64_t intermediate = 0;   // dense MLP width
  int64_t experts = 0;        // routed experts per MoE layer (0 = dense model)
  int64_t shared_experts = 0;
  int64_t moe_intermediate = 0;
  int64_t experts_per_token = 0;
  int64_t first_dense_layers = 0;  // leading layers with a dense MLP in MoE models
  bool tied_embeddings = false;
  std::string dtype = "BF16";
  // Multi-head latent attention (DeepSeek-V3, Kimi-K2); kv_lora_rank == 0 means GQA attention.
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  bool qk_norm = false;      // per-head q/k RMSNorm weights (Qwen3)
  bool router_bias = false;  // mlp.gate.e_score_correction_bias, F32 (DeepSeek-V3, Kimi-K2)

  bool is_moe() const { return experts > 0; }
  bool is_mla() const { return kv_lora_rank > 0; }
  // True if layer `i` has a routed-expert MLP.
  bool is_moe_layer(int64_t i) const { return is_moe() && i >= first_dense_layers; }
};

struct TensorSpec {
  std::string name;
  std::string dtype;  // safetensors dtype string
  std::vector<int64_t> shape;
  uint64_t num_elements() const;
  uint64_t nbytes() const;
};

// Known preset names (small test sizes first, then the public architectures).
std::vector<std::string> PresetNames();
// kNotFound for an unknown name (the message lists the known ones).
StatusOr<ModelConfig> GetPreset(const std::string& name);
// A scaled-down variant that can be materialized: depth and width divided (rounded, >= 1),
// expert count divided; keeps the tensor structure. scale = 1 returns `cfg`.
// Depth: layers / depth_div (a MoE model keeps >= 1 dense layer if it had one and >= 1 MoE layer).
// Width: hidden, intermediate sizes, LoRA ranks, vocab and head counts / width_div; head_dim is kept
// until the head count reaches 1, then shrinks (>= 8). Experts: routed experts / expert_div
// (experts_per_token clamped). Non-positive divisors count as 1. The name gets a suffix
// "@d<depth_div>w<width_div>e<expert_div>".
ModelConfig ScaleModel(const ModelConfig& cfg, int64_t depth_div, int64_t width_div,
                       int64_t expert_div);
// The canonical tensor inventory (sorted by name).
std::vector<TensorSpec> ModelInventory(const ModelConfig& cfg);
uint64_t ModelParameterCount(const ModelConfig& cfg);
// Bytes of all tensors of the inventory.
uint64_t ModelBytes(const ModelConfig& cfg);

// ---- synthetic AdamW trainer ----

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
  int steps = 2;               // checkpoints written: step0 .. step{steps-1}
  double change_rate = 0.03;   // target fraction of BF16 elements whose bits change per step
  double lr = 0;               // 0 = calibrate to change_rate
  int warmup_steps = 10;       // optimizer steps before step0 (leaves the first-step spike behind)
  int threads = 0;             // 0 = hardware concurrency; never changes the output
  double grad_snr = 0.1;       // std of the persistent gradient part / std of the per-step noise
  // Elements simulated per lr-calibration probe (contiguous runs spread over the BF16 tensors);
  // a model with fewer BF16 elements is calibrated on all of them. Default 2^17.
  uint64_t calibration_sample = uint64_t{1} << 17;
};

// Progress callback: (done, total, phase).
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

#endif  // DCR_CORE_INCLUDE_DCR_MODEL_H_
