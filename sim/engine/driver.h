// The simulation driver: runs the project's transport state machines (dcr/relay_policy.h) over a
// SimGrid platform, one actor per node; each actor is the NodeEnvironment of a PolicyHost
// (dcr/policy_host.h) and maps the actions to activities:
//
//   Send        -> Mailbox::put_init(piece)->set_rate(stream cap)->start() to the child's mailbox
//                  (every mailbox has its actor as permanent receiver, so pieces flow like a TCP
//                  socket before the child asks), at once: the policy hands a stream one piece at
//                  a time. SendDone when the modelled stream accepted it: its bytes are out at the
//                  stream's rate and fewer than pieces_in_flight pieces are on the wire.
//   Ack, ReportCommit -> a 64-byte control message (pays latency like any message).
//   Apply       -> an exec job (apply cost) on the node's host, or on the shared CPU of a
//                  one-machine run (PlatformSpec::shared_cpu_cores); ApplyDone on completion.
//   Put / Fetch -> host-to-host Comms with no store actor: a Put is the upload (node -> store);
//                  a Fetch is a 64-byte request (node -> store, paying the store's first-byte
//                  latency) and, when it lands, the object (store -> node). Requests are thus
//                  served concurrently, as by a real object store. List -> a small reply from the
//                  store carrying the keys whose Put had completed.
//   SetTimer    -> an exec job on the clock host that ends at the due time (one per node; a new
//                  SetTimer replaces it); now -> Engine::get_clock().
// The sender (or uploader) also builds the blobs: chunk builds are exec jobs, up to
// `build_parallel` at a time, in BuildDelta's production order (dcr/delta.h ProductionOrder over
// windows of `build_window` chunks: a window is built, then emitted at once, then the next one
// starts); BlobProduced in blob order.
//
// Edge relay (RunSpec::edge_relay): the sender streams `wan_blobs` over the long link to the edge
// relay's receiving side, a leaf whose Apply is the transcoding; each transcoded blob is handed
// (a 64-byte same-host message) to the edge relay's forwarding side, the root of `topology`, as
// BlobProduced in id order. Both sides are tree policies (MakeTreePolicy), as every other node.
// Several edge relays split by chunk range (RunSpec::edge_range_of): each blob's transcoding runs
// on the host of its range and the hand-off carries its plain bytes to the root's host. The edge
// relay acknowledges a chunk once it is transcoded, as the real one does; the sender's policy
// watches that edge for lag (RunSpec::edge_lag_bytes, RelayOptions::edge_lag_bytes): its
// Transcode is the sender's own transcoding of the chunk (the edge relay's cost of the blob, on
// one core of the sender's host), answered with the plain form's size (`blobs`); the pieces it
// then sends are the plain form, which the edge relay forwards without transcoding.
//
// Rate caps: SimGrid's own TCP-gamma cap is disabled (TCP-gamma = 0) and every Comm gets an
// explicit rate = the cap of one real TCP stream, min(window, tcp_gamma) / RTT of its route, shared
// by the pieces in flight on that stream (window / piece). This models one TCP socket per stream
// instead of one flow per message (SimGrid's own TCP-gamma cap would apply per message).
//
// One simulation per process: RunInThisProcess builds the (only) SimGrid Engine of the process.
// RunForked runs it in a child process and returns its outcome, so a caller may simulate many
// runs. Thread safety: none needed; SimGrid is single-threaded.
#ifndef DCR_SIM_ENGINE_DRIVER_H_
#define DCR_SIM_ENGINE_DRIVER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dcr/relay_policy.h"
#include "dcr/statusor.h"
#include "platform.h"

