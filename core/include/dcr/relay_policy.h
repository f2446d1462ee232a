// The transport core of dcr: a pure state machine per node (events in, actions out).
//
// A refit moves one *stream* of blobs from a sender to every receiver: blob 0 is the delta header,
// then the chunks, and the last blob is the trailer (or, for the full-checkpoint reference, the
// same three kinds carrying raw file slices). Blob ids are dense, 0 .. N-1, in production order;
// the trailer is the blob with the highest id, so a node knows N once it has seen the trailer.
//
// The policies here decide everything about scheduling -- what to send to whom next, how many
// streams an edge has and which piece goes on which stream when, what to fetch, when to apply,
// when a node or the whole tree has committed, retries with backoff, which form of a chunk goes to
// an edge relay that lags (RelayOptions::edge_lag_bytes) -- and nothing else. They own
// no threads, sockets, clocks or buffers: every event carries the driver's notion of "now"
// (seconds, monotonic real time in the real drivers, Engine::get_clock() in the simulator),
// timers are actions (SetTimer) whose expiry the driver reports back as a TimerFired event, and
// bytes stay in the driver, which only ever moves the byte ranges the actions name. Drivers host
// a policy through PolicyHost (policy_host.h) and implement only its NodeEnvironment. The same
// code therefore runs
//   * over POSIX TCP and object stores (`dcr run`, `dcr node`),
//   * over SimGrid (sim/): one actor per node, now = Engine::get_clock(), and
//   * in the deterministic fault harness (dcr/testing/fault_injection.h) on a discrete-event clock.
//
// Node roles (NodeRole):
//   kSender     root of a relay tree: gets blobs from the delta builder (BlobProduced) and sends
//               them, piece by piece, to each of its children.
//   kRelay      receives pieces from its parent and forwards every piece to each child as soon as
//               it has arrived (cut-through), whether or not the blob is complete; applies the
//               stream itself when RelayOptions::apply (a relay is usually also a receiver).
//   kReceiver   a relay without children (a leaf).
//   kUploader   object-store producer: Put of every blob as it is produced, trailer last (its
//               presence publishes the whole delta), with retries.
//   kDownloader object-store consumer: List polling, bounded parallel Fetch, apply as blobs arrive,
//               with retries. Once the trailer is listed every other key is implied (ids are
//               dense), so a lagging listing (eventually consistent stores) does not stall it.
//
// Apply order on every applying node: the header is applied first; chunks (any order, up to
// max_parallel_applies at a time) only after the header; the trailer last, after every chunk.
// When the trailer is applied the node's copy is whole: Commit is emitted once.
//
// Commit reporting up the tree: a node sends ReportCommit{parent, n} once it has committed
// itself (if it applies) and every child has reported; n counts committed receivers in its
// subtree. The sender emits TreeCommitted{n} when all its children have reported: this is the
// end of the refit as seen from the sender's clock.
//
// Streams and pacing: the policy decides how many streams every tree edge has (EdgeStreams; a
// driver opens exactly links() of them) and which piece goes on which stream when. A stream
// carries one piece at a time: the policy issues a Send on a stream only after the transport
// accepted the previous piece of that stream (SendDone), and gives the next piece of a child to
// its lowest-numbered idle stream. Pieces of one blob may therefore arrive out of order over
// several streams, and the receiver tracks them per piece. Per-child queues live here, so a slow
// child costs the parent buffer memory, never throughput to the other children; drivers keep no
// queue or pacing rule of their own.
//
// SendDone means one thing in every driver: the transport accepted the piece -- its bytes were
// handed to the transport and the stream may take the next one (in `dcr node`: paced onto the
// socket writer's delay line, the emulated link, within its window -- at once without emulation;
// in the simulator: its bytes out at the stream's rate within the modelled TCP window; in the
// fault harness: off the sender at the link's bandwidth). It says nothing about delivery: the
// child's Ack does.
//
// Faults (driver-visible errors) come in as SendFailed / PutDone{ok=false} / FetchDone{ok=false} /
// ApplyDone{ok=false}. Store operations are retried after retry_backoff_s * 2^attempt (SetTimer),
// up to max_retries, then Fail. A failed send or apply ends the node with Fail; what the node does
// next (fallback to the object store, re-parenting, overwrite repair, restart from its journal)
// is decided by RecoveryPolicy (recovery_policy.h).
//
// Thread safety: a policy object is not thread-safe; drivers call Handle from one thread (or
// under one lock). Policies are deterministic: the same events give the same actions.
#ifndef DCR_CORE_INCLUDE_DCR_RELAY_POLICY_H_
#define DCR_CORE_INCLUDE_DCR_RELAY_POLICY_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "dcr/status.h"
#include "dcr/statusor.h"

