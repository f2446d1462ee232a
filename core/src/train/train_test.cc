// Training side: per-rank deltas applied to the exporter's canonical base give the exporter's
// output of the new state byte for byte, over random layouts.
#include "dcr/train.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <set>

#include "dcr/apply.h"
#include "dcr/checkpoint.h"
#include "dcr/delta.h"
#include "dcr/testing/reference_trainer.h"

namespace dcr {
namespace {

ModelConfig DenseConfig() {
  ModelConfig c;
  c.name = "t-dense";
  c.vocab = 250;  // not a multiple of the padding: padded rows are dropped by the exporter
  c.hidden = 64;
  c.layers = 4;
  c.heads = 16;
  c.kv_heads = 8;
  c.head_dim = 4;
  c.intermediate = 96;
  return c;
}

ModelConfig MoeConfig() {
  ModelConfig c = DenseConfig();
  c.name = "t-moe";
  c.vocab = 200;
  c.experts = 8;
  c.moe_intermediate = 16;
  c.shared_experts = 1;
  c.experts_per_token = 2;
  c.first_dense_layers = 1;
  c.qk_norm = true;
  return c;
}

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/dcr_train_" + std::to_string(getpid()) + "_" + name;
}

struct Rig {
  std::shared_ptr<const TrainStructure> s;
  std::shared_ptr<const Exporter> ex;
  std::shared_ptr<const LayoutMap> map;
  std::unique_ptr<TrainState> state;
};

Rig Make(const ModelConfig& cfg, const TrainLayout& l, uint64_t seed = 1, double lr = 0) {
  Rig st;
  auto s = TrainStructure::Create(cfg, l);
  EXPECT_TRUE(s.ok()) << s.status() << " layout " << l.ToString();
  if (!s.ok()) return st;
  st.s = *s;
  st.ex = std::make_shared<ReferenceExporter>(st.s);
  auto m = LayoutMap::Discover(*st.ex, 2);
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return st;
  st.map = *m;
  TrainOptions to;
  to.seed = seed;
  to.threads = 2;
  to.warmup_steps = 2;
  to.lr = lr;
  auto state = TrainState::Create(st.s, to);
  EXPECT_TRUE(state.ok()) << state.status();
  if (state.ok()) st.state = std::move(*state);
  return st;
}

// Builds deltas for `steps` steps and checks apply(base) == export(new) byte for byte.
void CheckRoundTrip(Rig& st, int steps, uint64_t chunk_elems, const std::string& tag,
                    const std::function<bool(const LocalParam&)>& filter = nullptr,
                    TrainDeltaStats* last_stats = nullptr) {
  ASSERT_TRUE(st.state);
  TrainDeltaOptions o;
  o.chunk_elems = chunk_elems;
  o.threads = 2;
  auto b = TrainDeltaBuilder::Create(st.s, st.map, st.ex, st.state->shards(), o);
  ASSERT_TRUE(b.ok()) << b.status();
  auto& builder = **b;
  const std::string base_path = TempPath(tag + "_base.safetensors");
  const std::string delta_path = TempPath(tag + ".dcr");
  const std::string out_path = TempPath(tag + "_out.safetensors");
  ASSERT_TRUE(st.ex->ExportFile(ShardSetReader(*st.s, st.state->shards()), base_path, 2).ok());
  {
    auto ck = Checkpoint::Open(base_path);
    ASSERT_TRUE(ck.ok()) << ck.status();
    // The builder's distributed content hash equals the exported file's.
    EXPECT_EQ((*ck)->ContentHash(2), builder.base_hash()) << tag;
    EXPECT_EQ((*ck)->header_json(), builder.inventory_json()) << tag;
  }
  for (int k = 0; k < steps; ++k) {
    ShardSet prev = st.state->shards();
    st.state->Step(filter);
    DeltaFileSink sink(delta_path);
    auto stats = builder.BuildStep(prev, st.state->shards(), &sink);
    ASSERT_TRUE(stats.ok()) << stats.status() << " " << tag;
    if (last_stats) *last_stats = *stats;
    ApplyOptions ao;
    ao.threads = 2;
    ao.verify_full = true;
    auto applied = ApplyDeltaFile(base_path, delta_path, out_path, ao);
    ASSERT_TRUE(applied.ok()) << applied.status() << " " << tag << " step " << k;
    auto want = st.ex->ExportFileImage(ShardSetReader(*st.s, st.state->shards()), 2);
    ASSERT_TRUE(want.ok());
    auto got = ReadFile(out_path);
    ASSERT_TRUE(got.ok());
    ASSERT_EQ(got->size(), want->size()) << tag;
    if (*got != *want) {
      auto ck = Checkpoint::FromBytes(*want);
      ASSERT_TRUE(ck.ok());
      for (const auto& t : (*ck)->tensors()) {
        const uint64_t off = (*ck)->data_section_offset() + t.offset;
        EXPECT_EQ(0, std::memcmp(got->data() + off, want->data() + off, t.nbytes))
            << tag << " step " << k << ": tensor " << t.name << " differs";
      }
      FAIL() << tag << " step " << k << ": output differs from the exporter's";
    }
    EXPECT_EQ(applied->result_hash, stats->target_hash);
    ASSERT_EQ(0, std::rename(out_path.c_str(), base_path.c_str()));
  }
  std::remove(base_path.c_str());
  std::remove(delta_path.c_str());
}

TEST(TrainLayoutTest, ParsesAndRejects) {
  auto l = TrainLayout::Parse("tp=2, pp=4,ep=1,dp=2,dist_opt=1,tied=0,fold_layers=1");
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->tp, 2);
  EXPECT_EQ(l->pp, 4);
  EXPECT_EQ(l->dp, 2);
  EXPECT_TRUE(l->dist_opt);
  EXPECT_EQ(l->tied, 0);
  auto again = TrainLayout::Parse(l->ToString());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->ToString(), l->ToString());
  for (const char* bad :
       {"tp=two", "tq=2", "tp", "dist_opt=2", "tied=5", "pp=", "tp=99999999999"}) {
    auto r = TrainLayout::Parse(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_TRUE(r.status().IsInvalidArgument()) << bad;
  }
  EXPECT_NE(TrainLayout::Parse("tq=2").status().message().find("tq"), std::string::npos);
}

