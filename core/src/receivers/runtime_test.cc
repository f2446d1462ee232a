// Receiver-side tests: the reference serving runtime refitted in place by deltas must equal a dense
// load of the target through the same loader, byte for byte, for every serving layout.
#include "dcr/runtime.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "dcr/dcr_c.h"
#include "dcr/delta.h"
#include "dcr/hash.h"
#include "dcr/status_macros.h"
#include "dcr/testing/reference_loader.h"
#include "dcr/testing/test_model.h"
#include "receivers/recorder.h"

namespace dcr {
namespace {

using internal::MakeSyntheticModel;
using internal::StepSyntheticModel;
using internal::SyntheticModel;

ModelConfig DenseModel(bool tied = false) {
  ModelConfig c;
  c.name = "rt-dense";
  c.vocab = 1000;  // not a multiple of the padding: padded rows on the last rank
  c.hidden = 128;
  c.layers = 2;
  c.heads = 8;
  c.kv_heads = 2;
  c.head_dim = 16;
  c.intermediate = 256;
  c.tied_embeddings = tied;
  return c;
}

ModelConfig MoeModel() {
  ModelConfig c = DenseModel();
  c.name = "rt-moe";
  c.layers = 2;
  c.experts = 4;
  c.moe_intermediate = 128;
  c.shared_experts = 1;
  c.first_dense_layers = 1;
  c.qk_norm = true;
  c.router_bias = true;
  return c;
}

// Compares every buffer of a refitted rank with a dense load of `target`.
void ExpectEqualsDenseLoad(const Storage& refit, const Checkpoint& target,
                           const LoaderFactory& factory, int rank, const std::string& what) {
  Storage dense(0);
  auto loader = factory(rank);
  ASSERT_TRUE(loader.ok()) << loader.status();
  ASSERT_TRUE(LoadCheckpoint(target, loader->get(), &dense).ok());
  ASSERT_EQ(refit.buffers().size(), dense.buffers().size());
  for (size_t b = 0; b < dense.buffers().size(); ++b) {
    const auto& x = refit.buffers()[b];
    const auto& y = dense.buffers()[b];
    ASSERT_EQ(x.name, y.name);
    ASSERT_EQ(x.nbytes, y.nbytes);
    if (std::memcmp(x.data, y.data, x.nbytes) != 0) {
      uint64_t i = 0;
      while (x.data[i] == y.data[i]) ++i;
      FAIL() << what << ": rank " << rank << " buffer " << x.name << " differs at byte " << i;
    }
  }
}

std::unique_ptr<DeltaReader> MakeDelta(const Checkpoint& base, const Checkpoint& target,
                                       uint64_t bv, uint64_t tv, ValuePolicy policy) {
  DeltaOptions o;
  o.chunk_elems = 1 << 12;  // many chunks
  o.small_tensor_elems = 1 << 10;
  o.threads = 1;
  o.base_version = bv;
  o.target_version = tv;
  o.value_policy = policy;
  DeltaMemorySink sink;
  auto st = BuildDelta(&base, target, o, &sink);
  EXPECT_TRUE(st.ok()) << st.status();
  auto r = DeltaReader::FromBytes(sink.Release());
  EXPECT_TRUE(r.ok()) << r.status();
  return std::move(r).value();
}

std::vector<size_t> Shuffled(size_t n, uint64_t seed) {
  std::vector<size_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = i;
  std::shuffle(v.begin(), v.end(), std::mt19937_64(seed));
  return v;
}

struct Layout {
  bool moe;
  int tp;
  bool fp8;
  FusedLayout fused;
  bool tied;
};

std::string Name(const Layout& l) {
  return std::string(l.moe ? "moe" : "dense") + "_tp" + std::to_string(l.tp) +
         (l.fp8 ? "_fp8" : "_bf16") + (l.fused == FusedLayout::kInterleaved ? "_interleaved" : "") +
         (l.tied ? "_tied" : "");
}

ServingConfig ConfigOf(const Layout& l) {
  ServingConfig c;
  c.model = l.moe ? MoeModel() : DenseModel(l.tied);
  c.tp = l.tp;
  c.fp8 = l.fp8;
  c.fp8_block = 16;
  c.fused = l.fused;
  c.vocab_multiple = 16;
  c.max_positions = 64;
  return c;
}

class RefitTest : public ::testing::TestWithParam<Layout> {};

// Canonical deltas applied in place (bit-preserving scatter + converted re-loads), random chunk
// order, several steps with special values; equals a dense load of each target.
TEST_P(RefitTest, CanonicalDeltaEqualsDenseLoad) {
  const Layout l = GetParam();
  const ServingConfig cfg = ConfigOf(l);
  const LoaderFactory factory = ReferenceLoaderFactory(cfg);
  SyntheticModel model = MakeSyntheticModel(cfg.model, 11);
  std::unique_ptr<Checkpoint> prev = model.ToCheckpoint();
  ASSERT_NE(prev, nullptr);
  auto rep = ServingReplica::Create(cfg.tp, factory, *prev, 0);
  ASSERT_TRUE(rep.ok()) << rep.status();
  ServingReplica& replica = **rep;
  if (!l.fp8) {
    EXPECT_GT(replica.placement(0).bit_preserving_bytes(), 0u);
    EXPECT_GT(replica.placement(0).converted_bytes(), 0u);  // FP32 norms
    EXPECT_GT(replica.placement(0).constant_bytes(), 0u);   // rotary tables
  }
  const ValuePolicy policies[] = {ValuePolicy::kAuto, ValuePolicy::kXor, ValuePolicy::kAbsolute};
  for (int step = 1; step <= 3; ++step) {
    StepSyntheticModel(&model, 0.03, 100 + step, /*specials=*/true);
    std::unique_ptr<Checkpoint> next = model.ToCheckpoint();
    auto delta = MakeDelta(*prev, *next, step - 1, step, policies[step - 1]);
    ASSERT_GT(delta->num_chunks(), 4u);
    Status st = ApplyDelta(*delta, &replica, Shuffled(delta->num_chunks(), step));
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_TRUE(replica.committed());
    EXPECT_EQ(replica.version(), static_cast<uint64_t>(step));
    EXPECT_EQ(replica.version_hash(), next->ContentHash());
    for (int r = 0; r < cfg.tp; ++r) {
      ExpectEqualsDenseLoad(replica.storage(r), *next, factory, r,
                            Name(l) + " step " + std::to_string(step));
    }
    prev = std::move(next);
  }
}

// Serving-space deltas (the FP8 path, but valid for any layout): per-rank storage images.
TEST_P(RefitTest, ServingSpaceDeltaEqualsDenseLoad) {
  const Layout l = GetParam();
  const ServingConfig cfg = ConfigOf(l);
  const LoaderFactory factory = ReferenceLoaderFactory(cfg);
  SyntheticModel model = MakeSyntheticModel(cfg.model, 12);
  std::unique_ptr<Checkpoint> prev = model.ToCheckpoint();
  std::vector<std::unique_ptr<Storage>> storages;
  std::vector<std::unique_ptr<StorageReceiver>> rx;
  for (int r = 0; r < cfg.tp; ++r) {
    storages.push_back(std::make_unique<Storage>(0));
    auto loader = factory(r);
    ASSERT_TRUE(loader.ok());
    ASSERT_TRUE(LoadCheckpoint(*prev, loader->get(), storages.back().get()).ok());
    rx.push_back(StorageReceiver::Create(storages.back().get(), 0, factory, r));
  }
  for (int step = 1; step <= 2; ++step) {
    StepSyntheticModel(&model, 0.03, 200 + step, true);
    std::unique_ptr<Checkpoint> next = model.ToCheckpoint();
    for (int r = 0; r < cfg.tp; ++r) {
      DeltaOptions o;
      o.chunk_elems = 1 << 12;
      o.threads = 1;
      o.base_version = step - 1;
      o.target_version = step;
      DeltaMemorySink sink;
      auto stats = BuildServingDelta(*prev, *next, factory, r, o, &sink);
      ASSERT_TRUE(stats.ok()) << stats.status();
      auto reader = DeltaReader::FromBytes(sink.Release());
      ASSERT_TRUE(reader.ok()) << reader.status();
      Status st =
          ApplyDelta(**reader, rx[r].get(), Shuffled((*reader)->num_chunks(), step * 10 + r));
      ASSERT_TRUE(st.ok()) << st;
      EXPECT_EQ(rx[r]->held().number, static_cast<uint64_t>(step));
      EXPECT_TRUE(rx[r]->Verify(*next).ok()) << rx[r]->Verify(*next);
      ExpectEqualsDenseLoad(*storages[r], *next, factory, r, Name(l) + " serving-space");
    }
    prev = std::move(next);
  }
}

std::vector<Layout> AllLayouts() {
  std::vector<Layout> v;
  for (bool moe : {false, true}) {
    for (int tp : {1, 2, 4, 8}) {
      for (bool fp8 : {false, true}) v.push_back(Layout{moe, tp, fp8, FusedLayout::kConcat, false});
    }
  }
  v.push_back(Layout{false, 2, false, FusedLayout::kInterleaved, false});
  v.push_back(Layout{false, 8, false, FusedLayout::kInterleaved, true});
  v.push_back(Layout{false, 4, false, FusedLayout::kConcat, true});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Layouts, RefitTest, ::testing::ValuesIn(AllLayouts()),
                         [](const auto& info) { return Name(info.param); });

// ---- a loader that dcr has never seen: its own fused layout ----
//
// [v | k | q] fused in reverse order, every matrix stored transposed (column copies), norms kept
// BF16 but negated into a staging buffer (a conversion dcr cannot know), the rest copied whole.
class ForeignLoader : public ModelLoader {
 public:
  explicit ForeignLoader(const ModelConfig& m) : m_(m) {}
  Status Init(Storage* s) override {
    for (const TensorSpec& t : ModelInventory(m_)) {
      const std::string n = Rename(t.name);
      if (s->Find(n) != nullptr) continue;
      std::vector<int64_t> shape = t.shape;
      if (n.find("qkv") != std::string::npos)
        shape = {m_.hidden, (m_.heads + 2 * m_.kv_heads) * m_.head_dim};
      else if (shape.size() == 2)
        std::swap(shape[0], shape[1]);
      DCR_RETURN_IF_ERROR(s->Allocate(n, t.dtype, shape).status());
    }
    return Status::OK();
  }
  Status LoadWeight(const WeightRef& w, Storage* s) override {
    Storage::Buffer* b = s->Find(Rename(w.name));
    if (b == nullptr) return InvalidArgumentError("foreign loader: no buffer for " + w.name);
    if (w.shape.size() == 1) {  // negated copy via staging
      std::vector<uint8_t> tmp(w.data, w.data + w.nbytes);
      for (uint64_t i = 1; i < w.nbytes; i += 2) tmp[i] ^= 0x80;
      std::memcpy(b->data, tmp.data(), w.nbytes);
      return Status::OK();
    }
    int64_t col0 = 0;
    if (w.name.find("q_proj") != std::string::npos) col0 = 2 * m_.kv_heads * m_.head_dim;
    if (w.name.find("k_proj") != std::string::npos) col0 = m_.kv_heads * m_.head_dim;
    const int64_t rows = w.shape[0], cols = w.shape[1], pitch = b->shape[1];
    const size_t ew = DTypeWidth(w.dtype);  // a runtime size: a real call, like cudaMemcpy2D
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        std::memcpy(b->data + (j * pitch + col0 + i) * ew, w.data + (i * cols + j) * ew, ew);
      }
    }
    return Status::OK();
  }

