// StreamVerifier, VerifyDeltaFile and TrustedReceiver: what a receiver checks of a signed delta.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <string>

#include "dcr/commitment.h"
#include "dcr/signing.h"
#include "dcr/status_macros.h"
#include "internal/commitment_tracker.h"

namespace dcr {
namespace {

std::string U(uint64_t v) { return std::to_string(v); }

double NowUnix() {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

StreamVerifier::StreamVerifier(std::shared_ptr<const TrustKey> key, std::optional<uint64_t> run_id)
    : key_(std::move(key)), run_id_(run_id) {}

Status StreamVerifier::Begin(const uint8_t* header, size_t size) {
  size_t consumed = 0;
  DCR_ASSIGN_OR_RETURN(FileHeader h, ParseFileHeader(header, size, &consumed));
  if ((h.flags & kFlagSigned) == 0) {
    return FailedPreconditionError("delta (v" + U(h.base_version) + " -> v" + U(h.target_version) +
                                   ") is not signed; only deltas signed by " + key_->Fingerprint() +
                                   " are accepted");
  }
  std::lock_guard<std::mutex> l(mu_);
  header_ = std::move(h);
  header_sha_ = Sha256(header, consumed);
  header_bytes_.assign(header, header + consumed);
  final_manifest_bytes_.clear();
  begun_ = true;
  manifests_.clear();
  final_sequence_.reset();
  final_commitment_.reset();
  final_commitment_leaves_.clear();
  listed_.clear();
  return Status();
}

void StreamVerifier::BeginOther(const uint8_t* header, size_t size, uint64_t target_version) {
  std::lock_guard<std::mutex> l(mu_);
  header_ = FileHeader();
  header_.target_version = target_version;
  header_sha_ = Sha256(header, size);
  header_bytes_.assign(header, header + size);
  final_manifest_bytes_.clear();
  begun_ = true;
  manifests_.clear();
  final_sequence_.reset();
  final_commitment_.reset();
  final_commitment_leaves_.clear();
  listed_.clear();
}

bool StreamVerifier::complete_locked() const {
  return final_sequence_.has_value() && manifests_.size() == *final_sequence_ + 1 &&
         manifests_.rbegin()->first == *final_sequence_;
}

Status StreamVerifier::AddManifest(const uint8_t* record, size_t size,
                                   std::vector<uint64_t>* listed) {
  size_t rsize = 0;
  DCR_ASSIGN_OR_RETURN(Manifest m, ParseManifest(record, size, &rsize));
  const std::string what = "manifest " + U(m.sequence);
  if (m.signer != key_->raw()) {
    return FailedPreconditionError(what + " is signed by " + KeyFingerprint(m.signer) +
                                   ", not by the trusted key " + key_->Fingerprint());
  }
  if (!key_->Verify(record, rsize - kManifestSignatureBytes, m.signature)) {
    return FailedPreconditionError(what + ": bad signature (forged or altered bytes)");
  }
  if (m.commitment && !m.commitment_leaves.empty() &&
      CommitmentRoot(m.commitment_leaves) != *m.commitment) {
    return DataLossError(what + ": its commitment leaves do not make its commitment root " +
                         CommitmentPrefix(*m.commitment));
  }
  const Sha256Digest digest = Sha256(record, rsize);
  std::lock_guard<std::mutex> l(mu_);
  if (!begun_) return FailedPreconditionError(what + " before the delta header");
  if (run_id_.has_value() && m.run_id != *run_id_) {
    return FailedPreconditionError(what + " is signed for run " + U(m.run_id) + ", not this run (" +
                                   U(*run_id_) + ")");
  }
  if (m.header_sha256 != header_sha_ || m.base_version != header_.base_version ||
      m.target_version != header_.target_version || m.base_hash != header_.base_hash) {
    return FailedPreconditionError(
        what + " belongs to another delta (v" + U(m.base_version) + " -> v" + U(m.target_version) +
        ", header " + Sha256Hex(m.header_sha256).substr(0, 16) + ") than the one in progress (v" +
        U(header_.base_version) + " -> v" + U(header_.target_version) + ", header " +
        Sha256Hex(header_sha_).substr(0, 16) + ")");
  }
  auto seen = manifests_.find(m.sequence);
  if (seen != manifests_.end()) {
    if (seen->second == digest) return Status();  // delivered again: nothing new
    return FailedPreconditionError(what + " arrived twice with different contents");
  }
  if (m.final && final_sequence_.has_value()) {
    return FailedPreconditionError(what + " is a second final manifest");
  }
  if (final_sequence_.has_value() && m.sequence > *final_sequence_) {
    return FailedPreconditionError(what + " comes after the final manifest " + U(*final_sequence_));
  }
  for (const ManifestEntry& e : m.entries) {
    if (listed_.count(e.chunk_id)) {
      return FailedPreconditionError(what + " lists chunk " + U(e.chunk_id) +
                                     " that another manifest lists");
    }
  }
  for (size_t i = 0; i < m.entries.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (m.entries[i].chunk_id == m.entries[j].chunk_id) {
        return FailedPreconditionError(what + " lists chunk " + U(m.entries[i].chunk_id) +
                                       " twice");
      }
    }
  }
  manifests_[m.sequence] = digest;
  if (m.final) {
    final_sequence_ = m.sequence;
    final_chunks_ = m.num_chunks;
    final_target_hash_ = m.target_hash;
    final_commitment_ = m.commitment;
    final_commitment_leaves_ = std::move(m.commitment_leaves);
    final_manifest_bytes_.assign(record, record + rsize);
  }
  for (const ManifestEntry& e : m.entries) {
    listed_[e.chunk_id] = e;
    if (listed != nullptr) listed->push_back(e.chunk_id);
  }
  return Status();
}

std::optional<Sha256Digest> StreamVerifier::signed_commitment() const {
  std::lock_guard<std::mutex> l(mu_);
  return final_commitment_;
}

std::vector<Sha256Digest> StreamVerifier::signed_commitment_leaves() const {
  std::lock_guard<std::mutex> l(mu_);
  return final_commitment_leaves_;
}

std::vector<uint8_t> StreamVerifier::header_bytes() const {
  std::lock_guard<std::mutex> l(mu_);
  return header_bytes_;
}

std::vector<uint8_t> StreamVerifier::final_manifest_bytes() const {
  std::lock_guard<std::mutex> l(mu_);
  return final_manifest_bytes_;
}

Status WriteSignedState(const std::string& path, const StreamVerifier& verifier) {
  const std::vector<uint8_t> header = verifier.header_bytes();
  const std::vector<uint8_t> manifest = verifier.final_manifest_bytes();
  if (manifest.empty() || !verifier.signed_commitment()) {
    return FailedPreconditionError("no verified final manifest with a commitment to keep");
  }
  std::vector<uint8_t> out;
  auto u32 = [&out](uint32_t v) {
    const auto* b = reinterpret_cast<const uint8_t*>(&v);
    out.insert(out.end(), b, b + 4);
  };
  out.insert(out.end(), {'D', 'C', 'R', 'S'});
  u32(1);
  u32(static_cast<uint32_t>(header.size()));
  out.insert(out.end(), header.begin(), header.end());
  u32(static_cast<uint32_t>(manifest.size()));
  out.insert(out.end(), manifest.begin(), manifest.end());
  return WriteFileAtomic(path, out.data(), out.size()).WithContext("signed state");
}

StatusOr<SignedState> ReadSignedState(const std::string& path, std::shared_ptr<const TrustKey> key,
                                      std::optional<uint64_t> run_id) {
  DCR_ASSIGN_OR_RETURN(const std::vector<uint8_t> bytes, ReadFile(path));
  const std::string what = "signed state " + path;
  size_t off = 0;
  auto u32 = [&](uint32_t* v) {
    if (bytes.size() - off < 4) return false;
    std::memcpy(v, bytes.data() + off, 4);
    off += 4;
    return true;
  };
  uint32_t version = 0, header_size = 0, manifest_size = 0;
  if (bytes.size() < 4 || std::memcmp(bytes.data(), "DCRS", 4) != 0) {
    return DataLossError(what + ": bad magic");
  }
  off = 4;
  if (!u32(&version) || version != 1 || !u32(&header_size) || bytes.size() - off < header_size) {
    return DataLossError(what + ": truncated or of an unknown version");
  }
  const size_t header_at = off;
  off += header_size;
  if (!u32(&manifest_size) || bytes.size() - off != manifest_size) {
    return DataLossError(what + ": truncated or trailing bytes");
  }
  StreamVerifier v(std::move(key), run_id);
  // A delta header, or the header blob of another stream (BeginOther) is not kept here.
  DCR_RETURN_IF_ERROR(v.Begin(bytes.data() + header_at, header_size).WithContext(what));
  size_t rsize = 0;
  DCR_ASSIGN_OR_RETURN(Manifest m, ParseManifest(bytes.data() + off, manifest_size, &rsize));
  if (!m.final || rsize != manifest_size) {
    return DataLossError(what + ": not one final manifest record");
  }
  DCR_RETURN_IF_ERROR(v.AddManifest(bytes.data() + off, rsize, nullptr).WithContext(what));
  SignedState st;
  st.target_version = v.header().target_version;
  st.commitment.root = v.signed_commitment();
  st.commitment.leaves = v.signed_commitment_leaves();
  if (!st.commitment.root) {
    return FailedPreconditionError(what + ": the signed final manifest carries no commitment");
  }
  return st;
}

StatusOr<bool> StreamVerifier::CheckChunk(uint64_t chunk_id, const Sha256Digest& sha) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = listed_.find(chunk_id);
  if (it == listed_.end()) {
    if (complete_locked()) {
      return FailedPreconditionError("chunk " + U(chunk_id) +
                                     " is listed by no signed manifest of this delta");
    }
    return false;
  }
  const ManifestEntry& e = it->second;
  if (sha == e.plain || (e.has_context && sha == e.context)) return true;
  return FailedPreconditionError(
      "chunk " + U(chunk_id) + " has SHA-256 " + Sha256Hex(sha).substr(0, 16) +
      "..., not the one its signed manifest lists (" + Sha256Hex(e.plain).substr(0, 16) +
      "...): altered bytes or a chunk of another delta");
}

Status StreamVerifier::CheckTrailer(const Trailer& trailer) {
  std::lock_guard<std::mutex> l(mu_);
  if (!final_sequence_.has_value()) {
    return FailedPreconditionError("no signed final manifest: the delta cannot be committed");
  }
  if (!complete_locked()) {
    return FailedPreconditionError("a signed manifest before the final one (" +
                                   U(*final_sequence_) + ") is missing");
  }
  if (trailer.chunks.size() != final_chunks_) {
    return FailedPreconditionError("the trailer lists " + U(trailer.chunks.size()) +
                                   " chunks, the signed final manifest " + U(final_chunks_));
  }
  if (trailer.target_hash != final_target_hash_) {
    return FailedPreconditionError("the trailer's target hash " + trailer.target_hash.ToHex() +
                                   " is not the signed one " + final_target_hash_.ToHex());
  }
  if (listed_.size() != final_chunks_) {
    return FailedPreconditionError("the signed manifests list " + U(listed_.size()) +
                                   " chunks, the final manifest says " + U(final_chunks_));
  }
  for (const ChunkTableEntry& e : trailer.chunks) {
    if (!listed_.count(e.chunk_id)) {
      return FailedPreconditionError("the trailer lists chunk " + U(e.chunk_id) +
                                     " that no signed manifest lists");
    }
  }
  return Status();
}

Status VerifyDeltaFile(const DeltaReader& reader, std::shared_ptr<const TrustKey> key,
                       std::optional<uint64_t> run_id, SignedCommitment* commitment) {
  StreamVerifier v(std::move(key), run_id);
  const uint8_t* data = reader.data();
  const size_t size = reader.size();
  size_t hsize = 0;
  DCR_RETURN_IF_ERROR(ParseFileHeader(data, size, &hsize).status());
  DCR_RETURN_IF_ERROR(v.Begin(data, hsize));
  uint64_t trailer_offset = 0;
  std::memcpy(&trailer_offset, data + size - 24, 8);  // checked by DeltaReader
  std::map<uint64_t, uint64_t> verified;              // offset -> record size
  size_t off = hsize;
  while (off < trailer_offset) {
    const uint8_t* p = data + off;
    const size_t left = trailer_offset - off;
    if (IsManifestRecord(p, left)) {
      size_t rsize = 0;
      DCR_RETURN_IF_ERROR(ParseManifest(p, left, &rsize).status());
      Status s = v.AddManifest(p, rsize, nullptr);
      if (!s.ok()) return s.WithContext("at byte " + U(off));
      off += rsize;
      continue;
    }
    size_t hs = 0, rs = 0;
    auto h = ParseChunkHeader(p, left, &hs, &rs);
    if (!h.ok()) return h.status().WithContext("record at byte " + U(off));
    if (rs > left)
      return DataLossError("chunk record at byte " + U(off) + " runs past the trailer");
    DCR_ASSIGN_OR_RETURN(bool ok, v.CheckChunk(h->chunk_id, Sha256(p, rs)));
    if (!ok) {
      return FailedPreconditionError("chunk " + U(h->chunk_id) + " at byte " + U(off) +
                                     " comes before any signed manifest that lists it");
    }
    verified[off] = rs;
    off += rs;
  }
  if (off != trailer_offset) return DataLossError("records overlap the delta trailer");
  DCR_RETURN_IF_ERROR(v.CheckTrailer(reader.trailer()));
  for (const ChunkTableEntry& e : reader.trailer().chunks) {
    auto it = verified.find(e.offset);
    if (it == verified.end() || it->second != e.size) {
      return FailedPreconditionError("chunk table entry of chunk " + U(e.chunk_id) +
                                     " names bytes that are not a verified chunk record");
    }
  }
  SignedCommitment signed_commitment;
  signed_commitment.root = v.signed_commitment();
  signed_commitment.leaves = v.signed_commitment_leaves();
  if (commitment != nullptr) *commitment = std::move(signed_commitment);
  return Status();
}

// ---- TrustedReceiver ----

TrustedReceiver::TrustedReceiver(std::unique_ptr<Receiver> inner, TrustOptions options)
    : inner_(std::move(inner)), options_(std::move(options)) {}

TrustedReceiver::~TrustedReceiver() = default;

Status TrustedReceiver::Begin(const uint8_t* header, size_t size) {
  size_t consumed = 0;
  DCR_ASSIGN_OR_RETURN(FileHeader h, ParseFileHeader(header, size, &consumed));
  if (options_.floor != nullptr) DCR_RETURN_IF_ERROR(options_.floor->Check(h.target_version));
  std::unique_ptr<StreamVerifier> verifier;
  if (options_.key != nullptr) {
    verifier = std::make_unique<StreamVerifier>(options_.key, options_.run_id);
    DCR_RETURN_IF_ERROR(verifier->Begin(header, size));
  }
  DCR_RETURN_IF_ERROR(inner_->Begin(header, size));
  tracker_.reset();
  if (verifier != nullptr && options_.check_commitment && options_.hash_leaves_early) {
    // Without an inventory the leaves wait for Commit (the inner receiver parsed the header).
    StatusOr<Inventory> inventory = Inventory::FromHeader(h);
    if (inventory.ok())
      tracker_ =
          internal::CommitmentTracker::Start(*inner_, *inventory, options_.commitment_threads);
  }
  std::lock_guard<std::mutex> l(mu_);
  verifier_ = std::move(verifier);
  target_version_ = h.target_version;
  pending_.clear();
  pending_bytes_ = 0;
  return Status();
}

Status TrustedReceiver::ApplyRecord(const uint8_t* record, size_t size) {
  const bool manifest = IsManifestRecord(record, size);
  StreamVerifier* v = verifier_.get();
  if (v == nullptr) {
    if (manifest) return ParseManifest(record, size, nullptr).status();  // skipped unchecked
    return inner_->ApplyRecord(record, size);
  }
  if (manifest) {
    std::vector<uint64_t> listed;
    DCR_RETURN_IF_ERROR(v->AddManifest(record, size, &listed));
    // Chunks that arrived before this manifest: checked and applied now.
    std::vector<std::vector<uint8_t>> ready;
    {
      std::lock_guard<std::mutex> l(mu_);
      for (uint64_t id : listed) {
        auto it = pending_.find(id);
        if (it == pending_.end()) continue;
        pending_bytes_ -= it->second.size();
        ready.push_back(std::move(it->second));
        pending_.erase(it);
      }
    }
    Status first;
    for (const std::vector<uint8_t>& rec : ready) {
      Status s = ApplyRecord(rec.data(), rec.size());
      if (first.ok() && !s.ok()) first = s;
    }
    return first;
  }
  size_t hs = 0, rs = 0;
  DCR_ASSIGN_OR_RETURN(ChunkHeader h, ParseChunkHeader(record, size, &hs, &rs));
  const Sha256Digest sha = Sha256(record, size);
  DCR_ASSIGN_OR_RETURN(bool verified, v->CheckChunk(h.chunk_id, sha));
  if (verified) return ApplyInner(h, record, size);
  {
    std::lock_guard<std::mutex> l(mu_);
    if (pending_.count(h.chunk_id) == 0) {
      if (pending_bytes_ + size > options_.max_pending_bytes) {
        return ResourceExhaustedError("chunk " + std::to_string(h.chunk_id) +
                                      " arrived before its signed manifest and " +
                                      "the records waiting for theirs would exceed " +
                                      std::to_string(options_.max_pending_bytes) + " bytes");
      }
      pending_[h.chunk_id].assign(record, record + size);
      pending_bytes_ += size;
    }
  }
  // The manifest may have been verified between the check and the insertion: check again.
  DCR_ASSIGN_OR_RETURN(bool now, v->CheckChunk(h.chunk_id, sha));
  if (!now) return Status();
  std::vector<uint8_t> rec;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = pending_.find(h.chunk_id);
    if (it == pending_.end()) return Status();  // the manifest's thread took it
    pending_bytes_ -= it->second.size();
    rec = std::move(it->second);
    pending_.erase(it);
  }
  return ApplyInner(h, rec.data(), rec.size());
}