TEST(TrainLayoutTest, BadLayoutsGiveClearErrors) {
  struct Case {
    ModelConfig cfg;
    std::string layout;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {DenseConfig(), "tp=16", "kv_heads"},
      {DenseConfig(), "tp=3", "kv_heads"},
      {DenseConfig(), "ep=2", "MoE"},
      {MoeConfig(), "ep=3", "experts"},
      {DenseConfig(), "pp=5", "layers"},
      {DenseConfig(), "fold_layers=5", "fold_layers"},
      {MoeConfig(), "fold_layers=2", "fold_layers"},
      {DenseConfig(), "tp=0", "tp"},
      {DenseConfig(), "dp=0", "dp"},
      {DenseConfig(), "vocab_pad=0", "vocab_pad"},
  };
  for (const auto& c : cases) {
    auto l = TrainLayout::Parse(c.layout);
    ASSERT_TRUE(l.ok()) << c.layout;
    auto s = TrainStructure::Create(c.cfg, *l);
    ASSERT_FALSE(s.ok()) << c.layout;
    EXPECT_TRUE(s.status().IsInvalidArgument()) << s.status();
    EXPECT_NE(s.status().message().find(c.needle), std::string::npos)
        << c.layout << ": " << s.status();
  }
}

TEST(TrainMapTest, ClassifiesConversions) {
  TrainLayout l;
  l.tp = 2;
  l.fold_layers = 1;
  Rig st = Make(DenseConfig(), l);
  ASSERT_TRUE(st.map);
  const auto& canon = st.s->canonical();
  std::set<std::string> residual;
  for (const auto& r : st.map->residual()) residual.insert(canon[r.tensor].name);
  // FP32 norms and the folded down_proj are residual; everything else is an index map.
  EXPECT_TRUE(residual.count("model.norm.weight"));
  EXPECT_TRUE(residual.count("model.layers.0.input_layernorm.weight"));
  EXPECT_TRUE(residual.count("model.layers.3.mlp.down_proj.weight"));
  EXPECT_FALSE(residual.count("model.layers.2.mlp.down_proj.weight"));
  EXPECT_FALSE(residual.count("model.layers.0.self_attn.q_proj.weight"));
  EXPECT_FALSE(residual.count("model.embed_tokens.weight"));
  for (const auto& r : st.map->residual()) {
    EXPECT_FALSE(r.deps.empty()) << canon[r.tensor].name;
  }
  const MapStats& ms = st.map->stats();
  EXPECT_EQ(ms.affine_elements + ms.residual_elements, ms.canonical_elements);
  EXPECT_GT(ms.affine_share(), 0.8);

  // Without the FP32 norms and the fold every element is an index map.
  l.fp32_norms = false;
  l.fold_layers = 0;
  Rig plain = Make(DenseConfig(), l);
  ASSERT_TRUE(plain.map);
  EXPECT_TRUE(plain.map->residual().empty());
  EXPECT_EQ(plain.map->stats().affine_elements, plain.map->stats().canonical_elements);
}

