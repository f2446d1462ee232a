// A node plan's trust settings on its receiver.
#include "node/node_trust.h"

#include <cstring>
#include <ctime>
#include <map>
#include <mutex>
#include <set>

#include "dcr/manifest.h"
#include "dcr/status_macros.h"

namespace dcr::internal {

std::string SignedStatePath(const NodePlan& plan) {
  if (plan.state_dir.empty() || plan.trust_key.empty() || plan.rank == 0) return "";
  return plan.state_dir + "/rank-" + std::to_string(plan.rank) + ".signed";
}

StatusOr<std::unique_ptr<TrustedReceiver>> WithPlanTrust(const NodePlan& plan,
                                                         std::unique_ptr<Receiver> receiver,
                                                         std::unique_ptr<VersionFloor>* floor) {
  TrustOptions o;
  if (!plan.trust_key.empty()) {
    auto key = TrustKey::Load(plan.trust_key);
    if (!key.ok()) return key.status().WithContext("plan.trust_key");
    o.key = *key;
    o.run_id = plan.run_id;
    o.signed_state_path = SignedStatePath(plan);
  }
  if (!plan.version_floor_path.empty()) {
    auto f = VersionFloor::Load(plan.version_floor_path, plan.run_id);
    if (!f.ok()) return f.status().WithContext("plan.version_floor_path");
    *floor = std::make_unique<VersionFloor>(std::move(*f));
    o.floor = floor->get();
  }
  return std::make_unique<TrustedReceiver>(std::move(receiver), std::move(o));
}

namespace {

uint64_t U64At(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

bool IsFullManifestBlob(const uint8_t* data, size_t size) {
  return size >= 8 && U64At(data) == kFullManifestMark;
}

// WithPlanFullTrust's receiver.
class TrustedFullReceiver : public Receiver {
 public:
  TrustedFullReceiver(std::unique_ptr<Receiver> inner, std::shared_ptr<const TrustKey> key,
                      uint64_t run_id, uint64_t version)
      : inner_(std::move(inner)), key_(std::move(key)), run_id_(run_id), version_(version) {}

  Status Begin(const uint8_t* header, size_t size) override {
    DCR_RETURN_IF_ERROR(inner_->Begin(header, size));
    std::lock_guard<std::mutex> l(mu_);
    if (key_ != nullptr) {
      verifier_ = std::make_unique<StreamVerifier>(key_, run_id_);
      verifier_->BeginOther(header, size, version_);
    }
    signed_ = false;
    pending_.clear();
    pending_bytes_ = 0;
    applied_.clear();
    return Status();
  }

  Status ApplyRecord(const uint8_t* record, size_t size) override {
    const bool manifest = IsFullManifestBlob(record, size);
    if (key_ == nullptr) return manifest ? Status() : inner_->ApplyRecord(record, size);
    if (manifest) {
      std::vector<uint64_t> listed;
      Status s = verifier_->AddManifest(record + 8, size - 8, &listed);
      if (!s.ok()) return s.WithContext("full stream");
      std::vector<std::vector<uint8_t>> ready;
      {
        std::lock_guard<std::mutex> l(mu_);
        signed_ = true;
        for (uint64_t id : listed) {
          auto it = pending_.find(id);
          if (it == pending_.end()) continue;
          pending_bytes_ -= it->second.size();
          ready.push_back(std::move(it->second));
          pending_.erase(it);
        }
      }
      for (const auto& r : ready) DCR_RETURN_IF_ERROR(ApplyRecord(r.data(), r.size()));
      return Status();
    }
    if (size < 8) return DataLossError("full stream slice too short");
    const uint64_t offset = U64At(record);
    auto ok = verifier_->CheckChunk(offset, Sha256(record, size));
    if (!ok.ok()) return ok.status().WithContext("full stream slice @" + std::to_string(offset));
    if (!*ok) {
      std::lock_guard<std::mutex> l(mu_);
      if (pending_bytes_ + size > kMaxPendingBytes) {
        return ResourceExhaustedError(
            "full stream: more than 1 GiB of slices before the signed "
            "manifest that lists them");
      }
      pending_bytes_ += size;
      pending_[offset].assign(record, record + size);
      return Status();
    }
    DCR_RETURN_IF_ERROR(inner_->ApplyRecord(record, size));
    std::lock_guard<std::mutex> l(mu_);
    applied_.insert(offset);
    return Status();
  }

  Status Commit(const uint8_t* trailer, size_t size) override {
    if (key_ != nullptr) {
      if (size < 24) return DataLossError("full stream trailer too short");
      Trailer t;  // the slices applied, as the chunk table StreamVerifier checks
      {
        std::lock_guard<std::mutex> l(mu_);
        if (!signed_) {
          return FailedPreconditionError(
              "the full-checkpoint stream is not signed; only streams "
              "signed by " +
              key_->Fingerprint() + " are accepted");
        }
        if (U64At(trailer + 8) != applied_.size()) {
          return FailedPreconditionError(
              "full stream: the trailer names " + std::to_string(U64At(trailer + 8)) + " slices, " +
              std::to_string(applied_.size()) + " verified slices arrived");
        }
        for (uint64_t off : applied_) t.chunks.push_back(ChunkTableEntry{off, 0, 0});
      }
      Status s = verifier_->CheckTrailer(t);
      if (!s.ok()) return s.WithContext("full stream");
    }
    return inner_->Commit(trailer, size);
  }
  void Abort() override { inner_->Abort(); }
  Status MarkApplied(uint64_t chunk_id, const Hash128& version_delta) override {
    return inner_->MarkApplied(chunk_id, version_delta);
  }
  Status Verify(const Checkpoint& target) const override { return inner_->Verify(target); }
  VersionId held() const override { return inner_->held(); }
  bool in_delta() const override { return inner_->in_delta(); }
  std::vector<uint64_t> MissingChunks(const Trailer& trailer) const override {
    return inner_->MissingChunks(trailer);
  }

 private:
  static constexpr uint64_t kMaxPendingBytes = uint64_t{1} << 30;
  std::unique_ptr<Receiver> inner_;
  std::shared_ptr<const TrustKey> key_;
  const uint64_t run_id_, version_;
  std::unique_ptr<StreamVerifier> verifier_;
  std::mutex mu_;
  bool signed_ = false;                               // a manifest verified
  std::map<uint64_t, std::vector<uint8_t>> pending_;  // offset -> slice awaiting its manifest
  uint64_t pending_bytes_ = 0;
  std::set<uint64_t> applied_;  // offsets of the verified slices applied
};

}  // namespace

FullStreamSigner::FullStreamSigner(const SigningKey* key, uint64_t run_id, uint64_t version,
                                   Emit emit, uint32_t per_manifest)
    : key_(key),
      run_id_(run_id),
      version_(version),
      emit_(std::move(emit)),
      per_manifest_(std::max<uint32_t>(1, std::min(per_manifest, kMaxManifestEntries))) {}

Status FullStreamSigner::operator()(BlobKind kind, std::vector<uint8_t> blob) {
  switch (kind) {
    case BlobKind::kHeader:
      header_sha_ = Sha256(blob.data(), blob.size());
      sequence_ = 0;
      batch_.clear();
      return emit_(kind, std::move(blob));
    case BlobKind::kChunk:
      if (blob.size() < 8) return DataLossError("full stream slice too short");
      batch_.push_back(std::move(blob));
      if (batch_.size() >= per_manifest_) return Flush(false, 0);
      return Status();
    case BlobKind::kTrailer:
      if (blob.size() < 24) return DataLossError("full stream trailer too short");
      DCR_RETURN_IF_ERROR(Flush(true, U64At(blob.data() + 8)));
      return emit_(kind, std::move(blob));
  }
  return InvalidArgumentError("full stream: unknown blob kind");
}

Status FullStreamSigner::Flush(bool final, uint64_t slices) {
  Manifest m;
  m.final = final;
  m.sequence = sequence_++;
  m.run_id = run_id_;
  m.target_version = version_;
  m.header_sha256 = header_sha_;
  for (const auto& b : batch_) {
    ManifestEntry e;
    e.chunk_id = U64At(b.data());
    e.plain = Sha256(b.data(), b.size());
    m.entries.push_back(e);
  }
  if (final) m.num_chunks = slices;
  m.signer = key_->public_key();
  std::vector<uint8_t> rec = SerializeManifest(m);
  DCR_ASSIGN_OR_RETURN(m.signature, key_->Sign(rec.data(), rec.size() - kManifestSignatureBytes));
  std::copy(m.signature.begin(), m.signature.end(), rec.end() - kManifestSignatureBytes);
  std::vector<uint8_t> blob(8 + rec.size());
  std::memcpy(blob.data(), &kFullManifestMark, 8);
  std::memcpy(blob.data() + 8, rec.data(), rec.size());
  DCR_RETURN_IF_ERROR(emit_(BlobKind::kChunk, std::move(blob)));
  for (auto& b : batch_) DCR_RETURN_IF_ERROR(emit_(BlobKind::kChunk, std::move(b)));
  batch_.clear();
  return Status();
}

StatusOr<std::unique_ptr<Receiver>> WithPlanFullTrust(const NodePlan& plan,
                                                      std::unique_ptr<Receiver> receiver) {
  std::shared_ptr<const TrustKey> key;
  if (!plan.trust_key.empty()) {
    auto k = TrustKey::Load(plan.trust_key);
    if (!k.ok()) return k.status().WithContext("plan.trust_key");
    key = *k;
  }
  return std::unique_ptr<Receiver>(
      new TrustedFullReceiver(std::move(receiver), std::move(key), plan.run_id, plan.version));
}

Status AdoptPlanFloor(const NodePlan& plan, TrustedReceiver* trusted,
                      std::unique_ptr<VersionFloor>* floor) {
  std::unique_ptr<VersionFloor> loaded;
  if (!plan.version_floor_path.empty()) {
    auto f = VersionFloor::Load(plan.version_floor_path, plan.run_id);
    if (!f.ok()) return f.status().WithContext("plan.version_floor_path");
    loaded = std::make_unique<VersionFloor>(std::move(*f));
  }
  trusted->SetFloor(loaded.get());
  *floor = std::move(loaded);
  trusted->SetSignedStatePath(SignedStatePath(plan));
  return Status();
}

std::string PlanFreezeReport(const NodePlan& plan, const VersionFloor* floor, double t_start_unix) {
  if (plan.freeze_after_s <= 0) return "";
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  const double now = static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  VersionFloor none;
  return (floor != nullptr ? *floor : none).FreezeReport(now, plan.freeze_after_s, t_start_unix);
}

}  // namespace dcr::internal
