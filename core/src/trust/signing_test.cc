// Signed deltas: manifest records, SigningSink, StreamVerifier / VerifyDeltaFile, TrustedReceiver
// and the version floor.
#include "dcr/signing.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <random>

#include "dcr/commitment.h"
#include "dcr/context.h"
#include "dcr/delta.h"
#include "dcr/journal.h"
#include "dcr/manifest.h"
#include "dcr/receiver.h"
#include "dcr/testing/fixtures.h"
#include "dcr/versioning.h"

namespace dcr {
namespace {

using testing::Model;
using testing::OwnedTensor;
using testing::TempDir;
using testing::Views;

Model RandomModel(std::mt19937_64& rng) {
  Model m;
  for (int t = 0; t < 3; ++t) {
    OwnedTensor x{"w" + std::to_string(t), "BF16", {40, 100}, {}};
    x.bytes.resize(40 * 100 * 2);
    for (auto& b : x.bytes) b = static_cast<uint8_t>(rng());
    m.push_back(std::move(x));
  }
  return m;
}

Model Changed(const Model& base, std::mt19937_64& rng, double frac) {
  Model t = base;
  for (auto& x : t) {
    for (size_t i = 0; i + 1 < x.bytes.size(); i += 2) {
      if (std::uniform_real_distribution<double>(0, 1)(rng) < frac) x.bytes[i] ^= 1 + (rng() & 7);
    }
  }
  return t;
}

// The blobs of a stream as a node sends them: header, records (manifests and chunks) in stream
// order, trailer.
struct Blobs {
  std::vector<uint8_t> header, trailer;
  std::vector<std::vector<uint8_t>> records;
};

Blobs Split(const std::vector<uint8_t>& s) {
  Blobs b;
  size_t hsize = 0;
  EXPECT_TRUE(ParseFileHeader(s.data(), s.size(), &hsize).ok());
  b.header.assign(s.begin(), s.begin() + hsize);
  uint64_t trailer_offset = 0;
  std::memcpy(&trailer_offset, s.data() + s.size() - 24, 8);
  size_t off = hsize;
  while (off < trailer_offset) {
    size_t rs = 0, hs = 0;
    if (IsManifestRecord(s.data() + off, trailer_offset - off)) {
      EXPECT_TRUE(ParseManifest(s.data() + off, trailer_offset - off, &rs).ok());
    } else {
      EXPECT_TRUE(ParseChunkHeader(s.data() + off, trailer_offset - off, &hs, &rs).ok());
    }
    b.records.emplace_back(s.begin() + off, s.begin() + off + rs);
    off += rs;
  }
  b.trailer.assign(s.begin() + trailer_offset, s.end());
  return b;
}

class SigningTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937_64 rng(7);
    base_ = RandomModel(rng);
    target_ = Changed(base_, rng, 0.02);
    other_ = Changed(base_, rng, 0.02);
    ASSERT_TRUE(WriteSafetensors(dir_ / "base", Views(base_)).ok());
    ASSERT_TRUE(WriteSafetensors(dir_ / "target", Views(target_)).ok());
    ASSERT_TRUE(WriteSafetensors(dir_ / "other", Views(other_)).ok());
    auto k = SigningKey::Generate();
    ASSERT_TRUE(k.ok());
    key_ = std::move(*k);
    auto t = TrustKey::FromRaw(key_->public_key());
    ASSERT_TRUE(t.ok());
    trust_ = *t;
  }

  // `commit`: the final manifest signs the target's commitment, as every signing sender does.
  std::vector<uint8_t> Build(const std::string& target, const SigningKey* key,
                             uint64_t target_version = 1, uint64_t run = 9, bool commit = true) {
    auto b = Checkpoint::Open(dir_ / "base");
    auto t = Checkpoint::Open(dir_ / target);
    EXPECT_TRUE(b.ok() && t.ok());
    DeltaOptions o;
    o.chunk_elems = 1000;
    o.threads = 1;
    o.target_version = target_version;
    DeltaMemorySink mem;
    if (key == nullptr) {
      EXPECT_TRUE(BuildDelta(b->get(), **t, o, &mem).ok());
    } else {
      SignOptions so;
      so.run_id = run;
      so.chunks_per_manifest = 3;
      if (commit) {
        auto c = CheckpointCommitment(**t, 1);
        EXPECT_TRUE(c.ok()) << c.status();
        so.commitment = c->root;
        so.commitment_leaves = c->leaves;
      }
      SigningSink sink(key, so, &mem);
      auto st = BuildDelta(b->get(), **t, o, &sink);
      EXPECT_TRUE(st.ok()) << st.status();
    }
    return mem.Release();
  }

