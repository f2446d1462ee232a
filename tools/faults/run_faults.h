// The `faults:` block of `dcr run` (mode real): fault-injection refits of a scenario's checkpoints
// through dcr/testing/fault_injection.h, summed into ScenarioResult::faults.
//
// Thread safety: not thread-safe (one runner per process).
#ifndef DCR_TOOLS_FAULTS_RUN_FAULTS_H_
#define DCR_TOOLS_FAULTS_RUN_FAULTS_H_

#include <string>
#include <vector>

#include "dcr/scenario.h"
#include "dcr/status.h"
#include "dcr/statusor.h"
#include "dcr/testing/fault_injection.h"

namespace dcr::cli {

// The options of fault-injection refit `run` (0-based) of `s`: seed s.faults.seed + run, the
// scenario's receivers, tree shape and long link, policy options RelayOptionsFor(s, "refit-v1")
// (the derivation `dcr run` uses), scratch directory under `work_dir` named by `rate` and `run`.
FaultRunOptions FaultRunOptionsFor(const Scenario& s, double rate, int run,
                                   const std::string& work_dir);

// Runs s.faults.runs fault-injection refits of ckpts[0] -> ckpts[1] (change rate `rate`) with the
// scenario's receivers, relay-tree shape and long link; adds the totals to out->faults. Errors:
// checkpoints that cannot be opened, a scratch directory that cannot be created. Runs that do not
// end bit-exact and committed are recorded in out->faults.errors (their faults not survived).
Status RunScenarioFaults(const Scenario& s, double rate, const std::vector<std::string>& ckpts,
                         const std::string& work_dir, ScenarioResult* out);

// The chunks of the delta base_path -> target_path under the scenario's delta options
// (s.delta.chunk_elems, zstd_level): the stream shape the fault points are planned on. Errors:
// checkpoints that cannot be opened or diffed.
StatusOr<uint64_t> CountScenarioDeltaChunks(const Scenario& s, const std::string& base_path,
                                            const std::string& target_path);

// Adds one real refit of a fault run to `sum`: the run, its `injected` faults (survived as well
// when the run ended `whole`, every receiver bit-exact and committed), its receivers and restarts,
// and, when not whole, the error "<what> run <run + 1>: " and the run's error (or "not every
// receiver bit-exact").
void AddFaultRun(const RunResult& rr, int injected, bool whole, const std::string& what, int run,
                 FaultSummary* sum);

// The fault kinds of the real process kills, as the result counts them ("process:...").
const std::vector<std::string>& ProcessFaultKinds();

// Runs s.faults.process_runs real refits of ckpts[0] -> ckpts[1] over the relay tree, each with
// s.faults.process_kills node processes SIGKILLed at seeded points (kinds cycled: a receiver
// between chunks and inside one, a relay mid-stream, the sender mid-stream, a kill from outside
// at a seeded moment), supervised and recovering (run_real.h RunOneRefit). Adds each run to
// out->runs (numbered from *run_index + 1) and the kills, per kind injected and survived, to
// out->faults. A planned kill counts as injected only when its node died. Errors: checkpoints
// that cannot be read or diffed, a run that cannot be started.
Status RunScenarioProcessFaults(const Scenario& s, double rate,
                                const std::vector<std::string>& ckpts, const std::string& work_dir,
                                int* run_index, ScenarioResult* out);

}  // namespace dcr::cli

#endif  // DCR_TOOLS_FAULTS_RUN_FAULTS_H_
