// The `faults:` block of `dcr run`: fault-injection refits (see run_faults.h).
#include "run_faults.h"

#include <chrono>
#include <cstdio>

#include "dcr/checkpoint.h"
#include "dcr/status_macros.h"
#include "dcr/testing/fault_injection.h"

namespace dcr::cli {

FaultRunOptions FaultRunOptionsFor(const Scenario& s, double rate, int run,
                                   const std::string& work_dir) {
  FaultRunOptions o;
  o.seed = s.faults.seed + static_cast<uint64_t>(run);
  o.receivers = s.receivers.count;
  o.fan_out = s.transport.relay_tree.fan_out;
  o.root_fan_out = s.transport.relay_tree.root_fan_out;
  o.relay = RelayOptionsFor(s, "refit-v1");
  if (s.network.long_link.bandwidth_Bps > 0) o.long_bandwidth_Bps = s.network.long_link.bandwidth_Bps;
  o.long_latency_s = s.network.long_link.latency_s;
  o.detect_timeout_s = s.faults.detect_timeout_s;
  o.restart_delay_s = s.faults.restart_delay_s;
  o.time_limit_s = std::max(120.0, s.timeout_s);
  char dir[64];
  std::snprintf(dir, sizeof(dir), "/faults-%d-%d", static_cast<int>(rate * 1e4), run);
  o.work_dir = work_dir + dir;
  return o;
}

Status RunScenarioFaults(const Scenario& s, double rate, const std::vector<std::string>& ckpts,
                         const std::string& work_dir, ScenarioResult* out) {
  if (ckpts.size() < 2) return InvalidArgumentError("faults: needs a base and a target checkpoint");
  DCR_ASSIGN_OR_RETURN(auto base, Checkpoint::Open(ckpts[0]));
  DCR_ASSIGN_OR_RETURN(auto target, Checkpoint::Open(ckpts[1]));
  DeltaOptions d;
  d.chunk_elems = s.faults.chunk_elems ? s.faults.chunk_elems : s.delta.chunk_elems;
  d.zstd_level = s.delta.zstd_level;
  d.threads = 1;
  d.base_version = 0;
  d.target_version = 1;
  std::vector<FaultKind> kinds;
  for (const std::string& k : s.faults.kinds) {
    DCR_ASSIGN_OR_RETURN(FaultKind fk, FaultKindFromName(k));
    kinds.push_back(fk);
  }
  FaultSummary& sum = out->faults;
  sum.enabled = true;
  auto t0 = std::chrono::steady_clock::now();
  for (int run = 0; run < s.faults.runs; ++run) {
    FaultRunOptions o = FaultRunOptionsFor(s, rate, run, work_dir);
    std::vector<FaultSpec> faults = SeededFaults(o.seed, s.faults.per_run);
    if (!kinds.empty()) {
      for (size_t i = 0; i < faults.size(); ++i) faults[i].kind = kinds[i % kinds.size()];
    }
    DCR_ASSIGN_OR_RETURN(FaultRunReport r, RunFaultScenario(*base, *target, d, faults, o));
    ++sum.runs;
    sum.faults_injected += r.faults_injected;
    sum.faults_survived += r.faults_survived;
    sum.receivers += r.receivers;
    sum.receivers_verified += std::min(r.receivers_verified, r.receivers_committed);
    for (const auto& [k, v] : r.injected_by_kind) sum.injected_by_kind[k] += v;
    sum.overwrite_repairs += r.overwrite_repairs;
    sum.fallbacks_to_store += r.fallbacks_to_store;
    sum.restarts += r.restarts;
    sum.payloads_refused += r.payloads_refused;
    sum.corrupt_detected += r.corrupt_detected;
    if (!r.error.empty()) sum.errors.push_back("seed " + std::to_string(o.seed) + ": " + r.error);
    if (s.progress) {
      std::fprintf(stderr, "  faults / %g%% / run %d: %d injected, %d survived, %d/%d receivers "
                   "bit-exact and committed%s%s\n",
                   rate * 100, run + 1, r.faults_injected, r.faults_survived,
                   std::min(r.receivers_verified, r.receivers_committed), r.receivers,
                   r.error.empty() ? "" : ": ", r.error.c_str());
    }
  }
  sum.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return Status::OK();
}

}  // namespace dcr::cli
