// The simulated platform: regions as SimGrid star zones joined by one split-duplex long link.
//
// Region 0 holds the trainer nodes (senders), region 1 the rollout nodes (receivers). Every host
// has its own up and down NIC links (bandwidth, latency); each region has a gateway router; the
// inter-region link joins the two gateways. An optional object-store host lives in one region with
// its own NIC (the store's aggregate bandwidth) whose latency is the store's first-byte latency,
// so every request (Comm) to or from the store pays it once.
//
// Hosts run at 1e9 flop/s per core: a job of b bytes at B bytes/s costs b * 1e9 / B flops (see
// ComputeFlops). Thread safety: SimGrid is single-threaded; build once per process, before run().
#ifndef DCR_SIM_ENGINE_PLATFORM_H_
#define DCR_SIM_ENGINE_PLATFORM_H_

#include <simgrid/s4u.hpp>
#include <string>
#include <vector>

namespace dcr::sim::internal {

inline constexpr double kHostFlops = 1e9;

struct RegionSpec {
  std::string name;
  int nodes = 1;
  int cores_per_node = 1;    // simulated cores (compute jobs run one per core in parallel)
  double nic_bandwidth = 0;  // bytes/s, per direction
  double nic_latency = 0;    // seconds, per hop host <-> gateway
};

struct PlatformSpec {
  std::vector<RegionSpec> regions;  // exactly 2: [0] trainer side, [1] rollout side
  double wan_bandwidth = 0;         // bytes/s, per direction (split duplex)
  double wan_latency = 0;           // seconds, one way
  bool object_store = false;
  int store_region = 1;
  double store_bandwidth = 0;  // bytes/s, per direction, aggregate of the store
  double store_latency = 0;    // first-byte latency, seconds (paid once per request)
  // > 0: every compute job (builds and applies of every node) runs on one shared CPU host with
  // this many cores instead of the node's own host: a one-machine run, where the sender, relays
  // and receivers are processes competing for the same cores.
  int shared_cpu_cores = 0;
  // Speed of each shared core as a fraction of a full core: what a loaded machine delivers to the
  // run (calibration available_cores / shared_cpu_cores, at most 1).
  double shared_cpu_share = 1.0;
  // Cores of the clock host that runs timers (one timer per node at most; 0 = no clock host).
  int clock_cores = 0;
  // > 0: `edge_count` edge-relay hosts in region 1 ("edge-relay", or "edge-relay-0" ..
  // "edge-relay-<edge_count - 1>" for several), each with this many cores and the region's NIC.
  int edge_cores = 0;
  int edge_count = 1;
};

struct Platform {
  std::vector<std::vector<simgrid::s4u::Host*>> hosts;  // [region][node]
  simgrid::s4u::Host* store = nullptr;
  simgrid::s4u::Link* wan = nullptr;
  simgrid::s4u::Host* shared_cpu = nullptr;  // spec.shared_cpu_cores > 0
  simgrid::s4u::Host* edge = nullptr;        // spec.edge_cores > 0: the first edge-relay host
  std::vector<simgrid::s4u::Host*> edges;    // every edge-relay host (edges[0] == edge)
  // Timers are exec jobs on this host (1 flop/s per core: a job of d flops ends after d seconds),
  // so a timer is an activity that wait_any waits on like any other.
  simgrid::s4u::Host* clock = nullptr;
};

inline constexpr double kClockFlops = 1.0;

// Builds the platform into the engine's root zone. REQUIRES: an Engine exists, network model
// configured, no platform loaded yet. Aborts (SimGrid asserts) only on an internal bug; callers
// validate the spec first (ValidatePlatformSpec).
Platform BuildPlatform(const PlatformSpec& spec);

// Empty string when valid, else a message naming the offending field.
std::string ValidatePlatformSpec(const PlatformSpec& spec);

inline double ComputeFlops(double bytes, double bytes_per_s) {
  return bytes_per_s > 0 ? bytes * kHostFlops / bytes_per_s : 0.0;
}

}  // namespace dcr::sim::internal

#endif  // DCR_SIM_ENGINE_PLATFORM_H_