  std::unique_ptr<TrustedReceiver> Receive(TrustOptions o) {
    auto r = BufferReceiver::Load(dir_ / "base");
    EXPECT_TRUE(r.ok());
    return std::make_unique<TrustedReceiver>(std::move(*r), std::move(o));
  }

  TrustOptions Trusting() {
    TrustOptions o;
    o.key = trust_;
    o.run_id = 9;
    return o;
  }

  // Delivers every blob in order; the first error.
  Status Deliver(Receiver* r, const Blobs& b) {
    Status s = r->Begin(b.header.data(), b.header.size());
    if (!s.ok()) return s;
    for (const auto& rec : b.records) {
      s = r->ApplyRecord(rec.data(), rec.size());
      if (!s.ok()) return s;
    }
    return r->Commit(b.trailer.data(), b.trailer.size());
  }

  TempDir dir_;
  Model base_, target_, other_;
  std::unique_ptr<SigningKey> key_;
  std::shared_ptr<const TrustKey> trust_;
};

TEST_F(SigningTest, SignedStreamIsVersion6AndApplies) {
  std::vector<uint8_t> plain = Build("target", nullptr);
  std::vector<uint8_t> sig = Build("target", key_.get());
  auto pr = DeltaReader::FromBytes(plain);
  auto sr = DeltaReader::FromBytes(sig);
  ASSERT_TRUE(pr.ok() && sr.ok()) << sr.status();
  EXPECT_EQ((*pr)->header().format_version, 5u);
  EXPECT_EQ((*sr)->header().format_version, 6u);
  EXPECT_TRUE((*sr)->header().flags & kFlagSigned);
  ASSERT_GT((*pr)->num_chunks(), 3u);
  EXPECT_EQ((*sr)->num_chunks(), (*pr)->num_chunks());
  // The same chunk records, moved to make room for the manifests.
  for (size_t i = 0; i < (*pr)->num_chunks(); ++i) {
    ASSERT_EQ((*pr)->chunk_size(i), (*sr)->chunk_size(i));
    EXPECT_EQ(0, std::memcmp((*pr)->chunk_data(i), (*sr)->chunk_data(i), (*pr)->chunk_size(i)));
  }
  EXPECT_TRUE(VerifyDeltaFile(**sr, trust_, 9).ok()) << VerifyDeltaFile(**sr, trust_, 9);
  Blobs b = Split(sig);
  const size_t manifests = (*pr)->num_chunks() / 3 + 1;
  EXPECT_EQ(b.records.size(), (*pr)->num_chunks() + manifests);
  EXPECT_TRUE(IsManifestRecord(b.records[0].data(), b.records[0].size()));
  auto r = Receive(Trusting());
  Status s = Deliver(r.get(), b);
  ASSERT_TRUE(s.ok()) << s;
  auto t = Checkpoint::Open(dir_ / "target");
  EXPECT_EQ(r->held().hash, (*t)->ContentHash(1));
  EXPECT_TRUE(r->Verify(**t).ok());
  // A receiver without a key applies the signed stream too (manifests skipped).
  auto plain_receiver = Receive(TrustOptions{});
  EXPECT_TRUE(Deliver(plain_receiver.get(), b).ok());
}

