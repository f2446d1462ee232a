// Internal: what a node plan says about signed deltas (dcr/signing.h), applied to a node's
// receiver: the trusted key, the run, the version floor, freeze reporting.
//
// Thread safety: free functions; the returned objects follow their own contracts.
#ifndef DCR_CORE_SRC_NODE_NODE_TRUST_H_
#define DCR_CORE_SRC_NODE_NODE_TRUST_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dcr/node.h"
#include "dcr/receiver.h"
#include "dcr/relay_policy.h"
#include "dcr/signing.h"
#include "dcr/statusor.h"

namespace dcr::internal {

// `receiver` inside a TrustedReceiver for `plan`: trusting plan.trust_key (PEM) for plan.run_id
// when set, with the version floor of plan.version_floor_path (loaded into `*floor`, which must
// outlive the receiver) when set. Errors: those of TrustKey::Load and VersionFloor::Load, with
// the plan field named.
StatusOr<std::unique_ptr<TrustedReceiver>> WithPlanTrust(const NodePlan& plan,
                                                         std::unique_ptr<Receiver> receiver,
                                                         std::unique_ptr<VersionFloor>* floor);

// The full-checkpoint reference stream signed. The blobs are FullStreamBlobs' (header, slices,
// trailer) with, before each batch of up to `per_manifest` slices, a manifest blob: u64
// kFullManifestMark, then a manifest record (dcr/manifest.h) naming run `run_id`, base version 0
// and a zero base hash, target version `version`, the SHA-256 of the header blob, and per slice
// its file offset as the chunk id and the SHA-256 of the whole slice blob; the final manifest
// leads the last batch and names the slice count (its target hash is zero: the signed header and
// slices fix every byte of the file). Not thread-safe; `key` must outlive it.
inline constexpr uint64_t kFullManifestMark = ~uint64_t{0};
class FullStreamSigner {
 public:
  using Emit = std::function<Status(BlobKind, std::vector<uint8_t>)>;
  FullStreamSigner(const SigningKey* key, uint64_t run_id, uint64_t version, Emit emit,
                   uint32_t per_manifest = 32);
  // One blob of the unsigned stream, in order; passes the signed stream to `emit`. Errors:
  // emit's, kDataLoss for a slice or trailer too short, kInternal if signing fails.
  Status operator()(BlobKind kind, std::vector<uint8_t> blob);

 private:
  Status Flush(bool final, uint64_t slices);

  const SigningKey* key_;
  uint64_t run_id_, version_;
  Emit emit_;
  uint32_t per_manifest_;
  Sha256Digest header_sha_{};
  uint32_t sequence_ = 0;
  std::vector<std::vector<uint8_t>> batch_;
};

// The full-stream receiver `receiver` for `plan`: with plan.trust_key, it applies a slice only
// after a manifest signed by that key for plan.run_id and plan.version lists it with this
// SHA-256 (a slice that comes first waits, at most 1 GiB), and commits only when every manifest
// up to the final one verified and the slices it lists all arrived; an unsigned stream, another
// signer, run or version, or an altered slice is kFailedPrecondition and reaches nothing of
// `receiver`. Without a trust key the manifests are skipped. Errors: those of TrustKey::Load.
StatusOr<std::unique_ptr<Receiver>> WithPlanFullTrust(const NodePlan& plan,
                                                      std::unique_ptr<Receiver> receiver);

// Where a signed delta receiver keeps the signed state of the version it committed
// (WriteSignedState, dcr/signing.h): <plan.state_dir>/rank-<r>.signed; empty without a state
// directory or a trust key, and for rank 0.
std::string SignedStatePath(const NodePlan& plan);

// The trust layer `trusted` of a stack kept from the version before (a long-lived node): its
// version floor becomes `*floor`, loaded afresh from plan.version_floor_path (none without one),
// and its signed state goes to SignedStatePath(plan). Errors: those of VersionFloor::Load, with
// the plan field named (then nothing changed).
Status AdoptPlanFloor(const NodePlan& plan, TrustedReceiver* trusted,
                      std::unique_ptr<VersionFloor>* floor);

// The freeze report of a receiver that committed nothing in this run (VersionFloor::FreezeReport
// with plan.freeze_after_s, waiting since `t_start_unix`); empty when freeze reporting is off or
// the limit was not passed. `floor` may be null (then only the waiting time counts).
std::string PlanFreezeReport(const NodePlan& plan, const VersionFloor* floor, double t_start_unix);

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_NODE_NODE_TRUST_H_
