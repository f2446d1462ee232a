// The scenario's mapping onto transport policy and devices (dcr/scenario.h): the tree, the relay
// options, the read deadline, each receiver's host, local index and device, and the enum names.
// Pure functions of a parsed Scenario; the YAML parser (dcr::scenario) is not linked here.
#include <algorithm>
#include <string>
#include <vector>

#include "dcr/relay_policy.h"
#include "dcr/scenario.h"
#include "dcr/status.h"
#include "dcr/statusor.h"

namespace dcr {

const char* RunModeName(RunMode m) { return m == RunMode::kReal ? "real" : "sim"; }
const char* MethodName(Method m) { return m == Method::kDelta ? "delta" : "full"; }
const char* TransportKindName(TransportKind k) {
  return k == TransportKind::kRelayTree ? "relay_tree" : "object_store";
}
const char* StoreKindName(StoreKind k) { return k == StoreKind::kDir ? "dir" : "s3"; }

const std::string& ReceiverDevice(const Scenario& s, int node) {
  auto it = s.receivers.node_devices.find(node);
  return it != s.receivers.node_devices.end() ? it->second : s.receivers.device;
}

StatusOr<Topology> TopologyFor(const Scenario& s) {
  const RelayTreeSpec& rt = s.transport.relay_tree;
  if (!rt.topology.empty()) {
    auto t = Topology::FromParents(rt.topology);
    if (!t.ok()) return t.status().WithContext("transport.relay_tree.topology");
    return t;
  }
  const int receivers = s.receivers.count;
  const int per_host = std::max(1, s.receivers.per_node);
  if (per_host == 1 || receivers <= 1) {
    auto t = Topology::FanOut(receivers + 1, rt.fan_out, rt.root_fan_out);
    if (!t.ok()) return t.status().WithContext("transport.relay_tree.fan_out");
    return t;
  }
  // The tree of the sender and the host leaders (virtual node h + 1 = leader of host h), then
  // every receiver's parent in node ids.
  const int hosts = (receivers + per_host - 1) / per_host;
  auto leaders = Topology::FanOut(hosts + 1, rt.fan_out, rt.root_fan_out);
  if (!leaders.ok()) return leaders.status().WithContext("transport.relay_tree.fan_out");
  auto leader_node = [per_host](int host) { return 1 + host * per_host; };
  std::vector<NodeId> parents(receivers + 1, kNoNode);
  for (int node = 1; node <= receivers; ++node) {
    const int host = ReceiverHost(s, node);
    if (node == leader_node(host)) {
      const NodeId up = leaders->parent[host + 1];
      parents[node] = up == 0 ? 0 : leader_node(up - 1);
    } else {
      parents[node] = leader_node(host);
    }
  }
  auto t = Topology::FromParents(parents);
  if (!t.ok()) return t.status().WithContext("receivers.per_node");
  return t;
}

int ReceiverHost(const Scenario& s, int node) {
  return node <= 0 ? 0 : (node - 1) / std::max(1, s.receivers.per_node);
}

int ReceiverLocalIndex(const Scenario& s, int node) {
  return node <= 0 ? 0 : (node - 1) % std::max(1, s.receivers.per_node);
}

int DeviceIndexFor(const Scenario& s, int local_index) {
  const std::vector<int>& d = s.receivers.devices;
  if (d.empty()) return local_index;
  return d[static_cast<size_t>(local_index) % d.size()];
}

uint64_t EdgeLagBytesFor(const Scenario& s, uint64_t window_bytes) {
  const RelayTreeSpec& rt = s.transport.relay_tree;
  if (rt.edge_lag > 0) return rt.edge_lag;
  return 4 * window_bytes * static_cast<uint64_t>(std::max(1, rt.streams));
}

double ReadDeadlineFor(const Scenario& s) {
  if (s.network.read_deadline_s > 0) return s.network.read_deadline_s;
  const auto& rt = s.transport.relay_tree;
  const double streams = std::max(1, rt.root_fan_out) * std::max(1, rt.streams);
  const double bw = s.network.long_link.bandwidth_Bps;
  const double round = (bw > 0 ? 65536.0 * streams / bw : 0.0) + s.network.long_link.latency_s;
  return std::max({10.0, 2 * s.network.heartbeat_interval_s, 4 * round});
}

RelayOptions RelayOptionsFor(const Scenario& s, const std::string& prefix,
                             const TransportScale& scale) {
  RelayOptions o;
  o.piece_bytes = s.transport.relay_tree.chunk * std::max<uint64_t>(1, scale.piece_factor);
  o.window_bytes = s.transport.relay_tree.window;
  o.root_streams = std::max(1, s.transport.relay_tree.streams);
  o.max_parallel_applies = std::max(1, s.receivers.apply_threads);
  o.max_parallel_puts = std::max(1, s.transport.object_store.parallel);
  o.max_parallel_fetches = std::max(1, s.transport.object_store.parallel);
  o.poll_interval_s = std::max(s.transport.object_store.poll_s, scale.min_poll_interval_s);
  o.poll_timeout_s = s.timeout_s;
  o.prefix = prefix;
  return o;
}

}  // namespace dcr
