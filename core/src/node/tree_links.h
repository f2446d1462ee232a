// The tree links of a node: the sockets of every relay-tree edge its policy names, a writer per
// stream (with the emulated long link on edges out of the sender) and a reader per connection
// that turns frames into the policy's events.
//
// Thread safety: Open, TurnAwayParent, LeaveChildren, Send, SendToParent, SendReport and Close
// from the node's event thread; AbortChildren from any thread (the parent's reader forwards a
// refusal while Open may still be connecting the children); the readers post to its EventQueue.
#ifndef DCR_CORE_SRC_NODE_TREE_LINKS_H_
#define DCR_CORE_SRC_NODE_TREE_LINKS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dcr/delta.h"
#include "dcr/node.h"
#include "dcr/receiver.h"
#include "dcr/relay_policy.h"
#include "dcr/status.h"
#include "dcr/statusor.h"
#include "node/commit_reports.h"
#include "node/edge_relay.h"
#include "node/event_queue.h"
#include "node/node_state.h"
#include "transport/heartbeat.h"
#include "transport/net.h"

namespace dcr::internal {

class TreeLinks {
 public:
  TreeLinks(const NodePlan& plan, NodeState* state, EventQueue* queue)
      : plan_(plan),
        state_(state),
        queue_(queue),
        reports_(plan.parents, plan.rank, plan.run_id, plan.version) {}
  ~TreeLinks() { Close(); }

  // Opens exactly the edges of `links` (NodePolicy::links): connects every stream to each child
  // (children listen before anything else, so this only waits for their startup), each child on
  // a thread of its own while this thread accepts the parent's streams. With recovery a child
  // that is not up within plan.receiver_deadline_s (1 s once this process counted it lost) is
  // lost for the version, as one that died mid-stream. Edges out of the sender cross the emulated
  // long link when plan.emulate_wan. With plan.tls_* set, every stream is mutual TLS 1.3
  // (transport/tls.h: peers of this run, in a role the edge allows, with the rank they claim).
  Status Open(const std::vector<Link>& links, double deadline);

  // A restarted node takes its version from the store and does not rejoin the tree. Until Close
  // it listens on its address all the same, for `parent`'s connections: one of this version is
  // accepted only to be closed, so the parent counts this child lost at once (as one that died
  // mid-stream) instead of trying to connect until its deadline; one of a later version is kept
  // for that version (node/held_hellos.h). At Close the listener is kept for the next version's
  // wait rather than closed, so a parent connecting for that version just then waits in its
  // backlog instead of being reset. An address that cannot be listened on is named on stderr and
  // skipped. Errors: the credentials'.
  Status TurnAwayParent(const Link& parent, double deadline);

  // A restarted node's children may still be waiting for it to connect for this version (it
  // died before it did). Each gets this version's hellos on connections that close at once, so
  // it counts its parent lost (the stream then comes from the store) instead of waiting for the
  // stream to appear in the store, which in `dcr run` the sender sends only after the start
  // signal that waits for that child. A child past that wait refuses the connections, or is no
  // longer listening (each connection is tried for a second). Runs beside the node until Close.
  Status LeaveChildren(const std::vector<Link>& links);

  // The node's run credentials (plan.tls_*), once: they sign its reports and, with
  // plan.tls_links, secure its edges.
  Status LoadCredentials();

  // Hands a piece to its stream's writer; SendDone (or SendFailed) is posted once accepted.
  Status Send(const action::Send& s, const BlobPtr& b);

  // A control frame (kAck) to the parent on stream 0.
  void SendToParent(FrameType type, uint64_t value) {
    FrameHeader h = Frame(type);
    h.blob = value;
    parent_writer_->Send(h, nullptr, nullptr, [](Status) {});
  }

  // The subtree's commit report to the parent on stream 0 (commit_reports.h): `own` (this
  // node's record, when it applies) followed by every record its children reported, verbatim.
  // Nothing when the node has no parent link.
  void SendReport(const internal::ReportRecord* own);
  bool has_parent() const { return parent_writer_ != nullptr; }
  // The run's TLS context; null on plain TCP.
  const internal::TlsContext* tls() const { return tls_.get(); }
  // The sender: a committed record must carry `root()` (its signed commitment root) to be kept
  // (commit_reports.h ReportCollector::set_expected_commitment). Set before Open.
  void ExpectCommitment(std::function<std::optional<Sha256Digest>()> root) {
    reports_.set_expected_commitment(std::move(root));
  }
  // The records this node's children reported and it kept.
  std::vector<CommitReport> reports() const { return reports_.reports(); }

