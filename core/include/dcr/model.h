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
// Shapes are [out_features, in_features] as in HF. dtype BF16 unless stated.
//
// Thread safety: pure functions / value types.
#ifndef DCR_CORE_INCLUDE_DCR_MODEL_H_
#define DCR_CORE_INCLUDE_DCR_MODEL_H_

#include <cstdint>
#include <functional>
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

  bool is_moe() const { return experts > 0; }
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
ModelConfig ScaleModel(const ModelConfig& cfg, int64_t depth_div, int64_t width_div,
                       int64_t expert_div);
// The canonical tensor inventory (sorted by name).
std::vector<TensorSpec> ModelInventory(const ModelConfig& cfg);
uint64_t ModelParameterCount(const ModelConfig& cfg);

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

struct SynthOptions {
  std::string preset = "tiny";
  int64_t depth_div = 1, width_div = 1, expert_div = 1;
  uint64_t seed = 1;
  int steps = 2;               // checkpoints written: step0 .. step{steps-1}
  double change_rate = 0.03;   // target fraction of BF16 elements whose bits change per step
  double lr = 0;               // 0 = calibrate to change_rate
  int warmup_steps = 10;       // optimizer steps before step0 (leaves the first-step spike behind)
  int threads = 0;
};

// Progress callback: (done, total, phase).
using ProgressFn = std::function<void(uint64_t, uint64_t, const std::string&)>;

// Writes `steps` consecutive checkpoints step{k}.safetensors into `out_dir`; returns their paths.
StatusOr<std::vector<std::string>> SynthesizeCheckpoints(const SynthOptions& options,
                                                         const std::string& out_dir,
                                                         const ProgressFn& progress = nullptr);

}  // namespace dcr

#endif  // DCR_CORE_INCLUDE_DCR_MODEL_H_