// A doubtful chunk is repaired with an overwrite form the receiving node builds itself: no
// manifest lists that record, so it is applied through ApplyDerived, which checks the signed
// record it came from.
TEST_F(SigningTest, RepairFormsDerivedFromSignedChunksApply) {
  Blobs b = Split(Build("target", key_.get()));
  ASSERT_GT(b.records.size(), 6u);
  auto base = Checkpoint::Open(dir_ / "base");
  auto target = Checkpoint::Open(dir_ / "target");
  ASSERT_TRUE(base.ok() && target.ok());
  auto chunk_id = [](const std::vector<uint8_t>& rec) {
    size_t hs = 0, rs = 0;
    auto h = ParseChunkHeader(rec.data(), rec.size(), &hs, &rs);
    EXPECT_TRUE(h.ok()) << h.status();
    return h.ok() ? h->chunk_id : ~uint64_t{0};
  };
  DeltaOptions o;
  o.chunk_elems = 1000;
  const std::vector<uint8_t>& first = b.records[1];  // listed by the first manifest
  const std::vector<uint8_t>& later = b.records[5];  // listed by the second one
  auto ow = OverwriteChunkFromCheckpoints(**base, **target, o, chunk_id(first));
  auto ow_later = OverwriteChunkFromCheckpoints(**base, **target, o, chunk_id(later));
  ASSERT_TRUE(ow.ok() && ow_later.ok()) << ow.status();

  auto r = Receive(Trusting());
  ASSERT_TRUE(r->Begin(b.header.data(), b.header.size()).ok());
  ASSERT_TRUE(r->ApplyRecord(b.records[0].data(), b.records[0].size()).ok());
  // Its own hash is not the signed one.
  EXPECT_TRUE(r->ApplyRecord(ow->data(), ow->size()).IsFailedPrecondition());
  // Derived from another chunk, or from one no verified manifest lists yet: refused.
  EXPECT_EQ(
      r->ApplyDerived(b.records[2].data(), b.records[2].size(), ow->data(), ow->size()).code(),
      StatusCode::kInvalidArgument);
  EXPECT_TRUE(r->ApplyDerived(later.data(), later.size(), ow_later->data(), ow_later->size())
                  .IsFailedPrecondition());
  // Derived from the signed record it repairs: applied.
  Status s = r->ApplyDerived(first.data(), first.size(), ow->data(), ow->size());
  ASSERT_TRUE(s.ok()) << s;
  for (size_t i = 2; i < b.records.size(); ++i) {
    s = r->ApplyRecord(b.records[i].data(), b.records[i].size());
    ASSERT_TRUE(s.ok()) << "record " << i << ": " << s;
  }
  s = r->Commit(b.trailer.data(), b.trailer.size());
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(r->Verify(**target).ok());
}

// BF16 weights of few exponents whose small magnitudes change more often, by one ulp: chunks
// whose context-coded form is the smaller.
Model FloatModel(std::mt19937_64& rng, Model* target) {
  Model m;
  target->clear();
  for (int t = 0; t < 2; ++t) {
    OwnedTensor x{"f" + std::to_string(t), "BF16", {50, 200}, {}};
    x.bytes.resize(50 * 200 * 2);
    OwnedTensor y = x;
    for (size_t i = 0; i < x.bytes.size(); i += 2) {
      const uint64_t r = rng();
      const int e = 124 - static_cast<int>(r % 5) - static_cast<int>((r >> 3) % 5);
      const uint16_t v = static_cast<uint16_t>(((r >> 20) & 1) << 15 | e << 7 | ((r >> 8) & 0x7F));
      std::memcpy(&x.bytes[i], &v, 2);
      const bool moves = (rng() % 1024) < (uint64_t{4} << ((124 - e) / 2));
      const uint16_t w = moves ? static_cast<uint16_t>(v + 1) : v;
      std::memcpy(&y.bytes[i], &w, 2);
    }
    m.push_back(std::move(x));
    target->push_back(std::move(y));
  }
  return m;
}