 private:
  static std::string Rename(const std::string& n) {
    const size_t p = n.find("self_attn.");
    if (p != std::string::npos && n.find("o_proj") == std::string::npos)
      return n.substr(0, p) + "qkv";
    return n;
  }
  ModelConfig m_;
};

TEST(RuntimeTest, ANewLoaderLayoutNeedsNoChangeInDcr) {
  const ModelConfig m = DenseModel();
  LoaderFactory factory = [m](int) -> StatusOr<std::unique_ptr<ModelLoader>> {
    return std::unique_ptr<ModelLoader>(new ForeignLoader(m));
  };
  SyntheticModel model = MakeSyntheticModel(m, 5);
  auto prev = model.ToCheckpoint();
  auto rep = ServingReplica::Create(1, factory, *prev, 0);
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_EQ((*rep)->placement(0).converted_tensors().size(), 2u * m.layers + 1);  // the norms
  for (int step = 1; step <= 2; ++step) {
    StepSyntheticModel(&model, 0.05, 300 + step, true);
    auto next = model.ToCheckpoint();
    auto delta = MakeDelta(*prev, *next, step - 1, step, ValuePolicy::kAuto);
    Status st = ApplyDelta(*delta, rep->get(), Shuffled(delta->num_chunks(), 9));
    ASSERT_TRUE(st.ok()) << st;
    ExpectEqualsDenseLoad((*rep)->storage(0), *next, factory, 0, "foreign loader");
    prev = std::move(next);
  }
}

