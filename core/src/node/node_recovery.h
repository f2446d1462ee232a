// The parts of a dcr-node that outlive its process: the start count, the receiver's durable
// versions, and the in-region copy of the stream (the store that recovering nodes read).
//
//   * Start count: a node counts its starts in <state_dir>/rank-<r>.starts; a count above one
//     means the process was restarted (by `dcr run`'s supervisor, a cluster scheduler, a person).
//   * DurableReceiver: the node's storage lives in its process (host memory on "cpu", a device's
//     memory on "host" / "cuda") and its committed versions are made durable by a version log
//     (receivers/version_log.h) in NodePlan::version_log_dir (default <state_dir>/rank-<r>.vlog):
//     a full image of one version plus the chunk records applied since. A commit appends the
//     version's records as they are applied, then its trailer and a commit marker, each fsynced:
//     O(delta) bytes, never the model. A full image is written only when the log's ImageDue()
//     (VersionLogOptions defaults: every 1024 versions, or once the log holds 1.25 images), the
//     first start writes the base as the first image. A restarted process recovers the version
//     the log committed last (the image with the log replayed, each version proven against its
//     target hash) into fresh storage: the base of the version in flight, or its target when
//     the log shows it committed. The storage (and its open log) passes from one version to the
//     next of the same process (TakeStorage, Open's `carried`), so a version starts without
//     loading anything. Under the log a JournaledReceiver (dcr/journal.h, journal
//     <state_dir>/rank-<r>.journal) keeps each chunk's state within the version; the storage
//     never survives its process, so a restart starts the journal over at the recovered version.
//     At each Begin the target's safetensors header (a single-file target) is recorded in
//     <state_dir>/rank-<r>.storage.header: with the recovered bytes it makes the version's
//     committed checkpoint file when one is asked for (version_state.h MaterializeHeld).
//   * StoreMirror: a long-link relay (a child of the sender, the first node in the rollout region)
//     puts every blob it received whole into the in-region object store, trailer last, so that the
//     nodes of its region recover from the store without the stream crossing the long link again.
//
// Failure model: a process kill or a machine restart loses the storage and nothing committed
// (the log's marker is fsynced before Commit returns); a version's entries without their marker
// are discarded on recovery, and the version is applied again from the stream or the store.
//
// Thread safety: DurableReceiver is as receiver.h says (ApplyRecord concurrently for distinct
// chunks); StoreMirror is thread-safe.
#ifndef DCR_CORE_SRC_NODE_NODE_RECOVERY_H_
#define DCR_CORE_SRC_NODE_NODE_RECOVERY_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dcr/device.h"
#include "dcr/journal.h"
#include "dcr/node.h"
#include "dcr/object_store.h"
#include "dcr/receiver.h"
#include "dcr/recovery_policy.h"
#include "dcr/relay_policy.h"
#include "node/fault_points.h"
#include "receivers/version_log.h"

namespace dcr::internal {

// Counts one more start of node `rank` in <state_dir>/rank-<rank>.starts and returns the count
// (1 for the first start). Errors: errno errors naming the file.
StatusOr<int> CountNodeStart(const std::string& state_dir, int rank);

// A durable receiver's storage with its open version log, handed from one version's
// DurableReceiver to the next of the same process (DurableReceiver::TakeStorage, then Open's
// `carried`). As a Receiver it forwards to the storage. Thread safety: as receiver.h says.
class HeldStorage final : public Receiver {
 public:
  ~HeldStorage() override;
  Status Begin(const uint8_t* h, size_t n) override { return storage_->Begin(h, n); }
  Status ApplyRecord(const uint8_t* r, size_t n) override { return storage_->ApplyRecord(r, n); }
  Status Commit(const uint8_t* t, size_t n) override { return storage_->Commit(t, n); }
  void Abort() override { storage_->Abort(); }
  Status MarkApplied(uint64_t id, const Hash128& d) override {
    return storage_->MarkApplied(id, d);
  }
  Status Verify(const Checkpoint& target) const override { return storage_->Verify(target); }
  const Receiver* storage() const override { return storage_->storage(); }
  VersionId held() const override { return storage_->held(); }
  bool in_delta() const override { return storage_->in_delta(); }
  std::vector<uint64_t> MissingChunks(const Trailer& t) const override {
    return storage_->MissingChunks(t);
  }

