// Versions over time inside the rollout region: receivers that follow a long-lived relay-tree run
// from the in-region store (the store the long-link relay fills, NodePlan::mirror_to_store), a
// receiver that fell behind catching up, and a late joiner taking a full frame, none of it across
// the long link (core/docs/fault-tolerance.md, "Catch-up and late joiners").
//
// What the in-region store holds per version `v` of prefix P_v (what catch-up needs retained):
//   P_v/<id>.<hdr|chk|trl>       the version's delta as the long-link relay received it (the
//                                plain encoding; trailer put last), ObjectKey layout
//   P_v/reports/<rank>           a region receiver's commit report (commit_reports.h record)
//   P_v/full/frame.safetensors   a full frame of v (a safetensors image of an in-region holder's
//                                storage), present only when a full frame was requested
//   <root>/catch-up/requests/<rank>  a pending full-frame request (root: CatchUpRoot)
//   <root>/catch-up/returning/<rank> a caught-up receiver about to take a live version
// A receiver k versions behind replays the deltas of the k versions it missed; so a retention
// policy that deletes P_v's delta while a receiver may still hold v - 1 turns its catch-up into
// a full-frame request.
//
// Thread safety: PlanCatchUp is pure; the store functions are thread-compatible (one caller per
// ObjectStore); RunRegionReceiverVersions is self-contained like RunNode.
#ifndef DCR_CORE_SRC_NODE_CATCH_UP_H_
#define DCR_CORE_SRC_NODE_CATCH_UP_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/node.h"
#include "dcr/object_store.h"
#include "dcr/receiver.h"
#include "dcr/signing.h"
#include "dcr/status.h"
#include "node/receiver_stack.h"

