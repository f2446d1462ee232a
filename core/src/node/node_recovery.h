// The parts of a dcr-node that outlive its process: the start count, the receiver's journal and
// storage, and the in-region copy of the stream (the store that recovering nodes read).
//
//   * Start count: a node counts its starts in <state_dir>/rank-<r>.starts; a count above one
//     means the process was restarted (by `dcr run`'s supervisor, a cluster scheduler, a person).
//   * DurableReceiver: the node's receiver wrapped in a JournaledReceiver (dcr/journal.h) whose
//     journal is <state_dir>/rank-<r>.journal. Device "cpu" keeps its storage in a file-backed
//     MAP_SHARED mapping, <state_dir>/rank-<r>.storage (a byte copy of the base checkpoint's
//     files, written in place), which outlives the process as a serving engine's memory outlives
//     a refit agent: a restarted node re-attaches it. Devices "host" and "cuda" hold their storage
//     in the process (host or GPU memory), which dies with it; the same mapping file is then
//     their committed image: the base's bytes at the start, and at each commit (before the
//     journal records it) every tensor downloaded from the device into it. A restarted one
//     reloads the device from the version it can reload: the committed target's image when the
//     journal records the target committed (a single-file base; a sharded one starts over), else
//     the base checkpoint file, and applies the delta again. At each commit the target's
//     safetensors header (a single-file target) is recorded in <storage>.header, which gives the
//     version's committed checkpoint its header (CommitStorageAsCheckpoint, version_state.h).
//   * StoreMirror: a long-link relay (a child of the sender, the first node in the rollout region)
//     puts every blob it received whole into the in-region object store, trailer last, so that the
//     nodes of its region recover from the store without the stream crossing the long link again.
//
// Failure model of the storage: a process kill loses nothing written (the kernel holds the
// mapping's pages and the journal's records). A machine restart (a new boot id) may lose any
// write since the last commit, which msyncs the storage before the journal records the version:
// storage whose journal has a delta in flight is then treated as lost and reloaded from the base.
// On "cpu" the pages each chunk wrote are handed to the kernel's writeback as soon as the chunk
// is applied (sync_file_range, not waited for), so that the disk writes overlap the rest of the
// stream and the commit's msync waits only for what is still in flight.
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

namespace dcr::internal {

// Counts one more start of node `rank` in <state_dir>/rank-<rank>.starts and returns the count
// (1 for the first start). Errors: errno errors naming the file.
StatusOr<int> CountNodeStart(const std::string& state_dir, int rank);

class DurableReceiver {
 public:
  // The receiver of `plan` (plan.method "delta", plan.state_dir set) on `device` (null = "cpu",
  // host memory). `starts` is CountNodeStart's count. `faults` (may be null: none): the fault
  // points (fault_points.h) told of every chunk application, under the journal and after it.
  // `carried` (may be null): the device storage this process kept from the version before
  // (TakeDevice); on a first start it is applied to instead of loading the device again when
  // it holds the base (number and content hash), else it is freed first.
  // Errors: the base's (Checkpoint::Open, MakeDeviceReceiver), the journal's, errno errors of the
  // storage file.
  static StatusOr<std::unique_ptr<DurableReceiver>> Open(const NodePlan& plan,
                                                         std::shared_ptr<Device> device,
                                                         int starts, FaultPoints* faults,
                                                         std::unique_ptr<Receiver> carried = nullptr);
  ~DurableReceiver();

  // The journaled receiver the node applies through.
  Receiver* receiver();
  // A receiver that forwards every call to receiver(), for a decorator that takes ownership of
  // the receiver it wraps (the node's trust layer). REQUIRES: this object outlives it.
  std::unique_ptr<Receiver> Handle();
  // What RecoveryPolicy's Restarted event says about this start (meaningful when starts > 1).
  recovery::Restarted restart_event() const { return restart_; }
  // The version the node held before this refit (the base) and whether the journal shows a
  // later version committed (the refit's target: nothing left to fetch).
  bool target_committed() const { return restart_.target_committed; }
  // Whether the journal now records a version other than the base committed: the refit's
  // target (a commit that finished while its completion was being dropped, e.g. by a fallback).
  bool TargetCommittedNow() const;
  // RecoveryPolicy's ReloadCommitted: the storage is rewritten from the base checkpoint and the
  // in-flight delta abandoned in the journal. Device storage is uploaded from the base again
  // when a chunk was applied to it since its load at Open.
  // REQUIRES: not in a delta (the node's applies drained).
  Status ReloadCommitted();
  // The overwrite form (absolute target values, dcr/versioning.h) of the relative chunk `record`
  // of the delta begun, built from the base checkpoint, the version the chunk applies to.
  StatusOr<std::vector<uint8_t>> OverwriteForm(const uint8_t* record, size_t size) const;
  // Whether the journal shows chunk `chunk_id` of the in-flight delta doubtful.
  bool Doubtful(uint64_t chunk_id) const;
  JournaledApplyStats stats() const;
  bool storage_reattached() const { return reattached_; }
  // Whether the device storage is the one carried in from the version before.
  bool device_carried() const { return carried_; }
  // The device storage (a DeviceReceiver) for the next version of this process, when it holds
  // the version the journal records committed and no chunk was applied since: null otherwise
  // (and on "cpu", whose storage is the mapping). REQUIRES: no call runs or follows through
  // receiver() or Handle(); stats() and the queries stay usable.
  std::unique_ptr<Receiver> TakeDevice();

 private:
  DurableReceiver() = default;
  class HookedReceiver;
  Status OpenMapped(const NodePlan& plan, bool restarted);
  Status CopyBaseIntoMapping();
  Status MsyncMapping();
  // Starts writeback of the mapping's dirty pages without waiting for it (errors surface at the
  // commit's msync).
  void StartWriteback();
  // The address in the mapping of every base tensor, in the base's tensor order.
  std::vector<uint8_t*> MappedTensors() const;
  // A device's commit: every tensor downloaded into its place in the mapping, then msynced.
  Status DownloadIntoMapping();
  // At each commit: the target's header recorded beside the storage (StorageHeaderPath,
  // version_state.h), or a stale record removed for a sharded target.
  Status RecordTargetHeader();

  std::unique_ptr<Checkpoint> base_;
  std::string storage_path_;
  uint8_t* map_ = nullptr;
  uint64_t map_size_ = 0;
  int storage_fd_ = -1;  // the mapping's file, for StartWriteback
  std::unique_ptr<Receiver> backend_;           // BufferReceiver over the mapping, or a device's
  DeviceReceiver* device_rx_ = nullptr;         // backend_ on a device (null on "cpu")
  std::atomic<bool> written_{false};            // a chunk reached backend_ since its load / commit
  bool carried_ = false;                        // backend_ came from the version before
  std::unique_ptr<HookedReceiver> durable_layer_;  // commit and writeback hooks on the backend
  std::unique_ptr<ReceiverJournal> journal_;
  std::unique_ptr<JournaledReceiver> journaled_;
  std::unique_ptr<Receiver> outer_;             // the inventory, after each journaled apply
  VersionId base_version_;
  Inventory inventory_;  // of the delta begun (set by the outer layer's Begin)
  std::string target_header_;  // its single-file target's JSON header ("" sharded; ditto)
  recovery::Restarted restart_;
  bool reattached_ = false;
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
