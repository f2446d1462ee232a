// Receivers: the receiving end of a delta stream, one interface for every kind of storage.
//
// A Receiver holds one checkpoint version in storage it writes in place (host buffers, a mapped
// file, a serving runtime's buffers) and moves it to the next version by applying a delta as its
// pieces arrive. The pieces are the delta's serialized blobs (FORMAT.md), exactly as sent:
//
//   Begin(file header)  ->  ApplyRecord(chunk record), once per chunk, any order, concurrently
//   for distinct chunks  ->  Commit(trailer)  ->  the receiver holds the target version.
//
// Contract of every implementation (the conformance suite, receiver_conformance_test.cc, runs each
// one through it):
//   * Begin checks that the delta fits before anything is written: its base content hash equals
//     the held version's hash unless the delta is a full frame (kFlagNoBase); its inventory names
//     the held tensors with their dtypes and shapes. Errors: kDataLoss (corrupt header),
//     kFailedPrecondition (another base: the message names both hashes; or a delta already in
//     progress, except that JournaledReceiver accepts the in-flight delta again and resumes it),
//     kInvalidArgument (the inventory does not match the storage). On error nothing is written and
//     the receiver is unchanged.
//   * ApplyRecord is atomic per chunk: a refused record leaves nothing of its chunk written.
//     Errors: kFailedPrecondition (no delta in progress; relative payload whose current bits
//     differ from the chunk's base bits: a wrong base, or a half-applied chunk), kDataLoss
//     (corrupt record, values that do not produce the target bits, element widths or segments
//     that do not fit the storage). A record of a chunk already applied in this delta writes
//     nothing: an absolute payload is skipped (OK), a relative one refused (kFailedPrecondition:
//     applying it again would move the bits on); JournaledReceiver, whose journal knows the chunk
//     is applied, skips both (OK).
//   * Commit proves the version: every chunk of the trailer's table applied
//     (kFailedPrecondition naming the missing ones) and the storage's content hash (hash.h),
//     tracked incrementally, equal to the trailer's target hash (kDataLoss). After OK the receiver
//     holds the target (held() names it) and no delta is in progress; on error the delta stays in
//     progress (more records may arrive; a later Commit may succeed).
//   * Verify compares the storage byte for byte with a dense load of `target` through the
//     receiver's own loader (the identity for plain buffers; the serving runtime's native loader
//     for a serving replica; a replica attached to a runtime's own buffers, whose loader dcr cannot
//     run, compares every element it placed and every shadow). OK if equal; kDataLoss naming the
//     first differing tensor and byte.
//
// Thread safety: ApplyRecord may be called concurrently for distinct chunks of the delta in
// progress; every other method must not run concurrently with any call. Queries (held,
// in_delta, MissingChunks) are safe between calls.
#ifndef DCR_CORE_INCLUDE_DCR_RECEIVER_H_
#define DCR_CORE_INCLUDE_DCR_RECEIVER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "dcr/apply.h"
#include "dcr/checkpoint.h"
#include "dcr/delta.h"
#include "dcr/format.h"
#include "dcr/status.h"
#include "dcr/statusor.h"

namespace dcr {

// A checkpoint version: its number (as in delta headers) and its content hash (hash.h).
struct VersionId {
  uint64_t number = 0;
  Hash128 hash;
  bool operator==(const VersionId& o) const { return number == o.number && hash == o.hash; }
  bool operator!=(const VersionId& o) const { return !(*this == o); }
  // "v<number>:<first 8 hex digits of the hash>".
  std::string ToString() const;
};

class Receiver {
 public:
  virtual ~Receiver() = default;

  // Starts the delta whose serialized file header is `header[0, size)`. See the file comment.
  virtual Status Begin(const uint8_t* header, size_t size) = 0;
  // Applies one chunk record (ChunkHeader + streams) of the delta in progress.
  virtual Status ApplyRecord(const uint8_t* record, size_t size) = 0;
  // Ends the delta with its serialized trailer. See the file comment.
  virtual Status Commit(const uint8_t* trailer, size_t size) = 0;
  // Abandons the delta in progress (no-op without one). Records applied since Begin stay written:
  // the storage then holds held() only if none was applied; otherwise it must be repaired with a
  // full frame or reloaded.
  virtual void Abort() = 0;