// With context coding the signed manifest lists each context-coded chunk twice (forms = 2): the
// SHA-256 of its plain record, as ContextChunkToPlain rebuilds it from the base, and that of the
// context-coded record. A receiver accepts the stream as built and the stream a relay forwards
// after decoding every context chunk to its plain form; an altered plain form is refused.
TEST_F(SigningTest, SignedContextDeltaListsBothFormsAndEitherApplies) {
  std::mt19937_64 rng(11);
  Model target;
  const Model base = FloatModel(rng, &target);
  ASSERT_TRUE(WriteSafetensors(dir_ / "fbase", Views(base)).ok());
  ASSERT_TRUE(WriteSafetensors(dir_ / "ftarget", Views(target)).ok());
  auto b = Checkpoint::Open(dir_ / "fbase");
  auto t = Checkpoint::Open(dir_ / "ftarget");
  ASSERT_TRUE(b.ok() && t.ok());
  DeltaOptions o;
  o.chunk_elems = 2000;
  o.threads = 2;
  o.target_version = 1;
  o.context_coding = true;
  DeltaMemorySink mem;
  SignOptions so;
  so.run_id = 9;
  so.chunks_per_manifest = 3;
  auto c = CheckpointCommitment(**t, 1);
  ASSERT_TRUE(c.ok()) << c.status();
  so.commitment = c->root;
  SigningSink sink(key_.get(), so, &mem);
  auto st = BuildDelta(b->get(), **t, o, &sink);
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_GT(st->context_chunks, 2u);
  auto reader = DeltaReader::FromBytes(mem.bytes());
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_TRUE((*reader)->header().flags & kFlagSigned);
  EXPECT_TRUE((*reader)->header().flags & kFlagContext);
  Status v = VerifyDeltaFile(**reader, trust_, 9);
  EXPECT_TRUE(v.ok()) << v;

  std::vector<std::vector<uint8_t>> bufs;
  for (const OwnedTensor& x : base) bufs.push_back(x.bytes);
  std::vector<TensorBuffer> tbs;
  for (auto& x : bufs) tbs.push_back(TensorBuffer{x.data(), x.size() / 2, 2, 0});

  Blobs blobs = Split(mem.bytes());
  Blobs decoded = blobs;  // what an edge relay forwards: every context chunk in its plain form
  std::map<uint64_t, ManifestEntry> listed;
  int both = 0;
  for (size_t i = 0; i < blobs.records.size(); ++i) {
    const std::vector<uint8_t>& rec = blobs.records[i];
    if (IsManifestRecord(rec.data(), rec.size())) {
      size_t rs = 0;
      auto m = ParseManifest(rec.data(), rec.size(), &rs);
      ASSERT_TRUE(m.ok()) << m.status();
      for (const ManifestEntry& e : m->entries) listed[e.chunk_id] = e;
      continue;
    }
    auto h = ParseChunkHeader(rec.data(), rec.size(), nullptr, nullptr);
    ASSERT_TRUE(h.ok()) << h.status();
    ASSERT_TRUE(listed.count(h->chunk_id));
    const ManifestEntry& e = listed[h->chunk_id];
    if (!IsContextCoded(*h)) {
      EXPECT_FALSE(e.has_context);
      EXPECT_EQ(e.plain, Sha256(rec.data(), rec.size()));
      continue;
    }
    ++both;
    EXPECT_TRUE(e.has_context);
    EXPECT_EQ(e.context, Sha256(rec.data(), rec.size()));
    std::vector<uint8_t> covered;
    ASSERT_TRUE(GatherCoveredBits(*h, tbs, &covered).ok());
    auto plain = ContextChunkToPlain(rec.data(), rec.size(), covered.data(), covered.size());
    ASSERT_TRUE(plain.ok()) << plain.status();
    EXPECT_EQ(e.plain, Sha256(plain->data(), plain->size()));
    decoded.records[i] = *plain;
  }
  EXPECT_EQ(static_cast<uint64_t>(both), st->context_chunks);

  for (const Blobs* stream : {&blobs, &decoded}) {
    auto r = BufferReceiver::Load(dir_ / "fbase");
    ASSERT_TRUE(r.ok());
    TrustedReceiver rx(std::move(*r), Trusting());
    Status s = Deliver(&rx, *stream);
    ASSERT_TRUE(s.ok()) << (stream == &blobs ? "as built: " : "decoded: ") << s;
    EXPECT_TRUE(rx.Verify(**t).ok());
  }
  // A plain form with one byte altered matches neither listed hash.
  for (size_t i = 0; i < decoded.records.size(); ++i) {
    if (decoded.records[i] == blobs.records[i]) continue;
    Blobs altered = decoded;
    altered.records[i].back() ^= 0x10;
    auto r = BufferReceiver::Load(dir_ / "fbase");
    ASSERT_TRUE(r.ok());
    TrustedReceiver rx(std::move(*r), Trusting());
    Status s = Deliver(&rx, altered);
    EXPECT_TRUE(s.IsFailedPrecondition()) << s;
    EXPECT_NE(s.message().find("not the one its signed manifest lists"), std::string::npos) << s;
    break;
  }
}

