// Node plans: what each `dcr-node` process of a refit runs, derived from a parsed scenario
// (dcr/scenario.h's Scenario; reading the YAML is dcr::scenario's, not this library's). Shared by
// `dcr run` (which starts one dcr-node per rank on loopback), `dcr-node SCENARIO.yaml --rank R`
// (one process per host, multi-host) and the trainer-side C API (dcr/publisher_c.h). Product
// code (dcr::plans): no fixtures, no YAML parser, no CLI.
//
// Thread safety: pure functions (FreePort asks the kernel for a port).
#ifndef DCR_CORE_SRC_PLANS_NODE_PLANS_H_
#define DCR_CORE_SRC_PLANS_NODE_PLANS_H_

#include <functional>
#include <string>
#include <vector>

#include "dcr/node.h"
#include "dcr/scenario.h"
#include "dcr/statusor.h"

namespace dcr {

// The plans of every rank of one run. `addresses` (relay tree) come from network.hosts or free
// loopback ports; `run_dir` holds results; `store_prefix` names the run's objects. The run id
// (NodePlan::run_id) is a hash of the transport, `store_prefix`, the store and the addresses:
// public data, a placeholder that tells runs apart on the wire and nothing more; a run with
// certificates or signed deltas replaces it by its deployment id (SetDeployment). The
// version is left 0 (the caller numbers it). Devices: rank 0
// gets sender.device (device 0), receiver rank r receivers.device on device
// DeviceIndexFor(s, ReceiverLocalIndex(s, r)) (dcr/scenario.h).
StatusOr<std::vector<NodePlan>> MakePlans(const Scenario& s, Method method, TransportKind transport,
                                          const std::string& base, const std::string& target,
                                          const std::string& run_dir, const std::string& work_dir,
                                          const std::string& store_prefix);

// Binds `plans` to deployment `id` (16 hex digits, transport/tls.h NewRunId): NodePlan::run_id
// becomes its value (RunIdValue), which the trainer signs into every manifest, receivers require
// of every manifest, generated certificates name, and state directories are scoped by.
// Errors: RunIdValue's.
Status SetDeployment(const std::string& id, std::vector<NodePlan>* plans);

// The deployment id of a multi-host run of `s` (`dcr keys` made it): the one the node's own
// certificate names (network.tls cert, "{rank}" replaced by `rank`) when the scenario names
// certificates, and the one in the file "deployment" beside the trainer's public key
// (network.signing.trust) when signing names one; both must agree. "" when the scenario names
// neither (an unsigned run without certificates has no deployment). Errors: kFailedPrecondition
// for signed keys without a deployment file, or a certificate and file of two deployments;
// the file's and certificate's read errors.
StatusOr<std::string> ScenarioDeployment(const Scenario& s, int rank);

// Mutual TLS for relay-tree `plans` (network.tls): the scenario's files ("{rank}" in cert and
// key replaced by each plan's rank) when it names them; else, with `generate_dir` set, a fresh
// run CA and node certificates written there (transport/tls.h WriteRunCredentials; files of an
// earlier refit in that directory are replaced). Leaves the plans plain when network.tls is off
// or the transport is not a relay tree. Errors: kFailedPrecondition when TLS is on, the scenario
// names no files and `generate_dir` is empty (a multi-host node cannot make its run's CA
// alone), and WriteRunCredentials' errors.
Status AddTls(const Scenario& s, const std::string& generate_dir, std::vector<NodePlan>* plans);

// Signed deltas for delta `plans` (network.signing, on by default): the sender signs with the
// scenario's key, every receiver trusts its public key, keeps its version floor in
// `floor_dir`/version-floor-<rank> (none when `floor_dir` is empty) and reports a freeze past
// network.signing.freeze_after_s. Without named files and with `generate_dir` set, a fresh key
// pair is written there (trainer.key 0600, trainer.pub; files of an earlier refit replaced).
// The manifests name the plans' run id: a caller sets the deployment first (SetDeployment).
// Leaves the plans unsigned when signing is off, the method is the full checkpoint, or the
// scenario names no key pair and `generate_dir` is empty (the multi-host form: `dcr keys` makes
// the pair and prints the scenario keys). Errors: the key writer's.
Status AddSigning(const Scenario& s, const std::string& generate_dir, const std::string& floor_dir,
                  std::vector<NodePlan>* plans);

// Versions 1..targets.size() of a long-lived run for every plan (NodePlan::versions): version k
// delivers targets[k - 1] ("" for a sender whose trainer hands the contents through
// dcr/publisher_c.h), is verified against it by receivers that verify (plan.verify_path set),
// goes under store prefix prefix_of(k) and writes its result to
// result_dir/node-<rank>-v<k>.json.
void AddVersions(const std::vector<std::string>& targets,
                 const std::function<std::string(int)>& prefix_of, const std::string& result_dir,
                 std::vector<NodePlan>* plans);

// Recovery for every node (node_recovery.h, version_state.h): durable state in `state_dir`; a
// relay tree without a store gets `region_store` as its in-region store, which the sender's
// children (the long-link relays) fill with what they receive and every recovery reads. The
// caller decides whether `state_dir` starts empty (`dcr run`) or is the one a restarted node
// resumes from (the multi-host form).
void AddRecovery(const std::string& state_dir, const std::string& region_store,
                 std::vector<NodePlan>* plans);

// The plan of one rank of a multi-host run of `s` (`dcr-node SCENARIO --rank R`, and the
// trainer-side C API's sender): addresses from network.hosts, TLS and signing from the files the
// scenario names (`dcr keys`), no start barrier. Two forms:
//   * one refit: `target` given (the sender's new version; receivers verify against it), from
//     `base` to `target` under store prefix `prefix` ("" = refit/step-1);
//   * long-lived (`target` empty): `base` ("" = model.checkpoints[0]) then one version per
//     model.checkpoints entry after the first (their checkpoints; receivers verify against
//     them), or, with a preset, `steps` versions whose contents the trainer hands (the sender
//     needs VersionHooks::content), or, with model.base (`base` "" = model.base), open-ended
//     versions from 1 on (NodePlan::open_versions), as many as the trainer hands: the plans
//     do not depend on how many. Version k goes under prefix "<prefix>/step-<k>" ("" =
//     "refit"). With `state_dir` every node recovers (AddRecovery) and a restarted process
//     resumes at the version it holds; its durable state and the versions' result files
//     (node-<rank>-v<k>.json) live in the deployment's directory under it (state_dir.h
//     DeploymentStateDir), so a fresh deployment in the same directory starts fresh and never
//     overwrites an earlier one's results; the in-region store is `store` (a store URL), else
//     the scenario's transport.object_store when it names a path or S3.
// The deployment is ScenarioDeployment's (the run id a hash of public data when there is none).
// A signed receiver of the long-lived form needs `state_dir` (its version floor's home). The
// one-refit form with `state_dir` (the deployment's directory under it, made 0700 and checked as
// a node's own: state_dir.h OpenStateDir) numbers its versions so that they never repeat within
// the deployment: a delta sender publishes the next one (state_dir.h NextPublishedVersion,
// recorded there before this returns) built from the one before, and a signed delta receiver
// keeps its version floor there (OpenOneRefitFloor), which refuses an older one. Without
// `state_dir` the one-refit form publishes version 1 and keeps its floor in `work_dir`
// (version-floor-<rank>, naming its deployment). Without `state_dir`, the results live in
// `work_dir`.
// Errors: kInvalidArgument for a rank outside the scenario, a relay tree without
// network.hosts, a directory store without a path, recovery without a store, a long-lived
// signed receiver without `state_dir`; the state directory's (OpenStateDir,
// NextPublishedVersion, OpenOneRefitFloor); ScenarioDeployment's, MakePlans', AddTls',
// AddSigning's.
struct HostPlanOptions {
  Method method = Method::kDelta;
  TransportKind transport = TransportKind::kRelayTree;
  std::string base, target;
  std::string work_dir = ".";
  std::string prefix;
  std::string state_dir;
  std::string store;
  std::string result_path;  // the node's result JSON ("" = none)
};
StatusOr<NodePlan> HostPlan(const Scenario& s, int rank, const HostPlanOptions& o);

namespace internal {
// The version after `v` of an open-ended plan (NodePlan::open_versions), as RunNodeVersions
// takes it: declared in node/versions.h, defined with it; here for the CLI, which includes only
// this folder.
NodeVersion NextOpenVersion(const NodeVersion& v);
}  // namespace internal

// Checks, before any node starts, that every device the nodes of a mode-real run of `s` open is
// usable: ProbeDevice (dcr/device.h) of sender.device (device 0; when the scenario has the delta
// method, whose build uses it) and of receivers.device on each receiver's device index
// (MakePlans). Device "cpu" needs none. Errors: ProbeDevice's, with the
// key and the node named (kUnavailable naming CUDA and the reason when no usable GPU is present).
Status ProbeScenarioDevices(const Scenario& s);
// The same check for one node's plan (plan.device on plan.device_index; none for a sender of the
// full stream). kInvalidArgument for an unknown device name.
Status ProbePlanDevice(const NodePlan& plan);

}  // namespace dcr

#endif  // DCR_CORE_SRC_PLANS_NODE_PLANS_H_
