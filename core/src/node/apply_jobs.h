// The apply pool of a node: Apply actions through the node's receiver stack (receiver.h), run on
// a pool; completions are posted to the node's EventQueue.
//
// Thread safety: Open, Release from the node's event thread with no job running; Apply
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
#include "node/receiver_stack.h"
#include "node/work_pool.h"

namespace dcr::internal {

class ApplyJobs {
 public:
  ApplyJobs(NodeState* state, EventQueue* queue) : state_(state), queue_(queue) {}

  // Opens the receiver stack of `plan` (receiver_stack.h OpenReceiverStack: at start number
  // `starts`, over `carried`, what the version before of this process handed on) and starts the
  // pool.
  Status Open(const NodePlan& plan, int starts, ReceiverStack carried = ReceiverStack());
  // Hands the stack on once the pool has stopped (ReleaseReceiverStack; empty when none was
  // opened).
  ReceiverStack Release();
  bool open() const { return rx_ != nullptr; }
  internal::DurableReceiver* durable() { return stack_.durable.get(); }
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
  const VersionFloor* floor() const { return stack_.floor.get(); }

 private:
  void ApplyJob(const BlobPtr& b);

  // The version the storage holds, for the metrics endpoint (called when no Receiver call runs).
  void ReportHeld();

  NodeState* state_;
  EventQueue* queue_;
  ReceiverStack stack_;
  Receiver* rx_ = nullptr;  // stack_.outer
  std::atomic<uint64_t> repairs_{0};
  WorkPool pool_;
};

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_NODE_APPLY_JOBS_H_