TEST_F(SigningTest, UnsignedDeltaIsRefusedWithAKey) {
  Blobs b = Split(Build("target", nullptr));
  auto r = Receive(Trusting());
  Status s = Deliver(r.get(), b);
  EXPECT_TRUE(s.IsFailedPrecondition()) << s;
  EXPECT_NE(s.message().find("not signed"), std::string::npos) << s;
  EXPECT_FALSE(r->in_delta());
  auto d = DeltaReader::FromBytes(Build("target", nullptr));
  EXPECT_TRUE(VerifyDeltaFile(**d, trust_).IsFailedPrecondition());
}

// A receiver holding a trust key commits only what it proves by the signed commitment: a signed
// delta without one is refused, and so is storage whose commitment it cannot compute.
TEST_F(SigningTest, SignedDeltaWithoutACommitmentIsRefusedWithAKey) {
  Blobs b = Split(Build("target", key_.get(), 1, 9, /*commit=*/false));
  auto r = Receive(Trusting());
  Status s = Deliver(r.get(), b);
  EXPECT_TRUE(s.IsFailedPrecondition()) << s;
  EXPECT_NE(s.message().find("carries no commitment of its target"), std::string::npos) << s;
  EXPECT_NE(r->held().number, 1u);
  // check_commitment false: the chain alone (what a format test or a chain benchmark asks for).
  TrustOptions chain = Trusting();
  chain.check_commitment = false;
  auto c = Receive(chain);
  EXPECT_TRUE(Deliver(c.get(), b).ok());
  EXPECT_FALSE(c->committed_commitment().has_value());
}

namespace {
// A receiver that forwards to another but does not say what storage it writes (as a serving
// replica does not): its commitment cannot be computed.
class OpaqueReceiver : public Receiver {
 public:
  explicit OpaqueReceiver(std::unique_ptr<Receiver> inner) : inner_(std::move(inner)) {}
  Status Begin(const uint8_t* h, size_t n) override { return inner_->Begin(h, n); }
  Status ApplyRecord(const uint8_t* r, size_t n) override { return inner_->ApplyRecord(r, n); }
  Status Commit(const uint8_t* t, size_t n) override { return inner_->Commit(t, n); }
  void Abort() override { inner_->Abort(); }
  Status MarkApplied(uint64_t id, const Hash128& d) override { return inner_->MarkApplied(id, d); }
  Status Verify(const Checkpoint& target) const override { return inner_->Verify(target); }
  VersionId held() const override { return inner_->held(); }
  bool in_delta() const override { return inner_->in_delta(); }
  std::vector<uint64_t> MissingChunks(const Trailer& t) const override {
    return inner_->MissingChunks(t);
  }

 private:
  std::unique_ptr<Receiver> inner_;
};
}  // namespace

TEST_F(SigningTest, StorageWhoseCommitmentCannotBeComputedIsRefusedWithAKey) {
  Blobs b = Split(Build("target", key_.get()));
  auto inner = BufferReceiver::Load(dir_ / "base");
  ASSERT_TRUE(inner.ok());
  TrustedReceiver r(std::make_unique<OpaqueReceiver>(std::move(*inner)), Trusting());
  Status s = Deliver(&r, b);
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented) << s;
  EXPECT_NE(s.message().find("commit of version 1 refused"), std::string::npos) << s;
  EXPECT_NE(r.held().number, 1u);
}

// A journaled receiver (journal.h) says what storage it writes: the commitment is computed over
// it and checked at commit.
TEST_F(SigningTest, JournaledReceiverIsCheckedAgainstTheCommitment) {
  Blobs b = Split(Build("target", key_.get()));
  auto j = ReceiverJournal::Open(dir_ / "journal");
  ASSERT_TRUE(j.ok()) << j.status();
  auto inner = BufferReceiver::Load(dir_ / "base");
  ASSERT_TRUE(inner.ok());
  ASSERT_TRUE((*j)->RecordCommitted((*inner)->held()).ok());
  TrustedReceiver r(std::make_unique<JournaledReceiver>(inner->get(), j->get()), Trusting());
  Status s = Deliver(&r, b);
  ASSERT_TRUE(s.ok()) << s;
  auto t = CheckpointCommitment(**Checkpoint::Open(dir_ / "target"), 1);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(r.committed_commitment(), t->root);
}