// A loader that writes storage with plain stores: the recording load must refuse it.
class SneakyLoader : public ModelLoader {
 public:
  Status Init(Storage* s) override { return s->Allocate("all", "U8", {1 << 20}).status(); }
  Status LoadWeight(const WeightRef& w, Storage* s) override {
    volatile uint8_t* d = s->Find("all")->data;
    for (uint64_t i = 0; i < std::min<uint64_t>(w.nbytes, 64); ++i) d[off_ + i] = w.data[i];
    off_ += 64;
    return Status::OK();
  }

 private:
  uint64_t off_ = 0;
};

TEST(RuntimeTest, WritesBehindTheHookAreRefused) {
  SyntheticModel model = MakeSyntheticModel(DenseModel(), 1);
  auto ckpt = model.ToCheckpoint();
  LoaderFactory factory = [](int) -> StatusOr<std::unique_ptr<ModelLoader>> {
    return std::unique_ptr<ModelLoader>(new SneakyLoader());
  };
  Storage s(0);
  std::unique_ptr<ModelLoader> loader;
  auto map = RecordLoad(*ckpt, factory, 0, &loader, &s);
  ASSERT_FALSE(map.ok());
  EXPECT_TRUE(map.status().IsFailedPrecondition()) << map.status();
  EXPECT_NE(map.status().message().find("buffer all"), std::string::npos) << map.status();
}

