// Signed deltas: the trainer's Ed25519 key signs manifest records (dcr/manifest.h, format version
// 6) that bind the SHA-256 of every chunk record; receivers holding the trainer's public key apply
// a chunk only once a verified manifest lists its hash, and commit only what the signed final
// manifest describes. Receivers also keep a version floor (the highest version they committed) so
// that an older, correctly signed delta is refused (rollback), and say how long they have seen no
// new version (freeze). core/docs/security.md states the threat model.
//
// Stream layout of a signed delta: header (kFlagSigned), then per batch of up to
// SignOptions::chunks_per_manifest chunks a manifest record followed by those chunks, then the
// trailer. The last manifest is final: it also names the delta's chunk count and target hash.
// Relays forward the bytes as they come (cut-through); only receivers verify.
//
// Keys are PEM files: the private key PKCS#8 (created 0600, refused when group or others can read
// it), the public key SubjectPublicKeyInfo.
//
// Thread safety: SigningKey and TrustKey are immutable after Load and may be shared; SigningSink
// is called from one thread; TrustedReceiver follows the Receiver contract (ApplyRecord may run
// concurrently for distinct records); StreamVerifier is thread-safe; VersionFloor is not.
#ifndef DCR_CORE_INCLUDE_DCR_SIGNING_H_
#define DCR_CORE_INCLUDE_DCR_SIGNING_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "dcr/delta.h"
#include "dcr/manifest.h"
#include "dcr/receiver.h"
#include "dcr/status.h"
#include "dcr/statusor.h"

namespace dcr {

namespace internal {
class CommitmentTracker;
}  // namespace internal

// SHA-256 of [data, data + size).
Sha256Digest Sha256(const uint8_t* data, size_t size);
// 64 lowercase hex digits.
std::string Sha256Hex(const Sha256Digest& d);

// The trainer's private signing key.
class SigningKey {
 public:
  ~SigningKey();
  // Loads a PEM Ed25519 private key. Errors: kNotFound, kFailedPrecondition (group or others can
  // read the file; not an Ed25519 key), kInvalidArgument (unparsable PEM).
  static StatusOr<std::unique_ptr<SigningKey>> Load(const std::string& path);
  // A fresh key in memory (not written anywhere).
  static StatusOr<std::unique_ptr<SigningKey>> Generate();
  // The key of a 32-byte Ed25519 seed (RFC 8032's private key): deterministic keys for golden
  // files and tests.
  static StatusOr<std::unique_ptr<SigningKey>> FromSeed(const std::array<uint8_t, 32>& seed);
  // Ed25519 signature of the bytes. kInternal only if OpenSSL fails.
  StatusOr<Ed25519Signature> Sign(const uint8_t* data, size_t size) const;
  const Ed25519PublicKey& public_key() const { return public_; }
  // Writes the key (0600) and its public key (0644) as PEM files, each created exclusively
  // (O_EXCL | O_NOFOLLOW): an existing file is kFailedPrecondition naming it.
  Status Write(const std::string& key_path, const std::string& public_path) const;

 private:
  SigningKey() = default;
  void* pkey_ = nullptr;  // EVP_PKEY
  Ed25519PublicKey public_{};
};

// A public key that receivers trust.
class TrustKey {
 public:
  ~TrustKey();
  // Loads a PEM Ed25519 public key (or the public half of a PEM private key). Errors: kNotFound,
  // kInvalidArgument (unparsable), kFailedPrecondition (not Ed25519).
  static StatusOr<std::shared_ptr<const TrustKey>> Load(const std::string& path);
  static StatusOr<std::shared_ptr<const TrustKey>> FromRaw(const Ed25519PublicKey& raw);
  // Whether `signature` is this key's Ed25519 signature of the bytes.
  bool Verify(const uint8_t* data, size_t size, const Ed25519Signature& signature) const;
  const Ed25519PublicKey& raw() const { return raw_; }
  // "ed25519:" and the first 16 hex digits of the raw key, as errors name keys.
  std::string Fingerprint() const;

