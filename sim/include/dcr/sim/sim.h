// dcr::sim: simulate a scenario's refits on SimGrid, driving the project's own transport state
// machines (dcr/relay_policy.h), with payload sizes measured by the real codec and compute costs
// from a calibration file written by `dcr bench codec --json`. SimGrid-free header.
//
// What is simulated, per run (method x transport x change rate of the scenario):
//   * the platform: two regions (star zones; hosts with their own NIC links at the region's
//     bandwidth/latency), gateways joined by a split-duplex long link, an object-store host with
//     its bandwidth and first-byte latency (in the rollout region unless
//     sim.extra.object_store_region: train), receivers.per_node receivers sharing a host, in the
//     relay tree of TopologyFor (dcr/scenario.h), the one `dcr run` builds;
//   * the sender builds chunks (encode cost from the calibration, sim.gpus_per_node jobs in
//     parallel) and runs the same Sender/Relay/Receiver or Uploader/Downloader policies as
//     `dcr run` in mode real; receivers apply chunks (decode+apply cost from the calibration;
//     memcpy cost for the full checkpoint), receivers.apply_threads at a time;
//   * the payload: header + chunks + trailer, sized by the payload model (real codec on trained
//     samples of each element class of the preset's inventory, scaled to the inventory).
// Chunks and pieces are coarsened so the simulation sends at most ~sim.extra.comm_budget messages
// (default 40000; downloaders poll at most ~200 times per run): pieces grow and fewer of them are
// in flight, so each stream keeps its bytes in flight (until one piece exceeds the window) and its
// TCP rate cap (min(window, tcp_gamma) / RTT); a test checks the result does not move with the
// coarsening. With a `serving` block, a receiver applies 1 / serving.tp of the checkpoint.
//
// sim.extra keys: comm_budget, build_cores, object_store_region (train | rollout), and
// calibration_clock (cpu, the default: per-core CPU-time bandwidths; wall: the bench's wall-clock
// bandwidths, which is what a loaded, shared machine delivers, e.g. to compare with a real run
// here).
//
// Results use the real runner's schema (dcr/scenario.h ScenarioResult, mode "sim"); the
// calibration, the payload model and the coarsening are recorded in `setup`. A receiver counts as
// verified when its policy committed after applying every blob exactly once (the simulator moves
// no bytes, so this checks the protocol, not data).
//
// Each run is simulated in a forked child process (SimGrid allows one engine per process), runs in
// parallel up to the number of CPUs, so Simulate may be called many times by one process.
// Deterministic: same scenario and calibration, same result. Thread safety: call from one thread at
// a time (it forks).
#ifndef DCR_SIM_INCLUDE_DCR_SIM_SIM_H_
#define DCR_SIM_INCLUDE_DCR_SIM_SIM_H_

#include <cstdint>
#include <string>

#include "dcr/scenario.h"
#include "dcr/statusor.h"

namespace dcr::sim {

struct SimOptions {
  // Calibration file; overrides the scenario's sim.calibration. Default "" = the scenario's (a
  // relative path is taken against the scenario file's folder), else DefaultCalibrationPath().
  std::string calibration_path;
  // Print one progress line per run to stderr. Default false.
  bool progress = false;
};

// Where the default calibration lives: $DCR_SIM_CALIBRATION if set, else the first
// share/dcr/calibration/default.json in the running binary's folder or one of the three above it
// (the build copies sim/calibration/ to <build>/share/dcr/calibration/); "" if none. Never a path
// of the source tree: a binary run elsewhere does not fall back to the checkout it was built
// from.
std::string DefaultCalibrationPath();

// Simulates every run of `scenario` (its `mode` is not consulted). Errors: kInvalidArgument
// naming the scenario key (unsupported preset, region count, sim.network_model, unknown
// sim.extra key...), kNotFound for a missing calibration file, kInternal if a simulation process
// dies. A run whose receivers do not all commit is reported in the run's `error`, not as a
// Status.
StatusOr<ScenarioResult> Simulate(const Scenario& scenario, const SimOptions& options = {});

}  // namespace dcr::sim

#endif  // DCR_SIM_INCLUDE_DCR_SIM_SIM_H_