// GCC expands memcpy with a small constant size inline: such copies never reach the hook. The
// recording load must notice instead of missing placements.
class InliningLoader : public ModelLoader {
 public:
  Status Init(Storage* s) override { return s->Allocate("w", "BF16", {1 << 16}).status(); }
  Status LoadWeight(const WeightRef& w, Storage* s) override {
    if (w.name != "model.embed_tokens.weight") return Status::OK();
    uint8_t* d = s->Find("w")->data;
    // Reversed, so that GCC cannot turn the loop back into one memcpy call.
    for (uint64_t i = 0; i < (1 << 16); ++i)
      std::memcpy(d + 2 * i, w.data + 2 * ((1 << 16) - 1 - i), 2);
    return Status::OK();
  }
};

TEST(RuntimeTest, InlinedCopiesAreCaught) {
  SyntheticModel model = MakeSyntheticModel(DenseModel(), 1);
  auto ckpt = model.ToCheckpoint();
  LoaderFactory factory = [](int) -> StatusOr<std::unique_ptr<ModelLoader>> {
    return std::unique_ptr<ModelLoader>(new InliningLoader());
  };
  Storage s(0);
  std::unique_ptr<ModelLoader> loader;
  auto map = RecordLoad(*ckpt, factory, 0, &loader, &s);
  ASSERT_FALSE(map.ok());
  EXPECT_TRUE(map.status().IsFailedPrecondition()) << map.status();
}

