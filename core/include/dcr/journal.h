// The receiver journal: a durable record of which chunks of which delta a receiver has applied.
//
// XOR and ulp payloads are not idempotent: replaying a chunk that was half applied flips bits back.
// The journal makes the receiver's state recoverable after a process restart:
//   * before a chunk is applied, a ChunkBegin record (chunk id, value mode, the chunk's base and
//     target change hashes) is appended and fsynced (write-ahead);
//   * after it is applied, a ChunkEnd record is appended;
//   * when every chunk of the delta is applied and the version is proven, a Committed record.
// On reopen, records are replayed: a chunk with a Begin and no End is *doubtful* (its bits may be
// any mix of base and target at its changed positions). A doubtful chunk is repaired only with its
// overwrite form (absolute target values at the same positions; versioning.h), never by replaying
// the relative chunk. JournaledReceiver enforces that.
//
// File format (all integers little-endian):
//   file header: "DCRJRNL\0" (8) | u32 journal_version (=1) | u32 reserved (0)
//   records:     u32 payload_size | u8 type | payload (payload_size bytes)
//                | u64 checksum = XXH3-64(payload_size, type, payload)
// A record that is incomplete or whose checksum does not match ends the journal: it and any
// bytes after it are the torn tail of an interrupted append and are truncated on open (counted in
// JournalState::torn_bytes). Records are only appended; Compact() rewrites the file atomically
// (temp + fsync + rename + directory fsync) with one snapshot of the current state.
//
// Thread safety: ReceiverJournal is thread-safe (one internal mutex); JournaledReceiver is as
// receiver.h says (ApplyRecord concurrently for distinct chunks of one delta).
#ifndef DCR_CORE_INCLUDE_DCR_JOURNAL_H_
#define DCR_CORE_INCLUDE_DCR_JOURNAL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "dcr/apply.h"
#include "dcr/checkpoint.h"
#include "dcr/delta.h"
#include "dcr/format.h"
#include "dcr/receiver.h"
#include "dcr/status.h"
#include "dcr/statusor.h"

namespace dcr {

// Identity of one delta: base version -> target version number, plus a digest of its header bytes
// (inventory, grid) so two different deltas with the same numbers are never confused. The target
// content hash is known once the trailer arrives.
struct DeltaRef {
  VersionId base;  // base.hash is zero for a full frame (no base)
  uint64_t target_number = 0;
  uint64_t header_digest = 0;  // XXH3-64 of the serialized FileHeader
  bool full_frame = false;     // kFlagNoBase: the delta rebuilds the whole checkpoint
  bool operator==(const DeltaRef& o) const {
    return base == o.base && target_number == o.target_number && header_digest == o.header_digest &&
           full_frame == o.full_frame;
  }
};

// Builds the DeltaRef of a parsed header (digest over SerializeFileHeader(header)).
DeltaRef DeltaRefFromHeader(const FileHeader& header);

// What the journal knows about one chunk of the in-flight delta.
struct JournalChunk {
  ValueMode mode = ValueMode::kXor;  // mode of the last application begun
  Hash128 version_delta;             // of the delta's chunk: its move of the version hash (ledger)
  Hash128 target_change_hash;        // to match an overwrite form against the interrupted chunk
  Hash128 target_range_hash;
  bool absolute_repair = false;  // the chunk was (last) applied through its overwrite form
  bool was_doubtful = false;     // it was already doubtful when this application began
};

enum class JournalChunkState { kNone, kApplied, kDoubtful };

// The replayed state of a journal.
struct JournalState {
  std::optional<VersionId> committed;         // last committed version; none for a fresh receiver
  std::optional<DeltaRef> in_flight;          // delta being applied since the last commit
  std::map<uint64_t, JournalChunk> applied;   // chunk id -> applied (Begin and End recorded)
  std::map<uint64_t, JournalChunk> doubtful;  // chunk id -> begun, not ended (needs overwrite)
  std::set<uint64_t> failed;  // begun and cleanly refused by the applier (not written)
  uint64_t records = 0;       // records replayed + appended
  uint64_t torn_bytes = 0;    // bytes truncated from the tail on open
  uint64_t commits = 0;       // Committed records seen (replayed + appended)
};

struct JournalOptions {
  // fsync after ChunkEnd records too. Default false: a lost End only makes a chunk doubtful, which
  // is repaired by its overwrite form (safe); Begin and Committed records are always fsynced.
  bool sync_end = false;
  // Compact() automatically after a commit when the file exceeds this many bytes. Default 1 MiB.
  uint64_t compact_bytes = uint64_t{1} << 20;
  // Group commit of ChunkBegin records: each is written (write(2)) before its chunk is applied,
  // in order, but fsynced with its group: by the next record that is always fsynced (BeginDelta,
  // Committed, Abandon) or once `group_records` records are unsynced, so a delta of many chunks
  // costs a few fsyncs instead of one per chunk. A killed process loses no written record (the
  // kernel holds them), so the write-ahead rule holds against process death; a machine crash
  // may lose the unsynced tail, which is why storage that must survive one (dcr-node's mapped
  // storage) is treated as lost after a reboot while a delta is in flight. Default false (every
  // ChunkBegin fsynced).
  bool group_commit = false;
  uint64_t group_records = 1024;
};

class ReceiverJournal {
 public:
  // Opens (creating if absent) the journal at `path`, replays it and truncates a torn tail.
  // Errors: kDataLoss (bad file header, a record that contradicts the state machine), errno errors.
  static StatusOr<std::unique_ptr<ReceiverJournal>> Open(const std::string& path,
                                                         const JournalOptions& options = {});
  // Replays journal bytes without a file (used by tests and the fuzzer). Same rules as Open; the
  // torn tail is reported in torn_bytes.
  static StatusOr<JournalState> Replay(const uint8_t* data, size_t size);

