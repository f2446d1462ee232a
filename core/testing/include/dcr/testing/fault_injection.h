// Fault injection: runs one refit (base -> target) through the real transport state machines
// (relay_policy.h: sender, cut-through relays, receivers, object-store uploader and downloaders),
// the real codec, a real DirectoryStore and journaled receivers (journal.h), on a deterministic
// discrete-event clock, while injecting faults. Every run must end with every receiver bit-exact
// at a committed version and the joint commit whole; the report counts faults injected and
// survived.
//
// The harness decides nothing about recovery: every node's decisions come from its
// RecoveryPolicy (recovery_policy.h, rules R1-R9); the harness injects the faults, reports to
// each policy what a real node's transport and supervisor would see (a lost link, a failed
// stream, a restart with its journal, a doubtful chunk refused) and carries out the actions as
// its RecoveryEnvironment.
//
// Failure model (the policy's rules as they play out here; see core/docs/fault-tolerance.md):
//   * a receiver or relay killed (at a chunk boundary, inside a chunk, with its journal's last
//     record torn, or with its memory lost) restarts from its journal: storage that survived is
//     re-attached and chunks interrupted mid-apply are repaired with their overwrite form (served
//     by the sender into the object store on demand); lost storage is reloaded from the committed
//     version and the delta restarts;
//   * a node whose parent died (noticed detect_timeout_s later), whose stream failed (corrupt
//     piece, apply error) or whose tree policy failed falls back to the object store
//     (DownloaderPolicy) and skips chunks its journal shows applied; the harness offers no
//     re-parent adopter (its tree policies have a fixed child set), so every fallback goes to the
//     store;
//   * corrupt pieces are caught by chunk checksums (kDataLoss) before anything is written;
//     duplicates are skipped by the journal; reordering and delay are harmless (chunks are
//     independent); transient store-write failures are retried by the uploader; a partitioned long
//     link fails the tree's sends, receivers fall back to the store, and uploads retry until the
//     partition heals; a restarted sender rebuilds the identical delta (determinism) and
//     re-publishes it; payloads for another base are refused without writing.
//
// Thread safety: RunFaultScenario is self-contained (one run per call; no shared state).
#ifndef DCR_CORE_TESTING_INCLUDE_DCR_TESTING_FAULT_INJECTION_H_
#define DCR_CORE_TESTING_INCLUDE_DCR_TESTING_FAULT_INJECTION_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/delta.h"
#include "dcr/fault_kind.h"
#include "dcr/recovery_policy.h"
#include "dcr/relay_policy.h"
#include "dcr/status.h"
#include "dcr/statusor.h"

