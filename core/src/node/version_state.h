// The durable state of a long-lived node (NodePlan::versions with NodePlan::state_dir) from one
// version to the next, so that a killed process comes back at the version it holds and takes
// part in the version in flight.
//
// Layout under the node's state_dir:
//   * v<k>/: the state directory of version k, as a one-version node keeps it (node_recovery.h):
//     rank-<r>.starts counts the processes that started version k (a count above one is a
//     restart *in that version*, and the faults block's kill points fire on the first only);
//     a delta receiver's journal of that version and the target header it recorded
//     (rank-<r>.storage.header).
//   * rank-<r>.vlog/: a delta receiver's version log (receivers/version_log.h), one for all
//     versions (NodePlan::version_log_dir): an image of one version and the chunk records of
//     every version committed since. It holds the versions the receiver committed; each version
//     writes its records and a commit marker there, not the model.
//   * v<k>/rank-<r>.done: rank r finished version k (written after its result file). For a
//     delta receiver it names where version k is held: the version log's directory, or a
//     committed checkpoint file of version k (v<k>/rank-<r>.committed.safetensors, or the
//     directory v<k>/rank-<r>.committed of a sharded one) when one was made: by
//     MaterializeHeld, from the log's image with the log replayed and the target header the
//     receiver recorded (byte for byte the target checkpoint), after each version when the
//     environment sets DCR_NODE_COMMITTED_FILES=1 (an operator option), else when a consumer
//     asks for the held checkpoint as a file (HeldPath: a region receiver's catch-up, an edge
//     relay's base, full frames served from it); or a full frame a region receiver adopted
//     (Adopt). `dcr export` writes the held version as a file without touching the state
//     (ExportHeldVersion).
//   * rank-<r>.held: the last version rank r finished ({"version": k}). Once it is written, the
//     rank's files of every earlier version (v<j>/rank-<r>.*, j < k: start counts, done records,
//     journals, a sharded checkpoint's directory) are removed (the directories stay, for ranks
//     behind): they serve no recovery any more (a restart resumes at k, whose files stay, from
//     the version log). So a long-lived node's state holds, besides its version log (and a
//     committed checkpoint file of the version it holds, when one was made), the files of at
//     most two versions (that one and the one in flight), however many versions the run has.
//   * rank-0.commit: the sender's joint commit (SenderJointCommit) after the last version it
//     finished: that version, the baseline (number and content hash) and the live receivers.
//     A restarted sender resumes from it and never publishes a finished version again.
//   * v<k>/rank-<r>.signed: a signed delta receiver's signed state of version k (the delta header
//     and the trainer's signed final manifest with the commitment, dcr/signing.h
//     WriteSignedState), written at its commit (or when it took a full frame of k): a restart
//     proves the version it holds (its checkpoint file, or what its version log recovers)
//     against it before serving or reporting it (CheckHeld).
//   * rank-<r>.floor: a signed delta receiver's version floor (state_dir.h), written at its first
//     start; every version's plan uses it (NodePlan::version_floor_path).
//   * rank-<r>.layout.safetensors: a receiver that joined without a base (a late region
//     receiver): a link to the first checkpoint it held (a full frame), the layout of its
//     version log's image.
// The state_dir itself is the node's own (state_dir.h OpenStateDir): owned by its user, mode
// 0700 when the node makes it, refused otherwise.
//
// Thread safety: free functions over files; one process per rank uses them.
#ifndef DCR_CORE_SRC_NODE_VERSION_STATE_H_
#define DCR_CORE_SRC_NODE_VERSION_STATE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dcr/node.h"
#include "dcr/status.h"
#include "dcr/statusor.h"
#include "dcr/versioning.h"