TEST(RuntimeTest, RefusesWrongBaseDuplicateChunksAndIncompleteDeltas) {
  ServingConfig cfg = ConfigOf(Layout{false, 2, false, FusedLayout::kConcat, false});
  const LoaderFactory factory = ReferenceLoaderFactory(cfg);
  SyntheticModel model = MakeSyntheticModel(cfg.model, 21);
  auto v0 = model.ToCheckpoint();
  StepSyntheticModel(&model, 0.03, 1, false);
  auto v1 = model.ToCheckpoint();
  StepSyntheticModel(&model, 0.03, 2, false);
  auto v2 = model.ToCheckpoint();
  auto rep = ServingReplica::Create(2, factory, *v0, 0);
  ASSERT_TRUE(rep.ok());
  ServingReplica& replica = **rep;
  // Wrong base.
  auto d12 = MakeDelta(*v1, *v2, 1, 2, ValuePolicy::kXor);
  EXPECT_TRUE(BeginDelta(*d12, &replica).IsFailedPrecondition());
  // Duplicate chunk: refused, storage untouched.
  auto d01 = MakeDelta(*v0, *v1, 0, 1, ValuePolicy::kXor);
  ASSERT_TRUE(BeginDelta(*d01, &replica).ok());
  ASSERT_TRUE(replica.ApplyRecord(d01->chunk_data(0), d01->chunk_size(0)).ok());
  std::vector<uint8_t> before(
      replica.storage(0).buffers()[0].data,
      replica.storage(0).buffers()[0].data + replica.storage(0).buffers()[0].nbytes);
  Status dup = replica.ApplyRecord(d01->chunk_data(0), d01->chunk_size(0));
  EXPECT_TRUE(dup.IsFailedPrecondition()) << dup;
  EXPECT_EQ(0, std::memcmp(before.data(), replica.storage(0).buffers()[0].data, before.size()));
  // A corrupted value is caught by the target change hash; nothing written.
  auto c1 = d01->Decode(1);
  ASSERT_TRUE(c1.ok());
  DecodedChunk bad = *c1;
  ASSERT_FALSE(bad.values.empty());
  bad.values[0] ^= 1;
  EXPECT_TRUE(replica.ApplyDecoded(bad).IsDataLoss());
  // Missing chunks: no commit.
  EXPECT_TRUE(CommitDelta(*d01, &replica).IsFailedPrecondition());
  EXPECT_FALSE(replica.committed());
  for (size_t i = 1; i < d01->num_chunks(); ++i) {
    ASSERT_TRUE(replica.ApplyRecord(d01->chunk_data(i), d01->chunk_size(i)).ok());
  }
  ASSERT_TRUE(CommitDelta(*d01, &replica).ok());
  EXPECT_EQ(replica.version_hash(), v1->ContentHash());
  // An absolute (repair) chunk re-applied is harmless.
  auto a12 = MakeDelta(*v1, *v2, 1, 2, ValuePolicy::kAbsolute);
  ASSERT_TRUE(BeginDelta(*a12, &replica).ok());
  for (size_t i = 0; i < a12->num_chunks(); ++i) {
    ASSERT_TRUE(replica.ApplyRecord(a12->chunk_data(i), a12->chunk_size(i)).ok());
    ASSERT_TRUE(replica.ApplyRecord(a12->chunk_data(i), a12->chunk_size(i)).ok());
  }
  ASSERT_TRUE(CommitDelta(*a12, &replica).ok());
  for (int r = 0; r < 2; ++r) ExpectEqualsDenseLoad(replica.storage(r), *v2, factory, r, "repair");
}