namespace dcr {

struct FaultSpec {
  FaultKind kind = FaultKind::kKillReceiverAtBoundary;
  // Victim node (1 .. receivers; node 0 is the sender). -1: chosen from the run's seed (a relay
  // for kKillRelay). Ignored by kStoreWriteFail, kPartitionLongLink and kRestartSender.
  int node = -1;
  // Where: the victim's n-th chunk apply (kills), the n-th chunk blob (corrupt, duplicate, delay,
  // store write), the n-th produced blob (restart sender). -1: chosen from the seed.
  int at = -1;
  // Seconds: partition length, delay, sender downtime. 0: a default (0.3 s).
  double duration_s = 0;
  // Failures in a row (kStoreWriteFail). Default 2 (below the uploader's retry limit).
  int count = 2;
};

// The harness's default policy options: 1 KiB pieces, 8 KiB windows, prefix "refit-v1", polls
// every 0.02 s with a 60 s timeout, 6 store retries from 0.05 s; the rest RelayOptions' defaults.
RelayOptions FaultRunRelayDefaults();

struct FaultRunOptions {
  int receivers = 6;  // nodes 1..receivers; every one applies (relays included)
  int fan_out = 2;    // tree shape (Topology::FanOut)
  int root_fan_out = 1;
  // The policies' options, for every node (tree roles, uploader, downloaders) and the store key
  // prefix. Defaults: FaultRunRelayDefaults().
  RelayOptions relay = FaultRunRelayDefaults();
  double long_latency_s = 0.03;  // one way, edges out of the sender and uploads
  double short_latency_s = 0.0005;
  double long_bandwidth_Bps = 50e6;
  double short_bandwidth_Bps = 1e9;
  double produce_interval_s = 0.002;  // sender emits one blob per interval (streaming build)
  double detect_timeout_s = 0.25;     // RecoveryOptions::detect_timeout_s (R1)
  double restart_delay_s = 0.2;       // a killed node restarts after this long
  int max_recoveries = 12;            // RecoveryOptions::max_recoveries (R7)
  double time_limit_s = 120;          // virtual seconds
  bool journal_sync = true;           // fsync journal records (real durability)
  uint64_t seed = 1;
  // Scratch directory for journals and the object store (created; removed when keep_files is
  // false). REQUIRES: non-empty.
  std::string work_dir;
  bool keep_files = false;
  // Record every event fed to a policy and the actions it returned (FaultRunReport::trace).
  bool record_trace = false;
};

// The policy configuration of a fault run: the tree over nodes 0..receivers, the transport
// options every relay, uploader and downloader policy gets, and the recovery options of every
// node. Another driver given the same configuration runs the same policies.
struct FaultRunPolicies {
  Topology topology;
  RelayOptions relay;
  RecoveryOptions recovery;
};
// Errors: kInvalidArgument for receivers < 1 or a bad tree shape (Topology::FanOut).
StatusOr<FaultRunPolicies> FaultRunPolicyConfig(const FaultRunOptions& options);

// One policy step of a run: the event fed to one of a node's policies at `time` and the actions
// it returned, in order (relay_policy.h and recovery_policy.h ToString forms). A trace is what
// the policies decided, independent of how the harness carries it out; two runs with the same
// inputs and seed give the same trace.
struct FaultTraceEntry {
  double time = 0;     // virtual seconds
  int node = 0;        // 0: the sender
  std::string policy;  // "sender", "relay", "receiver", "uploader", "downloader" or "recovery"
  std::string event;
  std::vector<std::string> actions;
};

struct FaultRunReport {
  int faults_injected = 0;
  int faults_survived = 0;
  std::map<std::string, int> injected_by_kind;
  int receivers = 0;
  int receivers_committed = 0;      // journal says committed(target)
  int receivers_verified = 0;       // storage byte-equal to the target
  bool joint_commit_whole = false;  // CommitCoordinator: every receiver holds the target
  uint64_t overwrite_repairs = 0;   // doubtful chunks repaired with overwrite forms
  uint64_t overwrites_served = 0;   // overwrite forms built by the sender
  uint64_t duplicates_skipped = 0;
  uint64_t payloads_refused = 0;  // relative chunks of doubtful chunks, stale deltas
  uint64_t corrupt_detected = 0;  // chunk/blob decode errors (checksums)
  uint64_t fallbacks_to_store = 0;
  uint64_t restarts = 0;
  bool sender_rebuild_identical = true;  // a restarted sender produced the same bytes
  double virtual_seconds = 0;
  std::string error;                   // empty when every check passed
  std::vector<std::string> log;        // one line per fault and recovery step
  std::vector<FaultTraceEntry> trace;  // when FaultRunOptions::record_trace
};

// The tree policy node `node` of a run with `options` starts with: its role in
// FaultRunPolicyConfig's tree with its relay options. Errors: those of FaultRunPolicyConfig,
// kInvalidArgument for a node outside the tree.
StatusOr<std::unique_ptr<NodePolicy>> MakeFaultRunTreePolicy(const FaultRunOptions& options,
                                                             NodeId node);

// Runs one refit under `faults`. Returns an error only for bad arguments or I/O setup failures;
// a run that does not end bit-exact and committed is reported in FaultRunReport::error (and its
// faults are not counted as survived).
StatusOr<FaultRunReport> RunFaultScenario(const Checkpoint& base, const Checkpoint& target,
                                          const DeltaOptions& delta_options,
                                          const std::vector<FaultSpec>& faults,
                                          const FaultRunOptions& options);

// `count` faults drawn from `seed`, cycling through every kind so that each appears.
std::vector<FaultSpec> SeededFaults(uint64_t seed, int count);

}  // namespace dcr

#endif  // DCR_CORE_TESTING_INCLUDE_DCR_TESTING_FAULT_INJECTION_H_