namespace dcr::internal {

// <state_dir>/v<version>.
std::string VersionStateDir(const std::string& state_dir, uint64_t version);

// The highest version under `state_dir` that rank `rank` started (its v<k>/rank-<r>.starts
// exists); 0 when none. What a supervisor names as the version a dead node was in.
uint64_t VersionStarted(const std::string& state_dir, int rank);

// What rank `rank` recorded when it finished `version` (v<k>/rank-<r>.done), or nullopt when it
// has not finished it. `checkpoint`: a delta receiver's committed checkpoint of that version.
struct VersionDone {
  uint64_t version = 0;
  std::string checkpoint;
};
std::optional<VersionDone> ReadVersionDone(const std::string& state_dir, uint64_t version,
                                           int rank);
// Records `done` for rank `rank` (atomically). Errors: errno errors naming the file.
Status WriteVersionDone(const std::string& state_dir, int rank, const VersionDone& done);

// Where DurableReceiver records, at each commit, the safetensors JSON header of the single-file
// target its storage `storage` holds: "<storage>.header" (absent for a sharded target).
inline std::string StorageHeaderPath(const std::string& storage) { return storage + ".header"; }

// Delta receiver (any device), after version `version` committed: turns its storage mapping
// of that version (<state_dir>/v<k>/rank-<r>.storage, a byte copy of `layout_path`'s files as
// DurableReceiver keeps it) into a checkpoint in `layout_path`'s layout and returns its path.
// A single-file storage with its target's header recorded (StorageHeaderPath) gets that header:
// the committed file is then the target checkpoint byte for byte (its metadata included), in
// place when the header has the base's length and every tensor the base's offsets, else
// rewritten in the target's layout. Idempotent: a second call after a restart returns the path
// already made. REQUIRES: the mapping is no longer written (the version's receiver is closed).
// Errors: kFailedPrecondition when the storage's size is not the layout's, or when the recorded
// header names a tensor the storage lacks or gives one another size; kDataLoss for a recorded
// header that does not parse; errno errors.
StatusOr<std::string> CommitStorageAsCheckpoint(const std::string& state_dir, uint64_t version,
                                                int rank, const std::string& layout_path);

// The environment variable that asks a delta receiver with versions to make the committed
// checkpoint file of each version it finishes (VersionRecovery::MaterializeHeld): "1" (unset or
// "0": only when a consumer asks for one). An operator option for hosts that want a file per
// version (core/docs/operations.md); each such file costs a write of the model. `dcr export`
// gives the held version as a file without it.
inline constexpr char kCommittedFilesEnv[] = "DCR_NODE_COMMITTED_FILES";
bool CommittedFilesAsked();

// The sender's joint commit as rank-0.commit holds it.
struct JointCommitState {
  uint64_t done = 0;      // the last version the sender finished (0: none)
  VersionId baseline;     // the version the next delta is built from
  std::vector<int> live;  // receivers still live
  // The checkpoint of each version from the baseline to `done`, as the sender had it (the
  // trainer's files): what a restarted sender builds the next deltas from.
  std::map<uint64_t, std::string> checkpoints;
};
// nullopt when the sender finished no version yet. Errors: kDataLoss for a file that does not
// parse (the sender cannot know what it published, so it does not guess).
StatusOr<std::optional<JointCommitState>> ReadJointCommitState(const std::string& state_dir);
Status WriteJointCommitState(const std::string& state_dir, const JointCommitState& s);

// The recovery side of RunNodeVersions for a plan with versions and state_dir: which versions
// this rank finished in an earlier process, what each version's one-version plan recovers
// from, and what a finished version leaves behind.
class VersionRecovery {
 public:
  // REQUIRES: !plan.state_dir.empty(), !plan.versions.empty(). Errors: OpenStateDir's (a
  // state_dir that is not this user's own, mode 0700), before anything is read or written in it;
  // for a signed delta receiver (rank > 0, plan.trust_key) OpenStateFloor's (a missing floor in
  // a state that records earlier starts of this rank); errno errors creating the versions'
  // directories; ReadJointCommitState's.
  static StatusOr<std::unique_ptr<VersionRecovery>> Open(const NodePlan& plan);

  // Whether this rank finished version `v` in an earlier process (its result file was written
  // then; a receiver's committed checkpoint of it is the base of the next version). A sender
  // finished the versions its joint commit state records; any rank the versions before its
  // rank-<r>.held record (their files collected).
  bool Finished(const NodeVersion& v);
  // The sender's joint commit state of an earlier process; nullopt on a first start.
  const std::optional<JointCommitState>& commit() const { return commit_; }
  // Fills the one-version plan `p` of v = plan.versions[index]: state_dir v<k>; a receiver's
  // base (receiver_base_path, base_version): the committed checkpoint it holds; a signed delta
  // receiver's version_floor_path: rank-<r>.floor in the state_dir; the fault points only in
  // plan.fault_version.
  void Prepare(const NodeVersion& v, size_t index, NodePlan* p) const;
  // After p's version ended ok: the version is recorded done and held (a delta receiver's in
  // its version log; a committed checkpoint file made too when CommittedFilesAsked(); the file
  // of the version before is removed), and the rank's files of earlier versions are removed
  // (see the layout above).
  Status Done(const NodePlan& p);
  // Receiver: makes the checkpoint file `image` (a full frame of version `version`, already
  // written under VersionStateDir(state_dir, version)) the committed checkpoint it holds, and
  // records the version done and held (earlier versions' files removed as Done does).
  // Errors: errno errors writing the record.
  Status Adopt(uint64_t version, const std::string& image);
  // Receiver: the checkpoint file of the version it holds, made from the version log when the
  // version is held there (MaterializeHeld): plan.receiver_base_path until it finished a
  // version; empty for a late joiner before its first frame. Errors: MaterializeHeld's.
  StatusOr<std::string> HeldPath();
  // Delta receiver: the committed checkpoint file of `version` (v<k>/rank-<r>.committed...),
  // made when absent from the version log (image and replay, read only: it may run while this
  // process holds the log open between versions) with the target header recorded at the
  // version's Begin: byte for byte the target checkpoint. Errors: kFailedPrecondition when the
  // log holds another version; VersionLog::Recover's; CommitStorageAsCheckpoint's.
  StatusOr<std::string> MaterializeHeld(uint64_t version);
  uint64_t held_number() const { return held_number_; }
  // Delta receiver: the checkpoint whose layout its version log's image has (the base it started
  // from, or the first checkpoint a receiver that joined without a base held); empty before that.
  const std::string& layout_path() const { return layout_path_; }
  // Signed delta receiver (rank > 0, plan.trust_key) that resumes from a version an earlier
  // process finished: proves it again before it is served, reported or used as a base. The
  // held bytes (its checkpoint file, else the version its log recovers, read only) must have
  // the commitment its version's signed state (v<k>/rank-<r>.signed, ReadSignedState) signs,
  // verified with the trust key and run.
  // Errors: kFailedPrecondition naming the checkpoint, and the first wrong range when its bytes
  // differ, or that the state has no signed state for it; kDataLoss for a malformed one;
  // Checkpoint::Open's. OK (and
  // nothing checked) otherwise, and for every call after the first that passed.
  Status CheckHeld();
  // Bytes of earlier versions' files this process removed (Done, Adopt).
  uint64_t collected_bytes() const { return collected_bytes_; }
  // An open-ended plan's next version (NodePlan::open_versions): its directory is made and its
  // files are collected as the listed versions' are. Errors: errno errors of the mkdir.
  Status AddVersion(uint64_t version);
  // Sender: records the joint commit after version `done`, with the checkpoints of the versions
  // from the baseline on (those of `checkpoints` below it are not kept).
  Status SaveCommit(uint64_t done, const VersionId& baseline, const std::vector<int>& live,
                    const std::map<uint64_t, std::string>& checkpoints);