TEST(RuntimeTest, AppendBoxBuildsTransposedBoxes) {
  // Column copies of a 3x4 matrix transposed into [4,3]: D[i][j] = S[j][i].
  Placement box;
  bool have = false;
  std::vector<Placement> boxes;
  for (int j = 0; j < 3; ++j) {
    for (int i = 0; i < 4; ++i) {
      Placement r;
      r.width = 2;
      r.elem_offset = j * 4 + i;
      r.count[0] = 1;
      r.dst_stride[0] = 2;
      r.dst_offset = (i * 3 + j) * 2;
      if (have && internal::AppendBox(&box, r)) continue;
      if (have) boxes.push_back(box);
      box = r;
      have = true;
    }
  }
  boxes.push_back(box);
  Placement merged = boxes[0];
  for (size_t i = 1; i < boxes.size(); ++i) ASSERT_TRUE(internal::AppendBox(&merged, boxes[i]));
  EXPECT_EQ(merged.ndim, 2u);
  for (uint64_t e = 0; e < 12; ++e) {
    EXPECT_EQ(merged.Locate(e), static_cast<int64_t>(((e % 4) * 3 + e / 4) * 2)) << e;
  }
  EXPECT_EQ(merged.Locate(12), -1);
}

TEST(RuntimeTest, E4M3Conversion) {
  EXPECT_EQ(FloatToE4M3(0.0f), 0x00);
  EXPECT_EQ(FloatToE4M3(-0.0f), 0x80);
  EXPECT_EQ(FloatToE4M3(1.0f), 0x38);
  EXPECT_EQ(FloatToE4M3(448.0f), 0x7E);
  EXPECT_EQ(FloatToE4M3(1000.0f), 0x7E);
  EXPECT_EQ(FloatToE4M3(-1e30f), 0xFE);
  EXPECT_EQ(FloatToE4M3(std::ldexp(1.0f, -9)), 0x01);
  EXPECT_EQ(FloatToE4M3(std::ldexp(1.0f, -10)), 0x00);  // tie to even
  EXPECT_EQ(FloatToE4M3(1.0625f), 0x38);                // tie 1 + 1/16 -> even mantissa 0
  EXPECT_EQ(FloatToE4M3(1.1875f), 0x3A);                // tie 1 + 3/16 -> even mantissa 2
  EXPECT_EQ(FloatToE4M3(std::nanf("")) & 0x7F, 0x7F);
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7F) == 0x7F) continue;
    EXPECT_EQ(FloatToE4M3(E4M3ToFloat(static_cast<uint8_t>(b))), b) << b;
  }
}

TEST(RuntimeTest, BadServingConfigsNameTheField) {
  ServingConfig c = ConfigOf(Layout{false, 3, false, FusedLayout::kConcat, false});
  Status s = ValidateServingConfig(c);
  EXPECT_TRUE(s.IsInvalidArgument());
  EXPECT_NE(s.message().find("heads"), std::string::npos) << s;
  c = ConfigOf(Layout{false, 2, true, FusedLayout::kConcat, false});
  c.fp8_block = 48;
  EXPECT_TRUE(ValidateServingConfig(c).IsInvalidArgument());
  EXPECT_FALSE(
      MakeReferenceLoader(ConfigOf(Layout{false, 2, false, FusedLayout::kConcat, false}), 2).ok());
}

}  // namespace
}  // namespace dcr

