// A per-rank layout described by data (TrainStructure::FromLayoutSpec) over a tensor set that is
// no preset: rows, columns and whole placements over BF16, F16 and F32 tensors on two ranks, the
// framework's exporter written against the spec, map discovery, and per-rank deltas whose
// apply to the base checkpoint is the exporter's dense checkpoint of the new shards, byte for
// byte. Malformed specs: tests/golden-errors (layout_*.json).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "dcr/apply.h"
#include "dcr/checkpoint.h"
#include "dcr/delta.h"
#include "dcr/dtype.h"
#include "dcr/train.h"

namespace dcr {
namespace {

std::vector<TensorSpec> Tensors() {
  return {{"enc.proj.weight", "BF16", {64, 48}},
          {"enc.out.weight", "BF16", {48, 64}},
          {"enc.norm", "F32", {48}},
          {"head.w", "F16", {32, 64}},
          {"head.bias", "BF16", {32}}};
}

const char* kSpec = R"({"ranks": 2, "tensors": [
  {"tensor": "enc.proj.weight", "split": "rows", "ranks": [0, 1]},
  {"tensor": "enc.out.weight", "split": "columns", "ranks": [1, 0]},
  {"tensor": "enc.norm", "split": "whole", "ranks": [0, 1]},
  {"tensor": "head.w", "split": "rows", "ranks": [1, 0]},
  {"tensor": "head.bias", "split": "whole", "ranks": [1]}]})";

// The framework's converter for kSpec, written as a trainer would: it knows its own placement.
struct Placement {
  std::string split;
  std::vector<int> ranks;
};

class SpecExporter : public Exporter {
 public:
  SpecExporter(std::shared_ptr<const TrainStructure> s, std::map<std::string, Placement> plan)
      : Exporter(s), plan_(std::move(plan)) {}
  Status ExportTensor(const ShardReader& shards, size_t t, uint8_t* out) const override {
    const TensorSpec& spec = structure().canonical()[t];
    const Placement& pl = plan_.at(spec.name);
    const uint64_t w = static_cast<uint64_t>(DTypeWidth(DTypeFromName(spec.dtype)));
    auto local = [&](int rank) {
      const RankSpec& rk = structure().ranks()[rank];
      const LocalParam& p = rk.params[rk.FindParam(spec.name)];
      return std::make_pair(p.buffer, p.numel);
    };
    const uint64_t parts = pl.ranks.size();
    if (pl.split == "whole") {
      auto [b, n] = local(pl.ranks[0]);
      std::memcpy(out, shards.Read(pl.ranks[0], b, 0, n), n * w);
    } else if (pl.split == "rows") {
      for (uint64_t k = 0; k < parts; ++k) {
        auto [b, n] = local(pl.ranks[k]);
        std::memcpy(out + k * n * w, shards.Read(pl.ranks[k], b, 0, n), n * w);
      }
    } else {  // columns
      const uint64_t rows = static_cast<uint64_t>(spec.shape[0]);
      const uint64_t cols = spec.num_elements() / rows, per = cols / parts;
      for (uint64_t k = 0; k < parts; ++k) {
        auto [b, n] = local(pl.ranks[k]);
        const uint8_t* src = shards.Read(pl.ranks[k], b, 0, n);
        for (uint64_t r = 0; r < rows; ++r) {
          std::memcpy(out + (r * cols + k * per) * w, src + r * per * w, per * w);
        }
      }
    }
    return Status();
  }

 private:
  std::map<std::string, Placement> plan_;
};

std::map<std::string, Placement> Plan() {
  return {{"enc.proj.weight", {"rows", {0, 1}}},
          {"enc.out.weight", {"columns", {1, 0}}},
          {"enc.norm", {"whole", {0, 1}}},
          {"head.w", {"rows", {1, 0}}},
          {"head.bias", {"whole", {1}}}};
}

std::string TempPath(const std::string& name) {
  return "/tmp/dcr_layout_spec_" + std::to_string(getpid()) + "_" + name;
}

TEST(LayoutSpec, PlacesEveryTensorAsTheSpecSays) {
  auto s = TrainStructure::FromLayoutSpec(kSpec, Tensors());
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ((*s)->ranks().size(), 2u);
  const RankSpec& r0 = (*s)->ranks()[0];
  const RankSpec& r1 = (*s)->ranks()[1];
  const LocalParam& proj = r0.params[r0.FindParam("enc.proj.weight")];
  EXPECT_EQ(proj.shape, (std::vector<int64_t>{32, 48}));
  const LocalParam& out = r1.params[r1.FindParam("enc.out.weight")];
  EXPECT_EQ(out.shape, (std::vector<int64_t>{48, 32}));
  EXPECT_FALSE(r0.params[r0.FindParam("enc.norm")].replica);
  EXPECT_TRUE(r1.params[r1.FindParam("enc.norm")].replica);
  EXPECT_EQ(r0.FindParam("head.bias"), -1);
  EXPECT_EQ(r1.buffers[r1.params[r1.FindParam("head.w")].buffer].dtype, DType::kF16);
  // Canonical tensors sorted by name, as the exporter writes them.
  EXPECT_EQ((*s)->canonical().front().name, "enc.norm");
}

