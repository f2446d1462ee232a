// Commitments (dcr/commitment.h): known-answer roots, partitions, first wrong range, and the
// commitment a signed final manifest carries.
#include "dcr/commitment.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "dcr/delta.h"
#include "dcr/manifest.h"
#include "dcr/receiver.h"
#include "dcr/signing.h"
#include "dcr/status_macros.h"

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

// Delivers the signed stream `d` to `rx` record by record, manifests included, in stream order.
Status Deliver(const std::vector<uint8_t>& d, Receiver* rx) {
  size_t header = 0;
  DCR_RETURN_IF_ERROR(ParseFileHeader(d.data(), d.size(), &header).status());
  DCR_RETURN_IF_ERROR(rx->Begin(d.data(), header));
  uint64_t trailer = 0;
  std::memcpy(&trailer, d.data() + d.size() - 24, 8);
  for (size_t off = header; off < trailer;) {
    size_t rs = 0, hs = 0;
    if (IsManifestRecord(d.data() + off, trailer - off)) {
      DCR_RETURN_IF_ERROR(ParseManifest(d.data() + off, trailer - off, &rs).status());
    } else {
      DCR_RETURN_IF_ERROR(ParseChunkHeader(d.data() + off, trailer - off, &hs, &rs).status());
    }
    DCR_RETURN_IF_ERROR(rx->ApplyRecord(d.data() + off, rs));
    off += rs;
  }
  return rx->Commit(d.data() + trailer, d.size() - trailer);
}

// A receiver whose base has the genuine content hash but other bytes (what a collision makes):
// the signed chunk chain and the additive hash pass, the commitment refuses the commit, names
// the first wrong range and leaves the receiver at its version. The honest receiver commits and
// keeps a signed state that verifies again, and only with the trainer's key.
TEST(Commitment, TrustedReceiverCommitsOnlyTheSignedCommitment) {
  std::mt19937_64 rng(5);
  std::vector<uint8_t> a(3 * kCommitmentLeafBytes / 2), b(4096);
  for (auto& x : a) x = static_cast<uint8_t>(rng() & 0x3f);
  for (auto& x : b) x = static_cast<uint8_t>(rng() & 0x3f);
  std::vector<Owned> base_model = {{"a", "BF16", {static_cast<int64_t>(a.size() / 2)}, a},
                                   {"b", "BF16", {static_cast<int64_t>(b.size() / 2)}, b}};
  std::vector<Owned> target_model = base_model;
  for (size_t i = 0; i < a.size(); i += 97) target_model[0].bytes[i] ^= 1;
  auto base = Checkpoint::FromBytes(SafetensorsImage(Views(base_model)));
  auto target = Checkpoint::FromBytes(SafetensorsImage(Views(target_model)));
  ASSERT_TRUE(base.ok() && target.ok());
  auto key = SigningKey::Generate();
  auto other = SigningKey::Generate();
  ASSERT_TRUE(key.ok() && other.ok());
  auto commitment = CheckpointCommitment(**target, 2);
  ASSERT_TRUE(commitment.ok());
  DeltaOptions o;
  o.chunk_elems = 1 << 16;
  o.base_version = 4;
  o.target_version = 5;
  DeltaMemorySink mem;
  SignOptions so;
  so.run_id = 9;
  so.commitment = commitment->root;
  so.commitment_leaves = commitment->leaves;
  SigningSink sink(key->get(), so, &mem);
  ASSERT_TRUE(BuildDelta(base->get(), **target, o, &sink).ok());
  const std::vector<uint8_t> delta = mem.Release();
  const std::string state =
      std::filesystem::temp_directory_path() / ("dcr-signed-state-" + std::to_string(getpid()));
  std::filesystem::remove(state);
  TrustOptions to;
  to.key = *TrustKey::FromRaw((*key)->public_key());
  to.run_id = 9;
  to.signed_state_path = state;

  // The forged base: one byte of "a" that the delta does not change, the genuine hash claimed.
  const uint64_t poisoned = 2 * 70001;
  ASSERT_NE(poisoned % 97, 0u);
  std::vector<uint8_t> forged_a = a;
  forged_a[poisoned] ^= 0x20;
  std::vector<uint8_t> forged_b = b;
  std::vector<ReceiverTensor> tensors(2);
  tensors[0].info = *(*base)->Find("a");
  tensors[0].data = forged_a.data();
  tensors[1].info = *(*base)->Find("b");
  tensors[1].data = forged_b.data();
  const VersionId genuine{4, (*base)->ContentHash()};
  TrustedReceiver forged(std::make_unique<BufferReceiver>(tensors, genuine), to);
  Status s = Deliver(delta, &forged);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("commit of version 5 refused"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("first wrong range: tensor a bytes [0, 4194304)"), std::string::npos)
      << s.ToString();
  EXPECT_EQ(forged.held(), genuine);
  EXPECT_FALSE(forged.committed_commitment().has_value());
  EXPECT_FALSE(std::filesystem::exists(state));

  // The honest receiver commits and keeps its signed state.
  TrustedReceiver honest(BufferReceiver::Copy(**base, 4), to);
  ASSERT_TRUE(Deliver(delta, &honest).ok());
  EXPECT_EQ(honest.held().number, 5u);
  ASSERT_TRUE(honest.committed_commitment().has_value());
  EXPECT_EQ(*honest.committed_commitment(), commitment->root);
  auto kept = ReadSignedState(state, to.key, 9);
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  EXPECT_EQ(kept->target_version, 5u);
  EXPECT_EQ(*kept->commitment.root, commitment->root);
  EXPECT_EQ(kept->commitment.leaves, commitment->leaves);
  EXPECT_EQ(ReadSignedState(state, *TrustKey::FromRaw((*other)->public_key()), 9).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReadSignedState(state, to.key, 10).status().code(), StatusCode::kFailedPrecondition);
  auto bytes = ReadFile(state);
  ASSERT_TRUE(bytes.ok());
  (*bytes)[bytes->size() - 100] ^= 1;  // inside the manifest's signed bytes
  ASSERT_TRUE(WriteFileAtomic(state, bytes->data(), bytes->size()).ok());
  EXPECT_FALSE(ReadSignedState(state, to.key, 9).ok());
  std::filesystem::remove(state);
  EXPECT_EQ(ReadSignedState(state, to.key, 9).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace dcr