TEST(TrainDeltaTest, RandomLayoutsRoundTripBitExact) {
  std::mt19937_64 rng(20261129);
  auto pick = [&](std::vector<int> v) { return v[rng() % v.size()]; };
  for (int i = 0; i < 24; ++i) {
    const bool moe = i % 2 == 1;
    TrainLayout l;
    l.tp = pick({1, 2, 4, 8});
    l.pp = pick({1, 2, 4});
    l.ep = moe ? pick({1, 2, 4, 8}) : 1;
    l.dp = pick({1, 2, 3});
    l.dist_opt = rng() % 2;
    l.tied = static_cast<int>(rng() % 2);
    l.fp32_norms = rng() % 4 != 0;
    l.rope_permute = rng() % 4 != 0;
    l.fold_layers = static_cast<int>(rng() % 2);
    l.vocab_pad = pick({1, 8, 128});
    const uint64_t chunk = pick({97, 1000, 1 << 22});
    SCOPED_TRACE(l.ToString() + " chunk=" + std::to_string(chunk) + (moe ? " moe" : " dense"));
    Rig st = Make(moe ? MoeConfig() : DenseConfig(), l, 1 + i);
    ASSERT_TRUE(st.state);
    CheckRoundTrip(st, 2, chunk, "rand" + std::to_string(i));
  }
}