TEST_F(SigningTest, AnotherSignerIsRefused) {
  auto forger = SigningKey::Generate();
  ASSERT_TRUE(forger.ok());
  std::vector<uint8_t> forged = Build("other", forger->get());
  auto d = DeltaReader::FromBytes(forged);
  ASSERT_TRUE(d.ok());
  Status v = VerifyDeltaFile(**d, trust_, 9);
  EXPECT_TRUE(v.IsFailedPrecondition()) << v;
  EXPECT_NE(v.message().find("not by the trusted key"), std::string::npos) << v;
  auto r = Receive(Trusting());
  Status s = Deliver(r.get(), Split(forged));
  EXPECT_TRUE(s.IsFailedPrecondition()) << s;
  // Nothing of the forged delta reached the storage.
  auto base = Checkpoint::Open(dir_ / "base");
  EXPECT_TRUE(r->Verify(**base).ok());
}

TEST_F(SigningTest, ForgedSignerFieldFailsTheSignature) {
  // A forger that copies the trusted public key into its manifests still cannot sign them.
  auto forger = SigningKey::Generate();
  Blobs b = Split(Build("other", forger->get()));
  for (auto& rec : b.records) {
    if (!IsManifestRecord(rec.data(), rec.size())) continue;
    std::memcpy(rec.data() + rec.size() - 96, key_->public_key().data(), 32);
  }
  auto r = Receive(Trusting());
  Status s = Deliver(r.get(), b);
  EXPECT_TRUE(s.IsFailedPrecondition()) << s;
  EXPECT_NE(s.message().find("bad signature"), std::string::npos) << s;
}

TEST_F(SigningTest, AlteredChunkIsRefusedAndNotWritten) {
  Blobs b = Split(Build("target", key_.get()));
  auto r = Receive(Trusting());
  ASSERT_TRUE(r->Begin(b.header.data(), b.header.size()).ok());
  ASSERT_TRUE(r->ApplyRecord(b.records[0].data(), b.records[0].size()).ok());  // manifest 0
  std::vector<uint8_t> chunk = b.records[1];
  chunk[chunk.size() - 1] ^= 0x40;  // a payload byte
  Status s = r->ApplyRecord(chunk.data(), chunk.size());
  EXPECT_TRUE(s.IsFailedPrecondition()) << s;
  EXPECT_NE(s.message().find("not the one its signed manifest lists"), std::string::npos) << s;
  auto base = Checkpoint::Open(dir_ / "base");
  EXPECT_TRUE(r->Verify(**base).ok());
}

TEST_F(SigningTest, MixAndMatchOfTwoSignedDeltasIsRefused) {
  Blobs a = Split(Build("target", key_.get()));
  Blobs o = Split(Build("other", key_.get()));
  // A chunk of the other delta in place of this delta's chunk with the same id.
  {
    Blobs mixed = a;
    mixed.records[1] = o.records[1];
    auto r = Receive(Trusting());
    Status s = Deliver(r.get(), mixed);
    EXPECT_TRUE(s.IsFailedPrecondition()) << s;
  }
  // A manifest of the other delta (its header differs).
  {
    Blobs mixed = a;
    mixed.records[0] = o.records[0];
    auto r = Receive(Trusting());
    Status s = Deliver(r.get(), mixed);
    EXPECT_TRUE(s.IsFailedPrecondition()) << s;
    EXPECT_NE(s.message().find("another delta"), std::string::npos) << s;
  }
  // The other delta's trailer.
  {
    Blobs mixed = a;
    mixed.trailer = o.trailer;
    auto r = Receive(Trusting());
    Status s = Deliver(r.get(), mixed);
    EXPECT_TRUE(s.IsFailedPrecondition()) << s;
    EXPECT_FALSE(r->held().number == 1);
  }
}

TEST_F(SigningTest, AnotherRunIsRefused) {
  Blobs b = Split(Build("target", key_.get(), 1, /*run=*/10));
  auto r = Receive(Trusting());
  Status s = Deliver(r.get(), b);
  EXPECT_TRUE(s.IsFailedPrecondition()) << s;
  EXPECT_NE(s.message().find("run 10"), std::string::npos) << s;
}