  ~ReceiverJournal();
  ReceiverJournal(const ReceiverJournal&) = delete;
  ReceiverJournal& operator=(const ReceiverJournal&) = delete;

  // A copy of the whole replayed state (O(chunks)).
  JournalState state() const;
  // The state of one chunk of the in-flight delta; fills `out` unless kNone.
  JournalChunkState Lookup(uint64_t chunk_id, JournalChunk* out) const;
  std::optional<VersionId> committed() const;
  std::optional<DeltaRef> in_flight() const;
  const std::string& path() const { return path_; }

  // Records that the receiver's storage holds version `v` whole (after a dense load, a full frame
  // or a proven delta). Clears the in-flight delta. fsynced.
  Status RecordCommitted(const VersionId& v);
  // Starts delta `d`. REQUIRES: no other delta in flight (kFailedPrecondition), and d.base equals
  // the committed version unless d.full_frame (kFailedPrecondition). Re-beginning the same delta
  // is a no-op (recovery). fsynced.
  Status BeginDelta(const DeltaRef& d);
  // Write-ahead record for one chunk application. fsynced before returning (with
  // JournalOptions::group_commit: written before returning, fsynced with its group).
  // REQUIRES: a delta in flight.
  Status BeginChunk(uint64_t chunk_id, const JournalChunk& chunk);
  // The chunk is fully applied.
  Status EndChunk(uint64_t chunk_id);
  // The applier refused the chunk and left nothing written (e.g. a base-check failure).
  Status FailChunk(uint64_t chunk_id);
  // The in-flight delta is abandoned because the storage was reloaded from the committed version
  // (process memory lost): every chunk of it counts as not applied. fsynced.
  Status AbandonDelta();
  // Rewrites the file as a snapshot of the current state (atomic).
  Status Compact();
  // Fault injection: from now on every append fails with kAborted and writes nothing, as if the
  // process had been killed at this instant (the file keeps exactly what was written so far).
  void Freeze();

 private:
  ReceiverJournal() = default;
  Status AppendLocked(uint8_t type, const std::vector<uint8_t>& payload, bool sync);
  Status CompactLocked();

