// The faults block of `dcr run` (mode real), as the runner's FaultBlockRunner (run_real.h): the
// fault-injection refits (run_faults.h), real process kills (run_faults.h), fault proxies on
// relay-tree edges (run_proxy_faults.h) and an HTTP fault proxy before S3 (run_s3_faults.h).
// Test tooling: the `dcr` CLI links it; no product library or dcr-node does
// (tests/layout/link_closure.sh, link_test.sh).
//
// Thread safety: not thread-safe (one runner per process).
#ifndef DCR_TOOLS_FAULTS_FAULT_RUNS_H_
#define DCR_TOOLS_FAULTS_FAULT_RUNS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "dcr/scenario.h"
#include "dcr/status.h"
#include "dcr/statusor.h"

namespace dcr::cli {

// Runs, for change rate `rate`, each kind of run the faults block of `s` asks for, in this order:
// s.faults.runs fault-injection refits (when s.faults.per_run > 0), s.faults.process_runs process
// kills, s.faults.proxy_runs proxy runs, s.faults.s3_runs S3 runs. Real runs are numbered from
// *run_index + 1 and added to out->runs; the faults go to out->faults. Errors: the first failing
// kind's (see the runners' headers).
Status RunScenarioFaultBlock(const Scenario& s, double rate, const std::vector<std::string>& ckpts,
                             const std::string& work_dir, int* run_index, ScenarioResult* out);

// Starts this binary as `dcr <subcommand> --spec <spec_path>` (the fault proxies), its stdout and
// stderr to `log` (created or truncated). Returns the child's pid; the caller signals and reaps
// it. Errors: this binary's path cannot be read, fork fails.
StatusOr<pid_t> SpawnSubcommand(const char* subcommand, const std::string& spec_path,
                                const std::string& log);

}  // namespace dcr::cli

#endif  // DCR_TOOLS_FAULTS_FAULT_RUNS_H_