 private:
  friend class DurableReceiver;
  HeldStorage() = default;
  std::vector<uint8_t> image_;         // "cpu": the storage, the layout's files back to back
  std::unique_ptr<Receiver> storage_;  // a BufferReceiver over image_, or the device's receiver
  BufferReceiver* host_ = nullptr;     // storage_ in host memory (null on a device)
  DeviceReceiver* device_ = nullptr;   // storage_ on a device (null on "cpu")
  std::unique_ptr<VersionLog> log_;
  std::string log_dir_;
  uint64_t layout_size_ = 0;
};

class DurableReceiver {
 public:
  // The receiver of `plan` (plan.method "delta", plan.state_dir set) on `device` (null = "cpu",
  // host memory), holding version plan.base_version (-1 or 0: version 0) with the layout of
  // plan.receiver_base_path (its tensors and files; its bytes are the base only when the log
  // does not hold that version). `starts` is CountNodeStart's count. `faults` (may be null:
  // none): the fault points (fault_points.h), whose chunk layers go under the journal and over
  // it and which are told of the version log's commit steps. `carried` (may be null): what the
  // version before of this process handed on (TakeStorage); used when it is of the same log
  // and holds the base version and no delta, else freed first.
  // The storage is, in this order: the carried one; the version the log committed last when it
  // is the base (or, on a restart, the target: target_committed()); else the bytes of
  // plan.receiver_base_path as the base, which also start a fresh log. The base file's bytes are
  // never held as the base version when the log names that version committed with another
  // content hash (VersionLog::NamedVersions): the file is then only the log's layout.
  // Errors: the layout's (Checkpoint::Open), MakeDeviceReceiver's, the journal's, the version
  // log's (Create; a log that exists but cannot be recovered is left as it is and named in the
  // error only when the base file cannot replace it), kDataLoss when the log cannot recover the
  // base version and the base file is not it (content hash other than the log's; the log is
  // left as it is), errno errors.
  static StatusOr<std::unique_ptr<DurableReceiver>> Open(
      const NodePlan& plan, std::shared_ptr<Device> device, int starts, FaultPoints* faults,
      std::unique_ptr<HeldStorage> carried = nullptr);
  ~DurableReceiver();

  // The journaled receiver the node applies through.
  Receiver* receiver();
  // A receiver that forwards every call to receiver(), for a decorator that takes ownership of
  // the receiver it wraps (the node's trust layer). REQUIRES: this object outlives it.
  std::unique_ptr<Receiver> Handle();
  // What RecoveryPolicy's Restarted event says about this start (meaningful when starts > 1).
  recovery::Restarted restart_event() const { return restart_; }
  // Whether the log shows the refit's target committed (nothing left to fetch).
  bool target_committed() const { return restart_.target_committed; }
  // Whether the log now records a version other than the base committed: the refit's target
  // (a commit that finished while its completion was being dropped, e.g. by a fallback).
  bool TargetCommittedNow() const;
  // RecoveryPolicy's ReloadCommitted: the in-flight delta abandoned (journal and log) and, when
  // a chunk reached the storage since it was loaded, the storage reloaded with the version the
  // log committed last (recovered from the log). REQUIRES: not in a delta (applies drained).
  Status ReloadCommitted();
  // The overwrite form (absolute target values, dcr/versioning.h) of the relative chunk `record`
  // of the delta begun, built from the base (recovered from the log on first use; a single-file
  // layout: kUnimplemented for a sharded one).
  StatusOr<std::vector<uint8_t>> OverwriteForm(const uint8_t* record, size_t size) const;
  // Whether the journal shows chunk `chunk_id` of the in-flight delta doubtful.
  bool Doubtful(uint64_t chunk_id) const;
  JournaledApplyStats stats() const;
  // The storage lives in the process: never re-attached.
  bool storage_reattached() const { return false; }
  // Whether the storage is the one carried in from the version before.
  bool device_carried() const { return carried_; }
  // The version log's bytes written since Open (entries and markers; images).
  uint64_t log_bytes() const;
  uint64_t image_bytes() const;
  // Bytes this process wrote to disk since Open, as the kernel's per-process I/O accounting
  // counts them (the log, the journal and every other file of the node; 0 where it does not).
  uint64_t write_bytes() const;
  // Seconds this Open spent recovering the held version from the log (0 when it did not).
  double restore_s() const { return restore_s_; }
  // The storage and its log for the next version of this process, when the storage holds the
  // version the log committed last and no delta: null otherwise. REQUIRES: no call runs or
  // follows through receiver() or Handle(); stats() and the queries stay usable.
  std::unique_ptr<HeldStorage> TakeStorage();
  // The storage under the layers: in host memory (null on a device), on a device (null on
  // "cpu"). REQUIRES: TakeStorage has not handed it on.
  const BufferReceiver* host_storage() const { return held_->host_; }
  const DeviceReceiver* device_storage() const { return held_->device_; }

