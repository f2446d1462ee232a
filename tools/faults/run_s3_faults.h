// The faults block's S3 runs (`faults.s3_runs`): object-store refits through the shipped
// dcr-node processes with an HTTP fault proxy (`dcr s3-fault-proxy`, s3_fault_proxy.h) in front
// of the scenario's S3 endpoint.
//
// Thread safety: not thread-safe (one runner per process).
#ifndef DCR_TOOLS_FAULTS_RUN_S3_FAULTS_H_
#define DCR_TOOLS_FAULTS_RUN_S3_FAULTS_H_

#include <string>
#include <vector>

#include "dcr/scenario.h"
#include "dcr/status.h"

namespace dcr::cli {

// The fault kinds of the S3 runs, as the result counts them: "s3:<kind>:<direction>" for each
// of S3FaultKinds and direction upload / download.
const std::vector<std::string>& S3RunFaultKinds();

// Runs s.faults.s3_runs real refits of ckpts[0] -> ckpts[1] over the object store (run_real.h
// RunOneRefit: supervised and recovering), each with a fresh `dcr s3-fault-proxy` process in
// front of transport.object_store.endpoint: every node's store spec names the proxy instead.
// Each run plans s.faults.s3_faults faults, cycled over the (kind, direction) pairs of
// s.faults.s3_kinds (empty: every kind) x (upload, download), at seeded requests early in the
// stream; a stall holds for the store's read deadline + 1 s. A planned fault counts as injected
// only when the proxy's log shows it, and as survived when its run ended with every receiver
// bit-exact and committed. Each run is added to out->runs (numbered from *run_index + 1), the
// faults to out->faults. Errors: a scenario whose store is not S3, checkpoints that cannot be
// read or diffed, a proxy or run that cannot be started.
Status RunScenarioS3Faults(const Scenario& s, double rate, const std::vector<std::string>& ckpts,
                           const std::string& work_dir, int* run_index, ScenarioResult* out);

}  // namespace dcr::cli

#endif  // DCR_TOOLS_FAULTS_RUN_S3_FAULTS_H_
