#include "platform.h"

#include <algorithm>
#include <string>

namespace sg4 = simgrid::s4u;

namespace dcr::sim::internal {

std::string ValidatePlatformSpec(const PlatformSpec& spec) {
  if (spec.regions.size() != 2) return "network.regions: exactly two regions are simulated";
  for (size_t r = 0; r < spec.regions.size(); ++r) {
    const RegionSpec& reg = spec.regions[r];
    std::string key = "network.regions[" + std::to_string(r) + "]";
    if (reg.nodes < 1) return key + ".nodes: must be >= 1";
    if (reg.cores_per_node < 1) return key + ".cores: must be >= 1";
    if (!(reg.nic_bandwidth > 0)) return key + ".nic_bandwidth: must be > 0";
    if (!(reg.nic_latency >= 0)) return key + ".latency: must be >= 0";
  }
  if (!(spec.wan_bandwidth > 0)) return "network.wan.bandwidth: must be > 0";
  if (!(spec.wan_latency >= 0)) return "network.wan.latency: must be >= 0";
  if (spec.object_store) {
    if (spec.store_region < 0 || spec.store_region > 1) return "object_store.region: 0 or 1";
    if (!(spec.store_bandwidth > 0)) return "object_store.bandwidth: must be > 0";
    if (!(spec.store_latency >= 0)) return "object_store.first_byte_latency: must be >= 0";
  }
  return "";
}

namespace {

// Host-to-everything and everything-to-host links of one star member.
void AttachNic(sg4::NetZone* zone, simgrid::kernel::routing::NetPoint* point,
               const std::string& name, double bandwidth, double latency) {
  sg4::Link* up = zone->create_link(name + "_up", bandwidth)->set_latency(latency)->seal();
  sg4::Link* down = zone->create_link(name + "_down", bandwidth)->set_latency(latency)->seal();
  zone->add_route(point, nullptr, nullptr, nullptr, {sg4::LinkInRoute(up)}, false);
  zone->add_route(nullptr, point, nullptr, nullptr, {sg4::LinkInRoute(down)}, false);
}

}  // namespace

Platform BuildPlatform(const PlatformSpec& spec) {
  Platform p;
  sg4::NetZone* root = sg4::create_full_zone("world");
  std::vector<sg4::NetZone*> zones;
  std::vector<simgrid::kernel::routing::NetPoint*> gateways;
  p.hosts.resize(spec.regions.size());
  for (size_t r = 0; r < spec.regions.size(); ++r) {
    const RegionSpec& reg = spec.regions[r];
    sg4::NetZone* zone = sg4::create_star_zone(reg.name);
    zone->set_parent(root);
    for (int n = 0; n < reg.nodes; ++n) {
      std::string name = reg.name + "-" + std::to_string(n);
      sg4::Host* h = zone->create_host(name, kHostFlops)->set_core_count(reg.cores_per_node);
      h->seal();
      AttachNic(zone, h->get_netpoint(), name, reg.nic_bandwidth, reg.nic_latency);
      p.hosts[r].push_back(h);
    }
    if (r == 1 && spec.edge_cores > 0) {
      const int count = std::max(1, spec.edge_count);
      for (int k = 0; k < count; ++k) {
        const std::string name =
            count == 1 ? std::string("edge-relay") : "edge-relay-" + std::to_string(k);
        sg4::Host* h = zone->create_host(name, kHostFlops)->set_core_count(spec.edge_cores);
        h->seal();
        AttachNic(zone, h->get_netpoint(), name, reg.nic_bandwidth, reg.nic_latency);
        p.edges.push_back(h);
      }
      p.edge = p.edges[0];
    }
    if (spec.object_store && static_cast<int>(r) == spec.store_region) {
      sg4::Host* h = zone->create_host("object-store", kHostFlops);
      h->seal();
      AttachNic(zone, h->get_netpoint(), "object-store", spec.store_bandwidth, spec.store_latency);
      p.store = h;
    }
    if (r == 0 && spec.shared_cpu_cores > 0) {
      p.shared_cpu = zone->create_host("shared-cpu", kHostFlops * spec.shared_cpu_share)
                         ->set_core_count(spec.shared_cpu_cores)
                         ->seal();
    }
    if (r == 0 && spec.clock_cores > 0) {
      p.clock = zone->create_host("clock", kClockFlops)->set_core_count(spec.clock_cores)->seal();
    }
    // The gateway is a router with a non-limiting attachment (the inter-region route needs links).
    auto* gw = zone->create_router(reg.name + "-gw");
    AttachNic(zone, gw, reg.name + "-gw", 1e15, 0.0);
    zone->seal();
    zones.push_back(zone);
    gateways.push_back(gw);
  }
  auto* wan = root->create_split_duplex_link("wan", spec.wan_bandwidth);
  wan->set_latency(spec.wan_latency);
  wan->seal();
  p.wan = wan;
  root->add_route(zones[0]->get_netpoint(), zones[1]->get_netpoint(), gateways[0], gateways[1],
                  {sg4::LinkInRoute(wan, sg4::LinkInRoute::Direction::UP)}, true);
  root->seal();
  return p;
}

}  // namespace dcr::sim::internal