 private:
  TrustKey() = default;
  void* pkey_ = nullptr;  // EVP_PKEY
  Ed25519PublicKey raw_{};
};

// "ed25519:" and the first 16 hex digits of `raw`.
std::string KeyFingerprint(const Ed25519PublicKey& raw);

struct SignOptions {
  // The run the delta is meant for (0 = none named); a receiver that knows its run refuses a
  // manifest of another. Default 0.
  uint64_t run_id = 0;
  // Chunks per manifest record (>= 1). The sink holds up to this many chunk records before it
  // signs and passes them on: the memory and first-byte latency of signing. Default 32.
  uint32_t chunks_per_manifest = 32;
  // The commitment root of the target (dcr/commitment.h) that the final manifest carries
  // (kManifestFlagCommitment), with its leaves (empty = root only). Unset (the default) = none:
  // a receiver that requires a commitment refuses such a delta.
  std::optional<Sha256Digest> commitment;
  std::vector<Sha256Digest> commitment_leaves;
};

// A DeltaSink that turns the unsigned stream a builder produces into a signed one on `inner`: the
// header with kFlagSigned (format version 6), a signed manifest before each batch of chunks, the
// trailer's chunk table with the records' new offsets. Each manifest entry lists the SHA-256 of
// the chunk's plain record and, for a context-coded chunk handed over with its plain form
// (OnContextChunk, as BuildDelta does), also the SHA-256 of the context-coded record (forms = 2):
// a receiver accepts either, so a relay that decodes the context form to the plain one (for a
// subtree without the base bits) forwards a chunk that still verifies. A context-coded chunk that
// arrives through OnChunk alone is listed with its own SHA-256 in the plain slot (forms = 1).
// `key` and `inner` must outlive the sink.
// Errors: the inner sink's, kDataLoss for a header or trailer that does not parse,
// kInvalidArgument for a stream that already has manifests.
class SigningSink : public DeltaSink {
 public:
  SigningSink(const SigningKey* key, SignOptions options, DeltaSink* inner);
  Status OnHeader(const std::vector<uint8_t>& bytes) override;
  Status OnChunk(const ChunkHeader& header, const std::vector<uint8_t>& bytes) override;
  Status OnContextChunk(const ChunkHeader& header, const std::vector<uint8_t>& bytes,
                        const std::vector<uint8_t>& plain) override;
  Status OnManifest(const std::vector<uint8_t>& bytes) override;
  Status OnTrailer(const std::vector<uint8_t>& bytes) override;

 private:
  struct Held {
    ChunkHeader header;
    std::vector<uint8_t> bytes;
    std::optional<Sha256Digest> plain_sha;  // set for a context-coded record with its plain form
  };
  Status Hold(Held held);
  Status Flush(bool final, const Trailer* trailer);

  const SigningKey* key_;
  SignOptions options_;
  DeltaSink* inner_;
  FileHeader header_;
  Sha256Digest header_sha_{};
  uint32_t sequence_ = 0;
  uint64_t offset_ = 0;  // bytes passed to inner_
  std::vector<Held> batch_;
  std::map<uint64_t, ChunkTableEntry> placed_;  // chunk id -> where it went
};

// The checks of one signed stream, record by record: what TrustedReceiver and VerifyDeltaFile
// run. Thread-safe.
class StreamVerifier {
 public:
  // `key`: the trusted signer. `run_id`: when set, manifests must name this run.
  StreamVerifier(std::shared_ptr<const TrustKey> key, std::optional<uint64_t> run_id);

  // Starts a stream whose header bytes are [header, header + size). kFailedPrecondition for an
  // unsigned delta (no kFlagSigned), kDataLoss for a header that does not parse.
  Status Begin(const uint8_t* header, size_t size);
  // Starts a stream that is not a delta, whose header bytes are [header, header + size): the
  // full-checkpoint reference stream (FullStreamBlobs) as the node signs it. Its manifests must
  // name base version 0, a zero base hash, `target_version` and the SHA-256 of the header bytes;
  // chunk ids are what that stream makes them (slice offsets).
  void BeginOther(const uint8_t* header, size_t size, uint64_t target_version);
  // Verifies a manifest record: signed by the trusted key, for this run, this header and its
  // versions, a sequence number not seen with other contents. Appends the chunk ids it newly
  // lists to `listed`. Errors: kFailedPrecondition (another signer, a bad signature, another
  // run, header or version, a chunk listed twice), kDataLoss (malformed).
  Status AddManifest(const uint8_t* record, size_t size, std::vector<uint64_t>* listed);
  // Whether chunk `chunk_id` with record hash `sha` may be applied: true when a verified manifest
  // lists it with this hash (plain or context form); false when no manifest lists it yet (one may
  // still come). kFailedPrecondition when the listed hash differs (altered bytes, a chunk of
  // another delta) or when every manifest has arrived and none lists the chunk.
  StatusOr<bool> CheckChunk(uint64_t chunk_id, const Sha256Digest& sha);
  // The trailer agrees with the final manifest (chunk count, target hash) and every chunk of its
  // table is listed. kFailedPrecondition otherwise (no final manifest yet, a manifest missing).
  Status CheckTrailer(const Trailer& trailer);

