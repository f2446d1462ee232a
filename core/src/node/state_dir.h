// The state directory of a long-lived node (NodePlan::state_dir, `dcr-node --state`, a
// publisher's state): what it resumes from and, for a signed receiver, its version floor. Both
// are trusted on restart, so the directory must be the node's own: no other local user may
// have made it, read it or write to it.
//
// Thread safety: free functions over files; one process per rank uses them.
#ifndef DCR_CORE_SRC_NODE_STATE_DIR_H_
#define DCR_CORE_SRC_NODE_STATE_DIR_H_

#include <string>

#include "dcr/status.h"
#include "dcr/statusor.h"

namespace dcr::internal {

// The state of deployment `run_id` (NodePlan::run_id) under a node's state directory `root`
// (`--state`): <root>/deployment-<16 hex digits>. Everything a node resumes from (its version
// floor, held version, start counts, the versions' journals and committed checkpoints, the
// sender's joint commit) lives there, so a fresh deployment in the same `root` starts fresh and
// a deployment never sees another's floor.
std::string DeploymentStateDir(const std::string& root, uint64_t run_id);

// Opens `dir` as a node's state directory: creates it (mode 0700; its parent must exist) when
// missing, then requires a directory (not a symlink) owned by the process's effective user and
// neither readable nor writable by group or others. A deployment's directory
// (DeploymentStateDir) is opened after its root, which is created and checked alike. Errors:
// kFailedPrecondition naming the path, its owner and mode (and this user) for a directory that is
// not the node's own, or a path that is not a directory; errno errors naming the path.
Status OpenStateDir(const std::string& dir);

// <dir>/rank-<rank>.floor: the version floor (dcr/signing.h VersionFloor) of rank `rank`.
std::string StateFloorPath(const std::string& dir, int rank);

// Checks the version floor of rank `rank` in its state directory `dir` (opened by OpenStateDir).
// `fresh`: the directory records no earlier start of this rank. A fresh state without a floor
// file gets one of version 0, so that from then on a missing floor is told apart from a fresh
// start: a state that is not fresh and has no floor file is refused (deleting the floor would
// re-enable rollback), and so is a floor file that does not parse. Errors: kFailedPrecondition
// naming the floor's path for a missing one; VersionFloor::Load's and Record's.
// `run_id`: the deployment the floor belongs to (VersionFloor::Load).
Status OpenStateFloor(const std::string& dir, int rank, bool fresh, uint64_t run_id);

// The one-refit form (`dcr-node --target` with `--state`): versions never repeat within a
// deployment, though each refit is a process of its own.
//
// The version the one-refit sender of deployment `run_id` publishes next from its state
// directory `dir` (opened by OpenStateDir): one above the last one recorded in
// <dir>/rank-0.published (none recorded: 1). The new number is recorded there (written
// atomically and durably) before this returns, so a refit that fails, or a sender that crashes
// after publishing, never hands its number out again. Errors: kDataLoss for a file that does not
// parse, kFailedPrecondition for one of another deployment; errno errors naming the path.
StatusOr<uint64_t> NextPublishedVersion(const std::string& dir, uint64_t run_id);

// Opens the version floor of the one-refit receiver of rank `rank` in its state directory `dir`
// (opened by OpenStateDir) as OpenStateFloor does, the state being fresh when it holds no
// <dir>/rank-<rank>.started, which it then records: a floor deleted after a first start is
// refused rather than taken as a fresh start. Errors: OpenStateFloor's; errno errors.
Status OpenOneRefitFloor(const std::string& dir, int rank, uint64_t run_id);

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_NODE_STATE_DIR_H_