TEST_F(SigningTest, ChunksBeforeTheirManifestWaitAndApply) {
  Blobs b = Split(Build("target", key_.get()));
  std::reverse(b.records.begin(), b.records.end());  // every chunk before its manifest
  auto r = Receive(Trusting());
  Status s = Deliver(r.get(), b);
  ASSERT_TRUE(s.ok()) << s;
  auto t = Checkpoint::Open(dir_ / "target");
  EXPECT_TRUE(r->Verify(**t).ok());
}

TEST_F(SigningTest, WaitingRecordsAreBounded) {
  Blobs b = Split(Build("target", key_.get()));
  TrustOptions o = Trusting();
  o.max_pending_bytes = b.records[1].size() + 1;
  auto r = Receive(o);
  ASSERT_TRUE(r->Begin(b.header.data(), b.header.size()).ok());
  EXPECT_TRUE(r->ApplyRecord(b.records[1].data(), b.records[1].size()).ok());
  Status s = r->ApplyRecord(b.records[2].data(), b.records[2].size());
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s;
}

TEST_F(SigningTest, DroppedManifestBlocksCommit) {
  Blobs b = Split(Build("target", key_.get()));
  Blobs cut = b;
  cut.records.erase(cut.records.begin() + 4, cut.records.begin() + 8);  // manifest 1 and chunks
  auto r = Receive(Trusting());
  Status s = Deliver(r.get(), cut);
  EXPECT_TRUE(s.IsFailedPrecondition()) << s;
  EXPECT_NE(r->held().number, 1u);
}

TEST_F(SigningTest, VersionFloorRefusesRollbackAndPersists) {
  const std::string path = dir_ / "floor";
  {
    auto f = VersionFloor::Load(path);
    ASSERT_TRUE(f.ok());
    EXPECT_EQ(f->version(), 0u);
    TrustOptions o = Trusting();
    o.floor = &*f;
    auto r = Receive(o);
    ASSERT_TRUE(Deliver(r.get(), Split(Build("target", key_.get(), 5))).ok());
    EXPECT_EQ(f->version(), 5u);
  }
  auto f = VersionFloor::Load(path);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->version(), 5u);
  EXPECT_GT(f->committed_unix(), 0);
  // A correctly signed older delta: refused before anything is written.
  TrustOptions o = Trusting();
  o.floor = &*f;
  auto r = Receive(o);
  Status s = Deliver(r.get(), Split(Build("target", key_.get(), 4)));
  EXPECT_TRUE(s.IsFailedPrecondition()) << s;
  EXPECT_NE(s.message().find("rollback refused"), std::string::npos) << s;
  EXPECT_FALSE(r->in_delta());
  // The floor's own version may be delivered again; a higher one moves it.
  EXPECT_TRUE(f->Check(5).ok());
  auto r2 = Receive(o);
  EXPECT_TRUE(Deliver(r2.get(), Split(Build("target", key_.get(), 6))).ok());
  EXPECT_EQ(VersionFloor::Load(path)->version(), 6u);
}

TEST_F(SigningTest, VersionFloorBelongsToItsDeployment) {
  const std::string path = dir_ / "floor";
  const uint64_t a = 0xa1a2a3a4a5a6a7a8ull, b = 0xb1b2b3b4b5b6b7b8ull;
  {
    auto f = VersionFloor::Load(path, a);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(f->Record(5, 100).ok());
  }
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("dcr-version-floor 2\ndeployment a1a2a3a4a5a6a7a8\nversion 5\n"),
            std::string::npos)
      << text;
  // The same deployment: its floor holds, an older version is a rollback.
  auto same = VersionFloor::Load(path, a);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->version(), 5u);
  EXPECT_FALSE(same->other_deployment());
  EXPECT_TRUE(same->Check(1).IsFailedPrecondition());
  // Another deployment: a fresh start, and its first commit makes the floor its own.
  auto other = VersionFloor::Load(path, b);
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(other->other_deployment());
  EXPECT_EQ(other->version(), 0u);
  EXPECT_EQ(other->committed_unix(), 0);
  EXPECT_TRUE(other->Check(1).ok());
  ASSERT_TRUE(other->Record(1, 200).ok());
  EXPECT_EQ(VersionFloor::Load(path, b)->version(), 1u);
  EXPECT_EQ(VersionFloor::Load(path, a)->version(), 0u);
  // None named (an offline apply): the file's floor, whatever its deployment.
  EXPECT_EQ(VersionFloor::Load(path)->version(), 1u);
  // A format-1 floor names no deployment: a fresh start for a named one.
  { std::ofstream(path) << "dcr-version-floor 1\nversion 9\ncommitted_unix 1\n"; }
  EXPECT_EQ(VersionFloor::Load(path, a)->version(), 0u);
  EXPECT_EQ(VersionFloor::Load(path)->version(), 9u);
}

