// The sender's watch over its edge relays' progress (see edge_lag.h).
#include "node/edge_lag.h"

namespace dcr::internal {

EdgeLagWatch::EdgeLagWatch(const std::vector<NodeId>& edges, uint64_t bound) : bound_(bound) {
  for (NodeId e : edges) edges_[e];
}

void EdgeLagWatch::Sent(NodeId child, BlobId blob) {
  auto it = edges_.find(child);
  if (it != edges_.end()) it->second.started.insert(blob);
}

bool EdgeLagWatch::Accepted(NodeId child, BlobId blob, uint64_t length) {
  auto it = edges_.find(child);
  if (it == edges_.end()) return false;
  Edge& e = it->second;
  if (e.acked.count(blob) != 0) return false;  // acknowledged before the link's answer came
  e.unacked[blob] += length;
  e.total += length;
  if (e.lagging || bound_ == 0 || e.total <= bound_) return false;
  e.lagging = true;
  return true;
}

bool EdgeLagWatch::Acked(NodeId child, BlobId blob) {
  auto it = edges_.find(child);
  if (it == edges_.end()) return false;
  Edge& e = it->second;
  if (!e.acked.insert(blob).second) return false;
  auto b = e.unacked.find(blob);
  if (b != e.unacked.end()) {
    e.total -= b->second;
    e.unacked.erase(b);
  }
  if (!e.lagging || e.total > resume_bound()) return false;
  e.lagging = false;
  return true;
}

bool EdgeLagWatch::lagging(NodeId child) const {
  auto it = edges_.find(child);
  return it != edges_.end() && it->second.lagging;
}

bool EdgeLagWatch::started(NodeId child, BlobId blob) const {
  auto it = edges_.find(child);
  return it != edges_.end() && it->second.started.count(blob) != 0;
}

uint64_t EdgeLagWatch::unacked(NodeId child) const {
  auto it = edges_.find(child);
  return it == edges_.end() ? 0 : it->second.total;
}

std::vector<NodeId> EdgeLagWatch::lagging_children() const {
  std::vector<NodeId> out;
  for (const auto& [id, e] : edges_) {
    if (e.lagging) out.push_back(id);
  }
  return out;
}

}  // namespace dcr::internal