namespace dcr::sim::internal {

struct SimBlob {
  BlobInfo info;
  double build_flops = 0;  // on the sender host (0: produced at start)
  double apply_flops = 0;  // on each applying node's host
  // A receiver's commitment leaves this chunk completes (TrustOptions::hash_leaves_early): hashed
  // once its apply is done, on up to RunSpec::commitment_threads cores of the receiver's host
  // beside the applies (the receiver's hashing pool); its commit waits for them.
  double hash_flops = 0;
};

struct RunSpec {
  PlatformSpec platform;
  bool object_store = false;  // uploader + downloaders; else a relay tree
  int receivers = 1;
  int receivers_per_host = 1;    // rollout host of receiver i (1-based node i) = (i-1)/per_host
  Topology topology;             // relay tree over nodes 0..receivers (node 0: sender)
  RelayOptions relay;            // the nodes' policy options (plan.h PlanRun)
  std::vector<SimBlob> blobs;    // header, chunks, trailer in id order
  int build_parallel = 1;        // concurrent build jobs on the sender
  int build_window = 1;          // ProductionOrder window, in chunks (>= 1)
  double tcp_gamma = 4194304;    // bytes: one TCP stream's window cap
  double real_window = 8 << 20;  // bytes in flight per stream of the real transport
  int pieces_in_flight = 8;      // window / piece of the simulated transport (>= 1)
  std::string network_model = "CM02";
  double loopback_bandwidth = 1e10;  // same-host messages
  // Mutual TLS on relay-tree edges (network.tls): CPU seconds per byte that each data piece costs
  // the sending end (encryption on the stream's writer, concurrent with its transfer; the stream
  // accepts the next piece when both are done) and the receiving end (decryption as the records
  // arrive: concurrent with the transfer; the piece is usable when both are done). Each is one
  // exec job on the end's host (one core). 0: not charged.
  double tls_send_s_per_byte = 0;
  double tls_recv_s_per_byte = 0;
  // Per byte a measured receiver (relays included) hashes as the bytes arrive, in the same job
  // as the receiving end's TLS (a signed full stream's slices, verified before they are
  // applied). 0: not charged.
  double recv_hash_s_per_byte = 0;
  // Edge relay (relay tree only; platform.edge_cores > 0 names its host): the long link carries
  // `wan_blobs` (the context-coded stream: sizes, build cost on the sender; apply_flops = the edge
  // relay's transcoding of the blob, context decode + apply onto its canonical base + plain
  // re-encode, per core) from the sender to the edge relay, a leaf of a two-node tree that
  // transcodes up to `edge_parallel` blobs at once (0: platform.edge_cores); each transcoded blob
  // is produced, in id order, at the root of `topology`, which runs on the edge host and forwards
  // `blobs` (the plain form) to the receivers. Same blob ids in both streams.
  bool edge_relay = false;
  std::vector<SimBlob> wan_blobs;
  int edge_parallel = 0;
  // The edge relay's lag bound (the sender's RelayOptions::edge_lag_bytes; scenario.h
  // EdgeLagBytesFor). 0: it never lags.
  uint64_t edge_lag_bytes = 0;
  // Several edge relays (platform.edge_count > 1, dcr/edge_split.h): a chain at the head of the
  // rollout region. The long link ends at the first (platform edge host 0), the tree's root runs
  // on the last; `edge_range_of[id]` is the edge relay (host index) whose chunk range holds wan
  // blob `id`, whose transcoding (its apply_flops, up to `edge_parallel` at once per edge relay)
  // runs on that host, and whose plain form then crosses the region once, to the root's host
  // (the chain's in-region hops, charged as one). Empty: every blob on host 0.
  std::vector<int> edge_range_of;
  // Durable receivers: wall seconds each receiver's commit takes (its version log's fsyncs and the
  // journal's record, a wait on the disk, not on a core), from the trailer's arrival: it follows
  // the last chunk's apply and cannot overlap the transfer. 0: not charged.
  double commit_seconds = 0;
  // The commitment of a signed delta (dcr/commitment.h). A receiver hashes the leaves each chunk
  // completes once the chunk is applied (the chunk blobs' hash_flops, on up to
  // `commitment_threads` cores); what is left after the trailer, the leaves no chunk covers, is
  // `commitment_cpu_s`: CPU seconds (one core) run on up to `commitment_threads` cores of its
  // host (or of the shared CPU) once every chunk is applied and hashed and the trailer is in,
  // before the durable commit (TrustedReceiver::Commit): it cannot overlap the transfer and
  // adds. The sender's is the
  // pass over the target on up to `sender_commitment_threads` cores before it builds the first
  // blob: the refit clock (from the first blob, as the real runner's) starts after it; the
  // simulated clock (sim_clock) includes it. 0: not charged.
  double commitment_cpu_s = 0;
  int commitment_threads = 1;
  double sender_commitment_cpu_s = 0;
  int sender_commitment_threads = 1;
  // The harness's byte comparison of each receiver's storage with the target file
  // (`receivers.verify` of dcr run): CPU seconds on one core of its host (or of the shared CPU),
  // started when it commits. It does not delay its own commit; it competes with the nodes still
  // working. 0: not charged.
  double verify_cpu_s = 0;
};

struct NodeOutcome {
  bool committed = false;
  bool complete = false;  // every blob applied exactly once before commit
  double commit_at = 0;   // simulated seconds since the start
  uint64_t bytes_received = 0;
  std::string error;
};

struct RunOutcome {
  double first_built = -1;  // simulated time the first chunk was built
  double last_built = 0;
  double end = 0;             // last receiver committed (as the real runner measures)
  double tree_committed = 0;  // relay: the sender learnt that every receiver committed
  double refit_seconds = 0;   // end - first_built
  double wire_bytes = 0;      // over the inter-region link
  double store_put_bytes = 0, store_get_bytes = 0;
  uint64_t comms = 0;                  // Comms started (messages simulated)
  double tls_cpu_seconds = 0;          // CPU charged for TLS on every endpoint together
  double sender_ready = 0;             // simulated time the sender's commitment was done (0: none)
  double sim_clock = 0;                // Engine clock when run() returned
  std::vector<NodeOutcome> receivers;  // index = node - 1
  int edge_switches = 0;               // times the edge relay was found lagging (EdgeLag)
  uint64_t edge_plain_chunks = 0;      // chunks the sender sent it in the plain form (Send::plain)
  std::string error;                   // first failure, or a deadlock note
};

// The policy node `node` of `spec` runs (hosted by PolicyHost): uploader/downloader for an
// object-store run, else its tree role.
std::unique_ptr<NodePolicy> MakeSimPolicy(const RunSpec& spec, NodeId node);
// With an edge relay: the policy of the sender of the long-link stream (node 0 of the two-node
// tree sender -> edge relay, which is node 1), watching the edge relay for lag.
std::unique_ptr<NodePolicy> MakeSimEdgeSenderPolicy(const RunSpec& spec);

// Builds the engine, platform and actors, runs the simulation. Call at most once per process.
RunOutcome RunInThisProcess(const RunSpec& spec);
// Forks; the child calls RunInThisProcess and reports back through a pipe. kInternal if the child
// dies (the message carries its signal or exit code).
StatusOr<RunOutcome> RunForked(const RunSpec& spec);
// Runs several specs, each in its own child, up to `parallel` children at a time (0 = number of
// online CPUs); outcomes in the order of `specs`. Same results as calling RunForked in turn.
StatusOr<std::vector<RunOutcome>> RunForkedAll(const std::vector<RunSpec>& specs, int parallel);

// Per-Comm rate cap (bytes/s) of a stream with round-trip time `rtt` (see top).
double StreamRateCap(double tcp_gamma, double real_window, double rtt, int pieces_in_flight);

}  // namespace dcr::sim::internal

#endif  // DCR_SIM_ENGINE_DRIVER_H_
