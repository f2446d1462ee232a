// How the simulator turns a scenario into simulated runs: the sim.extra settings, the sizing of
// one run (blobs, coarsened pieces, build parallelism) and its RunSpec. The policy options come
// from RelayOptionsFor (dcr/scenario.h), the derivation the real runner uses, scaled by the
// coarsening (TransportScale), so a simulated node runs the policy a real node of the same
// scenario runs, on coarser pieces.
//
// Thread safety: pure functions.
#ifndef DCR_SIM_ENGINE_PLAN_H_
#define DCR_SIM_ENGINE_PLAN_H_

#include <cstdint>
#include <vector>

#include "dcr/relay_policy.h"
#include "dcr/scenario.h"
#include "dcr/statusor.h"
#include "driver.h"
#include "platform.h"

namespace dcr::sim::internal {

// Settings under sim.extra that the simulator understands.
struct Extra {
  double comm_budget = 40000;
  int store_region = 1;
  int build_cores = 0;      // 0 = sim.gpus_per_node
  bool wall_clock = false;  // calibration_clock: wall
  int shared_cpu = 0;       // > 0: every node computes on one shared CPU of this many cores
  int edge_cores = 64;      // edge_relay_cores: each edge relay's cores (with auto: the most)
  // edge_relays: how many edge relays split the base and its transcoding by chunk range
  // (dcr/edge_split.h). 0 = auto: the smallest set of at most kMaxEdgeRelays that keeps up with
  // the long link, fewest cores each (ChooseEdgeSplit). Default 1.
  int edge_count = 1;
  // edge_relay_memory: with edge_relays auto, the most base bytes one edge relay holds (its
  // range's share; a size, e.g. 256GiB). 0 = no bound.
  double edge_memory = 0;
  // durable: the receivers make each version durable as `dcr run`'s do (a state directory: the
  // version log's fsyncs and the journal's record at each commit), charged from the calibration's
  // commit_* keys. Default true; false: receivers without a state directory.
  bool durable = true;
};
inline constexpr int kMaxEdgeRelays = 64;
// kInvalidArgument naming the sim.extra key for an unknown key or a bad value.
StatusOr<Extra> ParseExtra(const Scenario& s);

// The sizing of one run.
struct Sizing {
  std::vector<SimBlob> blobs;
  uint64_t piece = 0, window = 0;  // simulated piece and bytes in flight per stream
  int pieces_in_flight = 1;
  uint64_t coarsen = 1;  // piece = relay_tree.chunk x coarsen
  uint64_t chunks = 0;
  int build_parallel = 1;  // concurrent chunk builds (each on build_cores / build_parallel cores)
  int build_window = 1;    // chunks built and emitted together (BuildDelta's window of cells)
};

// Blobs of one run: header, K chunks, trailer, coarsened within the message budget.
Sizing SizeRun(const Scenario& s, const Extra& extra, double payload, double header, double trailer,
               double dense, uint64_t grid_chunks, double build_Bps, double apply_Bps,
               int build_cores, int build_threads);

// The RunSpec of one run of `kind` over `plat` and `topo`, sized by `z`; its policy options are
// RelayOptionsFor(s, "dcr", {z.coarsen, polls at most ~200 per downloader over payload / the
// slower of long link and store}).
RunSpec PlanRun(const Scenario& s, const PlatformSpec& plat, const Topology& topo, const Sizing& z,
                TransportKind kind, double payload, double loopback_bandwidth);

}  // namespace dcr::sim::internal

#endif  // DCR_SIM_ENGINE_PLAN_H_