  std::string path_;
  JournalOptions options_;
  int fd_ = -1;
  uint64_t size_ = 0;
  bool frozen_ = false;
  uint64_t unsynced_ = 0;  // group commit: records written since the last fsync
  mutable std::mutex mu_;
  JournalState state_;
};

// Told by JournaledReceiver when storage stops and starts holding a whole version. A serving
// runtime must not serve between ApplyStarted and VersionWhole (the storage is mixed).
class ServingGate {
 public:
  virtual ~ServingGate() = default;
  virtual void ApplyStarted(const DeltaRef& delta) = 0;
  virtual void VersionWhole(const VersionId& v) = 0;
};

struct JournaledApplyStats {
  uint64_t applied = 0;   // chunks applied through the inner receiver (relative or absolute)
  uint64_t repaired = 0;  // doubtful chunks repaired with their overwrite form
  uint64_t duplicates_skipped = 0;  // chunks already applied (duplicates), skipped
  uint64_t refused = 0;  // chunks refused (relative form of a doubtful chunk, wrong delta)
};

// A Receiver decorator that journals every chunk around an inner Receiver (BufferReceiver, a
// serving replica, a device receiver) and keeps the version ledger:
//   ledger = base_hash + sum(version_delta) over applied chunks   (identity terms for a full frame)
// hash.h's additivity makes ledger == target_hash a proof of the target version when every chunk
// was verified by the inner receiver (relative chunks are base-checked, and every chunk's target
// bits are checked against its target_change_hash, before anything of it stays written).
//
// Rules: a chunk already applied is skipped (duplicate delivery is harmless); a doubtful chunk is
// accepted only in its absolute (overwrite) form, whose target_change_hash and target_range_hash
// must equal the ones recorded at its start (same positions, same target bits); the relative form
// of a doubtful chunk is refused with kFailedPrecondition naming the chunk.
//
// Restart: a JournaledReceiver over a reopened journal and an inner receiver over storage that
// survived (a mapped file, device memory) resumes the in-flight delta when Begin is called with
// its header again: the inner receiver is begun and told (MarkApplied) of every chunk the journal
// records as applied. Storage that did not survive is reloaded from the committed version and
// the delta abandoned (ReceiverJournal::AbandonDelta) before the receiver is built.
//
// Errors beyond receiver.h's: Begin refuses a base other than the journal's committed version
// and a different delta while one is in flight (kFailedPrecondition, "refused"); Commit refuses
// doubtful chunks (kFailedPrecondition, listed) and a ledger other than the target hash
// (kDataLoss); journal I/O errors are returned as they are.
class JournaledReceiver : public Receiver {
 public:
  // Neither pointer is owned; all must outlive this object. `gate` may be null.
  // REQUIRES: inner->held() is the journal's committed version and inner is not in a delta.
  JournaledReceiver(Receiver* inner, ReceiverJournal* journal, ServingGate* gate = nullptr);

  Status Begin(const uint8_t* header, size_t size) override;
  Status ApplyRecord(const uint8_t* record, size_t size) override;
  // After the inner receiver commits, records Committed durably and tells the gate the version
  // is whole.
  Status Commit(const uint8_t* trailer, size_t size) override;
  // Aborts the inner receiver; the journal keeps the in-flight delta (a Begin of the same delta
  // resumes it).
  void Abort() override;
  // Journals the chunk as applied (Begin and End records), then tells the inner receiver.
  Status MarkApplied(uint64_t chunk_id, const Hash128& version_delta) override;
  Status Verify(const Checkpoint& target) const override { return inner_->Verify(target); }
  // The inner receiver's storage (what a commitment is computed over).
  const Receiver* storage() const override { return inner_->storage(); }
  // The journal's committed version (the inner receiver's if the journal has none).
  VersionId held() const override;
  bool in_delta() const override;
  // From the journal: chunks of `trailer` not applied (including doubtful ones), sorted.
  std::vector<uint64_t> MissingChunks(const Trailer& trailer) const override;

  // Chunks of the in-flight delta that need their overwrite form (sorted).
  std::vector<uint64_t> DoubtfulChunks() const;
  // The current ledger hash (the committed hash when no delta is in flight).
  Hash128 Ledger() const;
  JournaledApplyStats stats() const;

 private:
  Receiver* inner_;
  ReceiverJournal* journal_;
  ServingGate* gate_;
  mutable std::mutex mu_;
  std::optional<FileHeader> header_;  // of the delta in progress; guarded by mu_
  JournaledApplyStats stats_;         // guarded by mu_
};

}  // namespace dcr

#endif  // DCR_CORE_INCLUDE_DCR_JOURNAL_H_