  const FileHeader& header() const { return header_; }
  // The commitment root (and its leaves; empty when not carried) the verified final manifest
  // signed; nullopt before it or when it carries none.
  std::optional<Sha256Digest> signed_commitment() const;
  std::vector<Sha256Digest> signed_commitment_leaves() const;
  // The stream's header bytes (Begin) and its verified final manifest record (empty before it):
  // with the trusted key, what proves the commitment again later (WriteSignedState).
  std::vector<uint8_t> header_bytes() const;
  std::vector<uint8_t> final_manifest_bytes() const;

 private:
  bool complete_locked() const;

  std::shared_ptr<const TrustKey> key_;
  std::optional<uint64_t> run_id_;
  mutable std::mutex mu_;
  bool begun_ = false;
  FileHeader header_;
  Sha256Digest header_sha_{};
  std::map<uint32_t, Sha256Digest> manifests_;  // sequence -> SHA-256 of its record
  std::optional<uint32_t> final_sequence_;
  uint64_t final_chunks_ = 0;
  Hash128 final_target_hash_;
  std::vector<uint8_t> header_bytes_;
  std::vector<uint8_t> final_manifest_bytes_;
  std::optional<Sha256Digest> final_commitment_;
  std::vector<Sha256Digest> final_commitment_leaves_;
  std::map<uint64_t, ManifestEntry> listed_;
};

// What VerifyDeltaFile proved: the commitment the final manifest signed (unset when it carries
// none) and its leaves (empty when not carried).
struct SignedCommitment {
  std::optional<Sha256Digest> root;
  std::vector<Sha256Digest> leaves;
};

// Checks every manifest and chunk of the signed delta in `reader` (a whole stream: each chunk
// after a manifest that lists it; the chunk table naming only those records; the trailer as the
// final manifest says). kFailedPrecondition naming what failed: unsigned, another signer, a bad
// signature, an altered or foreign chunk, another run; kDataLoss for malformed records, and for
// commitment leaves that do not make the signed root. `commitment`, when not null, receives the
// signed commitment of the target.
Status VerifyDeltaFile(const DeltaReader& reader, std::shared_ptr<const TrustKey> key,
                       std::optional<uint64_t> run_id = std::nullopt,
                       SignedCommitment* commitment = nullptr);

// The signed state of a committed version: the header of the delta it was committed under and
// that delta's signed final manifest, kept beside what a node holds (file "DCRS", u32 1, u32
// header size, header, u32 manifest size, manifest; written atomically) so that a restarted node
// proves its held checkpoint again, by the trainer's signature, before it serves or reports it.
struct SignedState {
  uint64_t target_version = 0;
  SignedCommitment commitment;  // root always set
};
// Writes the state of `verifier`'s stream (a final manifest with a commitment verified).
// kFailedPrecondition when it has none; errno errors naming the file.
Status WriteSignedState(const std::string& path, const StreamVerifier& verifier);
// Reads the signed state at `path` and verifies it again with `key` (and `run_id` when set):
// header and final manifest parse, the manifest is signed by the key for that header and
// carries a commitment. Errors: kNotFound (no file), kDataLoss (malformed),
// kFailedPrecondition (the signature checks of StreamVerifier, no commitment).
StatusOr<SignedState> ReadSignedState(const std::string& path, std::shared_ptr<const TrustKey> key,
                                      std::optional<uint64_t> run_id);

// The highest version a receiver committed in one deployment, persisted in a small file beside
// its state ("dcr-version-floor 2", "deployment <16 hex digits>", "version N", "committed_unix
// T", one per line), rewritten atomically (temporary + fsync + rename). A missing file is version
// 0, never committed. A file of another deployment (its deployment line names another id; a
// file of format 1 names none) is a fresh start for this one: version 0, replaced by the first
// Record. Versions never repeat within a deployment, so a floor of another deployment says
// nothing about this one's versions.
class VersionFloor {
 public:
  // `deployment`: the deployment id as a manifest names it (Manifest::run_id); 0 = none named
  // (the file's floor holds whatever deployment it names). Errors: kDataLoss for a file that
  // does not parse, errno errors reading it.
  static StatusOr<VersionFloor> Load(const std::string& path, uint64_t deployment = 0);