namespace dcr::internal {

class TlsContext;       // transport/tls.h
class VersionRecovery;  // node/version_state.h

// ---- the decision ----

// What the in-region store holds of one published version.
struct StoredVersion {
  uint64_t number = 0;
  bool delta_whole = false;  // header, every chunk and the trailer (ids 0..trailer) present
  uint64_t delta_bytes = 0;  // their total size (when whole)
  bool full_frame = false;   // P_v/full/frame.safetensors present
};

struct CatchUpLimits {
  // Replay at most this many missed versions; further behind, a full frame. Default 8 (the
  // library's CatchUpOptions::max_compose).
  int max_replay = 8;
  // A full frame instead when the deltas to replay hold more than this fraction of the
  // checkpoint's tensor bytes. Default 0.5 (CatchUpOptions::full_frame_fraction).
  double full_frame_fraction = 0.5;
};

// The next step of a region receiver about to take part in the version after `held`.
struct CatchUpStep {
  enum Kind {
    kFollow,            // in step (at most the next version is published): take version held+1
    kReplay,            // behind: apply the retained delta of version held+1 from the store
    kFullFrame,         // load the full frame of `version` from the store
    kRequestFullFrame,  // no usable delta chain and no full frame yet: ask an in-region holder
  };
  Kind kind = kFollow;
  uint64_t version = 0;  // kFollow / kReplay: held + 1; kFullFrame: the frame's version
  std::string why;
};

// `held`: the version the receiver holds (none: a late joiner with no version); `stored`: what
// the store holds of the versions after it (any order; versions not listed are not published);
// `dense_bytes`: the checkpoint's tensor bytes. The receiver is in step when no version after
// held + 1 is published; behind, it replays when every missed delta is whole, there are at most
// max_replay of them and they hold at most full_frame_fraction of dense_bytes; otherwise it
// takes the newest full frame after `held`, or replays anyway when no frame exists and the chain
// is whole (correct, only dearer), or requests a frame.
CatchUpStep PlanCatchUp(const std::optional<uint64_t>& held,
                        const std::vector<StoredVersion>& stored, uint64_t dense_bytes,
                        const CatchUpLimits& limits);

// ---- the in-region store ----

// The common parent of a long-lived plan's version prefixes (the first version's prefix up to
// its last '/'; the prefix itself when it has none).
std::string CatchUpRoot(const NodePlan& plan);
std::string FullFrameKey(const std::string& prefix);
std::string FullFrameRequestKey(const std::string& root, int rank);
std::string RegionReportKey(const std::string& prefix, int rank);
// A region receiver catching up (replaying, or after a full frame) leaves this marker before each
// version it takes, until one not yet published; the sender then waits (at most its deadline)
// for its report of the version it collects next, and so re-admits it once it is in step:
// "<root>/catch-up/returning/<rank>".
std::string ReturningKey(const std::string& root, int rank);
// The ranks with a returning marker under `root` (marker removed: each is waited for once).
std::vector<int> TakeReturning(ObjectStore* store, const std::string& root);

// What `store` holds of version `number` under `prefix`. Errors: the store's List.
StatusOr<StoredVersion> InspectStoredVersion(ObjectStore* store, const std::string& prefix,
                                             uint64_t number);

// Puts a full frame of what `storage` holds (a stack's storage layer: a BufferReceiver in host
// memory or a DeviceReceiver) at FullFrameKey(prefix); a device's tensors are downloaded into
// host memory first (the frame is a host-side image either way). Returns the bytes put.
// kUnimplemented for no storage; kFailedPrecondition with a delta in progress; the device's and
// the store's errors.
StatusOr<uint64_t> PutFullFrame(ObjectStore* store, const std::string& prefix,
                                const StorageLayer& storage);
// The same for a checkpoint file (a recovering holder's committed checkpoint of the version,
// version_state.h): a single safetensors file is put as it is, a sharded one as one image of its
// tensors. Errors: Checkpoint::Open's, the store's.
StatusOr<uint64_t> PutFullFrameOfCheckpoint(ObjectStore* store, const std::string& prefix,
                                            const std::string& checkpoint_path);
// The safetensors image of a storage layer's tensors (what PutFullFrame puts); errors as
// PutFullFrame's but the store's.
StatusOr<std::vector<uint8_t>> FullFrameImage(const StorageLayer& storage);

// Whom a full frame must come from: the trainer whose key signed the version's stream.
struct FrameTrust {
  std::shared_ptr<const TrustKey> key;  // the trainer's public key
  std::optional<uint64_t> run_id;       // when set, the manifest must name this run
  // When set, a frame that passed has its version's signed state written here
  // (WriteSignedState): what a restarted node proves the frame's checkpoint with.
  std::string signed_state_path;
};

// The commitment the trainer signed for version `number` under `prefix`: the final manifest of
// the version's stream in the store (as the long-link relay mirrored it), verified against the
// version's header object with `trust` (signer, signature, run, header hash, versions).
// Errors: kNotFound (no header object), kFailedPrecondition (an unsigned stream, another signer
// or run, a header of another version, no signed final manifest, one without a commitment),
// kDataLoss (malformed records), the store's.
StatusOr<SignedCommitment> StoredSignedCommitment(ObjectStore* store, const std::string& prefix,
                                                  uint64_t number, const FrameTrust& trust);

// Fetches the full frame of version `number` under `prefix` and checks its content hash against
// the target hash of that version's trailer in the store (the delta the long-link relay
// received) and, with `trust`, its commitment against the one the trainer signed
// (StoredSignedCommitment): whoever wrote the store, a frame is loaded only when it is the
// signed version. `bytes` gets the bytes fetched. Errors: kNotFound (no frame or no trailer),
// kDataLoss (the frame is not that version's bytes, or does not parse), kFailedPrecondition
// (with `trust`: not the signed commitment, naming the first wrong range; or
// StoredSignedCommitment's).
StatusOr<std::unique_ptr<BufferReceiver>> FetchFullFrame(ObjectStore* store,
                                                         const std::string& prefix, uint64_t number,
                                                         uint64_t* bytes,
                                                         const FrameTrust* trust = nullptr);
// The same, the frame as a checkpoint in host memory (what a device receiver is loaded from).
StatusOr<std::unique_ptr<Checkpoint>> FetchFullFrameCheckpoint(ObjectStore* store,
                                                               const std::string& prefix,
                                                               uint64_t number, uint64_t* bytes,
                                                               const FrameTrust* trust = nullptr);

// A region receiver's commit report of `version` at RegionReportKey(prefix, rank): what it holds,
// its commitment root `root` (nullopt: none known; the sender of a signed version then does not
// count it) and content hash `hash` (bookkeeping), signed with `signer` (the receiver's run
// certificate, tls.h SignReport) when it is set.
Status PutRegionReport(ObjectStore* store, const std::string& prefix, int rank, uint64_t run,
                       uint64_t version, const Hash128& hash,
                       const std::optional<Sha256Digest>& root, const TlsContext* signer = nullptr);
// A restarted region receiver's report of the version it holds, `version` committed as the
// checkpoint at `held_path`: put (PutRegionReport with that checkpoint's commitment root and
// content hash, computed from it) when the
// store has no report of `rank` for (run, version) under `prefix` and the version's stream is
// still there (a prefix that retention collected needs no report). A process killed between
// recording the version done and putting its report thus leaves none missing. Idempotent: a
// report already there is kept. Returns whether it put one. Errors: the checkpoint's, the
// store's.
StatusOr<bool> RestoreRegionReport(ObjectStore* store, const std::string& prefix, int rank,
                                   uint64_t run, uint64_t version, const std::string& held_path,
                                   const TlsContext* signer = nullptr);
// The report of `rank` for (run, version) under `prefix`, if the store holds one. With `checker`
// (the sender's run credentials) a report is taken only when `rank` signed it
// (CheckReportSignature); `refused` (may be null) then gets why one was not. A record of another
// format (commit_reports.h) is not taken either, and `refused` gets why.
std::optional<CommitReport> GetRegionReport(ObjectStore* store, const std::string& prefix, int rank,
                                            uint64_t run, uint64_t version,
                                            const TlsContext* checker = nullptr,
                                            std::string* refused = nullptr);

// Sender: the region receivers' commit reports of (run, version) under `prefix`: every report
// there of a rank at or above `first_rank` (the ranks outside the tree), polled until each rank
// in `wait_for` reported or `deadline_s` passed. A report of another run or version, one that
// does not parse, or (with `checker`) one its rank did not sign is not taken; `refused` (may be
// null) gets "<rank>: why" for each signed-report refusal, once per rank.
std::vector<CommitReport> CollectRegionReports(ObjectStore* store, const std::string& prefix,
                                               uint64_t run, uint64_t version, int first_rank,
                                               const std::set<int>& wait_for, double deadline_s,
                                               const TlsContext* checker = nullptr,
                                               std::vector<std::string>* refused = nullptr);

// An in-region holder of committed versions (NodePlan::serve_full_frames): when a request is
// pending under CatchUpRoot(plan), puts a full frame of `storage` (version `prefix`'s) and
// removes the requests it saw. Returns how many requests it served (0: none pending).
StatusOr<int> ServeFullFrameRequests(ObjectStore* store, const NodePlan& plan,
                                     const std::string& prefix, const StorageLayer& storage);
// The same for a recovering holder, from the committed checkpoint of the version it holds
// (PutFullFrameOfCheckpoint); with `below_rank` >= 0 only the requests of ranks below it (the
// sender serves the tree's ranks and leaves region receivers' to their in-region holders; a
// request of no rank it can read is left too).
StatusOr<int> ServeFullFrameRequestsFromCheckpoint(ObjectStore* store, const NodePlan& plan,
                                                   const std::string& prefix,
                                                   const std::string& checkpoint_path,
                                                   int below_rank = -1);

// ---- a tree receiver whose next version retention removed ----

// A long-lived tree receiver with recovery about to take (*versions)[i] while holding
// recovery->held_number(): when the in-region store no longer holds that version's delta
// (retention collected it) while a later version is whole there, the version can come neither
// from its parent (which moved on) nor from the store, and PlanCatchUp over what the store holds
// says so. The receiver then asks for a full frame (FullFrameRequestKey; the sender serves it
// after its next version, ServeFullFrameRequestsFromCheckpoint), waits for one of a version after
// the held one until `deadline` (a SteadyNow() time), loads it after FetchFullFrameCheckpoint's
// checks (the content hash of the version's trailer; with plan.trust_key the trainer's signed
// commitment), adopts it as its held version (VersionRecovery::Adopt), leaves its commit report
// in the store, where the sender re-admits it from, and writes the versions' results: catch_up
// "absent" for those passed over, "full_frame" for the frame's (*result gets it). *versions is
// extended as far as the store holds versions (an open-ended plan: NextOpenVersion, each added
// to `recovery`). Returns the index in *versions of the frame's version, or `i` when there is
// nothing to do (the version's delta is there or not yet published). Errors: kDeadlineExceeded
// when no frame came; the store's; FetchFullFrameCheckpoint's (a frame that is not the version);
// Adopt's; TlsContext::Load's.
StatusOr<size_t> CatchUpCollectedVersion(ObjectStore* store, const NodePlan& plan,
                                         std::vector<NodeVersion>* versions, size_t i,
                                         VersionRecovery* recovery, double deadline,
                                         NodeResult* result);

// ---- the region receiver ----

// RunNode for a long-lived receiver that follows the versions from the in-region store
// (NodePlan::region_receiver): before each version it plans its step (PlanCatchUp over what the
// store holds), takes the version as a downloader (follow or replay) or loads a full frame,
// verifies, and leaves its commit report at RegionReportKey (signed with its run certificate when
// the plan names one: plan.tls_ca / tls_cert / tls_key). A version it does not hold (not yet
// joined, or skipped by a full frame) gets a result with catch_up "absent". With
// plan.state_dir it recovers as the tree's long-lived receivers do (version_state.h): each
// version taken as a journaled one-version downloader in <state_dir>/v<k>/, the committed
// checkpoint of every version it held (a full frame written out as one) its next base, and a
// restarted process resumes at the version it holds, leaving the results of the versions it
// finished as they are. Errors: the first version's error; kDeadlineExceeded when no full frame
// came within plan.timeout_s; VersionRecovery::Open's; TlsContext::Load's.
Status RunRegionReceiverVersions(const NodePlan& plan, NodeResult* result);

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_NODE_CATCH_UP_H_
