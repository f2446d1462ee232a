// Model presets and their canonical tensor inventories.
//
// Architecture numbers are those of the public Hugging Face config.json files:
//   meta-llama/Meta-Llama-3-8B, meta-llama/Meta-Llama-3-70B, Qwen/Qwen3-30B-A3B,
//   Qwen/Qwen3-235B-A22B, deepseek-ai/DeepSeek-V3, moonshotai/Kimi-K2-Instruct.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "dcr/dtype.h"
#include "dcr/model.h"

namespace dcr {
namespace {

std::vector<ModelConfig> BuildPresets() {
  std::vector<ModelConfig> p;
  {
    // Llama-style dense model of ~4M parameters: unit tests and the quickstart.
    ModelConfig c;
    c.name = "tiny";
    c.vocab = 2048;
    c.hidden = 256;
    c.layers = 4;
    c.heads = 4;
    c.kv_heads = 2;
    c.head_dim = 64;
    c.intermediate = 704;
    p.push_back(c);
  }
  {
    // Qwen3-MoE-style model (GQA, q/k norms, 8 experts top-2) of ~5M parameters.
    ModelConfig c;
    c.name = "tiny-moe";
    c.vocab = 2048;
    c.hidden = 256;
    c.layers = 4;
    c.heads = 4;
    c.kv_heads = 2;
    c.head_dim = 64;
    c.intermediate = 704;
    c.experts = 8;
    c.moe_intermediate = 128;
    c.experts_per_token = 2;
    c.qk_norm = true;
    p.push_back(c);
  }
  {
    // DeepSeek-V3-style model (MLA, shared expert, first dense layer, router bias), ~6M parameters.
    ModelConfig c;
    c.name = "tiny-mla";
    c.vocab = 2048;
    c.hidden = 256;
    c.layers = 4;
    c.heads = 4;
    c.kv_heads = 4;
    c.head_dim = 48;
    c.intermediate = 704;
    c.experts = 8;
    c.shared_experts = 1;
    c.moe_intermediate = 128;
    c.experts_per_token = 2;
    c.first_dense_layers = 1;
    c.q_lora_rank = 96;
    c.kv_lora_rank = 64;
    c.qk_nope_head_dim = 32;
    c.qk_rope_head_dim = 16;
    c.v_head_dim = 32;
    c.router_bias = true;
    p.push_back(c);
  }
  {
    ModelConfig c;
    c.name = "llama3-8b";
    c.vocab = 128256;
    c.hidden = 4096;
    c.layers = 32;
    c.heads = 32;
    c.kv_heads = 8;
    c.head_dim = 128;
    c.intermediate = 14336;
    p.push_back(c);
  }
  {
    ModelConfig c;
    c.name = "qwen3-30b-a3b";
    c.vocab = 151936;
    c.hidden = 2048;
    c.layers = 48;
    c.heads = 32;
    c.kv_heads = 4;
    c.head_dim = 128;
    c.intermediate = 6144;
    c.experts = 128;
    c.moe_intermediate = 768;
    c.experts_per_token = 8;
    c.qk_norm = true;
    p.push_back(c);
  }
  {
    ModelConfig c;
    c.name = "llama3-70b";
    c.vocab = 128256;
    c.hidden = 8192;
    c.layers = 80;
    c.heads = 64;
    c.kv_heads = 8;
    c.head_dim = 128;
    c.intermediate = 28672;
    p.push_back(c);
  }
  {
    ModelConfig c;
    c.name = "qwen3-235b-a22b";
    c.vocab = 151936;
    c.hidden = 4096;
    c.layers = 94;
    c.heads = 64;
    c.kv_heads = 4;
    c.head_dim = 128;
    c.intermediate = 12288;
    c.experts = 128;
    c.moe_intermediate = 1536;
    c.experts_per_token = 8;
    c.qk_norm = true;
    p.push_back(c);
  }
  {
    ModelConfig c;
    c.name = "deepseek-v3-671b";
    c.vocab = 129280;
    c.hidden = 7168;
    c.layers = 61;
    c.heads = 128;
    c.kv_heads = 128;
    c.head_dim = 192;  // qk_nope_head_dim + qk_rope_head_dim
    c.intermediate = 18432;
    c.experts = 256;
    c.shared_experts = 1;
    c.moe_intermediate = 2048;
    c.experts_per_token = 8;
    c.first_dense_layers = 3;
    c.q_lora_rank = 1536;
    c.kv_lora_rank = 512;
    c.qk_nope_head_dim = 128;
    c.qk_rope_head_dim = 64;
    c.v_head_dim = 128;
    c.router_bias = true;
    p.push_back(c);
  }
  {
    ModelConfig c;
    c.name = "kimi-k2-1t";
    c.vocab = 163840;
    c.hidden = 7168;
    c.layers = 61;
    c.heads = 64;
    c.kv_heads = 64;
    c.head_dim = 192;
    c.intermediate = 18432;
    c.experts = 384;
    c.shared_experts = 1;
    c.moe_intermediate = 2048;
    c.experts_per_token = 8;
    c.first_dense_layers = 1;
    c.q_lora_rank = 1536;
    c.kv_lora_rank = 512;
    c.qk_nope_head_dim = 128;
    c.qk_rope_head_dim = 64;
    c.v_head_dim = 128;
    c.router_bias = true;
    p.push_back(c);
  }
  return p;
}

const std::vector<ModelConfig>& Presets() {
  static const std::vector<ModelConfig> presets = BuildPresets();
  return presets;
}

int64_t DivRound(int64_t x, int64_t d) {
  if (x <= 0) return x;
  return std::max<int64_t>(1, (x + d / 2) / d);
}

void Add(std::vector<TensorSpec>* out, std::string name, std::vector<int64_t> shape,
         const std::string& dtype) {
  TensorSpec t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = std::move(shape);
  out->push_back(std::move(t));
}

void AddMlp(std::vector<TensorSpec>* out, const std::string& prefix, int64_t hidden, int64_t inter,
            const std::string& dt) {
  Add(out, prefix + "gate_proj.weight", {inter, hidden}, dt);
  Add(out, prefix + "up_proj.weight", {inter, hidden}, dt);
  Add(out, prefix + "down_proj.weight", {hidden, inter}, dt);
}

}  // namespace

uint64_t TensorSpec::num_elements() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

uint64_t TensorSpec::nbytes() const {
  return num_elements() * static_cast<uint64_t>(DTypeWidth(DTypeFromName(dtype)));
}

std::vector<std::string> PresetNames() {
  std::vector<std::string> names;
  for (const auto& c : Presets()) names.push_back(c.name);
  return names;
}

StatusOr<ModelConfig> GetPreset(const std::string& name) {
  for (const auto& c : Presets())
    if (c.name == name) return c;
  std::string known;
  for (const auto& c : Presets()) known += (known.empty() ? "" : ", ") + c.name;
  return NotFoundError("unknown model preset '" + name + "' (known: " + known + ")");
}

ModelConfig ScaleModel(const ModelConfig& cfg, int64_t depth_div, int64_t width_div,
                       int64_t expert_div) {
  depth_div = std::max<int64_t>(1, depth_div);
  width_div = std::max<int64_t>(1, width_div);
  expert_div = std::max<int64_t>(1, expert_div);
  if (depth_div == 1 && width_div == 1 && expert_div == 1) return cfg;
  ModelConfig c = cfg;
  c.name = cfg.name + "@d" + std::to_string(depth_div) + "w" + std::to_string(width_div) + "e" +
           std::to_string(expert_div);
  // Depth.
  c.layers = DivRound(cfg.layers, depth_div);
  if (cfg.is_moe()) {
    c.first_dense_layers =
        cfg.first_dense_layers > 0 ? DivRound(cfg.first_dense_layers, depth_div) : 0;
    if (c.layers < c.first_dense_layers + 1) c.layers = c.first_dense_layers + 1;
  }
  // Width.
  c.hidden = DivRound(cfg.hidden, width_div);
  c.intermediate = DivRound(cfg.intermediate, width_div);
  c.moe_intermediate = DivRound(cfg.moe_intermediate, width_div);
  c.vocab = DivRound(cfg.vocab, width_div);
  c.q_lora_rank =
      cfg.q_lora_rank > 0 ? std::max<int64_t>(8, DivRound(cfg.q_lora_rank, width_div)) : 0;
  c.kv_lora_rank =
      cfg.kv_lora_rank > 0 ? std::max<int64_t>(8, DivRound(cfg.kv_lora_rank, width_div)) : 0;
  c.heads = std::max<int64_t>(1, cfg.heads / width_div);
  int64_t head_shrink = std::max<int64_t>(1, width_div / std::max<int64_t>(1, cfg.heads));
  auto shrink_dim = [&](int64_t d) {
    return d > 0 ? std::max<int64_t>(std::min<int64_t>(d, 8), d / head_shrink) : 0;
  };
  c.head_dim = shrink_dim(cfg.head_dim);
  c.qk_nope_head_dim = shrink_dim(cfg.qk_nope_head_dim);
  c.qk_rope_head_dim = shrink_dim(cfg.qk_rope_head_dim);
  c.v_head_dim = shrink_dim(cfg.v_head_dim);
  if (cfg.is_mla()) c.head_dim = c.qk_nope_head_dim + c.qk_rope_head_dim;
  if (cfg.kv_heads == cfg.heads) {
    c.kv_heads = c.heads;
  } else {
    c.kv_heads = std::max<int64_t>(1, cfg.kv_heads / width_div);
    c.kv_heads = std::gcd(c.kv_heads, c.heads);
  }
  // Experts.
  if (cfg.is_moe()) {
    c.experts = std::max<int64_t>(1, cfg.experts / expert_div);
    c.experts_per_token = std::min(cfg.experts_per_token, c.experts);
  }
  return c;
}

std::vector<TensorSpec> ModelInventory(const ModelConfig& c) {
  std::vector<TensorSpec> out;
  const std::string& dt = c.dtype;
  Add(&out, "model.embed_tokens.weight", {c.vocab, c.hidden}, dt);
  Add(&out, "model.norm.weight", {c.hidden}, dt);
  if (!c.tied_embeddings) Add(&out, "lm_head.weight", {c.vocab, c.hidden}, dt);
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string l = "model.layers." + std::to_string(i) + ".";
    Add(&out, l + "input_layernorm.weight", {c.hidden}, dt);
    Add(&out, l + "post_attention_layernorm.weight", {c.hidden}, dt);
    const std::string a = l + "self_attn.";
    if (c.is_mla()) {
      const int64_t qk_head = c.qk_nope_head_dim + c.qk_rope_head_dim;
      if (c.q_lora_rank > 0) {
        Add(&out, a + "q_a_proj.weight", {c.q_lora_rank, c.hidden}, dt);
        Add(&out, a + "q_a_layernorm.weight", {c.q_lora_rank}, dt);
        Add(&out, a + "q_b_proj.weight", {c.heads * qk_head, c.q_lora_rank}, dt);
      } else {
        Add(&out, a + "q_proj.weight", {c.heads * qk_head, c.hidden}, dt);
      }
      Add(&out, a + "kv_a_proj_with_mqa.weight", {c.kv_lora_rank + c.qk_rope_head_dim, c.hidden},
          dt);
      Add(&out, a + "kv_a_layernorm.weight", {c.kv_lora_rank}, dt);
      Add(&out, a + "kv_b_proj.weight",
          {c.heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank}, dt);
      Add(&out, a + "o_proj.weight", {c.hidden, c.heads * c.v_head_dim}, dt);
    } else {
      Add(&out, a + "q_proj.weight", {c.heads * c.head_dim, c.hidden}, dt);
      Add(&out, a + "k_proj.weight", {c.kv_heads * c.head_dim, c.hidden}, dt);
      Add(&out, a + "v_proj.weight", {c.kv_heads * c.head_dim, c.hidden}, dt);
      Add(&out, a + "o_proj.weight", {c.hidden, c.heads * c.head_dim}, dt);
      if (c.qk_norm) {
        Add(&out, a + "q_norm.weight", {c.head_dim}, dt);
        Add(&out, a + "k_norm.weight", {c.head_dim}, dt);
      }
    }
    const std::string m = l + "mlp.";
    if (c.is_moe_layer(i)) {
      Add(&out, m + "gate.weight", {c.experts, c.hidden}, dt);
      if (c.router_bias) Add(&out, m + "gate.e_score_correction_bias", {c.experts}, "F32");
      for (int64_t e = 0; e < c.experts; ++e)
        AddMlp(&out, m + "experts." + std::to_string(e) + ".", c.hidden, c.moe_intermediate, dt);
      if (c.shared_experts > 0)
        AddMlp(&out, m + "shared_experts.", c.hidden, c.shared_experts * c.moe_intermediate, dt);
    } else {
      AddMlp(&out, m, c.hidden, c.intermediate, dt);
    }
  }
  std::sort(out.begin(), out.end(),
            [](const TensorSpec& x, const TensorSpec& y) { return x.name < y.name; });
  return out;
}

uint64_t ModelParameterCount(const ModelConfig& cfg) {
  uint64_t n = 0;
  for (const auto& t : ModelInventory(cfg)) n += t.num_elements();
  return n;
}

uint64_t ModelBytes(const ModelConfig& cfg) {
  uint64_t n = 0;
  for (const auto& t : ModelInventory(cfg)) n += t.nbytes();
  return n;
}

}  // namespace dcr
