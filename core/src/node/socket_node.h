// The node: the environment (policy_host.h) of its policy over the parts of tree_links.h,
// store_jobs.h, apply_jobs.h and sender_builder.h, with its event loop, its RecoveryPolicy and
// the recovery actions it carries out. dcr/node.h describes the process it runs.
//
// Thread safety: Run from one thread; the callbacks of NodeEnvironment from that thread only.
#ifndef DCR_CORE_SRC_NODE_SOCKET_NODE_H_
#define DCR_CORE_SRC_NODE_SOCKET_NODE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "dcr/delta.h"
#include "dcr/node.h"
#include "dcr/policy_host.h"
#include "dcr/receiver.h"
#include "dcr/recovery_policy.h"
#include "dcr/relay_policy.h"
#include "dcr/status.h"
#include "dcr/statusor.h"
#include "node/apply_jobs.h"
#include "node/blob_spool.h"
#include "node/commit_reports.h"
#include "node/edge_relay.h"
#include "node/event_queue.h"
#include "node/freeze_watch.h"
#include "node/node_recovery.h"
#include "node/node_state.h"
#include "node/sender_builder.h"
#include "node/store_jobs.h"
#include "node/tree_links.h"
#include "transport/net.h"

namespace dcr::internal {

class SocketNode : public NodeEnvironment {
 public:
  // `carry` (may be null): a receiver's stack kept across the versions of a long-lived node
  // (receiver_stack.h); a non-empty *carry is applied to instead of loading
  // plan.receiver_base_path (OpenReceiverStack), and the stack is handed back in it when the
  // node is done, whatever the outcome (ReleaseReceiverStack).
  SocketNode(const NodePlan& plan, NodeResult* result, ReceiverStack* carry = nullptr)
      : carry_(carry),
        plan_(plan),
        state_(result),
        links_(plan, &state_, &queue_),
        store_(plan, &state_, &queue_),
        applier_(&state_, &queue_),
        builder_(plan, &state_, &queue_),
        recovery_env_(this) {}
  ~SocketNode() override { Teardown(); }

  Status Run();

  // ---- NodeEnvironment (called on the loop thread) ----

  void SetTimer(TimePoint at) override { timer_at_ = at; }
  void Send(const action::Send& s) override;
  void Ack(const action::Ack& ack) override;
  void ReportCommit(const action::ReportCommit&) override {
    if (!applier_.open()) return links_.SendReport(nullptr);
    const internal::ReportRecord own = OwnReport(Status());
    links_.SendReport(&own);
  }
  void Apply(const action::Apply& ap) override {
    BlobPtr b = state_.Find(ap.blob.id);
    if (!b) return Fault(InternalError("apply of unknown blob " + std::to_string(ap.blob.id)));
    applier_.Apply(b);
  }
  void Release(BlobId blob) override;
  void Put(const action::Put& put) override;
  void List(const action::List& list) override { store_.List(list.prefix); }
  void Fetch(const action::Fetch& f) override { store_.Fetch(f.blob, f.key); }
  void Committed() override;
  void TreeCommitted(int receivers) override {
    state_.result()->t_commit = WallNow();
    state_.result()->receivers_committed = receivers;
    MarkCommittedInMetrics();
  }
  void Published() override {
    state_.result()->t_commit = WallNow();
    MarkCommittedInMetrics();
  }
  // The plain form of a context-coded chunk (PlainForm, kept in plain_forms_ for the Sends and
  // Puts that name it), answered at once; for an edge relay, counted in its open switch.
  void Transcode(const action::Transcode& t) override;
  // Recorded in NodeResult::edge_switches and said on stderr.
  void EdgeLag(const action::EdgeLag& lag) override;
  void Failed(const Status& status) override;

 private:
  // ---- recovery: the node's RecoveryPolicy and the environment that carries out its actions ----

