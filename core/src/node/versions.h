// Long-lived nodes: one dcr-node process taking part in version after version of a run
// (NodePlan::versions), and the sender's side of the joint commit over the relay tree's
// per-receiver commit reports (commit_reports.h).
//
// Thread safety: SenderJointCommit is thread-compatible (a pure state machine over
// CommitCoordinator); the Run functions are self-contained like RunNode.
#ifndef DCR_CORE_SRC_NODE_VERSIONS_H_
#define DCR_CORE_SRC_NODE_VERSIONS_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dcr/node.h"
#include "dcr/object_store.h"
#include "dcr/receiver.h"
#include "dcr/status.h"
#include "dcr/versioning.h"

namespace dcr::internal {

struct ReceiverStack;  // receiver_stack.h
class TlsContext;      // transport/tls.h

// A node's result file: written atomically (nothing when `path` is empty), and read back by a
// restarted process for the versions it finished. Read errors: ReadFile's, NodeResultFromJson's.
Status WriteResultFile(const std::string& path, const NodeResult& r);
StatusOr<NodeResult> ReadResultFile(const std::string& path);

// One version of a node (RunNode's body for `plan`, which has no versions): a receiver applies
// through the stack `*storage` holds when it is not empty (else it loads
// plan.receiver_base_path; receiver_stack.h OpenReceiverStack) and hands its stack back in it when
// done, whatever the outcome (ReleaseReceiverStack). Writes plan.result_path when set.
Status RunNodeVersion(const NodePlan& plan, NodeResult* result, ReceiverStack* storage);

// RunNode for a plan with versions: each version in turn through RunNodeVersion with the
// version's fields (number, target, verify path, prefix, result path) and, for the sender of a
// delta over the relay tree, the base SenderJointCommit names. Every version takes the start
// barrier: the first at plan.ready_path / plan.go_path, version k after it at those paths with
// ".v<k>" appended (so a version's clock starts only once every node is connected for it). `result`
// gets the last version's result (the failed one's on error), also written to plan.result_path.
// With plan.state_dir, each version recovers as a one-version node in its own state directory and a
// restarted process skips the versions it finished and resumes the one it was in (version_state.h
// VersionRecovery; the sender's joint commit state persisted after every version). Errors:
// kInvalidArgument for version numbers that do not increase from above 0; VersionRecovery::Open's;
// the first version's error otherwise.
Status RunNodeVersions(const NodePlan& plan, NodeResult* result);

// What the trainer hands for one version: its canonical checkpoint (a file or shard directory),
// and optionally a delta file of the version it built itself (from its per-rank shards).
struct VersionContent {
  std::string checkpoint;
  std::string delta_path;  // "" = none
  // The trainer ended the run before this version (an open-ended plan): RunNodeVersions stops
  // here with OK, the versions before it done.
  bool end = false;
};

// The version after `v` in an open-ended plan (NodePlan::open_versions): number + 1, the last
// "step-<k>" of its prefix and the last "-v<k>.json" of its result path renumbered; no target
// or verify path.
NodeVersion NextOpenVersion(const NodeVersion& v);

// A step-at-a-time feed of RunNodeVersions (the trainer-side API, dcr/publisher_c.h):
//   * content (the sender only): called before version v is built; returns its content, whose
//     checkpoint replaces v.target_path (also as the base of later versions); an error ends the
//     run with it. May block until the trainer hands the version. A delta_path is streamed as
//     the version when TrainerDeltaFits (trainer_delta.h) finds it built from the version the
//     delta must come from (the joint commit's baseline; over the store, the version before)
//     with that version's content hash; otherwise the delta is built from the checkpoints, and
//     the version's result says why (NodeResult::trainer_delta, trainer_delta_skipped).
//   * released (the sender only): called after a version ended ok and its state was saved,
//     before `done`, with the lowest version whose checkpoint this sender (or a sender restarted
//     on its state) may still build a delta from: the joint commit's baseline over the tree, the
//     version just out over the store. The trainer may delete the checkpoints it handed of
//     every version below it.
//   * done: called after each version's node returned, with its result and status.
// Unset members are not called.
struct VersionHooks {
  std::function<StatusOr<VersionContent>(const NodeVersion&)> content;
  std::function<void(uint64_t)> released;
  std::function<void(const NodeVersion&, const NodeResult&, const Status&)> done;
};
Status RunNodeVersions(const NodePlan& plan, NodeResult* result, const VersionHooks& hooks);

// Sender of a long-lived relay-tree run, after the tree ended version `version` (store prefix
// `prefix`): the committed reports (CommitReport::ok) of `version` that `store` holds of tree
// receivers (ranks 1 .. plan.parents.size() - 1) that `live` does not name and `reports` holds no
// committed report of -- ranks declared dead that came back by the store (restarted, catching
// up). A rank with no such report but a committed report of the version before in the store
// (`previous_prefix`, `previous`; none when `previous_prefix` is empty) is on its way back, one
// version behind at most: the call polls the store for it for at most plan.receiver_deadline_s.
// A rank with neither report costs no wait (an absent host, one further behind). With `checker`
// a report is taken only when its rank signed it (GetRegionReport). The reports are returned as
// the store holds them: whether one proves the version (its commitment root) is for
// SenderJointCommit::Published to decide.
std::vector<CommitReport> CollectReturningTreeReports(
    ObjectStore* store, const NodePlan& plan, const std::string& prefix, uint64_t version,
    const std::string& previous_prefix, uint64_t previous, const std::vector<int>& live,
    const std::vector<CommitReport>& reports, const TlsContext* checker);

// The sender's joint commit: which version the next delta is built from, from what the receivers
// reported. Receivers are named by rank.
class SenderJointCommit {
 public:
  // `receivers`: the ranks that apply (each reports once per version); `initial`: the version
  // they all hold at the start (number and content hash).
  SenderJointCommit(const std::vector<int>& receivers, const VersionId& initial);

  // The version the next delta must be built from (CommitCoordinator::baseline).
  VersionId baseline() const { return coordinator_.baseline(); }
  // Records that version `published` (built from `base`) went out and what the sender heard
  // back: every live receiver with a committed report of `published` has committed it; any
  // other live receiver (no report, a failure, another version, another commitment) is declared
  // dead and stops holding the baseline back. A report matches when it names `published`'s
  // number and, with `root` (the commitment root the sender signed), carries that root (the
  // content hash is then bookkeeping); without `root` (an unsigned version, which proves nothing)
  // its content hash. Returns the ranks declared dead, each with why. Errors:
  // CommitCoordinator::Publish's (a base other than the baseline).
  // A rank that is not live (declared dead, or never a member: a late joiner) and reported
  // `published` committed as above joins again; `readmitted` (may be null) gets those ranks.
  StatusOr<std::vector<std::pair<int, std::string>>> Published(
      const VersionId& base, const VersionId& published, const std::vector<CommitReport>& reports,
      const std::optional<Sha256Digest>& root, std::vector<int>* readmitted = nullptr);
  // Ranks still live.
  std::vector<int> live() const;

 private:
  CommitCoordinator coordinator_;
};

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_NODE_VERSIONS_H_
