#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>

#include "dcr/model.h"

namespace dcr {
namespace {

uint64_t Count(const std::string& name) {
  auto c = GetPreset(name);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? ModelParameterCount(c.value()) : 0;
}

TEST(PresetsTest, ParameterCountsMatchPublishedModels) {
  // Exact totals of the HF checkpoints (safetensors metadata "total_size" / 2 for BF16).
  EXPECT_EQ(Count("llama3-8b"), 8030261248ULL);
  EXPECT_EQ(Count("llama3-70b"), 70553706496ULL);
  // Published sizes (model cards): 30.5B, 235B, 671B (without the 14B MTP module), 1.04T.
  auto near = [](uint64_t got, double want, double tol) {
    return std::fabs(static_cast<double>(got) / want - 1.0) < tol;
  };
  uint64_t q30 = Count("qwen3-30b-a3b"), q235 = Count("qwen3-235b-a22b");
  uint64_t ds = Count("deepseek-v3-671b"), kimi = Count("kimi-k2-1t");
  EXPECT_TRUE(near(q30, 30.5e9, 0.01)) << q30;
  EXPECT_TRUE(near(q235, 235.1e9, 0.01)) << q235;
  EXPECT_TRUE(near(ds, 671.0e9, 0.005)) << ds;
  EXPECT_TRUE(near(kimi, 1.0264e12, 0.005)) << kimi;
  std::printf(
      "params: llama3-8b %llu llama3-70b %llu qwen3-30b-a3b %llu qwen3-235b-a22b %llu "
      "deepseek-v3-671b %llu kimi-k2-1t %llu\n",
      (unsigned long long)Count("llama3-8b"), (unsigned long long)Count("llama3-70b"),
      (unsigned long long)q30, (unsigned long long)q235, (unsigned long long)ds,
      (unsigned long long)kimi);
  // Small test sizes stay small.
  EXPECT_LT(Count("tiny"), 8000000ULL);
  EXPECT_GT(Count("tiny"), 1000000ULL);
  EXPECT_LT(Count("tiny-moe"), 12000000ULL);
  EXPECT_LT(Count("tiny-mla"), 12000000ULL);
}

TEST(PresetsTest, DeepSeekV3HasMlaShapes) {
  auto c = GetPreset("deepseek-v3-671b").value();
  auto inv = ModelInventory(c);
  auto find = [&](const std::string& n) -> const TensorSpec* {
    for (const auto& t : inv)
      if (t.name == n) return &t;
    return nullptr;
  };
  const TensorSpec* t = find("model.layers.0.self_attn.q_b_proj.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{24576, 1536}));
  t = find("model.layers.5.self_attn.kv_a_proj_with_mqa.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{576, 7168}));
  t = find("model.layers.5.self_attn.kv_b_proj.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{32768, 512}));
  t = find("model.layers.5.self_attn.o_proj.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{7168, 16384}));
  // Layers 0-2 dense, 3.. MoE with 256 experts, one shared expert and an F32 router bias.
  EXPECT_NE(find("model.layers.2.mlp.gate_proj.weight"), nullptr);
  EXPECT_EQ(find("model.layers.3.mlp.gate_proj.weight"), nullptr);
  EXPECT_NE(find("model.layers.3.mlp.experts.255.down_proj.weight"), nullptr);
  EXPECT_EQ(find("model.layers.3.mlp.experts.256.down_proj.weight"), nullptr);
  t = find("model.layers.60.mlp.shared_experts.down_proj.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{7168, 2048}));
  t = find("model.layers.3.mlp.gate.e_score_correction_bias");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, "F32");
  EXPECT_EQ(t->nbytes(), 256u * 4u);
  EXPECT_EQ(find("model.layers.61.input_layernorm.weight"), nullptr);
}

TEST(PresetsTest, InventoriesSortedUniqueAndPositive) {
  for (const auto& name : PresetNames()) {
    if (name == "kimi-k2-1t" || name == "deepseek-v3-671b") continue;  // covered below (scaled)
    auto inv = ModelInventory(GetPreset(name).value());
    ASSERT_FALSE(inv.empty()) << name;
    std::set<std::string> seen;
    for (size_t i = 0; i < inv.size(); ++i) {
      EXPECT_TRUE(seen.insert(inv[i].name).second) << name << " duplicate " << inv[i].name;
      if (i > 0) {
        EXPECT_LT(inv[i - 1].name, inv[i].name) << name;
      }
      for (int64_t d : inv[i].shape) EXPECT_GT(d, 0) << inv[i].name;
      EXPECT_TRUE(inv[i].dtype == "BF16" || inv[i].dtype == "F32") << inv[i].name;
    }
  }
  auto kimi = ModelInventory(GetPreset("kimi-k2-1t").value());
  // 3 global + 61 x (2 norms + 7 MLA) + 1 dense MLP x 3 + 60 x (router + bias + 384*3 + 3 shared).
  EXPECT_EQ(kimi.size(), 3u + 61u * 9u + 3u + 60u * (2u + 384u * 3u + 3u));
  std::set<std::string> seen;
  for (const auto& t : kimi) EXPECT_TRUE(seen.insert(t.name).second);
}

TEST(PresetsTest, UnknownPresetListsKnownNames) {
  auto c = GetPreset("gpt-5");
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(c.status().IsNotFound());
  EXPECT_NE(c.status().message().find("llama3-70b"), std::string::npos);
}

TEST(PresetsTest, ScaleModelKeepsStructure) {
  auto k = GetPreset("kimi-k2-1t").value();
  EXPECT_EQ(ScaleModel(k, 1, 1, 1).name, k.name);
  auto s = ScaleModel(k, 61, 64, 96);
  EXPECT_EQ(s.name, "kimi-k2-1t@d61w64e96");
  EXPECT_EQ(s.first_dense_layers, 1);
  EXPECT_EQ(s.layers, 2);  // one dense, one MoE
  EXPECT_EQ(s.experts, 4);
  EXPECT_EQ(s.hidden, 112);
  EXPECT_EQ(s.heads, 1);
  EXPECT_TRUE(s.is_mla());
  EXPECT_LT(ModelParameterCount(s), 20000000u);
  auto inv = ModelInventory(s);
  bool has_kv_b = false, has_expert3 = false;
  for (const auto& t : inv) {
    has_kv_b |= t.name == "model.layers.1.self_attn.kv_b_proj.weight";
    has_expert3 |= t.name == "model.layers.1.mlp.experts.3.up_proj.weight";
    for (int64_t d : t.shape) EXPECT_GT(d, 0) << t.name;
  }
  EXPECT_TRUE(has_kv_b);
  EXPECT_TRUE(has_expert3);
  auto l = ScaleModel(GetPreset("llama3-70b").value(), 10, 8, 1);
  EXPECT_EQ(l.layers, 8);
  EXPECT_EQ(l.hidden, 1024);
  EXPECT_EQ(l.heads, 8);
  EXPECT_EQ(l.kv_heads, 1);
  EXPECT_EQ(l.head_dim, 128);
  EXPECT_EQ(l.heads % l.kv_heads, 0);
}

}  // namespace
}  // namespace dcr