  // The deployment the floor belongs to (0: none named).
  uint64_t deployment() const { return deployment_; }
  // Whether the file held the floor of another deployment (ignored: a fresh start).
  bool other_deployment() const { return other_deployment_; }
  uint64_t version() const { return version_; }
  // Wall-clock seconds (CLOCK_REALTIME) of the last Record; 0 = never.
  double committed_unix() const { return committed_unix_; }
  // Refuses (kFailedPrecondition, "rollback") a delta whose target version is below the floor;
  // the floor's own version may be delivered again (a restarted sender, a repair).
  Status Check(uint64_t target_version) const;
  // Records `version` as committed at `now_unix` when it is at least the floor.
  Status Record(uint64_t version, double now_unix);
  // Freeze: when no version was committed for more than `limit_s` seconds before `now_unix`
  // (and one was committed at all, or `since_unix` > 0 is when waiting started), a message
  // saying so; empty otherwise. limit_s <= 0: never.
  std::string FreezeReport(double now_unix, double limit_s, double since_unix) const;

 private:
  std::string path_;
  uint64_t deployment_ = 0;
  bool other_deployment_ = false;
  uint64_t version_ = 0;
  double committed_unix_ = 0;
};

// How the commitment check of a TrustedReceiver's Commit was spent: the storage's leaves, those
// hashed before Commit began (TrustOptions::hash_leaves_early) and those left to it (leaves no
// applied chunk completed, those still queued for or being hashed by the pool, and early
// digests a later write to their leaf dropped: `rehashed_leaves`), the thread-seconds of early
// hashing and the wall seconds of Commit's pass (waiting for the pool, the remaining leaves and
// the root). Of the tail, `commit_hashed_leaves` were hashed by Commit itself (no applied chunk
// completed them, or a write dropped their early digest): unlike the pool's progress, a function
// of the records applied, not of timing.
struct CommitmentPassStats {
  uint64_t leaves = 0;
  uint64_t early_leaves = 0;
  uint64_t tail_leaves = 0;
  uint64_t commit_hashed_leaves = 0;
  uint64_t rehashed_leaves = 0;
  double early_seconds = 0;
  double tail_seconds = 0;
};

struct TrustOptions {
  // The trusted signer; null = unsigned deltas are accepted and manifest records are skipped
  // unchecked. Default null.
  std::shared_ptr<const TrustKey> key;
  // When set, manifests must name this run. Default unset.
  std::optional<uint64_t> run_id;
  // When set, a delta below its version is refused at Begin and the version is recorded after
  // each successful Commit. Must outlive the receiver. Default null.
  VersionFloor* floor = nullptr;
  // Chunk records that arrive before the manifest listing them (concurrent or reordered
  // delivery) are held in memory up to this many bytes; beyond it kResourceExhausted. Default
  // 1 GiB.
  uint64_t max_pending_bytes = uint64_t{1} << 30;
  // With a key, Commit recomputes the commitment (dcr/commitment.h) of what the inner receiver
  // holds after apply (HeldCommitment: host or device storage) and refuses the commit unless it
  // is the root the final manifest signed, naming the first wrong range; a signed delta without
  // a commitment, and storage whose commitment cannot be computed (e.g. a serving replica), are
  // refused (kFailedPrecondition / kUnimplemented). False: the chain alone. Default true.
  bool check_commitment = true;
  // Workers for that pass, and for the early hashing's pool (0 = hardware concurrency). Default
  // 0.
  int commitment_threads = 0;
  // With check_commitment, each leaf of the storage is hashed as soon as its bytes are final (the
  // chunks applied so far cover it and no chunk touching it is being applied), on a pool of
  // commitment_threads workers beside the apply threads; Commit waits for the pool and hashes
  // only the leaves left (those the last chunks completed and the pool has not reached, those
  // no chunk touched, and any that a write reached after its early hash). Chunk ranges come from
  // the records' segments. The root, the errors and the first wrong range named are those of
  // hashing everything at Commit. Host and device storage; other storage is hashed at Commit.
  // False: every leaf at Commit. Default true.
  bool hash_leaves_early = true;
  // When set, each Commit whose commitment was checked writes the delta's signed state
  // (WriteSignedState, durable) there before the inner Commit. Default empty: none.
  std::string signed_state_path;
};

// A Receiver decorator that applies only what the trusted key signed (see the file comment):
// Begin refuses an unsigned delta and one below the version floor; ApplyRecord verifies a
// manifest record or a chunk's SHA-256 against it before the inner receiver sees the chunk (a
// chunk that arrived before its manifest waits, and is applied when the manifest is); Commit
// refuses a trailer the final manifest does not describe, a final manifest without a commitment
// and storage whose commitment is not the signed root (TrustOptions::check_commitment; naming the
// first wrong range; the delta stays in progress, as after any refused Commit), commits the inner
// receiver, then records the version floor. Refused records leave the inner receiver untouched.
// Without a key it forwards chunks as they come and skips manifest records (an unsigned receiver
// of a signed stream), still checking the floor.
class TrustedReceiver : public Receiver {
 public:
  TrustedReceiver(std::unique_ptr<Receiver> inner, TrustOptions options);
  ~TrustedReceiver() override;