  // Tells every child that the refit is refused, with the reason (a kAbort frame on stream 0,
  // queued behind nothing: no piece was sent yet). A child whose link Open sets up after this
  // call gets the frame as soon as its link is up, so a refusal that reaches a relay while it
  // still connects its children reaches them all the same. Only the first reason is sent.
  // Close() flushes the frames before it closes the sockets.
  void AbortChildren(const std::string& reason);

  // With recovery, a lost parent connection is reported to the node's RecoveryPolicy
  // (ParentLost) instead of ending the node.
  void set_recover(bool on) { recover_ = on; }
  // With recovery: asked while the node waits for its parent's connection at startup; true
  // ends the wait as a lost parent (ParentLost). Set before Open; null: wait until the deadline.
  void set_parent_gone(std::function<bool()> gone) { parent_gone_ = std::move(gone); }
  // An edge relay's ingress (node/edge_relay.h): pieces from the parent go to it instead of the
  // policy. Set before Open; null: none.
  void set_ingress(internal::EdgeIngress* ingress) { ingress_ = ingress; }

  // Flushes what is queued (final acks / reports), then closes every socket so readers end.
  void Close();

 private:
  struct ChildLink {
    NodeId id = kNoNode;
    // Writers before connections: a writer is destroyed (joined) before the connection it uses.
    std::vector<std::unique_ptr<Conn>> conns;
    std::vector<std::unique_ptr<FrameWriter>> writers;
  };
  // A frame of `type` from this node, of its run and version (transport/net.h).
  FrameHeader Frame(FrameType type) const;
  // Why `h` is not a frame of this node's wire protocol, run and version ("" when it is).
  std::string Mismatch(const FrameHeader& h) const {
    return internal::WireMismatch(h, plan_.run_id, plan_.version);
  }

  // A child's link as Open sets it up on a thread of its own: the link, or the child lost while
  // connecting (with recovery), or the error that ends the node.
  struct ChildSetup {
    const Link* link_spec = nullptr;
    ChildLink link;
    std::optional<event::SendFailed> lost;
    Status error;
  };
  // Connects every stream of c->link_spec's child, sends the hellos and starts their heartbeats.
  void ConnectChild(ChildSetup* c, double deadline);

  // Heartbeats on stream `stream` to a child (transport/heartbeat.h; the parent's stream 0 joins
  // once it is up); those out of the sender cross the emulated long link and count in its bytes.
  void AddChildHeartbeat(FrameWriter* writer, int stream);

  ChildLink* FindChild(NodeId id);

  // Queues the kAbort frame of abort_ on child `c`'s stream 0 (nothing on a lost link).
  // REQUIRES: abort_mu_ held, abort_ set.
  void SendAbort(ChildLink* c);

  // The listener a restarted node kept from its previous version (TurnAwayParent), else a new
  // one on this node's address.
  StatusOr<int> ListenOnOwnAddress();

  Status AcceptParent(const Link& parent, int listen_fd, double deadline);

  void ParentReader(NodeId parent, Conn* conn);

  void ChildReader(NodeId child, Conn* conn);

  // Reads the payload of report frame `h` from `child` and keeps the records the collector
  // takes (a refused one is named on stderr and left out). A report of committed records ends
  // the child's part of the commit (SubtreeCommitted with the committed records kept); one
  // that carries a failure travels on up with this node's own report and ends nothing.
  // Errors: an oversized or malformed payload (the child is then treated as lost).
  Status ReadReport(NodeId child, Conn* conn, const FrameHeader& h, bool* committed_report);

  const NodePlan& plan_;
  NodeState* state_;
  EventQueue* queue_;
  internal::ReportCollector reports_;
  std::shared_ptr<TokenBucket> long_bucket_;
  std::shared_ptr<const internal::TlsContext> tls_;       // the node's certificate; null: none
  std::shared_ptr<const internal::TlsContext> link_tls_;  // tls_ on the edges; null: plain TCP
  // Guards abort_ and, against AbortChildren, the growth of children_ in Open (children_ is
  // otherwise the event thread's).
  std::mutex abort_mu_;
  std::shared_ptr<const std::string> abort_;  // the refusal told to children; null: none
  bool children_closed_ = false;              // Close began: nothing more to the children
  std::vector<ChildLink> children_;
  std::vector<std::unique_ptr<Conn>> parent_conns_;
  std::unique_ptr<FrameWriter> parent_writer_;
  std::unique_ptr<internal::Heartbeats> heartbeats_;  // stopped first in Close
  std::vector<std::thread> readers_;
  std::thread turn_away_;             // TurnAwayParent's listener, until Close
  std::vector<std::thread> leaving_;  // LeaveChildren's connections
  std::atomic<bool> stopping_{false};
  bool recover_ = false;
  std::function<bool()> parent_gone_;
  internal::EdgeIngress* ingress_ = nullptr;
  bool closed_ = false;
};

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_NODE_TREE_LINKS_H_
