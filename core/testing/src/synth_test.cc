#include "dcr/testing/synth.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "dcr/checkpoint.h"

namespace dcr {
namespace {

std::string TempDir(const std::string& name) {
  auto p = std::filesystem::temp_directory_path() /
           ("dcr_synth_test_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(p);
  return p.string();
}

TEST(SynthesizeCheckpointsTest, WritesConsecutiveCheckpointsAtTheRate) {
  const std::string dir = TempDir("tiny");
  SynthOptions o;
  o.preset = "tiny";
  o.steps = 3;
  o.change_rate = 0.03;
  o.seed = 4;
  o.threads = 2;
  uint64_t last_done = 0;
  bool saw_write = false;
  auto paths =
      SynthesizeCheckpoints(o, dir, [&](uint64_t done, uint64_t total, const std::string& phase) {
        EXPECT_LE(done, total);
        last_done = done;
        saw_write |= phase.rfind("wrote ", 0) == 0;
      });
  ASSERT_TRUE(paths.ok()) << paths.status();
  EXPECT_TRUE(saw_write);
  ASSERT_EQ(paths.value().size(), 3u);
  auto inv = ModelInventory(GetPreset("tiny").value());
  std::vector<std::unique_ptr<Checkpoint>> ck;
  for (const auto& p : paths.value()) {
    auto c = Checkpoint::Open(p);
    ASSERT_TRUE(c.ok()) << c.status();
    ck.push_back(std::move(c).value());
  }
  ASSERT_EQ(ck[0]->tensors().size(), inv.size());
  EXPECT_EQ(ck[0]->metadata().at("dcr.preset"), "tiny");
  for (const auto& spec : inv) {
    const TensorInfo* t = ck[0]->Find(spec.name);
    ASSERT_NE(t, nullptr) << spec.name;
    EXPECT_EQ(t->shape, spec.shape);
    EXPECT_EQ(t->dtype_name, spec.dtype);
  }
  // Change rate per transition over all BF16 elements.
  for (int k = 1; k < 3; ++k) {
    uint64_t n = 0, changed = 0;
    for (const auto& spec : inv) {
      const TensorInfo* a = ck[k - 1]->Find(spec.name);
      const TensorInfo* b = ck[k]->Find(spec.name);
      const uint16_t* pa = reinterpret_cast<const uint16_t*>(ck[k - 1]->data(*a));
      const uint16_t* pb = reinterpret_cast<const uint16_t*>(ck[k]->data(*b));
      for (uint64_t i = 0; i < a->num_elements(); ++i) changed += pa[i] != pb[i];
      n += a->num_elements();
    }
    const double rate = static_cast<double>(changed) / static_cast<double>(n);
    // Calibrated on the mean of both transitions; each stays close.
    EXPECT_NEAR(rate, 0.03, 0.006) << "transition " << k;
  }
  // Same options, other thread count: identical files.
  const std::string dir2 = TempDir("tiny1");
  o.threads = 1;
  auto again = SynthesizeCheckpoints(o, dir2);
  ASSERT_TRUE(again.ok()) << again.status();
  for (int k = 0; k < 3; ++k) {
    auto a = ReadFile(paths.value()[k]);
    auto b = ReadFile(again.value()[k]);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_TRUE(a.value() == b.value()) << "step " << k;
  }
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(dir2);
}

TEST(SynthesizeCheckpointsTest, ShardDirectoriesHoldTheSameTensors) {
  const std::string one = TempDir("one"), sharded = TempDir("sharded");
  SynthOptions o;
  o.steps = 2;
  o.seed = 9;
  auto files = SynthesizeCheckpoints(o, one);
  ASSERT_TRUE(files.ok()) << files.status();
  o.shard_bytes = 3000000;
  auto dirs = SynthesizeCheckpoints(o, sharded);
  ASSERT_TRUE(dirs.ok()) << dirs.status();
  ASSERT_EQ(dirs.value().size(), 2u);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(dirs.value()[k],
              (std::filesystem::path(sharded) / ("step" + std::to_string(k))).string());
    EXPECT_TRUE(
        std::filesystem::is_regular_file(std::filesystem::path(dirs.value()[k]) / kIndexFileName));
    auto a = Checkpoint::Open(files.value()[k]);
    auto b = Checkpoint::Open(dirs.value()[k]);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_TRUE(b.value()->sharded());
    EXPECT_GE(b.value()->files().size(), 3u);
    ASSERT_EQ(a.value()->tensors().size(), b.value()->tensors().size());
    for (const TensorInfo& t : a.value()->tensors()) {
      const TensorInfo* u = b.value()->Find(t.name);
      ASSERT_NE(u, nullptr) << t.name;
      ASSERT_EQ(t.nbytes, u->nbytes);
      EXPECT_EQ(std::memcmp(a.value()->data(t), b.value()->data(*u), t.nbytes), 0) << t.name;
    }
  }
  std::filesystem::remove_all(one);
  std::filesystem::remove_all(sharded);
}

TEST(SynthesizeCheckpointsTest, ScaledMoeAndErrors) {
  const std::string dir = TempDir("mla");
  SynthOptions o;
  o.preset = "deepseek-v3-671b";
  o.depth_div = 61;
  o.width_div = 56;
  o.expert_div = 64;
  o.steps = 2;
  o.warmup_steps = 2;
  o.calibration_sample = 1 << 14;
  auto paths = SynthesizeCheckpoints(o, dir);
  ASSERT_TRUE(paths.ok()) << paths.status();
  auto c = Checkpoint::Open(paths.value()[1]);
  ASSERT_TRUE(c.ok()) << c.status();
  const TensorInfo* bias = c.value()->Find("model.layers.1.mlp.gate.e_score_correction_bias");
  ASSERT_NE(bias, nullptr);
  EXPECT_EQ(bias->dtype, DType::kF32);
  EXPECT_NE(c.value()->Find("model.layers.1.self_attn.kv_a_proj_with_mqa.weight"), nullptr);
  std::filesystem::remove_all(dir);

  o.preset = "no-such-model";
  EXPECT_TRUE(SynthesizeCheckpoints(o, dir).status().IsNotFound());
  o.preset = "tiny";
  o.depth_div = 0;
  EXPECT_TRUE(SynthesizeCheckpoints(o, dir).status().IsInvalidArgument());
  // The unscaled 1T model cannot be materialized here: a clear error, no crash.
  o = SynthOptions();
  o.preset = "kimi-k2-1t";
  auto big = SynthesizeCheckpoints(o, dir);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), StatusCode::kResourceExhausted) << big.status();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dcr