  Status Begin(const uint8_t* header, size_t size) override;
  Status ApplyRecord(const uint8_t* record, size_t size) override;
  Status Commit(const uint8_t* trailer, size_t size) override;
  void Abort() override;
  Status MarkApplied(uint64_t chunk_id, const Hash128& version_delta) override;
  // Applies `derived`, a record the receiving node built itself from the chunk record `source`
  // (the overwrite form that repairs a doubtful chunk, OverwriteChunkFromRelative), to the inner
  // receiver, once `source` is verified against a signed manifest of this delta and `derived`
  // names the same chunk. `derived` is not listed by any manifest: what makes it trusted is that
  // its values come from `source` and the receiver's own base, and the inner receiver checks its
  // target hashes, which it copies from `source`. Errors: kFailedPrecondition when `source` is
  // not (yet) covered by a verified manifest or its hash differs, kInvalidArgument when the two
  // records name different chunks, and the inner receiver's.
  Status ApplyDerived(const uint8_t* source, size_t source_size, const uint8_t* derived,
                      size_t derived_size);
  Status Verify(const Checkpoint& target) const override { return inner_->Verify(target); }
  VersionId held() const override { return inner_->held(); }
  bool in_delta() const override { return inner_->in_delta(); }
  std::vector<uint64_t> MissingChunks(const Trailer& trailer) const override {
    return inner_->MissingChunks(trailer);
  }
  Receiver* inner() const { return inner_.get(); }
  const Receiver* storage() const override { return inner_->storage(); }
  // Points the version floor at `floor` (null: none), for a receiver kept across the versions of
  // a long-lived node whose floor object changes owner. REQUIRES: no delta in progress.
  void SetFloor(VersionFloor* floor) { options_.floor = floor; }
  // Points TrustOptions::signed_state_path at `path` (empty: none). REQUIRES: no delta in
  // progress.
  void SetSignedStatePath(const std::string& path) { options_.signed_state_path = path; }
  // The commitment root the last successful Commit checked the storage against (the trainer's
  // signed one); nullopt when that delta signed none or the storage could not be hashed.
  std::optional<Sha256Digest> committed_commitment() const;
  // How the commitment check of the last Commit that ran it was spent (zeros before one).
  CommitmentPassStats last_commitment_pass() const;

 private:
  std::unique_ptr<Receiver> inner_;
  TrustOptions options_;
  std::unique_ptr<StreamVerifier> verifier_;  // the delta in progress (with a key)
  uint64_t target_version_ = 0;
  mutable std::mutex mu_;
  std::map<uint64_t, std::vector<uint8_t>> pending_;  // chunk id -> record awaiting its manifest
  uint64_t pending_bytes_ = 0;
  std::optional<Sha256Digest> committed_commitment_;
  // The delta in progress's leaves hashed as they become final (hash_leaves_early); null when
  // none is or the storage cannot be read that way.
  std::unique_ptr<internal::CommitmentTracker> tracker_;
  CommitmentPassStats last_pass_;
  // inner_->ApplyRecord of the chunk record whose parsed header is `h`, announced to tracker_.
  Status ApplyInner(const ChunkHeader& h, const uint8_t* record, size_t size);
};

}  // namespace dcr

#endif  // DCR_CORE_INCLUDE_DCR_SIGNING_H_
