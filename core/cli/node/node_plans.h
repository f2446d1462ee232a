// Node plans: what each `dcr-node` process of a refit runs, derived from a scenario. Shared by
// `dcr run` (which starts one dcr-node per rank on loopback) and `dcr-node SCENARIO.yaml --rank R`
// (one process per host, multi-host). Product code only: no fixtures.
//
// Thread safety: pure functions (FreePort asks the kernel for a port).
#ifndef DCR_CORE_CLI_NODE_NODE_PLANS_H_
#define DCR_CORE_CLI_NODE_NODE_PLANS_H_

#include <string>
#include <vector>

#include "dcr/scenario.h"
#include "dcr/statusor.h"
#include "dcr/transport.h"

namespace dcr::cli {

// The plans of every rank of one run. `addresses` (relay tree) come from network.hosts or free
// loopback ports; `run_dir` holds results; `store_prefix` names the run's objects. The run id
// (NodePlan::run_id) is a hash of the transport, `store_prefix`, the store and the addresses:
// the same for every host of a multi-host run, distinct for refits of distinct prefixes. The
// version is left 0 (the caller numbers it). Devices: rank 0
// gets sender.device (device 0), receiver rank r receivers.device on device
// DeviceIndexFor(s, ReceiverLocalIndex(s, r)) (dcr/scenario.h).
StatusOr<std::vector<NodePlan>> MakePlans(const Scenario& s, Method method, TransportKind transport,
                                          const std::string& base, const std::string& target,
                                          const std::string& run_dir, const std::string& work_dir,
                                          const std::string& store_prefix);

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
// Leaves the plans unsigned when signing is off, the method is the full checkpoint, or the
// scenario names no key pair and `generate_dir` is empty (the multi-host form: `dcr keys` makes
// the pair and prints the scenario keys). Errors: the key writer's.
Status AddSigning(const Scenario& s, const std::string& generate_dir,
                  const std::string& floor_dir, std::vector<NodePlan>* plans);

// Checks, before any node starts, that every device the nodes of a mode-real run of `s` open is
// usable: ProbeDevice (dcr/device.h) of sender.device (device 0; when the scenario has the delta
// method, whose build uses it) and of receivers.device on each receiver's device index
// (MakePlans). Device "cpu" needs none. Errors: ProbeDevice's, with the
// key and the node named (kUnavailable naming CUDA and the reason when no usable GPU is present).
Status ProbeScenarioDevices(const Scenario& s);
// The same check for one node's plan (plan.device on plan.device_index; none for a sender of the
// full stream). kInvalidArgument for an unknown device name.
Status ProbePlanDevice(const NodePlan& plan);

// The dcr-node executable beside the running binary (/proc/self/exe's directory). kNotFound if
// it is not there or not executable.
StatusOr<std::string> NodeExe();

}  // namespace dcr::cli

#endif  // DCR_CORE_CLI_NODE_NODE_PLANS_H_