namespace dcr {

using NodeId = int32_t;
inline constexpr NodeId kNoNode = -1;
using BlobId = uint64_t;
// Seconds on the driver's clock (any origin; only differences matter).
using TimePoint = double;

// Pinned values: they travel in wire frames and object keys.
enum class BlobKind : uint8_t { kHeader = 0, kChunk = 1, kTrailer = 2 };
const char* BlobKindName(BlobKind kind);

struct BlobInfo {
  BlobId id = 0;
  BlobKind kind = BlobKind::kChunk;
  uint64_t size = 0;  // bytes
  bool operator==(const BlobInfo& o) const {
    return id == o.id && kind == o.kind && size == o.size;
  }
};

enum class NodeRole : uint8_t { kSender, kRelay, kReceiver, kUploader, kDownloader };
const char* NodeRoleName(NodeRole role);

// ---- tree shape ----

// A rooted tree over nodes 0 .. n-1; node 0 is the sender. Value type.
struct Topology {
  std::vector<NodeId> parent;                 // parent[0] == kNoNode
  std::vector<std::vector<NodeId>> children;  // ascending ids

  int size() const { return static_cast<int>(parent.size()); }
  // Hops from the root (root: 0).
  int Depth(NodeId node) const;
  // Number of nodes below `node` (excluding it).
  int SubtreeSize(NodeId node) const;

