// The `faults:` block of `dcr run`: fault-injection refits (see run_faults.h).
#include "run_faults.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>

#include "dcr/checkpoint.h"
#include "dcr/delta.h"
#include "dcr/status_macros.h"
#include "dcr/testing/fault_injection.h"
#include "run_real.h"

namespace dcr::cli {

FaultRunOptions FaultRunOptionsFor(const Scenario& s, double rate, int run,
                                   const std::string& work_dir) {
  FaultRunOptions o;
  o.seed = s.faults.seed + static_cast<uint64_t>(run);
  o.receivers = s.receivers.count;
  o.fan_out = s.transport.relay_tree.fan_out;
  o.root_fan_out = s.transport.relay_tree.root_fan_out;
  o.relay = RelayOptionsFor(s, "refit-v1");
  if (s.network.long_link.bandwidth_Bps > 0)
    o.long_bandwidth_Bps = s.network.long_link.bandwidth_Bps;
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
      std::fprintf(stderr,
                   "  faults / %g%% / run %d: %d injected, %d survived, %d/%d receivers "
                   "bit-exact and committed%s%s\n",
                   rate * 100, run + 1, r.faults_injected, r.faults_survived,
                   std::min(r.receivers_verified, r.receivers_committed), r.receivers,
                   r.error.empty() ? "" : ": ", r.error.c_str());
    }
  }
  sum.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return Status::OK();
}

namespace {

// One planned process kill.
struct PlannedKill {
  std::string kind;
  int rank = 0;
};

// Counts the chunks of a delta as it is built.
class ChunkCounter : public DeltaSink {
 public:
  Status OnHeader(const std::vector<uint8_t>&) override { return Status(); }
  Status OnChunk(const ChunkHeader&, const std::vector<uint8_t>&) override {
    ++chunks;
    return Status();
  }
  Status OnTrailer(const std::vector<uint8_t>&) override { return Status(); }
  uint64_t chunks = 0;
};

}  // namespace

StatusOr<uint64_t> CountScenarioDeltaChunks(const Scenario& s, const std::string& base_path,
                                            const std::string& target_path) {
  DCR_ASSIGN_OR_RETURN(auto base, Checkpoint::Open(base_path));
  DCR_ASSIGN_OR_RETURN(auto target, Checkpoint::Open(target_path));
  DeltaOptions d;
  d.chunk_elems = s.delta.chunk_elems;
  d.zstd_level = s.delta.zstd_level;
  ChunkCounter counter;
  DCR_RETURN_IF_ERROR(BuildDelta(base.get(), *target, d, &counter).status());
  return counter.chunks;
}

void AddFaultRun(const RunResult& rr, int injected, bool whole, const std::string& what, int run,
                 FaultSummary* sum) {
  ++sum->runs;
  sum->faults_injected += injected;
  if (whole) sum->faults_survived += injected;
  sum->receivers += rr.receivers;
  sum->receivers_verified += rr.receivers_verified;
  sum->restarts += rr.restarts.size();
  if (!whole) {
    sum->errors.push_back(what + " run " + std::to_string(run + 1) + ": " +
                          (rr.error.empty() ? "not every receiver bit-exact" : rr.error));
  }
}

const std::vector<std::string>& ProcessFaultKinds() {
  static const std::vector<std::string> kinds = {
      "process:receiver_between_chunks",    "process:receiver_inside_chunk",
      "process:relay_mid_stream",           "process:sender_mid_stream",
      "process:kill_from_outside",          "process:receiver_log_entries_synced",
      "process:receiver_log_marker_synced", "process:receiver_log_image_half_written",
      "process:receiver_log_image_renamed"};
  return kinds;
}