TEST(LayoutSpec, PerRankDeltasApplyToTheDenseCheckpointByteForByte) {
  auto s = TrainStructure::FromLayoutSpec(kSpec, Tensors());
  ASSERT_TRUE(s.ok()) << s.status();
  auto ex = std::make_shared<SpecExporter>(*s, Plan());
  auto map = LayoutMap::Discover(*ex, 2);
  ASSERT_TRUE(map.ok()) << map.status();
  // Every element of a spec-placed tensor is an index map of one rank element.
  EXPECT_EQ((*map)->stats().residual_elements, 0u);
  EXPECT_EQ((*map)->stats().affine_elements, (*map)->stats().canonical_elements);

  std::mt19937_64 rng(7);
  ShardSet base = ShardSet::Zeros(**s);
  for (auto& rank : base.buffers) {
    for (auto& buf : rank) {
      for (auto& byte : buf) byte = static_cast<uint8_t>(rng());
    }
  }
  // Replicas are copies of their owner's parameter.
  auto sync_replicas = [&](ShardSet* set) {
    for (size_t r = 0; r < (*s)->ranks().size(); ++r) {
      for (const LocalParam& p : (*s)->ranks()[r].params) {
        if (!p.replica) continue;
        const RankSpec& owner = (*s)->ranks()[0];
        set->buffers[r][p.buffer] = set->buffers[0][owner.params[owner.FindParam(p.name)].buffer];
      }
    }
  };
  sync_replicas(&base);
  TrainDeltaOptions o;
  o.chunk_elems = 1024;
  o.threads = 2;
  auto b = TrainDeltaBuilder::Create(*s, *map, ex, base, o);
  ASSERT_TRUE(b.ok()) << b.status();
  const std::string base_path = TempPath("base.safetensors");
  const std::string delta_path = TempPath("step.dcr");
  const std::string out_path = TempPath("out.safetensors");
  ASSERT_TRUE(ex->ExportFile(ShardSetReader(**s, base), base_path, 2).ok());
  ShardSet prev = base;
  for (int step = 0; step < 2; ++step) {
    ShardSet next = prev;
    for (auto& rank : next.buffers) {
      for (auto& buf : rank) {
        for (size_t i = 0; i < buf.size(); i += 1 + rng() % 40) buf[i] ^= 0x5a;
      }
    }
    sync_replicas(&next);
    {
      DeltaFileSink sink(delta_path);
      auto stats = (*b)->BuildStep(prev, next, &sink);
      ASSERT_TRUE(stats.ok()) << stats.status();
      EXPECT_GT(stats->affine_changes, 0u);
    }
    ApplyOptions ao;
    ao.threads = 2;
    ao.verify_full = true;
    auto applied = ApplyDeltaFile(step == 0 ? base_path : TempPath("prev.safetensors"), delta_path,
                                  out_path, ao);
    ASSERT_TRUE(applied.ok()) << applied.status() << " step " << step;
    auto want = ex->ExportFileImage(ShardSetReader(**s, next), 2);
    ASSERT_TRUE(want.ok());
    auto got = ReadFile(out_path);
    ASSERT_TRUE(got.ok());
    ASSERT_TRUE(*got == *want) << "step " << step << ": the applied checkpoint differs from the "
                               << "dense export of the new shards";
    ASSERT_EQ(std::rename(out_path.c_str(), TempPath("prev.safetensors").c_str()), 0);
    prev = next;
  }
  for (const char* f : {"base.safetensors", "step.dcr", "prev.safetensors"}) {
    std::remove(TempPath(f).c_str());
  }
}

TEST(LayoutSpec, MalformedSpecsNameTheEntry) {
  struct Case {
    const char* spec;
    const char* says;
  };
  const Case cases[] = {
      {"[1]", "not a JSON object"},
      {R"({"ranks": 0, "tensors": []})", "ranks: needs an integer"},
      {R"({"ranks": 1, "tensors": [], "tp": 2})", "unknown key 'tp'"},
      {R"({"ranks": 1, "tensors": [{"tensor": "nope", "split": "whole", "ranks": [0]}]})",
       "tensors[0] (nope): unknown tensor"},
      {R"({"ranks": 2, "tensors": [{"tensor": "head.w", "split": "rows", "ranks": [0, 0]}]})",
       "tensors[0] (head.w): overlapping coverage: rank 0 listed twice"},
      {R"({"ranks": 2, "tensors": [{"tensor": "enc.norm", "split": "columns", "ranks": [0, 1]}]})",
       "tensors[0] (enc.norm): columns split of shape [48]: the tensor has no dimension 1"},
      {R"({"ranks": 2, "tensors": [{"tensor": "head.bias", "split": "diagonal", "ranks": [0]}]})",
       "unknown split 'diagonal'"},
  };
  for (const Case& c : cases) {
    auto s = TrainStructure::FromLayoutSpec(c.spec, Tensors());
    ASSERT_FALSE(s.ok()) << c.spec;
    EXPECT_TRUE(s.status().IsInvalidArgument()) << s.status();
    EXPECT_NE(s.status().message().find(c.says), std::string::npos)
        << s.status() << " lacks '" << c.says << "'";
  }
}

}  // namespace
}  // namespace dcr
