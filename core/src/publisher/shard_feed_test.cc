// The publisher's per-rank shard path over a layout described by data (dcr/publisher_c.h
// dcr_train_layout_open_spec): a checkpoint that is no preset, a spec file placing its tensors
// on two ranks, the trainer's exporter as a C callback, and ShardFeed's per-version delta and
// canonical checkpoint, applied to the base checkpoint and compared byte for byte with the dense
// export. A malformed spec is refused naming the file and the entry.
#include "publisher/shard_feed.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "dcr/apply.h"
#include "dcr/checkpoint.h"
#include "dcr/dcr_c.h"
#include "dcr/publisher_c.h"

namespace dcr::internal {
namespace {

std::string TempPath(const std::string& name) {
  return "/tmp/dcr_shard_feed_" + std::to_string(getpid()) + "_" + name;
}

// The spec: "a" [8, 6] BF16 rows over ranks 0, 1; "b" [6, 8] F32 columns over 1, 0; "c" [6]
// BF16 whole on rank 1.
const char* kSpec = R"({"ranks": 2, "tensors": [
  {"tensor": "a", "split": "rows", "ranks": [0, 1]},
  {"tensor": "b", "split": "columns", "ranks": [1, 0]},
  {"tensor": "c", "split": "whole", "ranks": [1]}]})";

// The trainer's exporter for kSpec, through the C API only.
int ExportSpec(void* user, const dcr_shard_reader* shards, size_t tensor, void* out) {
  const dcr_train_layout* l = static_cast<const dcr_train_layout*>(user);
  dcr_tensor t;
  if (dcr_train_layout_tensor(l, tensor, &t) != 0) return DCR_INTERNAL;
  auto* o = static_cast<uint8_t*>(out);
  auto buffer_of = [&](int rank) {
    const long i = dcr_train_layout_find_param(l, rank, t.name);
    dcr_train_param p;
    dcr_train_layout_param(l, rank, static_cast<size_t>(i), &p);
    return p;
  };
  const std::string name = t.name;
  if (name == "a") {  // rows: rank 0's half, then rank 1's
    for (int k = 0; k < 2; ++k) {
      dcr_train_param p = buffer_of(k);
      const void* src = dcr_shard_read(shards, k, p.buffer, 0, p.numel);
      if (src == nullptr) return DCR_INTERNAL;
      std::memcpy(o + k * p.numel * 2, src, p.numel * 2);
    }
  } else if (name == "b") {  // columns: part 0 on rank 1, part 1 on rank 0
    const int on[2] = {1, 0};
    for (int k = 0; k < 2; ++k) {
      dcr_train_param p = buffer_of(on[k]);
      const auto* src =
          static_cast<const uint8_t*>(dcr_shard_read(shards, on[k], p.buffer, 0, p.numel));
      if (src == nullptr) return DCR_INTERNAL;
      for (int r = 0; r < 6; ++r) std::memcpy(o + (r * 8 + k * 4) * 4, src + r * 4 * 4, 4 * 4);
    }
  } else {
    dcr_train_param p = buffer_of(1);
    const void* src = dcr_shard_read(shards, 1, p.buffer, 0, p.numel);
    if (src == nullptr) return DCR_INTERNAL;
    std::memcpy(o, src, p.numel * 2);
  }
  return 0;
}