Status RunScenarioProcessFaults(const Scenario& s, double rate,
                                const std::vector<std::string>& ckpts, const std::string& work_dir,
                                int* run_index, ScenarioResult* out) {
  if (ckpts.size() < 2) return InvalidArgumentError("faults: needs a base and a target checkpoint");
  // The stream's shape, for the kill points: its chunks (blobs: header, chunks, trailer).
  DCR_ASSIGN_OR_RETURN(uint64_t chunks, CountScenarioDeltaChunks(s, ckpts[0], ckpts[1]));
  if (chunks == 0) return FailedPreconditionError("faults: the delta has no chunk to kill inside");
  DCR_ASSIGN_OR_RETURN(double measured, MeasureChangeRate(ckpts[0], ckpts[1]));
  // A multi-step scenario: each process run is one set of long-lived nodes through every step,
  // each kill at a seeded step (the fault points of a later step fire in that version).
  const int steps = std::max(1, s.steps);
  std::vector<double> measured_of(steps + 1, measured);
  for (int k = 2; k <= steps && static_cast<int>(ckpts.size()) > k; ++k) {
    DCR_ASSIGN_OR_RETURN(measured_of[k], MeasureChangeRate(ckpts[k - 1], ckpts[k]));
  }
  FaultSummary& sum = out->faults;
  sum.enabled = true;
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<std::string>& kinds = ProcessFaultKinds();
  size_t next_kind = 0;
  for (int run = 0; run < s.faults.process_runs; ++run) {
    std::mt19937_64 rng(s.faults.seed * 1000003 + static_cast<uint64_t>(run));
    auto pick = [&](uint64_t n) { return n == 0 ? 0 : static_cast<int64_t>(rng() % n); };
    std::vector<PlannedKill> planned;
    RefitFaults f;
    f.set_points = [&](std::vector<NodePlan>* plans) {
      const int n = static_cast<int>(plans->size());
      std::vector<bool> used(n, false);
      std::vector<int> relays;
      // Relays: tree ranks with a child (region receivers, ranks past the tree, have none).
      const int tree = static_cast<int>((*plans)[0].parents.size());
      for (int r = 1; r < tree; ++r) {
        for (int c = 1; c < tree; ++c) {
          if ((*plans)[0].parents[c] == r) {
            relays.push_back(r);
            break;
          }
        }
      }
      for (int k = 0; k < s.faults.process_kills; ++k) {
        const std::string kind = kinds[next_kind++ % kinds.size()];
        int rank = -1;
        if (kind == "process:sender_mid_stream") {
          rank = 0;
        } else if (kind == "process:relay_mid_stream" && !relays.empty()) {
          // Among the relays not already given a fault point, so that a run's receiver kills
          // do not crowd out its relay kill (a relay's kill point may also not fire: it fires
          // only while the relay forwards that version's stream).
          std::vector<int> free_relays;
          for (int r : relays) {
            if (!used[r]) free_relays.push_back(r);
          }
          if (!free_relays.empty()) rank = free_relays[pick(free_relays.size())];
        } else if (n > 1) {
          rank = 1 + static_cast<int>(pick(n - 1));
          if (kind == "process:kill_from_outside" && pick(4) == 0) rank = 0;
        }
        if (rank < 0 || used[rank]) continue;  // one fault point per process
        used[rank] = true;
        NodePlan& p = (*plans)[rank];
        const uint64_t step = steps > 1 ? 1 + static_cast<uint64_t>(pick(steps)) : 0;
        p.fault_version = step;
        if (kind == "process:receiver_between_chunks" || kind == "process:receiver_inside_chunk") {
          p.fault_kill_chunk = pick(chunks);
          p.fault_kill_inside = kind == "process:receiver_inside_chunk";
        } else if (kind == "process:relay_mid_stream" || kind == "process:sender_mid_stream") {
          p.fault_kill_blob = 1 + pick(chunks);
        } else if (kind.rfind("process:receiver_log_", 0) == 0) {
          // A step of the version log's commit ("entries_synced" -> "entries-synced"); an
          // image step needs a commit that writes an image: one every version on this rank.
          std::string step_name = kind.substr(std::string("process:receiver_log_").size());
          std::replace(step_name.begin(), step_name.end(), '_', '-');
          p.fault_kill_log_step = step_name;
          if (step_name.rfind("image-", 0) == 0) p.version_log_image_every = 1;
        } else {
          // From outside, at a seeded moment of the refit's first half second.
          f.kills.push_back(
              ExternalKill{static_cast<double>(pick(500)) / 1000.0, rank, false, step});
        }
        planned.push_back(PlannedKill{kind, rank});
      }
    };
    ++*run_index;
    std::vector<RunResult> step_runs;
    if (steps > 1) {
      DCR_ASSIGN_OR_RETURN(
          step_runs, RunLongLivedRefits(s, ckpts, Method::kDelta, TransportKind::kRelayTree, rate,
                                        measured_of, *run_index, work_dir, out, &f));
    } else {
      DCR_ASSIGN_OR_RETURN(RunResult one,
                           RunOneRefit(s, ckpts, Method::kDelta, TransportKind::kRelayTree, rate,
                                       measured, 1, *run_index, work_dir, out, &f));
      step_runs.push_back(std::move(one));
    }
    // A planned kill was injected when its node died (the supervisor restarted it); the run is
    // whole when every step of it is.
    bool whole = true;
    RunResult rr;  // the steps' restarts and recovery together
    rr.error.clear();
    for (const RunResult& x : step_runs) {
      whole = whole && x.error.empty() && x.receivers_verified == x.receivers;
      rr.receivers += x.receivers;
      rr.receivers_verified += x.receivers_verified;
      rr.restarts.insert(rr.restarts.end(), x.restarts.begin(), x.restarts.end());
      for (const auto& [k, v] : x.recovery) rr.recovery[k] += v;
      if (rr.error.empty() && !x.error.empty()) rr.error = x.error;
    }
    int injected = 0;
    for (const PlannedKill& k : planned) {
      const std::string who = "node " + std::to_string(k.rank) + ":";
      bool died = false;
      for (const std::string& line : rr.restarts) died |= line.rfind(who, 0) == 0;
      if (!died) continue;
      ++injected;
      ++sum.injected_by_kind[k.kind];
      if (whole) ++sum.survived_by_kind[k.kind];
    }
    AddFaultRun(rr, injected, whole, "process", run, &sum);
    sum.overwrite_repairs += rr.recovery["overwrite_repairs"];
    sum.fallbacks_to_store += rr.recovery["fallbacks"];
    if (s.progress) {
      std::fprintf(stderr,
                   "  faults / %g%% / process run %d: %d kills, %d/%d receivers bit-exact%s%s\n",
                   rate * 100, run + 1, injected, rr.receivers_verified, rr.receivers,
                   rr.error.empty() ? "" : ": ", rr.error.c_str());
    }
    for (RunResult& x : step_runs) out->runs.push_back(std::move(x));
  }
  sum.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return Status::OK();
}

}  // namespace dcr::cli
