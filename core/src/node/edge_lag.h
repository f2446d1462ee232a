// The sender's watch over its edge relays' progress (NodePlan::edge_lag_bytes): an edge relay
// acknowledges a chunk only once it has transcoded it (edge_relay.h), so the bytes the sender
// handed to the link for it (SendDone) and it has not acknowledged are what the link holds plus
// its transcoding backlog. An edge relay that keeps up holds about a window per stream and the
// chunks its threads are on; one that transcodes slower than the link delivers holds more and
// more. Past `bound` bytes the edge relay lags: from then on the sender sends it the plain form
// of every chunk it has not started on that edge (event::BlobReencoded), which the edge relay
// forwards as it arrives, so its subtree is no longer held back by the transcoding. Once its
// acknowledgements bring the bytes down to half the bound or fewer it has caught up: the chunks
// not started on its edge go to it in the context form again, until it next passes the bound.
//
// Pure bookkeeping: the driver reports its Sends, SendDones and Acks on the edges watched and
// acts on the answer. Thread safety: not thread-safe (the node's event thread only).
#ifndef DCR_CORE_SRC_NODE_EDGE_LAG_H_
#define DCR_CORE_SRC_NODE_EDGE_LAG_H_

#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "dcr/relay_policy.h"

namespace dcr::internal {

class EdgeLagWatch {
 public:
  // Watches the edges to `edges` (the sender's edge-relay children). `bound` 0: none lags.
  EdgeLagWatch(const std::vector<NodeId>& edges, uint64_t bound);

  bool watches(NodeId child) const { return edges_.count(child) != 0; }
  // A Send of a piece of `blob` to `child` was issued: the blob is started on that edge.
  void Sent(NodeId child, BlobId blob);
  // The link accepted `length` bytes of `blob` for `child`. True when a child that does not lag
  // passes the bound with its unacknowledged bytes (the child lags from here on).
  bool Accepted(NodeId child, BlobId blob, uint64_t length);
  // `child` acknowledged `blob`: its bytes no longer count. True when a child that lags is down
  // to resume_bound() unacknowledged bytes or fewer (it has caught up: it lags no more).
  bool Acked(NodeId child, BlobId blob);
  // Whether `child` lags (Accepted returned true for it, and no Acked since).
  bool lagging(NodeId child) const;
  bool started(NodeId child, BlobId blob) const;
  // Bytes accepted for `child` and not acknowledged.
  uint64_t unacked(NodeId child) const;
  // The children that lag, ascending.
  std::vector<NodeId> lagging_children() const;
  uint64_t bound() const { return bound_; }
  // Unacknowledged bytes at or below which a lagging child has caught up: bound / 2.
  uint64_t resume_bound() const { return bound_ / 2; }

 private:
  struct Edge {
    std::map<BlobId, uint64_t> unacked;  // per blob: bytes accepted, not acknowledged
    std::set<BlobId> acked;
    std::set<BlobId> started;
    uint64_t total = 0;
    bool lagging = false;
  };
  std::map<NodeId, Edge> edges_;
  uint64_t bound_;
};

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_NODE_EDGE_LAG_H_
