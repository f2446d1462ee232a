// The apply pool of a node: Apply actions through the node's receiver stack (receiver.h), run on
// a pool; completions are posted to the node's EventQueue.
//
// Thread safety: Open, Adopt, Release from the node's event thread with no job running; Apply
// and Repair from the event thread (the jobs run concurrently for distinct chunks).
#ifndef DCR_CORE_SRC_NODE_APPLY_JOBS_H_
#define DCR_CORE_SRC_NODE_APPLY_JOBS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "dcr/delta.h"
#include "dcr/node.h"
#include "dcr/receiver.h"
#include "dcr/relay_policy.h"
#include "dcr/signing.h"
#include "dcr/status.h"
#include "node/event_queue.h"
#include "node/node_recovery.h"
#include "node/node_state.h"
#include "node/work_pool.h"

namespace dcr::internal {

class ApplyJobs {
 public:
  ApplyJobs(NodeState* state, EventQueue* queue) : state_(state), queue_(queue) {}

  // The receiver of `plan`, in host memory for device "cpu", else in the memory of
  // OpenDevice(plan.device, plan.device_index): delta: holds plan.receiver_base_path (a device
  // that cannot be opened or cannot hold the base fails here, before the node takes part in the
  // refit); full: the file image, loaded onto the device at commit.
  // With plan.state_dir (delta): the node_recovery.h DurableReceiver (journal and version log;
  // storage in the process), at start number `starts`, applying to `carried` (the storage this
  // process kept from the version before, DurableReceiver::TakeStorage) when it holds the base.
  Status Open(const NodePlan& plan, int starts, std::unique_ptr<Receiver> carried = nullptr);
  // A receiver that stays up across versions: the storage of the version before (`backend`)
  // instead of one loaded from plan.receiver_base_path.
  Status Adopt(std::unique_ptr<Receiver> backend, const NodePlan& plan);
  // Hands the storage back once the pool has stopped (null when none was opened; for a
  // DurableReceiver, its storage and version log when the storage holds the version the log
  // committed: DurableReceiver::TakeStorage).
  std::unique_ptr<Receiver> Release();
  bool open() const { return rx_ != nullptr; }
  internal::DurableReceiver* durable() { return durable_.get(); }
  void Apply(const BlobPtr& b) {
    pool_.Submit([this, b] { ApplyJob(b); });
  }
  // RecoveryPolicy's RequestOverwrite for the refused chunk blob `b`: its overwrite form, built
  // from the base it applies to, applied in its place; ApplyDone reports the blob.
  void Repair(const BlobPtr& b);
  uint64_t repairs() const { return repairs_.load(); }
  void Drain() { pool_.Drain(); }
  Status Verify(const std::string& target_path) { return VerifyFile(*rx_, target_path); }
  // The version the storage holds (between applies).
  VersionId held() const { return rx_->held(); }
  // The trainer's signed commitment root the last commit found the storage to hold
  // (TrustedReceiver::committed_commitment); nullopt when none was checked.
  std::optional<Sha256Digest> committed_commitment() const;
  // The commitment root a commit report names (commit_reports.h): committed_commitment(), else,
  // when `compute` (the report is signed, so a sender may hold it as proof), the root of what
  // the storage holds, computed now (one SHA-256 pass); nullopt when neither is available (a
  // storage whose commitment cannot be computed, a full-stream receiver).
  std::optional<Sha256Digest> ReportedCommitment(bool compute) const;
  void Stop() { pool_.Stop(); }
  // The receiver's version floor (plan.version_floor_path); null without one.
  const VersionFloor* floor() const { return floor_.get(); }

 private:
  void ApplyJob(const BlobPtr& b);

  // The version the storage holds, for the metrics endpoint (called when no Receiver call runs).
  void ReportHeld();

  NodeState* state_;
  EventQueue* queue_;
  std::unique_ptr<Receiver> backend_;
  std::unique_ptr<VersionFloor> floor_;
  std::unique_ptr<internal::DurableReceiver> durable_;
  Receiver* rx_ = nullptr;  // backend_, or durable_'s journaled receiver
  std::atomic<uint64_t> repairs_{0};
  WorkPool pool_;
};

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_NODE_APPLY_JOBS_H_
