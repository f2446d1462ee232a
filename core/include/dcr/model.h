// Model presets: tensor inventories of public architectures (the canonical checkpoint a trainer
// exports). The testing library's synthetic trainer fills them with data.
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
  int64_t head_dim = 0;      // usually hidden / heads
  int64_t intermediate = 0;  // dense MLP width
  int64_t experts = 0;       // routed experts per MoE layer (0 = dense model)
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
// Width: hidden, intermediate sizes, LoRA ranks, vocab and head counts / width_div; head_dim is
// kept until the head count reaches 1, then shrinks (>= 8). Experts: routed experts / expert_div
// (experts_per_token clamped). Non-positive divisors count as 1. The name gets a suffix
// "@d<depth_div>w<width_div>e<expert_div>".
ModelConfig ScaleModel(const ModelConfig& cfg, int64_t depth_div, int64_t width_div,
                       int64_t expert_div);
// The canonical tensor inventory (sorted by name).
std::vector<TensorSpec> ModelInventory(const ModelConfig& cfg);
uint64_t ModelParameterCount(const ModelConfig& cfg);
// Bytes of all tensors of the inventory.
uint64_t ModelBytes(const ModelConfig& cfg);

}  // namespace dcr

#endif  // DCR_CORE_INCLUDE_DCR_MODEL_H_