Status TrustedReceiver::ApplyInner(const ChunkHeader& h, const uint8_t* record, size_t size) {
  if (tracker_ == nullptr) return inner_->ApplyRecord(record, size);
  const internal::CommitmentTracker::Touch touch = tracker_->Before(h);
  Status s = inner_->ApplyRecord(record, size);
  tracker_->After(touch, s.ok());
  return s;
}

Status TrustedReceiver::Commit(const uint8_t* trailer, size_t size) {
  if (verifier_ != nullptr) {
    DCR_ASSIGN_OR_RETURN(Trailer t, ParseTrailer(trailer, size));
    DCR_RETURN_IF_ERROR(verifier_->CheckTrailer(t));
    std::lock_guard<std::mutex> l(mu_);
    if (!pending_.empty()) {
      return FailedPreconditionError("chunk " + std::to_string(pending_.begin()->first) +
                                     " is listed by no signed manifest of this delta");
    }
  }
  std::optional<Sha256Digest> checked;
  if (verifier_ != nullptr && options_.check_commitment) {
    const std::string refused = "commit of version " + std::to_string(target_version_) + " refused";
    const std::optional<Sha256Digest> root = verifier_->signed_commitment();
    if (!root) {
      // The chunk chain and the additive hash prove nothing a forger cannot match.
      return FailedPreconditionError(
          refused +
          ": the signed delta carries no commitment of its target (its final manifest "
          "has no commitment root), so this receiver cannot prove what it would commit");
    }
    DCR_ASSIGN_OR_RETURN(Trailer t, ParseTrailer(trailer, size));
    // Only once every chunk is applied (otherwise the inner Commit names the missing ones).
    if (inner_->MissingChunks(t).empty()) {
      const auto t0 = std::chrono::steady_clock::now();
      StatusOr<Commitment> held = tracker_ != nullptr
                                      ? tracker_->Finish(options_.commitment_threads)
                                      : HeldCommitment(*inner_, options_.commitment_threads);
      if (!held.ok()) {
        return held.status().WithContext(refused + ": the commitment of the held version");
      }
      if (tracker_ != nullptr) {
        last_pass_ = tracker_->stats();
      } else {
        last_pass_ = CommitmentPassStats();
        last_pass_.leaves = last_pass_.tail_leaves = last_pass_.commit_hashed_leaves =
            held->leaves.size();
        last_pass_.tail_seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
      const std::vector<Sha256Digest> leaves = verifier_->signed_commitment_leaves();
      Status m = MatchCommitment(*held, *root, &leaves);
      if (!m.ok()) return m.WithContext(refused);
      checked = root;
    }
  }
  if (checked && !options_.signed_state_path.empty()) {
    // Durable before the inner commit makes the version durable: whatever instant the process
    // ends at, a restart that finds the version committed finds what proves it. A state written
    // for a version whose commit then fails proves nothing else (it names its own version).
    Status s = WriteSignedState(options_.signed_state_path, *verifier_);
    if (!s.ok()) {
      return s.WithContext("commit of version " + std::to_string(target_version_) +
                           " refused: its signed state is not written");
    }
  }
  DCR_RETURN_IF_ERROR(inner_->Commit(trailer, size));
  verifier_.reset();
  {
    std::lock_guard<std::mutex> l(mu_);
    committed_commitment_ = checked;
  }
  tracker_.reset();  // the delta is committed: its leaves are done with
  if (options_.floor != nullptr) {
    Status s = options_.floor->Record(target_version_, NowUnix());
    if (!s.ok())
      return s.WithContext("committed version " + std::to_string(target_version_) +
                           " but could not record the version floor");
  }
  return Status();
}

std::optional<Sha256Digest> TrustedReceiver::committed_commitment() const {
  std::lock_guard<std::mutex> l(mu_);
  return committed_commitment_;
}

CommitmentPassStats TrustedReceiver::last_commitment_pass() const { return last_pass_; }

void TrustedReceiver::Abort() {
  inner_->Abort();
  verifier_.reset();
  tracker_.reset();
  std::lock_guard<std::mutex> l(mu_);
  pending_.clear();
  pending_bytes_ = 0;
}

Status TrustedReceiver::ApplyDerived(const uint8_t* source, size_t source_size,
                                     const uint8_t* derived, size_t derived_size) {
  size_t hs = 0, rs = 0;
  DCR_ASSIGN_OR_RETURN(ChunkHeader src, ParseChunkHeader(source, source_size, &hs, &rs));
  DCR_ASSIGN_OR_RETURN(ChunkHeader der, ParseChunkHeader(derived, derived_size, &hs, &rs));
  if (src.chunk_id != der.chunk_id) {
    return InvalidArgumentError("a record derived from chunk " + std::to_string(src.chunk_id) +
                                " names chunk " + std::to_string(der.chunk_id));
  }
  if (verifier_ != nullptr) {
    DCR_ASSIGN_OR_RETURN(bool verified,
                         verifier_->CheckChunk(src.chunk_id, Sha256(source, source_size)));
    if (!verified) {
      return FailedPreconditionError("chunk " + std::to_string(src.chunk_id) +
                                     " is listed by no verified manifest yet: its repair waits");
    }
  }
  return ApplyInner(der, derived, derived_size);
}

Status TrustedReceiver::MarkApplied(uint64_t chunk_id, const Hash128& version_delta) {
  return inner_->MarkApplied(chunk_id, version_delta);
}

}  // namespace dcr
