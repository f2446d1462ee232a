// Commitments (dcr/commitment.h): known-answer roots, partitions, first wrong range, and the
// commitment a signed final manifest carries.
#include "dcr/commitment.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "dcr/manifest.h"
#include "dcr/signing.h"

namespace dcr {
namespace {

struct Owned {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

std::vector<TensorView> Views(const std::vector<Owned>& ts) {
  std::vector<TensorView> v;
  for (const Owned& t : ts) {
    v.push_back(TensorView{t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size()});
  }
  return v;
}

// The tensors of the known-answer vectors (computed independently with Python's hashlib from the
// construction in dcr/commitment.h).
std::vector<Owned> MultiLeafModel(bool with_m) {
  std::vector<uint8_t> big(20 * 1024 * 1024 + 12345);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>((i * 7 + 3) & 255);
  big.resize(big.size() / 2 * 2);
  std::vector<Owned> ts;
  ts.push_back({"z", "BF16", {static_cast<int64_t>(big.size() / 2)}, big});
  ts.push_back({"a", "F32", {2}, {1, 2, 3, 4, 5, 6, 7, 8}});
  if (with_m) ts.push_back({"m", "U8", {3}, {'x', 'y', 'z'}});
  return ts;
}

TEST(Commitment, KnownAnswers) {
  EXPECT_EQ(CommitmentHex(CommitmentRoot({})),
            "b46dc87dcbcfc3ac06f10848de674cd33bc6aff34d72ac303e8e5a97408dc22b");
  std::vector<Owned> small = {{"w", "F32", {2}, {1, 2, 3, 4, 5, 6, 7, 8}}, {"b", "U8", {0}, {}}};
  auto c = CommitmentOf(Views(small), 1);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->leaves.size(), 2u);
  EXPECT_EQ(CommitmentHex(c->root),
            "901983303dc338422a9b7b095cdb12a7cc0797340e57047b0a2f12ef2b83766c");
  auto multi = CommitmentOf(Views(MultiLeafModel(true)), 2);
  ASSERT_TRUE(multi.ok());
  EXPECT_EQ(multi->leaves.size(), 8u);
  EXPECT_EQ(CommitmentHex(multi->root),
            "02b805a9a21c508a35bb1e1bc75d5d9032b93f9b07b0941e29c88598a2ac0d38");
  auto seven = CommitmentOf(Views(MultiLeafModel(false)), 3);  // an odd leaf count
  ASSERT_TRUE(seven.ok());
  EXPECT_EQ(seven->leaves.size(), 7u);
  EXPECT_EQ(CommitmentHex(seven->root),
            "7f5f823cab5486e9e90c41f250481053cb91d8c4c4c215628b6502f858da70cf");
}

TEST(Commitment, IdentityIsBound) {
  std::vector<Owned> a = {{"w", "F32", {2}, {1, 2, 3, 4, 5, 6, 7, 8}}};
  const Sha256Digest ra = CommitmentOf(Views(a), 1)->root;
  std::vector<Owned> renamed = a;
  renamed[0].name = "v";
  std::vector<Owned> retyped = a;
  retyped[0].dtype = "I32";
  std::vector<Owned> reshaped = a;
  reshaped[0].shape = {1, 2};
  EXPECT_NE(CommitmentOf(Views(renamed), 1)->root, ra);
  EXPECT_NE(CommitmentOf(Views(retyped), 1)->root, ra);
  EXPECT_NE(CommitmentOf(Views(reshaped), 1)->root, ra);
  std::vector<Owned> dup = {a[0], a[0]};
  EXPECT_EQ(CommitmentOf(Views(dup), 1).status().code(), StatusCode::kInvalidArgument);
}

TEST(Commitment, PartitionsGiveTheWholeRoot) {
  std::vector<Owned> model = MultiLeafModel(true);
  std::vector<TensorView> all = Views(model);
  auto whole = CommitmentOf(all, 1);
  ASSERT_TRUE(whole.ok());
  auto layout = CommitmentLayout::Of(all);
  ASSERT_TRUE(layout.ok());
  // Two "ranks": {z} and {a, m}, in any order, each on its own threads.
  auto p0 = CommitmentLeavesOf(*layout, {all[0]}, 4);
  auto p1 = CommitmentLeavesOf(*layout, {all[2], all[1]}, 1);
  ASSERT_TRUE(p0.ok() && p1.ok());
  auto leaves = AssembleLeaves(*layout, {*p1, *p0});
  ASSERT_TRUE(leaves.ok()) << leaves.status().ToString();
  EXPECT_EQ(*leaves, whole->leaves);
  EXPECT_EQ(CommitmentRoot(*leaves), whole->root);
  // Incremental leaf hashing in pieces equals the one-shot digest.
  const uint64_t i = layout->first_leaf(*layout->Find("z")) + 1;
  LeafHasher h(*layout, i);
  const uint8_t* bytes = model[0].bytes.data() + layout->leaf(i).begin;
  for (uint64_t off = 0; off < layout->leaf(i).size; off += 1000003) {
    h.Update(bytes + off, std::min<uint64_t>(1000003, layout->leaf(i).size - off));
  }
  auto d = h.Finish();
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, whole->leaves[i]);
  // A leaf missing or given twice is refused.
  EXPECT_EQ(AssembleLeaves(*layout, {*p0}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(AssembleLeaves(*layout, {*p0, *p1, *p0}).status().code(), StatusCode::kInvalidArgument);
  // A part whose tensor differs from the layout is refused.
  TensorView wrong = all[1];
  wrong.shape = {8};
  EXPECT_EQ(CommitmentLeavesOf(*layout, {wrong}, 1).status().code(), StatusCode::kInvalidArgument);
}

TEST(Commitment, CheckNamesTheFirstWrongRange) {
  std::vector<Owned> model = MultiLeafModel(true);
  auto good = CommitmentOf(Views(model), 2);
  ASSERT_TRUE(good.ok());
  EXPECT_TRUE(CheckCommitment(Views(model), good->root, &good->leaves, 2).ok());
  // Two bytes changed in z's third leaf and its fifth: the third is named.
  model[0].bytes[2 * kCommitmentLeafBytes + 17] ^= 1;
  model[0].bytes[4 * kCommitmentLeafBytes + 5] ^= 1;
  Status s = CheckCommitment(Views(model), good->root, &good->leaves, 2);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("first wrong range: tensor z bytes [8388608, 12582912)"),
            std::string::npos)
      << s.ToString();
  // Without the leaves only the roots are named.
  Status r = CheckCommitment(Views(model), good->root, nullptr, 2);
  EXPECT_EQ(r.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.message().find(CommitmentPrefix(good->root)), std::string::npos);
  // Leaves that do not make the root are refused as such.
  std::vector<Sha256Digest> forged = good->leaves;
  forged[0][0] ^= 1;
  EXPECT_EQ(CheckCommitment(Views(model), good->root, &forged, 2).code(), StatusCode::kDataLoss);
  EXPECT_EQ(FirstWrongLeaf(good->leaves, good->leaves), std::nullopt);
  EXPECT_EQ(FirstWrongLeaf(forged, good->leaves), 0u);
}

TEST(Commitment, FinalManifestCarriesRootAndLeaves) {
  Manifest m;
  m.final = true;
  m.sequence = 3;
  m.num_chunks = 9;
  Sha256Digest root{};
  root[0] = 0xab;
  m.commitment = root;
  m.commitment_leaves.resize(3);
  m.commitment_leaves[2][31] = 7;
  std::vector<uint8_t> rec = SerializeManifest(m);
  size_t n = 0;
  auto back = ParseManifest(rec.data(), rec.size(), &n);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(n, rec.size());
  ASSERT_TRUE(back->commitment.has_value());
  EXPECT_EQ(*back->commitment, root);
  EXPECT_EQ(back->commitment_leaves, m.commitment_leaves);
  // A leaf count larger than the record is refused before anything is allocated.
  std::vector<uint8_t> lying = rec;
  const size_t count_at = rec.size() - kManifestSignatureBytes - 32 - 3 * 32 - 4;
  const uint32_t huge = 0x7fffffff;
  std::memcpy(lying.data() + count_at, &huge, 4);
  EXPECT_EQ(ParseManifest(lying.data(), lying.size(), &n).status().code(), StatusCode::kDataLoss);
  // The commitment flag on a manifest that is not final is refused.
  std::vector<uint8_t> nonfinal = rec;
  const uint32_t flags = kManifestFlagCommitment;
  std::memcpy(nonfinal.data() + 8, &flags, 4);
  EXPECT_EQ(ParseManifest(nonfinal.data(), nonfinal.size(), &n).status().code(),
            StatusCode::kDataLoss);
  // Without a commitment the record is the version-6 record, byte for byte.
  Manifest plain = m;
  plain.commitment.reset();
  plain.commitment_leaves.clear();
  std::vector<uint8_t> old = SerializeManifest(plain);
  uint32_t old_flags = 0;
  std::memcpy(&old_flags, old.data() + 8, 4);
  EXPECT_EQ(old_flags, kManifestFlagFinal);
  EXPECT_EQ(old.size(), rec.size() - 32 - 4 - 3 * 32);
}

}  // namespace
}  // namespace dcr