// With shard_bytes the target is the exporter's checkpoint as a shard directory: the per-rank
// delta's header names the same files and index, and applying it to the sharded base rebuilds
// that directory byte for byte (each shard and the index) over several steps and layouts.
TEST(TrainDeltaTest, ShardedExportRoundTripsAsADirectory) {
  namespace fs = std::filesystem;
  auto read = [](const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
  };
  int trial = 0;
  for (const char* text : {"tp=2,pp=2,dp=2,dist_opt=1", "tp=4,ep=2,fold_layers=1,vocab_pad=128"}) {
    SCOPED_TRACE(text);
    auto l = TrainLayout::Parse(text);
    ASSERT_TRUE(l.ok()) << l.status();
    Rig st = Make(trial % 2 ? MoeConfig() : DenseConfig(), *l, 7 + trial, 1e-3);
    ASSERT_TRUE(st.state);
    const uint64_t total = st.s->total_shard_bytes();
    TrainDeltaOptions o;
    o.chunk_elems = 1000;
    o.threads = 2;
    o.shard_bytes = total / 6 + 1;
    auto b = TrainDeltaBuilder::Create(st.s, st.map, st.ex, st.state->shards(), o);
    ASSERT_TRUE(b.ok()) << b.status();
    const fs::path dir = TempPath("sharded" + std::to_string(trial++));
    fs::remove_all(dir);
    fs::create_directories(dir);
    ASSERT_TRUE(st.ex
                    ->ExportDirectory(ShardSetReader(*st.s, st.state->shards()),
                                      (dir / "base").string(), o.shard_bytes, 2)
                    .ok());
    fs::path prev = dir / "base";
    for (int k = 1; k <= 2; ++k) {
      ShardSet before = st.state->shards();
      st.state->Step();
      const fs::path delta = dir / ("d" + std::to_string(k) + ".dcr");
      DeltaFileSink sink(delta.string());
      auto stats = (*b)->BuildStep(before, st.state->shards(), &sink);
      ASSERT_TRUE(stats.ok()) << stats.status();
      const fs::path want = dir / ("want" + std::to_string(k));
      const fs::path got = dir / ("got" + std::to_string(k));
      ASSERT_TRUE(st.ex
                      ->ExportDirectory(ShardSetReader(*st.s, st.state->shards()), want.string(),
                                        o.shard_bytes, 2)
                      .ok());
      ApplyOptions ao;
      ao.threads = 2;
      ao.verify_full = true;
      auto applied = ApplyDeltaFile(prev.string(), delta.string(), got.string(), ao);
      ASSERT_TRUE(applied.ok()) << applied.status();
      int files = 0;
      for (const auto& e : fs::directory_iterator(want)) {
        EXPECT_EQ(read(e.path()), read(got / e.path().filename())) << e.path().filename();
        ++files;
      }
      EXPECT_GE(files, 4);  // 3+ shards and the index
      EXPECT_EQ(std::distance(fs::directory_iterator(got), fs::directory_iterator()), files);
      prev = want;
    }
    fs::remove_all(dir);
  }
}

TEST(TrainDeltaTest, FoldTouchingWholeRowsGoesThroughTheExporter) {
  TrainLayout l;
  l.tp = 2;
  l.dp = 2;
  l.dist_opt = true;
  l.fold_layers = 1;
  Rig st = Make(DenseConfig(), l, 1, /*lr=*/1e-2);
  ASSERT_TRUE(st.state);
  // Only the folded scales train: no shard bit of any weight changes, yet whole canonical rows of
  // the folded down_proj do. The affine path alone would miss every one of them.
  TrainDeltaStats stats;
  CheckRoundTrip(
      st, 2, 1 << 22, "fold",
      [](const LocalParam& p) { return p.name.find("output_scale") != std::string::npos; }, &stats);
  EXPECT_EQ(stats.affine_changes, 0u);
  // Each scale step moves whole rows of [hidden, intermediate]: far more than one row changes.
  EXPECT_GE(stats.residual_changes, static_cast<uint64_t>(4 * DenseConfig().intermediate));
  EXPECT_EQ(stats.residual_tensors_exported, 1u);
}

TEST(TrainDeltaTest, PresetsWithAffineShares) {
  for (const std::string& preset : {std::string("tiny"), std::string("tiny-moe")}) {
    auto cfg = GetPreset(preset);
    ASSERT_TRUE(cfg.ok());
    auto l = TrainLayout::Parse(preset == "tiny" ? "tp=2,pp=2,dp=2,dist_opt=1"
                                                 : "tp=2,pp=2,ep=2,dp=2,dist_opt=1");
    ASSERT_TRUE(l.ok());
    Rig st = Make(*cfg, *l);
    ASSERT_TRUE(st.state);
    TrainDeltaStats stats;
    CheckRoundTrip(st, 1, 1 << 22, preset, nullptr, &stats);
    EXPECT_GT(st.map->stats().affine_share(), 0.95) << preset;
    EXPECT_GT(stats.affine_change_share(), 0.95) << preset;
    EXPECT_GT(stats.affine_changes, 0u);
  }
}

TEST(TrainDeltaTest, MlaPresetRoundTrips) {
  auto cfg = GetPreset("tiny-mla");
  ASSERT_TRUE(cfg.ok());
  auto l = TrainLayout::Parse("tp=2,pp=2,ep=2,fold_layers=1");
  ASSERT_TRUE(l.ok());
  Rig st = Make(*cfg, *l);
  ASSERT_TRUE(st.state);
  CheckRoundTrip(st, 1, 1 << 22, "mla");
}