TEST(ShardFeedSpec, ACustomLayoutFeedsTheDeltaOfACheckpointThatIsNoPreset) {
  std::mt19937_64 rng(11);
  std::vector<uint8_t> a(8 * 6 * 2), b(6 * 8 * 4), c(6 * 2);
  for (auto* v : {&a, &b, &c}) {
    for (auto& x : *v) x = static_cast<uint8_t>(rng());
  }
  const std::string ck = TempPath("ck.safetensors"), spec = TempPath("spec.json");
  ASSERT_TRUE(WriteSafetensors(ck, {{"a", "BF16", {8, 6}, a.data(), a.size()},
                                    {"b", "F32", {6, 8}, b.data(), b.size()},
                                    {"c", "BF16", {6}, c.data(), c.size()}})
                  .ok());
  std::ofstream(spec) << kSpec;
  dcr_train_layout* l = nullptr;
  ASSERT_EQ(dcr_train_layout_open_spec(spec.c_str(), ck.c_str(), &l), 0)
      << dcr_train_layout_error(l);
  ASSERT_EQ(dcr_train_layout_ranks(l), 2);
  EXPECT_EQ(dcr_train_layout_buffers(l, 0), 2u);  // a's rows, b's columns
  EXPECT_EQ(dcr_train_layout_buffers(l, 1), 3u);  // a's rows, b's columns, c
  dcr_train_buffer buf;
  ASSERT_EQ(dcr_train_layout_buffer(l, 1, 1, &buf), 0);
  EXPECT_STREQ(buf.name, "b");
  EXPECT_STREQ(buf.dtype, "F32");
  EXPECT_EQ(buf.numel, 24u);

  // The shards of the checkpoint (version 0) and of a changed version 1.
  auto shards_of = [&](const std::vector<uint8_t>& a, const std::vector<uint8_t>& b,
                       const std::vector<uint8_t>& c) {
    ShardSet set = ShardSet::Zeros(*l->s);
    std::memcpy(set.buffers[0][0].data(), a.data(), 48);
    std::memcpy(set.buffers[1][0].data(), a.data() + 48, 48);
    for (int r = 0; r < 6; ++r) {
      std::memcpy(set.buffers[1][1].data() + r * 16, b.data() + r * 32, 16);
      std::memcpy(set.buffers[0][1].data() + r * 16, b.data() + r * 32 + 16, 16);
    }
    std::memcpy(set.buffers[1][2].data(), c.data(), 12);
    return set;
  };
  auto feed = ShardFeed::Create(l->s, MakeCExporter(l->s, ExportSpec, l), 0, shards_of(a, b, c),
                                ShardFeedOptions{});
  ASSERT_TRUE(feed.ok()) << feed.status();
  auto base = Checkpoint::Open(ck);
  ASSERT_TRUE(base.ok());
  EXPECT_EQ((*feed)->base_hash(), (*base)->ContentHash(1)) << "the exporter does not give back "
                                                              "the checkpoint its shards came from";
  a[5] ^= 0x21;
  b[40] ^= 0x7e;
  b[191] ^= 0x01;
  c[11] ^= 0x80;
  const std::string next = TempPath("v1.safetensors"), delta = TempPath("v1.dcr");
  const std::string out = TempPath("out.safetensors");
  ASSERT_TRUE((*feed)->Step(1, shards_of(a, b, c), next, delta).ok());
  ApplyOptions ao;
  ao.verify_full = true;
  auto applied = ApplyDeltaFile(ck, delta, out, ao);
  ASSERT_TRUE(applied.ok()) << applied.status();
  auto got = ReadFile(out), want = ReadFile(next);
  ASSERT_TRUE(got.ok() && want.ok());
  EXPECT_TRUE(*got == *want) << "the applied delta differs from the exported version 1";
  // And the dense load of version 1 holds the changed tensors exactly.
  auto v1 = Checkpoint::Open(next);
  ASSERT_TRUE(v1.ok());
  EXPECT_EQ(0, std::memcmp((*v1)->data(*(*v1)->Find("b")), b.data(), b.size()));
  dcr_train_layout_close(l);

  std::ofstream(spec) << R"({"ranks": 2, "tensors": [{"tensor": "a", "split": "rows",
      "ranks": [0, 1]}, {"tensor": "b", "split": "rows", "ranks": [0, 1]}]})";
  ASSERT_EQ(dcr_train_layout_open_spec(spec.c_str(), ck.c_str(), &l), DCR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(dcr_train_layout_error(l))
                .find(spec + ": layout spec: missing coverage: "
                             "tensor 'c' has no entry"),
            std::string::npos)
      << dcr_train_layout_error(l);
  dcr_train_layout_close(l);
  for (const std::string& f : {ck, spec, next, delta, out}) std::remove(f.c_str());
}

}  // namespace
}  // namespace dcr::internal