  // Counts chunk `chunk_id` of the delta in progress as applied without touching the storage:
  // the storage already holds the chunk's target bits because it was applied before a restart
  // over storage that survived it (a journal proves that; JournaledReceiver calls this on
  // resume). `version_delta` is the chunk's (its move of the content hash). The receiver cannot
  // check the claim: Commit's hash check then rests on it. REQUIRES: a delta in progress
  // (kFailedPrecondition otherwise). kUnimplemented from a receiver without chunk accounting
  // (the full-stream receiver of transport.h).
  virtual Status MarkApplied(uint64_t chunk_id, const Hash128& version_delta) = 0;

  // Byte-for-byte comparison with a dense load of `target`. See the file comment.
  virtual Status Verify(const Checkpoint& target) const = 0;

  // The last committed version (the one the storage holds when no delta is in progress).
  virtual VersionId held() const = 0;
  // True between a successful Begin and a successful Commit (or Abort).
  virtual bool in_delta() const = 0;
  // Chunks of `trailer`'s table not applied in the delta in progress (sorted; all of them when
  // no delta is in progress).
  virtual std::vector<uint64_t> MissingChunks(const Trailer& trailer) const = 0;
  // The receiver whose memory holds the weights: this one, or for a decorator that knows it,
  // the storage of what it wraps (what the commitment of dcr/commitment.h is computed over).
  virtual const Receiver* storage() const { return this; }
};

// Whole-delta helpers over any receiver.

// Applies the delta held by `reader`: Begin, the chunk records in `order` (indices into the chunk
// table; the table's order if empty), Commit. Stops at the first error (returned as is).
Status ApplyDelta(const DeltaReader& reader, Receiver* receiver,
                  const std::vector<size_t>& order = {});
// Begin with the header / Commit with the trailer of the delta held by `reader` (its first and
// last blob, as sent).
Status BeginDelta(const DeltaReader& reader, Receiver* receiver);
Status CommitDelta(const DeltaReader& reader, Receiver* receiver);
// Verify against the checkpoint at `target_path` (errors of Checkpoint::Open too).
Status VerifyFile(const Receiver& receiver, const std::string& target_path);

// One tensor of a BufferReceiver's storage: its description (name, dtype, shape, nbytes; the
// offset is unused) and its bytes, which the receiver writes in place.
struct ReceiverTensor {
  TensorInfo info;
  uint8_t* data = nullptr;
};

// A receiver over plain buffers (host memory, a mapped file), applying each record through
// BufferApplier::ApplyRecord (chunks of one contiguous range are patched straight from their
// streams). The content hash is tracked as held hash + the applied chunks' version_delta
// (hash.h is additive); Verify compares each tensor with the target's tensor of the same name.
namespace internal {
class ChunkLedger;
}  // namespace internal

class BufferReceiver : public Receiver {
 public:
  // `tensors` (any order, distinct names) describe storage that must outlive the receiver;
  // `held.hash` must be the content hash of its bytes (Begin relies on it).
  BufferReceiver(std::vector<ReceiverTensor> tensors, VersionId held);
  ~BufferReceiver() override;
  // A receiver owning a private in-memory copy of the checkpoint at `path` (a file or a shard
  // directory; read and hashed here), holding version `number`. Errors: those of
  // Checkpoint::Open.
  static StatusOr<std::unique_ptr<BufferReceiver>> Load(const std::string& path,
                                                        uint64_t number = 0);
  // The same over an in-memory copy of `ckpt`.
  static std::unique_ptr<BufferReceiver> Copy(const Checkpoint& ckpt, uint64_t number = 0);

  Status Begin(const uint8_t* header, size_t size) override;
  Status ApplyRecord(const uint8_t* record, size_t size) override;
  Status Commit(const uint8_t* trailer, size_t size) override;
  void Abort() override;
  Status MarkApplied(uint64_t chunk_id, const Hash128& version_delta) override;
  Status Verify(const Checkpoint& target) const override;
  VersionId held() const override;
  bool in_delta() const override;
  std::vector<uint64_t> MissingChunks(const Trailer& trailer) const override;

  // The storage, in the order given at construction.
  const std::vector<ReceiverTensor>& tensors() const { return tensors_; }

 private:
  std::vector<ReceiverTensor> tensors_;
  std::vector<uint8_t> owned_;  // Load / Copy: the storage's bytes
  VersionId held_;
  // The delta in progress.
  std::unique_ptr<BufferApplier> applier_;  // null when none
  uint64_t target_number_ = 0;
  Hash128 start_;  // held hash, or the identity terms of a full frame
  std::unique_ptr<internal::ChunkLedger> ledger_;  // the chunks claimed, applied or marked
};

}  // namespace dcr

#endif  // DCR_CORE_INCLUDE_DCR_RECEIVER_H_
