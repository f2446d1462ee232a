// Retention of a store's version objects: what is needed survives any budget, the newest
// versions are kept while the budget allows, an unmeetable budget is reported, and an
// interrupted removal is finished by the next collection.
#include "dcr/retention.h"

#include <gtest/gtest.h>

#include <string>

#include "dcr/delta.h"
#include "dcr/manifest.h"
#include "dcr/relay_policy.h"
#include "dcr/signing.h"
#include "node/store_retention.h"

namespace dcr {
namespace {

// Puts a version object under `prefix`: header (base -> target), `chunks` chunks of `size`
// bytes, and the trailer when `complete`.
void PutVersion(ObjectStore* s, const std::string& prefix, uint64_t base, uint64_t target,
                int chunks, size_t size, bool complete = true, bool full_frame = false) {
  FileHeader h;
  h.base_version = full_frame ? 0 : base;
  h.target_version = target;
  h.flags = full_frame ? kFlagNoBase : 0;
  h.SetSingleFile("{}");
  h.chunk_elems = 1024;
  const std::vector<uint8_t> hb = SerializeFileHeader(h);
  ASSERT_TRUE(s->Put(ObjectKey(prefix, {0, BlobKind::kHeader, 0}), hb.data(), hb.size()).ok());
  const std::string c(size, 'c');
  for (int i = 0; i < chunks; ++i) {
    BlobInfo b{static_cast<BlobId>(i + 1), BlobKind::kChunk, 0};
    ASSERT_TRUE(s->Put(ObjectKey(prefix, b), c.data(), c.size()).ok());
  }
  if (complete) {
    BlobInfo t{static_cast<BlobId>(chunks + 1), BlobKind::kTrailer, 0};
    ASSERT_TRUE(s->Put(ObjectKey(prefix, t), "trl", 3).ok());
  }
}

const RetainedVersion* Find(const RetentionReport& r, const std::string& prefix) {
  for (const RetainedVersion& v : r.versions) {
    if (v.prefix == prefix) return &v;
  }
  return nullptr;
}

bool Has(ObjectStore* s, const std::string& prefix) {
  auto l = s->List(prefix + "/");
  return l.ok() && !l->empty();
}

TEST(CollectStore, KeepsTheNewestAndEverythingNeeded) {
  MemoryStore s;
  for (int v = 1; v <= 5; ++v) PutVersion(&s, "run/step-" + std::to_string(v), v - 1, v, 3, 100);
  PutVersion(&s, "run/step-6", 5, 6, 3, 100, /*complete=*/false);  // in flight
  ASSERT_TRUE(s.Put("run/step-2/reports/3", "r", 1).ok());
  ASSERT_TRUE(s.Put("ow/run/step-2/7", "ow", 2).ok());
  ASSERT_TRUE(s.Put("run/notes.txt", "x", 1).ok());
  RetentionOptions o;
  o.root = "run";
  o.keep_versions = 2;
  RetentionReport r;
  ASSERT_TRUE(CollectStore(&s, o, &r).ok()) << r.budget_error;
  ASSERT_TRUE(r.committed.has_value());
  EXPECT_EQ(*r.committed, 5u);
  EXPECT_EQ(Find(r, "run/step-6")->decision, "needed");
  EXPECT_EQ(Find(r, "run/step-5")->decision, "needed");
  EXPECT_EQ(Find(r, "run/step-4")->decision, "kept");
  EXPECT_EQ(Find(r, "run/step-3")->decision, "removed");
  EXPECT_EQ(Find(r, "run/step-2")->decision, "removed");
  EXPECT_EQ(Find(r, "run/step-2")->objects, 7u);  // header, 3 chunks, trailer, report, overwrite
  EXPECT_TRUE(Has(&s, "run/step-6"));
  EXPECT_TRUE(Has(&s, "run/step-4"));
  EXPECT_FALSE(Has(&s, "run/step-3"));
  EXPECT_FALSE(Has(&s, "run/step-1"));
  EXPECT_FALSE(Has(&s, "ow/run/step-2"));
  EXPECT_TRUE(s.Head("run/notes.txt").ok());
  EXPECT_EQ(r.other_bytes, 1u);
  EXPECT_EQ(r.removed_objects, 3u * 5 + 2);
}

TEST(CollectStore, TheCatchUpChainIsNeededUnlessAFullFrameIsThere) {
  MemoryStore s;
  for (int v = 1; v <= 4; ++v) PutVersion(&s, "p/v" + std::to_string(v), v - 1, v, 1, 10);
  RetentionOptions o;
  o.keep_versions = 0;
  o.oldest_held = 1;  // a live receiver at v1 catches up through v2..v4
  RetentionReport r;
  ASSERT_TRUE(CollectStore(&s, o, &r).ok());
  EXPECT_EQ(Find(r, "p/v1")->decision, "removed");
  EXPECT_EQ(Find(r, "p/v2")->decision, "needed");
  EXPECT_EQ(Find(r, "p/v3")->decision, "needed");
  EXPECT_TRUE(Has(&s, "p/v2"));
  PutVersion(&s, "p/v4-full", 0, 4, 1, 10, true, /*full_frame=*/true);
  ASSERT_TRUE(CollectStore(&s, o, &r).ok());
  EXPECT_EQ(Find(r, "p/v2")->decision, "removed");
  EXPECT_EQ(Find(r, "p/v4-full")->decision, "needed");
  EXPECT_FALSE(Has(&s, "p/v3"));
}

TEST(CollectStore, ABudgetRemovesKeptVersionsButNeverNeededOnes) {
  MemoryStore s;
  for (int v = 1; v <= 4; ++v) PutVersion(&s, "p/v" + std::to_string(v), v - 1, v, 2, 1000);
  RetentionOptions o;
  o.keep_versions = 4;
  o.budget_bytes = 4500;  // room for two versions (each a little over 2000 bytes)
  RetentionReport r;
  ASSERT_TRUE(CollectStore(&s, o, &r).ok()) << r.budget_error;
  EXPECT_EQ(Find(r, "p/v1")->decision, "removed");
  EXPECT_EQ(Find(r, "p/v2")->decision, "removed");
  EXPECT_EQ(Find(r, "p/v3")->decision, "kept");
  EXPECT_LE(r.bytes_after, o.budget_bytes);
  o.budget_bytes = 3000;  // less than v4 (needed) and v3 together, more than v4
  ASSERT_TRUE(CollectStore(&s, o, &r).ok());
  EXPECT_FALSE(Has(&s, "p/v3"));
  o.budget_bytes = 100;  // less than the committed version alone
  Status st = CollectStore(&s, o, &r);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st;
  EXPECT_NE(st.message().find("cannot be met"), std::string::npos) << st;
  EXPECT_TRUE(Has(&s, "p/v4"));
  EXPECT_EQ(Find(r, "p/v4")->decision, "needed");
}

TEST(CollectStore, DryRunDeletesNothing) {
  MemoryStore s;
  for (int v = 1; v <= 3; ++v) PutVersion(&s, "p/v" + std::to_string(v), v - 1, v, 1, 10);
  RetentionOptions o;
  o.keep_versions = 1;
  o.dry_run = true;
  RetentionReport r;
  ASSERT_TRUE(CollectStore(&s, o, &r).ok());
  EXPECT_EQ(Find(r, "p/v1")->decision, "removed");
  EXPECT_EQ(r.removed_objects, 0u);
  EXPECT_TRUE(Has(&s, "p/v1"));
  EXPECT_LT(r.bytes_after, r.bytes_before);
}

TEST(CollectStore, AnInterruptedRemovalIsFinished) {
  MemoryStore s;
  for (int v = 1; v <= 3; ++v) PutVersion(&s, "p/v" + std::to_string(v), v - 1, v, 2, 10);
  // A removal of v1 cut short after the tombstone, the trailer and the header went.
  ASSERT_TRUE(s.Put("p/v1/gc-removing", "removing version 1\n", 19).ok());
  ASSERT_TRUE(s.Delete(ObjectKey("p/v1", {3, BlobKind::kTrailer, 0})).ok());
  ASSERT_TRUE(s.Delete(ObjectKey("p/v1", {0, BlobKind::kHeader, 0})).ok());
  // And one of v2 cut short when only its tombstone was left.
  ASSERT_TRUE(s.Put("p/v0/gc-removing", "removing version 0\n", 19).ok());
  RetentionOptions o;
  o.keep_versions = 5;
  RetentionReport r;
  ASSERT_TRUE(CollectStore(&s, o, &r).ok());
  EXPECT_EQ(Find(r, "p/v1")->decision, "removed");
  EXPECT_EQ(Find(r, "p/v0")->decision, "removed");
  EXPECT_FALSE(Has(&s, "p/v1"));
  EXPECT_FALSE(Has(&s, "p/v0"));
  EXPECT_EQ(Find(r, "p/v2")->decision, "kept");
  EXPECT_EQ(*r.committed, 3u);
}

// Puts a version object signed by `key` for deployment `run_id` under `prefix`: a signed header
// (base -> target), a final manifest signed for it (blob 1), `chunks` chunks, and the trailer
// when `complete`.
void PutSignedVersion(ObjectStore* s, const SigningKey& key, uint64_t run_id,
                      const std::string& prefix, uint64_t base, uint64_t target, int chunks,
                      bool complete = true) {
  FileHeader h;
  h.base_version = base;
  h.target_version = target;
  h.flags = kFlagSigned;
  h.SetSingleFile("{}");
  h.chunk_elems = 1024;
  const std::vector<uint8_t> hb = SerializeFileHeader(h);
  ASSERT_TRUE(s->Put(ObjectKey(prefix, {0, BlobKind::kHeader, 0}), hb.data(), hb.size()).ok());
  Manifest m;
  m.final = true;
  m.run_id = run_id;
  m.base_version = base;
  m.target_version = target;
  m.header_sha256 = Sha256(hb.data(), hb.size());
  m.num_chunks = static_cast<uint64_t>(chunks);
  m.signer = key.public_key();
  std::vector<uint8_t> rec = SerializeManifest(m);
  auto sig = key.Sign(rec.data(), rec.size() - kManifestSignatureBytes);
  ASSERT_TRUE(sig.ok());
  std::copy(sig->begin(), sig->end(), rec.end() - kManifestSignatureBytes);
  ASSERT_TRUE(s->Put(ObjectKey(prefix, {1, BlobKind::kChunk, 0}), rec.data(), rec.size()).ok());
  const std::string c(100, 'c');
  for (int i = 0; i < chunks; ++i) {
    BlobInfo b{static_cast<BlobId>(i + 2), BlobKind::kChunk, 0};
    ASSERT_TRUE(s->Put(ObjectKey(prefix, b), c.data(), c.size()).ok());
  }
  if (complete) {
    BlobInfo t{static_cast<BlobId>(chunks + 2), BlobKind::kTrailer, 0};
    ASSERT_TRUE(s->Put(ObjectKey(prefix, t), "trl", 3).ok());
  }
}

TEST(CollectStore, OnlySignedVersionsCount) {
  auto key = SigningKey::Generate();
  auto other = SigningKey::Generate();
  ASSERT_TRUE(key.ok() && other.ok());
  auto trust = TrustKey::FromRaw((*key)->public_key());
  ASSERT_TRUE(trust.ok());
  const uint64_t run = 0x1234abcd5678ef01ull;
  MemoryStore s;
  for (int v = 1; v <= 3; ++v) {
    PutSignedVersion(&s, **key, run, "run/step-" + std::to_string(v), v - 1, v, 2);
  }
  // Planted: an empty tombstone on the committed version; fake versions 100 (unsigned), 101
  // (another signer), 102 (the trainer's key, another deployment).
  ASSERT_TRUE(s.Put("run/step-3/gc-removing", "", 0).ok());
  PutVersion(&s, "run/step-100", 99, 100, 1, 10);
  PutSignedVersion(&s, **other, run, "run/step-101", 100, 101, 1);
  PutSignedVersion(&s, **key, run + 1, "run/step-102", 101, 102, 1);
  RetentionOptions o;
  o.root = "run";
  o.keep_versions = 1;
  RetentionReport r;
  // Without the key a store of signed versions is refused and nothing is deleted.
  EXPECT_EQ(CollectStore(&s, o, &r).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Has(&s, "run/step-1"));
  o.trust = *trust;
  o.run_id = run;
  ASSERT_TRUE(CollectStore(&s, o, &r).ok()) << r.budget_error;
  ASSERT_TRUE(r.committed.has_value());
  EXPECT_EQ(*r.committed, 3u);
  EXPECT_EQ(Find(r, "run/step-3")->decision, "needed");
  EXPECT_TRUE(Find(r, "run/step-3")->signed_ok);
  EXPECT_NE(Find(r, "run/step-3")->why.find("tombstone is unsigned: ignored"), std::string::npos);
  for (const char* f : {"run/step-100", "run/step-101", "run/step-102"}) {
    EXPECT_EQ(Find(r, f)->decision, "unsigned") << f;
    EXPECT_TRUE(Has(&s, f)) << f;
  }
  EXPECT_EQ(Find(r, "run/step-1")->decision, "removed");
  EXPECT_EQ(Find(r, "run/step-2")->decision, "removed");
  EXPECT_FALSE(Has(&s, "run/step-1"));
  EXPECT_TRUE(s.Head(ObjectKey("run/step-3", {4, BlobKind::kTrailer, 0})).ok());
}

TEST(CollectStore, AnInterruptedSignedRemovalIsFinished) {
  auto key = SigningKey::Generate();
  ASSERT_TRUE(key.ok());
  auto trust = TrustKey::FromRaw((*key)->public_key());
  ASSERT_TRUE(trust.ok());
  MemoryStore s;
  for (int v = 1; v <= 3; ++v) {
    PutSignedVersion(&s, **key, 7, "run/step-" + std::to_string(v), v - 1, v, 2);
  }
  RetentionOptions o;
  o.root = "run";
  o.keep_versions = 1;
  o.trust = *trust;
  // A removal of version 1 killed after its tombstone, trailer and chunks (the order Remove
  // deletes in): its final manifest and header go last, so it is still the trainer's version,
  // and the next collection decides it again and finishes it.
  ASSERT_TRUE(s.Put("run/step-1/gc-removing", "removing version 1\n", 19).ok());
  ASSERT_TRUE(s.Delete(ObjectKey("run/step-1", {4, BlobKind::kTrailer, 0})).ok());
  ASSERT_TRUE(s.Delete(ObjectKey("run/step-1", {3, BlobKind::kChunk, 0})).ok());
  ASSERT_TRUE(s.Delete(ObjectKey("run/step-1", {2, BlobKind::kChunk, 0})).ok());
  RetentionReport r;
  ASSERT_TRUE(CollectStore(&s, o, &r).ok());
  EXPECT_EQ(Find(r, "run/step-1")->decision, "removed");
  EXPECT_FALSE(Has(&s, "run/step-1"));
  EXPECT_FALSE(Has(&s, "run/step-2"));
  EXPECT_TRUE(Has(&s, "run/step-3"));
}

TEST(CollectStore, NegativeKeepIsRefused) {
  MemoryStore s;
  RetentionOptions o;
  o.keep_versions = -1;
  RetentionReport r;
  EXPECT_EQ(CollectStore(&s, o, &r).code(), StatusCode::kInvalidArgument);
}

TEST(VersionsRoot, TheCommonDirectoryOfTheVersionPrefixes) {
  NodePlan p;
  p.relay.prefix = "refit-1-9/step-1";
  EXPECT_EQ(internal::VersionsRoot(p), "refit-1-9");
  for (const char* v : {"refit-1-9/step-1", "refit-1-9/step-2", "refit-1-9/step-10"}) {
    NodeVersion nv;
    nv.prefix = v;
    p.versions.push_back(nv);
  }
  EXPECT_EQ(internal::VersionsRoot(p), "refit-1-9");
  p.versions[1].prefix = "a/b/c";
  EXPECT_EQ(internal::VersionsRoot(p), "");
  p.versions.clear();
  p.relay.prefix = "flat";
  EXPECT_EQ(internal::VersionsRoot(p), "");
}

}  // namespace
}  // namespace dcr