  // The sender (node 0) has `root_fan_out` children (the long-link relays); every other node
  // has up to `fan_out` children, filled breadth first in id order. num_nodes >= 1.
  // Errors: kInvalidArgument if num_nodes < 1, fan_out < 1 or root_fan_out < 1.
  static StatusOr<Topology> FanOut(int num_nodes, int fan_out, int root_fan_out = 1);
  // Explicit shape: parents[i] is node i's parent; parents[0] must be -1, every other entry in
  // [0, n) and the graph a tree rooted at 0. Errors: kInvalidArgument naming the bad entry
  // ("parents[3]: ...").
  static StatusOr<Topology> FromParents(const std::vector<NodeId>& parents);
};

// ---- options ----

struct RelayOptions {
  // Cut-through unit: a blob is sent as pieces of this many bytes (the last may be shorter).
  // Default 1 MiB. REQUIRES: > 0.
  uint64_t piece_bytes = uint64_t{1} << 20;
  // Bytes a stream's transport keeps on the wire before it accepts more (the TCP window the
  // drivers model: the delay line of `dcr node`'s writers, the simulator's pieces in flight). The
  // policy does not read it: it hands a stream one piece at a time (see "Streams and pacing").
  // Default 8 MiB.
  uint64_t window_bytes = uint64_t{8} << 20;
  // Parallel streams from the sender (node 0) to each of its children: the long link. Other
  // edges use one stream (EdgeStreams). Default 1. REQUIRES: >= 1 (a smaller value is raised).
  int root_streams = 1;
  // Whether this node applies the stream (receiver). Ignored for kSender and kUploader.
  // Default true.
  bool apply = true;
  // Concurrent Apply actions outstanding. Default 2. REQUIRES: >= 1.
  int max_parallel_applies = 2;
  // Object store: concurrent Put / Fetch actions outstanding. Default 4.
  int max_parallel_puts = 4;
  int max_parallel_fetches = 4;
  // Object store: key prefix of this stream, e.g. "refit/step-2" (keys: ObjectKey()).
  std::string prefix = "dcr";
  // Downloader: seconds between List polls while the trailer has not appeared. Default 0.05.
  double poll_interval_s = 0.05;
  // Downloader: give up (Fail, kDeadlineExceeded) when no new blob was listed for this long.
  // Default 600 s.
  double poll_timeout_s = 600;
  // Store operations: a failed Put/Fetch/List is retried after retry_backoff_s * 2^(attempt-1)
  // seconds, at most max_retries times per operation, then Fail. Defaults 0.05 s, 5.
  double retry_backoff_s = 0.05;
  int max_retries = 5;
  // Sender: its children that are edge relays (they transcode the context-coded chunks they get
  // to the plain records their subtree applies, and acknowledge a chunk once transcoded), and
  // the lag bound of each, in bytes. The sender counts, per edge relay, the bytes the transport
  // accepted for it (SendDone) that it has not acknowledged (AckReceived): what the link holds
  // plus its transcoding backlog. Past `edge_lag_bytes` the edge relay lags: the sender emits
  // EdgeLag{lagging} and from then on sends it the plain form of every chunk it has not started
  // on that edge (Transcode, answered by BlobReencoded), also of chunks produced later. Once its
  // acknowledgements bring the bytes down to edge_lag_bytes / 2 or fewer it has caught up:
  // EdgeLag{!lagging}, and the chunks not started on its edge go in the produced form again,
  // until it next passes the bound. 0 (the default) or no edge relays: no edge lags. Ignored on
  // every role but kSender.
  std::vector<NodeId> edge_relays;
  uint64_t edge_lag_bytes = 0;
  // Uploader: the store gets the plain form of every chunk (a sender with edge relays filling
  // the store, so that every receiver can apply what it holds with or without the base). Before
  // a chunk's Put the policy emits Transcode{kNoNode, chunk}; the driver's BlobReencoded{kNoNode}
  // names the plain form (its Put then names that size and `plain`) or that there is none (the
  // chunk is put as produced). Default false: every blob is put as produced.
  bool store_plain = false;
};

// The retry schedule of a failed store operation, which every store write of a node follows:
// the policies' Put/Fetch/List, and a node's own puts beside the stream (its commit report). The
// delay before retry `attempt` (1-based) is o.retry_backoff_s * 2^(attempt - 1) seconds; nullopt
// once attempt > o.max_retries (the operation has failed for good).
std::optional<double> StoreRetryDelay(const RelayOptions& o, int attempt);

// Object key of a blob: "<prefix>/<id, 10 digits>.<hdr|chk|trl>", e.g. "dcr/0000000003.chk".
// Keys sort in blob order.
std::string ObjectKey(const std::string& prefix, const BlobInfo& blob);
// Inverse of ObjectKey (size is left 0). kInvalidArgument for a key not of that form.
StatusOr<BlobInfo> ParseObjectKey(const std::string& prefix, const std::string& key);

// ---- events (driver -> policy) ----

namespace event {
// First event of every node.
struct Start {};
// Sender / uploader: the builder finished blob `blob`; its bytes are held by the driver.
struct BlobProduced {
  BlobInfo blob;
};
// Relay / receiver: bytes [offset, offset+length) of `blob` arrived from the parent (on any
// stream). REQUIRES: offset is a multiple of the parent's piece_bytes and length is one piece.
// Duplicates are ignored.
struct DataReceived {
  BlobInfo blob;
  uint64_t offset = 0;
  uint64_t length = 0;
};
// The transport accepted the piece of a Send action (see "SendDone means one thing" above); its
// stream may take the next piece.
struct SendDone {
  NodeId to = kNoNode;
  int stream = 0;
  BlobId blob = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};
// A send to `to` failed (connection lost, timeout). The node fails (Fail action).
struct SendFailed {
  NodeId to = kNoNode;
  std::string message;
};
// Child `from` has received every byte of `blob` (Ack action on its side).
struct AckReceived {
  NodeId from = kNoNode;
  BlobId blob = 0;
};
// An Apply action finished.
struct ApplyDone {
  BlobId blob = 0;
  bool ok = true;
  StatusCode code = StatusCode::kInternal;  // when !ok: the apply error's code
  std::string message;
};
// Child `from` reports its subtree committed with `receivers` committed receivers.
struct SubtreeCommitted {
  NodeId from = kNoNode;
  int receivers = 0;
};
// Uploader: a Put finished.
struct PutDone {
  BlobId blob = 0;
  bool ok = true;
  std::string message;
};
// Downloader: a List finished; `blobs` are the parsed keys under the prefix with their sizes.
struct ListDone {
  bool ok = true;
  std::string message;
  std::vector<BlobInfo> blobs;
};
// Downloader: a Fetch finished (the driver holds the bytes).
struct FetchDone {
  BlobId blob = 0;
  bool ok = true;
  std::string message;
};
// The timer set by the last SetTimer action expired (a driver may also deliver it late).
struct TimerFired {};
// Sender (or uploader, `to` kNoNode): the driver's answer to Transcode{to, blob.id}. `plain`: child
// `to` gets blob `blob.id` in its plain form, of `blob.size` bytes, which the driver holds for it;
// every later Send of the blob to `to` names that size and `plain`. !plain: the blob has no plain
// form (it is not a context-coded chunk) and goes as produced. Taken only as the answer to a
// Transcode not yet answered, while no piece of the blob has been handed to a stream of that child;
// ignored otherwise, and on every other role.
struct BlobReencoded {
  NodeId to = kNoNode;
  BlobInfo blob;
  bool plain = true;
};
}  // namespace event

using Event = std::variant<event::Start, event::BlobProduced, event::DataReceived, event::SendDone,
                           event::SendFailed, event::AckReceived, event::ApplyDone,
                           event::SubtreeCommitted, event::PutDone, event::ListDone,
                           event::FetchDone, event::TimerFired, event::BlobReencoded>;

// ---- actions (policy -> driver) ----

namespace action {
// Send bytes [offset, offset+length) of `blob` to child `to` on stream `stream` (0-based, below
// EdgeStreams of the edge). The driver hands them to the transport at once and reports SendDone
// when the transport accepted them (or SendFailed). A stream never has two Sends unaccepted.
// `plain`: the bytes are those of the blob's plain form (Transcode / BlobReencoded), not the
// produced ones.
struct Send {
  NodeId to = kNoNode;
  int stream = 0;
  BlobInfo blob;
  uint64_t offset = 0;
  uint64_t length = 0;
  bool plain = false;
};
// Tell the parent `to` that this node holds all of `blob` (AckReceived there).
struct Ack {
  NodeId to = kNoNode;
  BlobId blob = 0;
};
// Apply the complete `blob` locally; report ApplyDone. Header first, trailer last (see top).
struct Apply {
  BlobInfo blob;
};
// Every child has acknowledged `blob` and it is applied (or needs no apply): the driver may free
// its bytes.
struct Release {
  BlobId blob = 0;
};
// This node's copy is whole (trailer applied). Emitted once.
struct Commit {};
// Report to the parent that this subtree committed `receivers` receivers.
struct ReportCommit {
  NodeId to = kNoNode;
  int receivers = 0;
};
// Sender only: every node of the tree committed. Emitted once.
struct TreeCommitted {
  int receivers = 0;
};
// Uploader: store blob under `key` (atomically visible); report PutDone. `plain`: the bytes of the
// blob's plain form (RelayOptions::store_plain), not the produced ones.
struct Put {
  BlobInfo blob;
  std::string key;
  bool plain = false;
};
// Uploader: the trailer is stored, the stream is published. Emitted once.
struct Published {};
// Downloader: list keys under `prefix`; report ListDone.
struct List {
  std::string prefix;
};
// Downloader: get object `key` (blob `blob`); report FetchDone.
struct Fetch {
  BlobInfo blob;
  std::string key;
};
// Deliver TimerFired at time `at` (replaces any earlier timer of this node).
struct SetTimer {
  TimePoint at = 0;
};
// Sender with edge relays (RelayOptions::edge_lag_bytes): edge relay `to` is to get produced
// blob `blob` (a chunk it has not started) in its plain form. The driver makes that form (or
// finds it has none) and answers with BlobReencoded{to, ...}, at once or later; until then the
// policy sends `to` no piece of the blob. Uploader with RelayOptions::store_plain: the same for
// the store (`to` kNoNode), before the blob's Put.
struct Transcode {
  NodeId to = kNoNode;
  BlobInfo blob;
};
// Sender with edge relays: edge relay `to` passed the lag bound (`lagging`; the chunks it has not
// started follow as Transcode actions) or caught up (!lagging; `chunks` of those it had not
// started go in the produced form again). `unacked`: the bytes accepted for it and not
// acknowledged at that point; `bound`: RelayOptions::edge_lag_bytes. An outcome: no completion.
struct EdgeLag {
  NodeId to = kNoNode;
  bool lagging = true;
  uint64_t unacked = 0;
  uint64_t bound = 0;
  uint64_t chunks = 0;
};
// The node cannot go on (retries exhausted, peer lost, apply error). Terminal: no further
// actions. `code` is a StatusCode value; `message` names the peer, blob or key.
struct Fail {
  StatusCode code = StatusCode::kUnavailable;
  std::string message;
};
}  // namespace action

using Action = std::variant<action::Send, action::Ack, action::Apply, action::Release,
                            action::Commit, action::ReportCommit, action::TreeCommitted,
                            action::Put, action::Published, action::List, action::Fetch,
                            action::SetTimer, action::Fail, action::Transcode, action::EdgeLag>;

// Human-readable one-liners (logs, golden tests).
std::string ToString(const Event& e);
std::string ToString(const Action& a);

// ---- policies ----

// One tree edge of a node as its driver must open it: `streams` connections (streams 0 ..
// streams-1) between this node and `peer`.
struct Link {
  NodeId peer = kNoNode;
  bool to_child = true;  // false: the edge from the parent (the driver accepts its streams)
  int streams = 1;
  bool operator==(const Link& o) const {
    return peer == o.peer && to_child == o.to_child && streams == o.streams;
  }
};

// Streams of the tree edge parent -> child: options.root_streams (at least 1) on the edges out of
// the sender (node 0, the long link), 1 elsewhere.
int EdgeStreams(NodeId parent, const RelayOptions& options);

// Common interface of every role's state machine.
class NodePolicy {
 public:
  virtual ~NodePolicy() = default;
  // Feeds one event at time `now`; appends the resulting actions to `out` (in the order the
  // driver should start them). Events not meaningful for the role are ignored; after a Fail
  // action every event is ignored.
  virtual void Handle(TimePoint now, const Event& event, std::vector<Action>* out) = 0;
  // True once the node has nothing left to do: committed (and, for inner nodes, reported and
  // released everything), published, or failed.
  virtual bool done() const = 0;
  virtual bool failed() const = 0;
  virtual NodeRole role() const = 0;
  // The tree edges the driver opens for this node: the parent edge first (if any), then one per
  // child in id order, each with its stream count. Empty for the object-store roles.
  virtual std::vector<Link> links() const { return {}; }
};

// kSender, kRelay or kReceiver in `topology` (the role follows from the node's position:
// node 0 is the sender, nodes with children relays, leaves receivers).
// REQUIRES: 0 <= self < topology.size().
std::unique_ptr<NodePolicy> MakeTreePolicy(const Topology& topology, NodeId self,
                                           const RelayOptions& options);
std::unique_ptr<NodePolicy> MakeUploaderPolicy(const RelayOptions& options);
std::unique_ptr<NodePolicy> MakeDownloaderPolicy(const RelayOptions& options);

// Number of pieces of a blob of `size` bytes (an empty blob is one empty piece).
inline uint64_t NumPieces(uint64_t size, uint64_t piece_bytes) {
  return size == 0 ? 1 : (size + piece_bytes - 1) / piece_bytes;
}

}  // namespace dcr

#endif  // DCR_CORE_INCLUDE_DCR_RELAY_POLICY_H_
