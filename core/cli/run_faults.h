// The `faults:` block of `dcr run` (mode real): fault-injection refits of a scenario's checkpoints
// through dcr/testing/fault_injection.h, summed into ScenarioResult::faults.
//
// Thread safety: not thread-safe (one runner per process).
#ifndef DCR_CORE_CLI_RUN_FAULTS_H_
#define DCR_CORE_CLI_RUN_FAULTS_H_

#include <string>
#include <vector>

#include "dcr/scenario.h"
#include "dcr/status.h"
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

}  // namespace dcr::cli

#endif  // DCR_CORE_CLI_RUN_FAULTS_H_
