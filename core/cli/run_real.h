// The real-mode scenario runner behind `dcr run` (mode: real).
//
// One run = (method, transport, change rate, step): the runner synthesizes (or takes) the
// checkpoints, writes one NodePlan per rank (plans/node_plans.h), starts `dcr-node --plan`
// processes on loopback (fork/exec of the dcr-node binary beside this one), waits for them with a
// progress line on stderr, and turns their NodeResults into a RunResult (scenario.h). Receivers
// verify their storage byte for byte against the target checkpoint after committing.
//
// Thread safety: not thread-safe (one runner per process).
#ifndef DCR_CORE_CLI_RUN_REAL_H_
#define DCR_CORE_CLI_RUN_REAL_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dcr/node.h"
#include "dcr/scenario.h"
#include "dcr/statusor.h"

namespace dcr::cli {

// Checkpoints of one change rate: paths[0] is the base, paths[k] the version after step k.
// Synthesized into <work_dir>/ckpt-<preset>-<rate>/ (reused when already there with the same
// parameters), or the scenario's explicit checkpoints.
StatusOr<std::vector<std::string>> PrepareCheckpoints(const Scenario& s, double rate,
                                                      const std::string& work_dir);

// The fraction of elements that differ between two checkpoints: the changed elements of the delta
// from `base_path` to `target_path` over all its elements (what a run reports as change_rate).
// Errors: those of Checkpoint::Open, kFailedPrecondition as CheckDeltaCompatible (delta.h).
StatusOr<double> MeasureChangeRate(const std::string& base_path, const std::string& target_path);

// A SIGKILL sent by the runner to node `rank` `at_s` seconds after the refit's start signal
// (long-lived nodes: the start signal of version `version`; 0 = the first).
struct ExternalKill {
  double at_s = 0;
  int rank = 0;
  bool done = false;
  uint64_t version = 0;
};

// Faults of one real refit (the faults block's process runs, tools/faults/run_faults.h):
// `set_points` sets the plans' fault points (NodePlan::fault_*) before the nodes start; `kills`
// come from outside.
struct RefitFaults {
  std::function<void(std::vector<NodePlan>*)> set_points;
  std::vector<ExternalKill> kills;
};

// One real refit: base ckpts[step - 1] to target ckpts[step] by `method` over `transport`, its
// node processes in run folder <work_dir>/run-<run_index>, supervised (a node that dies or fails
// is restarted with its plan, at most 8 times) and recovering (NodePlan::state_dir; a relay tree
// gets an in-region store that the long-link relays fill). `faults` may be null. A failed run is
// recorded in the result's error; the setup's CPU keys go to `out`.
StatusOr<RunResult> RunOneRefit(const Scenario& s, const std::vector<std::string>& ckpts,
                                Method method, TransportKind transport, double rate,
                                double measured_rate, int step, int run_index,
                                const std::string& work_dir, ScenarioResult* out,
                                const RefitFaults* faults);

// The refits of steps 1..s.steps by `method` over `transport` in ONE set of long-lived node
// processes (NodePlan::versions: version k = step k), in run folder <work_dir>/run-<run_index>:
// the nodes stay up from step to step, the sender building each step's delta from the joint
// commit's baseline. On device "cpu" the nodes recover (NodePlan::state_dir, an in-region store
// for a relay tree) and are supervised as RunOneRefit's: a node that dies is restarted with its
// plan, comes back at the version it holds and takes part in the version in flight (each
// restart line names that version, "...; in version <k>", and goes to that step's result).
// `faults` (may be null): fault points (NodePlan::fault_version picks the step) and kills from
// outside (ExternalKill::version). One RunResult per step, each receiver verified at each
// step; the steps after a failure carry it as their error.
StatusOr<std::vector<RunResult>> RunLongLivedRefits(
    const Scenario& s, const std::vector<std::string>& ckpts, Method method,
    TransportKind transport, double rate, const std::vector<double>& measured, int run_index,
    const std::string& work_dir, ScenarioResult* out, const RefitFaults* faults = nullptr);

// The contents of the file at `path`; empty when it cannot be read (a result or log a process
// did not write).
std::string ReadText(const std::string& path);

// The runs of a scenario's faults block for change rate `rate` (checkpoints `ckpts`, scratch
// under `work_dir`): each run is numbered from *run_index + 1 (advanced past the last) and added
// to out->runs, the faults to out->faults. The fault tools provide it (tools/faults/fault_runs.h).
using FaultBlockRunner =
    std::function<Status(const Scenario& s, double rate, const std::vector<std::string>& ckpts,
                         const std::string& work_dir, int* run_index, ScenarioResult* out)>;

// Runs every (method x transport x rate x step) of a mode-real scenario, and for each rate first
// the faults block's runs through `faults` when s.faults.enabled and it asks for runs. The runs
// work in s.model.work_dir, which is left as it is, or else in a fresh $TMPDIR/dcr-run-* dir that
// is removed when they end, succeeded or failed (after a failure but for its log files, which the
// errors name), unless `keep_work_dir`; stderr says which. The result's setup.work_dir names the
// dir and, when removed, says so. Errors: those of the runs; kFailedPrecondition for such a
// faults block when `faults` is empty.
StatusOr<ScenarioResult> RunScenarioReal(const Scenario& s, const FaultBlockRunner& faults = {},
                                         bool keep_work_dir = false);

}  // namespace dcr::cli

#endif  // DCR_CORE_CLI_RUN_REAL_H_