  class RecoveryEnv : public RecoveryEnvironment {
   public:
    explicit RecoveryEnv(SocketNode* n) : n_(n) {}
    void SetTimer(TimePoint at) override { n_->recovery_timer_at_ = at; }
    void FallBackToStore(const std::string& reason) override { n_->DoFallBack(reason); }
    void LeaveTree() override { n_->DoLeaveTree(); }
    void StartDownload() override { n_->StartPolicy(MakeDownloaderPolicy(n_->plan_.relay)); }
    void Reparent(NodeId to) override {
      // ParentLost never offers an adopter here: no tree node serves a child joining mid-stream.
      n_->Fault(InternalError("re-parent to node " + std::to_string(to) + " never offered"));
    }
    void ReloadCommitted() override { n_->DoReload(); }
    void RequestOverwrite(uint64_t chunk_id, const std::string&) override {
      n_->DoRepair(chunk_id);
    }
    void StopUpload() override {
      n_->Fault(
          UnavailableError("sender: the store upload failed; the stream stays unpublished "
                           "until the sender restarts"));
    }
    void Republish() override { n_->FillStore(); }
    void GiveUp(const std::string& message) override {
      n_->Fault(UnavailableError("node " + std::to_string(n_->plan_.rank) + ": " + message));
    }

   private:
    SocketNode* n_;
  };

  void Recover(const recovery::Event& e);
  // Decisions on what the last Handle reported (a policy's Fail, a commit).
  Status AfterHandle();
  // Hosts `policy` as the node's stream policy and starts it.
  void StartPolicy(std::unique_ptr<NodePolicy> policy) {
    host_ = std::make_unique<PolicyHost>(std::move(policy), this);
    timer_at_ = -1;
    host_->Handle(Now(), event::Start{});
  }
  // FallBackToStore: the stream policy and everything in flight for it are dropped.
  void DoFallBack(const std::string& reason);
  void DoLeaveTree() {
    links_.Close();
    if (plan_.rank == 0) FillStore();
  }
  // Sender: the stream goes to the store (the tree is left, or the sender restarted): an
  // uploader (MakeFillStorePolicy) over every blob built so far and the rest as the builder
  // produces them; objects the store already holds (the long-link relay's copy) are not put
  // again.
  void FillStore();
  // Sender with edge relays: the plain record of held blob `id` when it is a context-coded chunk
  // record (ContextChunkToPlain against the sender's base, which is the run's), else null.
  StatusOr<BlobPtr> PlainForm(BlobId id);
  // The open switch of `child` (the last one recorded for it), or null.
  static NodeResult::EdgeSwitch* OpenSwitch(NodeResult* r, NodeId child);
  // An edge relay's ingress (plan.edge_relays names this rank): its transcoder over the
  // canonical base the node holds (receiver_base_path), fed by the parent's reader threads.
  Status StartEdgeIngress();
  void DoReload() {
    state_.Update([](NodeResult* r) { ++r->reloads; });
    if (applier_.durable() == nullptr) return;  // the full-stream image starts empty anyway
    Fault(applier_.durable()->ReloadCommitted().WithContext("reloading the committed version"));
  }
  void DoRepair(uint64_t chunk_id);
  // The fault point of blob `blob` (fault_points.h BlobReached), when fault points are installed.
  void FaultPointAtBlob(uint64_t blob);
  void RecordRecovery();
  // Whether the loop is over: the stream policy is done (a failed one only once its failure
  // left the node committed), or, recovering, the policy holds the node committed.
  bool Finished() const;

  // While the node waits for its parent at startup: true once the stream is whole in the store
  // (its trailer listed under the prefix) and the parent has still not connected
  // read_deadline_s later. A healthy parent connects before the stream starts, so the tree went
  // on without this node (its parent counted it lost, or died before connecting), and waiting
  // on to the node's timeout would only hold back the run.
  std::function<bool()> ParentGoneCheck();

  double Now() const { return SteadyNow() - t0_; }
  // Store key of rank `rank`'s commit report: "<prefix>/reports/<rank>".
  std::string ReportKey(int rank) const {
    return plan_.relay.prefix + "/reports/" + std::to_string(rank);
  }
  // Whether every receiver rank has a committed report in `reports`.
  bool AllReportsOk(const std::vector<CommitReport>& reports) const;
  // Sender whose tree is gone, or whose tree lacks a receiver's committed report (a receiver
  // that restarted recovers outside the tree, and its parent reports it failed): waits (polling
  // the store, within the node's deadline) until every receiver rank has a committed report
  // from the tree or any report from the store, which replaces the tree's. A record of another
  // run or version is not taken, nor, when this node has the run's credentials, one that its
  // rank did not sign (a store is no more trusted than a relay).
  Status CollectStoreReports(std::vector<CommitReport>* reports);
  // The run credentials that sign this node's commit reports and check the store's: the tree
  // links' (when they opened TLS), else the plan's certificate loaded once (a store downloader,
  // or a node whose tree links did not open); null when the plan names none or they do not load
  // (the reports then go unsigned, and a sender checks none, as on a run without credentials).
  const internal::TlsContext* ReportCredentials() const;
  // This node's commit report: committed with the hash its storage holds, or failed with `s`.
  internal::ReportRecord OwnReport(const Status& s) const;
  void MarkCommittedInMetrics();
  // Freeze reporting from here until the node ends, also while it waits for its parent: each
  // second the dcr_freeze_seconds gauge, and while frozen a line on stderr every freeze_after_s.
  void StartFreezeWatch();
  // The first driver or policy error ends the loop.
  void Fault(const Status& s) {
    if (!s.ok() && error_.ok()) error_ = s;
  }

