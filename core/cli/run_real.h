// The real-mode scenario runner behind `dcr run` (mode: real) and the plan builder behind
// `dcr node SCENARIO.yaml --rank R` (multi-host).
//
// One run = (method, transport, change rate, step): the runner synthesizes (or takes) the
// checkpoints, writes one NodePlan per rank, starts `dcr node --plan` processes on loopback
// (fork/exec of this binary), waits for them with a progress line on stderr, and turns their
// NodeResults into a RunResult (scenario.h). Receivers verify their storage byte for byte against
// the target checkpoint after committing.
//
// Thread safety: not thread-safe (one runner per process).
#ifndef DCR_CORE_CLI_RUN_REAL_H_
#define DCR_CORE_CLI_RUN_REAL_H_

#include <string>
#include <vector>

#include "dcr/scenario.h"
#include "dcr/statusor.h"
#include "dcr/transport.h"

namespace dcr::cli {

// Checkpoints of one change rate: paths[0] is the base, paths[k] the version after step k.
// Synthesized into <work_dir>/ckpt-<preset>-<rate>/ (reused when already there with the same
// parameters), or the scenario's explicit checkpoints.
StatusOr<std::vector<std::string>> PrepareCheckpoints(const Scenario& s, double rate,
                                                      const std::string& work_dir);

// The plans of every rank of one run. `addresses` (relay tree) come from network.hosts or free
// loopback ports; `run_dir` holds results; `store_prefix` names the run's objects.
StatusOr<std::vector<NodePlan>> MakePlans(const Scenario& s, Method method, TransportKind transport,
                                          const std::string& base, const std::string& target,
                                          const std::string& run_dir, const std::string& work_dir,
                                          const std::string& store_prefix);

// Runs every (method x transport x rate x step) of a mode-real scenario.
StatusOr<ScenarioResult> RunScenarioReal(const Scenario& s);

// Allocator settings of a refit data-plane process (`dcr node`, and `dcr bench pipeline`, which
// times the same code): glibc's malloc keeps buffers up to 32 MiB in its heaps instead of
// mmapping them and giving them back on free. BuildDelta scans and encodes window after window
// on fresh worker threads; with the default (dynamic) threshold a fresh sender process mapped,
// faulted in and unmapped those buffers again every window: ~25k extra page faults, ~0.08 s of
// CPU in a 0.35 s build of compare-small, which a long-lived process (or the bench's warm
// repetitions) never pays.
void UseDataPlaneAllocator();

}  // namespace dcr::cli

#endif  // DCR_CORE_CLI_RUN_REAL_H_