TEST_F(SigningTest, VersionFloorFileIsStrictAndFreezeIsReported) {
  const std::string path = dir_ / "floor";
  { std::ofstream(path) << "version 3\n"; }
  EXPECT_TRUE(VersionFloor::Load(path).status().IsDataLoss());
  std::remove(path.c_str());
  auto f = VersionFloor::Load(path);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->FreezeReport(1000, 60, 0), "");    // nothing committed, not waiting
  EXPECT_NE(f->FreezeReport(1000, 60, 900), "");  // waited 100 s for a first version
  ASSERT_TRUE(f->Record(2, 1000).ok());
  EXPECT_EQ(f->FreezeReport(1050, 60, 0), "");
  const std::string frozen = f->FreezeReport(1100, 60, 0);
  EXPECT_NE(frozen.find("freeze: no new version for 100 s"), std::string::npos) << frozen;
  EXPECT_EQ(f->FreezeReport(1100, 0, 0), "");  // off
}

TEST_F(SigningTest, KeysRoundTripThroughFiles) {
  ASSERT_TRUE(key_->Write(dir_ / "k.pem", dir_ / "k.pub").ok());
  EXPECT_TRUE(
      key_->Write(dir_ / "k.pem", dir_ / "k2.pub").IsFailedPrecondition());  // never overwritten
  auto k = SigningKey::Load(dir_ / "k.pem");
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ((*k)->public_key(), key_->public_key());
  auto p = TrustKey::Load(dir_ / "k.pub");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ((*p)->raw(), key_->public_key());
  ASSERT_EQ(0, ::chmod((dir_ / "k.pem").c_str(), 0640));
  EXPECT_TRUE(SigningKey::Load(dir_ / "k.pem").status().IsFailedPrecondition());
  EXPECT_TRUE(TrustKey::Load(dir_ / "base").status().IsInvalidArgument());
}

TEST(ManifestTest, RoundTripAndEveryTruncationIsRefused) {
  Manifest m;
  m.final = true;
  m.sequence = 3;
  m.run_id = 77;
  m.base_version = 1;
  m.target_version = 2;
  m.base_hash = Hash128{1, 2};
  m.num_chunks = 9;
  m.target_hash = Hash128{3, 4};
  for (int i = 0; i < 4; ++i) {
    ManifestEntry e;
    e.chunk_id = 10 + i;
    e.plain[0] = static_cast<uint8_t>(i);
    e.has_context = i == 2;
    e.context[5] = 9;
    m.entries.push_back(e);
  }
  m.signature[63] = 5;
  std::vector<uint8_t> rec = SerializeManifest(m);
  size_t rs = 0;
  auto p = ParseManifest(rec.data(), rec.size(), &rs);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(rs, rec.size());
  EXPECT_EQ(SerializeManifest(*p), rec);
  for (size_t n = 0; n < rec.size(); ++n) {
    EXPECT_TRUE(ParseManifest(rec.data(), n, &rs).status().IsDataLoss()) << n;
  }
  // A count the size cannot hold, an unknown form, unknown flags.
  std::vector<uint8_t> bad = rec;
  const uint32_t huge = kMaxManifestEntries;
  std::memcpy(bad.data() + 88, &huge, 4);
  EXPECT_TRUE(ParseManifest(bad.data(), bad.size(), &rs).status().IsDataLoss());
  bad = rec;
  bad[92 + 8] = 3;
  EXPECT_TRUE(ParseManifest(bad.data(), bad.size(), &rs).status().IsDataLoss());
  bad = rec;
  bad[8] |= 2;
  EXPECT_TRUE(ParseManifest(bad.data(), bad.size(), &rs).status().IsDataLoss());
}

}  // namespace
}  // namespace dcr