namespace dcr {
namespace {

// The C API drives the same reference loader the way a foreign runtime would: it declares its
// buffers, names the tensor it is loading, and re-runs its loader from the reload callback.
struct CRuntime {
  std::unique_ptr<ModelLoader> loader;
  Storage storage{0};
};

struct ReloadCtx {
  CRuntime* rt;
  const Checkpoint* shapes_from;
};

int Reload(void* ctx, const char* tensor, const void* data, uint64_t nbytes) {
  auto* c = static_cast<ReloadCtx*>(ctx);
  const TensorInfo* t = c->shapes_from->Find(tensor);
  if (t == nullptr) return static_cast<int>(StatusCode::kNotFound);
  WeightRef w{t->name, t->dtype_name, t->dtype, t->shape, static_cast<const uint8_t*>(data),
              nbytes};
  return static_cast<int>(c->rt->loader->LoadWeight(w, &c->rt->storage).code());
}

TEST(RuntimeTest, CApiRecordsAndAppliesWithReloads) {
  ServingConfig cfg = ConfigOf(Layout{true, 2, false, FusedLayout::kConcat, false});
  SyntheticModel model = MakeSyntheticModel(cfg.model, 31);
  auto v0 = model.ToCheckpoint();
  const std::string path = ::testing::TempDir() + "/dcr_capi_v0.safetensors";
  std::vector<TensorView> views;
  for (size_t i = 0; i < model.inventory.size(); ++i) {
    views.push_back(TensorView{model.inventory[i].name, model.inventory[i].dtype,
                               model.inventory[i].shape, model.data[i].data(),
                               model.data[i].size()});
  }
  ASSERT_TRUE(WriteSafetensors(path, views).ok());
  const int rank = 1;
  CRuntime rt;
  dcr_recorder* rec = nullptr;
  ASSERT_EQ(dcr_recorder_begin(path.c_str(), &rec), DCR_OK) << dcr_last_error();
  auto l = MakeReferenceLoader(cfg, rank);
  ASSERT_TRUE(l.ok());
  rt.loader = std::move(l).value();
  ASSERT_TRUE(rt.loader->Init(&rt.storage).ok());
  for (const auto& b : rt.storage.buffers()) {
    ASSERT_EQ(dcr_recorder_add_buffer(rec, b.name.c_str(), b.data, b.nbytes), DCR_OK);
  }
  for (const TensorSpec& t : model.inventory) {
    uint64_t n = 0;
    const void* p = dcr_recorder_tensor_data(rec, t.name.c_str(), &n);
    ASSERT_NE(p, nullptr);
    ASSERT_EQ(dcr_recorder_set_tensor(rec, t.name.c_str()), DCR_OK);
    WeightRef w{t.name, t.dtype, DTypeFromName(t.dtype), t.shape, static_cast<const uint8_t*>(p),
                n};
    ASSERT_TRUE(rt.loader->LoadWeight(w, &rt.storage).ok());
  }
  ASSERT_EQ(dcr_recorder_set_tensor(rec, nullptr), DCR_OK);
  ReloadCtx rctx{&rt, v0.get()};
  dcr_receiver* rx = nullptr;
  ASSERT_EQ(dcr_recorder_end(rec, &Reload, &rctx, &rx), DCR_OK) << dcr_last_error();
  uint64_t bp = 0, cv = 0, cs = 0;
  dcr_receiver_stats(rx, &bp, &cv, &cs);
  EXPECT_GT(bp, 0u);
  EXPECT_GT(cv, 0u);
  std::unique_ptr<Checkpoint> prev = std::move(v0);
  for (int step = 1; step <= 2; ++step) {
    StepSyntheticModel(&model, 0.03, 400 + step, true);
    auto next = model.ToCheckpoint();
    auto d = MakeDelta(*prev, *next, step - 1, step, ValuePolicy::kAuto);
    size_t hsize = 0;
    ASSERT_TRUE(ParseFileHeader(d->data(), d->size(), &hsize).ok());
    ASSERT_EQ(dcr_receiver_begin(rx, d->data(), hsize), DCR_OK) << dcr_last_error();
    uint64_t end = hsize;
    for (size_t i : Shuffled(d->num_chunks(), step)) {
      ASSERT_EQ(dcr_receiver_apply_chunk(rx, d->chunk_data(i), d->chunk_size(i)), DCR_OK)
          << dcr_last_error();
      end = std::max<uint64_t>(end, d->trailer().chunks[i].offset + d->chunk_size(i));
    }
    ASSERT_EQ(dcr_receiver_finish(rx, d->data() + end, d->size() - end), DCR_OK)
        << dcr_last_error();
    rctx.shapes_from = next.get();
    ExpectEqualsDenseLoad(rt.storage, *next, ReferenceLoaderFactory(cfg), rank, "C API");
    // The same delta again: its base is no longer held; refused with a message.
    if (d->num_chunks() > 0) {
      ASSERT_EQ(dcr_receiver_begin(rx, d->data(), hsize), DCR_FAILED_PRECONDITION);
      EXPECT_NE(std::string(dcr_last_error()).find("base"), std::string::npos);
    }
    prev = std::move(next);
  }
  dcr_receiver_free(rx);
}

}  // namespace
}  // namespace dcr