TEST(TrainDeltaTest, HeaderNamesTheVersionsSet) {
  Rig st = Make(DenseConfig(), TrainLayout{});
  ASSERT_TRUE(st.state);
  auto b = TrainDeltaBuilder::Create(st.s, st.map, st.ex, st.state->shards(), TrainDeltaOptions{});
  ASSERT_TRUE(b.ok());
  auto header_of = [](const std::vector<uint8_t>& d) {
    size_t used = 0;
    auto h = ParseFileHeader(d.data(), d.size(), &used);
    EXPECT_TRUE(h.ok()) << h.status();
    return h.ok() ? *h : FileHeader{};
  };
  ShardSet prev = st.state->shards();
  st.state->Step();
  (*b)->SetNextVersions(4, 9);
  DeltaMemorySink first;
  ASSERT_TRUE((*b)->BuildStep(prev, st.state->shards(), &first).ok());
  EXPECT_EQ(header_of(first.bytes()).base_version, 4u);
  EXPECT_EQ(header_of(first.bytes()).target_version, 9u);
  EXPECT_EQ((*b)->version(), 9u);
  // Without a call the next delta goes on from the version reached.
  prev = st.state->shards();
  st.state->Step();
  DeltaMemorySink second;
  ASSERT_TRUE((*b)->BuildStep(prev, st.state->shards(), &second).ok());
  EXPECT_EQ(header_of(second.bytes()).base_version, 9u);
  EXPECT_EQ(header_of(second.bytes()).target_version, 10u);
}

TEST(TrainDeltaTest, WrongShardsAreRejected) {
  TrainLayout l;
  l.tp = 2;
  Rig st = Make(DenseConfig(), l);
  ASSERT_TRUE(st.state);
  auto b = TrainDeltaBuilder::Create(st.s, st.map, st.ex, st.state->shards(), TrainDeltaOptions{});
  ASSERT_TRUE(b.ok());
  std::vector<std::vector<uint8_t>> wrong = st.state->shards().buffers[0];
  wrong[0].pop_back();
  auto r = (*b)->BuildUnit(0, st.state->shards().buffers[0], wrong);
  EXPECT_TRUE(r.status().IsInvalidArgument()) << r.status();
  EXPECT_TRUE((*b)->BuildUnit(99, wrong, wrong).status().IsInvalidArgument());
}

}  // namespace
}  // namespace dcr

namespace dcr {
namespace {

TEST(TrainDeltaTest, BytesDoNotDependOnThreads) {
  auto l = TrainLayout::Parse("tp=2,pp=2,ep=2,dp=2,dist_opt=1,fold_layers=1");
  ASSERT_TRUE(l.ok());
  std::vector<std::vector<uint8_t>> outs;
  for (int threads : {1, 2, 3}) {
    auto s = TrainStructure::Create(MoeConfig(), *l);
    ASSERT_TRUE(s.ok());
    auto ex = std::make_shared<ReferenceExporter>(*s);
    auto map = LayoutMap::Discover(*ex, threads);
    ASSERT_TRUE(map.ok());
    TrainOptions to;
    to.threads = threads;
    to.warmup_steps = 1;
    auto state = TrainState::Create(*s, to);
    ASSERT_TRUE(state.ok());
    TrainDeltaOptions o;
    o.threads = threads;
    o.chunk_elems = 500;
    auto b = TrainDeltaBuilder::Create(*s, *map, ex, (*state)->shards(), o);
    ASSERT_TRUE(b.ok());
    ShardSet prev = (*state)->shards();
    (*state)->Step();
    DeltaMemorySink sink;
    ASSERT_TRUE((*b)->BuildStep(prev, (*state)->shards(), &sink).ok());
    outs.push_back(sink.Release());
  }
  EXPECT_GT(outs[0].size(), 0u);
  EXPECT_EQ(outs[0], outs[1]);
  EXPECT_EQ(outs[0], outs[2]);
}

}  // namespace
}  // namespace dcr