 private:
  VersionRecovery() = default;
  void Hold(uint64_t version, const std::string& checkpoint);
  // Records `version` as the last one finished (rank-<r>.held) and removes the rank's files of
  // the versions before it. Returns the bytes removed.
  StatusOr<uint64_t> CollectBefore(uint64_t version);
  std::vector<uint64_t> versions_;  // the plan's version numbers whose files are not collected
  uint64_t finished_before_ = 0;    // rank-<r>.held at Open: versions below it are finished
  bool state_floor_ = false;        // a signed delta receiver: its floor is rank-<r>.floor
  NodePlan plan_;                   // the long-lived plan (rank, method, state_dir, fault points)
  std::string held_path_;    // receiver: the checkpoint of the version it holds ("": the log)
  std::string layout_path_;  // plan.receiver_base_path: the layout of the version log's image
  std::string log_dir_;      // a delta receiver's version log
  uint64_t held_number_ = 0;
  bool held_checked_ = false;  // CheckHeld passed for held_path_
  std::optional<JointCommitState> commit_;
  uint64_t collected_bytes_ = 0;
};

// What ExportHeldVersion wrote.
struct ExportedVersion {
  uint64_t version = 0;      // the version the rank holds
  std::string path;          // the checkpoint written (a file, or a directory for a sharded one)
  std::string commitment;    // the trainer's signed commitment root it was proven against (hex)
  std::string content_hash;  // an unsigned export: the content hash it was checked against (hex)
  std::string source;        // where the held version was read: its version log or a checkpoint
};

// `dcr export`: writes the version delta receiver `plan.rank` holds in the long-lived state
// `plan.state_dir` (the plan dcr-node runs: HostPlan's for a deployment, or `dcr run`'s plan
// file) as its target checkpoint at `out`: the version log's image with its committed records
// replayed and the target header the receiver recorded (the function the node materializes a
// committed checkpoint with, CommitStorageAsCheckpoint, run on a private copy beside `out`), or,
// when the version's done record names a checkpoint file the rank holds it as (an adopted full
// frame, a committed file made with kCommittedFilesEnv) and the log committed nothing later, a
// copy of that file: what the node serves. Before anything is
// at `out`, the checkpoint's tensors must have the commitment root the trainer signed for that
// version (the rank's signed state of it, v<k>/rank-<r>.signed, verified with plan.trust_key and
// plan.run_id); then it is renamed onto `out` (a file replaced atomically; a sharded checkpoint
// is a directory, which `out` must not already be). Read only for the node's state: it may run
// while the node serves the version. A plan without a trust key (an unsigned deployment) has no
// signed root: only with `allow_unsigned`, the checkpoint's content hash must then be the one the
// version log recorded for the version (a checksum against damage, not a proof of origin).
// Errors: kInvalidArgument for the sender's rank, a full-stream plan or one without state_dir;
// kNotFound for a state that does not exist; kFailedPrecondition when the rank holds no version
// yet, for an unsigned plan without `allow_unsigned` (or whose version is held as a file, which
// records no hash), when the version has no signed state, and when the bytes do not have the
// signed root (naming the first wrong range) or the recorded hash; VersionLog::Recover's,
// ReadSignedState's, CommitStorageAsCheckpoint's, errno errors naming the file. On any error
// nothing is left at `out` (an earlier file there stays as it was) nor beside it.
StatusOr<ExportedVersion> ExportHeldVersion(const NodePlan& plan, const std::string& out,
                                            int threads, bool allow_unsigned = false);

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_NODE_VERSION_STATE_H_
