// The faults block's proxy runs (`faults.proxy_runs`): real refits through the shipped dcr-node
// processes with a fault proxy process (`dcr fault-proxy`, fault_proxy.h) on seeded relay-tree
// edges, and failed writes of the in-region store.
//
// Thread safety: not thread-safe (one runner per process).
#ifndef DCR_TOOLS_FAULTS_RUN_PROXY_FAULTS_H_
#define DCR_TOOLS_FAULTS_RUN_PROXY_FAULTS_H_

#include <string>
#include <vector>

#include "dcr/scenario.h"
#include "dcr/status.h"

namespace dcr::cli {

// The fault kinds of the proxy runs, as the result counts them: "proxy:<kind>" for each of
// FrameFaultKinds, and "store:write_fail".
const std::vector<std::string>& ProxyRunFaultKinds();

// Runs s.faults.proxy_runs real refits of ckpts[0] -> ckpts[1] over the relay tree
// (run_real.h RunOneRefit: supervised and recovering), each with s.faults.proxy_faults faults,
// kinds cycled over s.faults.proxy_kinds (empty: every kind). A frame fault goes to a fault
// proxy that `dcr run` starts on a seeded edge (a partition on a long-link edge), the parent's
// plan naming the proxy's address for the child; under TLS the proxy gets certificates minted
// from the run's CA. A store_write_fail makes the in-region store's directories refuse writes
// (read-only, and immutable when run as root, whose writes ignore the mode) for
// s.faults.store_fail_s once its first object is there. Each run is added to out->runs
// (numbered from *run_index + 1); the faults, per kind injected and survived, to out->faults. A
// planned fault counts as injected only when it happened: its proxy's log shows it, or the
// store window opened before the stream was published there and the long-link relays' mirror
// wrote fewer blobs than the stream has. Errors: checkpoints that cannot be read or diffed, a
// relay tree without one, TLS credentials from files (the proxy's certificates are minted from
// the run's CA key, which only a generated run has), a run that cannot be started.
Status RunScenarioProxyFaults(const Scenario& s, double rate, const std::vector<std::string>& ckpts,
                              const std::string& work_dir, int* run_index, ScenarioResult* out);

}  // namespace dcr::cli

#endif  // DCR_TOOLS_FAULTS_RUN_PROXY_FAULTS_H_