  Status Setup();

  // A receiver with recovery keeps the bytes of the version it receives in its state dir
  // (node/blob_spool.h): a first start begins the spool, a restart reads back what verifies, so
  // its download continues by (blob, offset) from those bytes instead of fetching them again.
  Status OpenSpool(bool restarted);

  Status Barrier();

  // Events in, one at a time, until the policy is done; the one timer and the deadline bound
  // every wait.
  Status Loop();

  // Sender of a delta: the published version's content hash, from its trailer, which the
  // receivers' reports are checked against.
  void NoteTargetHash(BlobId trailer);

  // Rewrites plan.progress_path when a second has passed since the last write. Best effort: a
  // failed write only leaves the previous progress in place.
  void WriteProgressIfDue();

  void Teardown();

  ReceiverStack* carry_;
  const NodePlan& plan_;
  NodeState state_;
  EventQueue queue_;
  TreeLinks links_;
  StoreJobs store_;
  ApplyJobs applier_;
  SenderBuilder builder_;
  std::unique_ptr<PolicyHost> host_;  // null while a recovery waits to start the next stream
  RecoveryEnv recovery_env_;
  std::unique_ptr<RecoveryPolicy> recovery_;  // null: no recovery (no state_dir or store)
  std::vector<recovery::Event> pending_recovery_;
  std::map<uint64_t, BlobId>
      doubtful_blobs_;  // chunk id -> the blob whose relative form was refused
  std::unique_ptr<internal::StoreMirror> mirror_;
  // Bytes of applied blobs kept for a resumed download (Release), at most kResumeHoldBytes;
  // the spool's file is bounded by the same.
  static constexpr uint64_t kResumeHoldBytes = uint64_t{256} << 20;
  std::unique_ptr<internal::BlobSpool> spool_;  // receiver with recovery: the version's bytes
  uint64_t kept_bytes_ = 0;
  std::set<BlobId> fed_;  // sender: blobs produced that the current policy was given
  int starts_ = 1;
  mutable std::shared_ptr<const internal::TlsContext> report_tls_;  // ReportCredentials
  mutable bool report_tls_tried_ = false;
  std::set<int> refused_store_reports_;  // sender: ranks whose store report it refused (said once)
  bool filled_store_ = false;  // sender: the stream went to the store (tree left, or restarted)
  std::unique_ptr<internal::EdgeTranscoder> store_plain_;  // sender: PlainForm's transcoder
  // Sender with edge relays: the plain forms made for lagging ones (Transcode) and the store.
  std::map<BlobId, BlobPtr> plain_forms_;
  uint64_t blobs_whole_ = 0;
  double recovery_timer_at_ = -1;
  double t0_ = 0, deadline_ = 0;
  // A long-lived receiver waiting for its version to begin (NodePlan::version_wait_s).
  bool awaiting_begin_ = false;
  double timer_at_ = -1;          // policy time of the armed timer; -1 = none
  double next_progress_ = 0;      // steady time of the next progress file write
  bool stream_complete_ = false;  // sender: the trailer blob is produced
  bool committed_ = false;
  bool torn_down_ = false;
  Status error_;
  // A receiver's freeze reporting while it waits (freeze_watch.h); Teardown stops it first.
  std::unique_ptr<internal::FreezeWatch> freeze_watch_;
  // Last, so that its threads stop first: they post to queue_ and store into state_.
  std::unique_ptr<internal::EdgeIngress> ingress_;  // edge relay: the parent's stream, transcoded
};

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_NODE_SOCKET_NODE_H_