 private:
  DurableReceiver() = default;
  class StorageHooks;
  class HeaderHooks;
  // The storage from the log's last committed version `rec` (its bytes consumed).
  Status StorageFromRecovered(const std::shared_ptr<Device>& device, RecoveredVersion* rec);
  // Writes the storage's bytes as the log's image of `v` (VersionLoggingReceiver's write_image).
  Status WriteImage(VersionLog* log, const VersionId& v);
  // Records the target header of the delta begun at header_path_ (removed for a sharded one).
  Status RecordTargetHeader();

  std::unique_ptr<Checkpoint> layout_;
  std::unique_ptr<HeldStorage> held_;
  std::string header_path_;
  std::atomic<bool> written_{false};  // a chunk reached the storage since its load / commit
  bool carried_ = false;
  std::unique_ptr<VersionLoggingReceiver> logging_;  // the log over the storage
  std::unique_ptr<StorageHooks> hooks_;              // written_ kept, over the log
  std::unique_ptr<Receiver> fault_inside_;           // fault points under the journal (or null)
  std::unique_ptr<ReceiverJournal> journal_;
  std::unique_ptr<JournaledReceiver> journaled_;
  std::unique_ptr<Receiver> fault_outside_;  // fault points over the journal (or null)
  std::unique_ptr<HeaderHooks> outer_;       // the inventory and target header at each Begin
  uint64_t base_number_ = 0;
  Inventory inventory_;        // of the delta begun (set by the outer layer's Begin)
  std::string target_header_;  // its single-file target's JSON header ("" sharded; ditto)
  recovery::Restarted restart_;
  double restore_s_ = 0;
  VersionLogStats stats_at_open_;
  VersionLog* log_ = nullptr;    // held_'s log (null once TakeStorage handed it on)
  VersionLogStats stats_taken_;  // the log's stats when TakeStorage handed it on
  uint64_t write_bytes0_ = 0;
  mutable std::mutex base_mu_;
  mutable std::unique_ptr<Checkpoint> base_;  // OverwriteForm's base, recovered on first use
};

// Puts blobs into an object store under `prefix` (ObjectKey) on one worker thread, the trailer
// only after every other blob of the stream. Failures are counted, not fatal: the mirror is a
// recovery path, the tree delivers the stream.
class StoreMirror {
 public:
  // REQUIRES: store non-null.
  StoreMirror(std::unique_ptr<ObjectStore> store, std::string prefix);
  ~StoreMirror();
  // Queues `bytes` (kept alive by `owner`) as blob `info`.
  void Put(const BlobInfo& info, std::shared_ptr<const std::vector<uint8_t>> bytes);
  // Waits until every queued put finished (or failed).
  void Flush();
  uint64_t puts() const;
  uint64_t failures() const;

 private:
  void Loop();
  std::unique_ptr<ObjectStore> store_;
  std::string prefix_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<BlobInfo, std::shared_ptr<const std::vector<uint8_t>>>> queue_;
  std::pair<BlobInfo, std::shared_ptr<const std::vector<uint8_t>>> trailer_;
  bool have_trailer_ = false;
  uint64_t put_ = 0, failed_ = 0;
  bool busy_ = false, stop_ = false;
  std::thread thread_;
};

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_NODE_NODE_RECOVERY_H_
