// The refit node: one `dcr node` process per tree node, running the state machines of
// relay_policy.h over POSIX TCP (relay tree) or an ObjectStore, with the delta streamed while it
// is built and applied by receivers as it arrives.
//
// Process structure of one node (RunNode):
//   * one event-loop thread owns the node's PolicyHost (policy_host.h) and its policy
//     (MakeNodePolicy): it pops events (socket reads, send completions, apply/put/fetch
//     completions, timers) and feeds them to the host, which performs the actions on the node's
//     environment (the parts below);
//   * sender: a builder thread runs BuildDelta (or slices the target file for the full-checkpoint
//     reference) and turns every header/chunk/trailer into a BlobProduced event;
//   * tree edges: the links the policy names (NodePolicy::links: streams per edge), one
//     connection per stream; per stream a writer sends pieces (frames of net.h); on the long link
//     (edges out of the sender) every stream shares one token bucket (rate) and has a delay line
//     (one-way latency) of at most relay.window_bytes, which is how the WAN is emulated in the
//     transport layer. SendDone is posted when the writer accepted the piece (its bytes entered
//     the delay line; without emulation, at once). The child answers with Ack / ReportCommit
//     frames on stream 0 (delayed by the same latency);
//   * per parent stream, a reader thread writes pieces straight into the blob's buffer and posts
//     DataReceived, so forwarding to children starts while the blob is still arriving;
//   * an apply pool runs Apply actions through the node's Receiver (receiver.h): a BufferReceiver
//     over an in-memory copy of its base (delta), or the full-stream receiver;
//   * object store: a pool runs Put / List / Fetch actions; uploads cross the emulated long link.
// Faults: without NodePlan::state_dir and store, a fault ends the node with a Status naming the
// peer, key or blob (no retry beyond the policy's store retries). With both, a delta receiver
// applies through a JournaledReceiver (journal, overwrite repair; storage in a file-backed shared
// mapping on device "cpu") and the event loop reports a lost parent, a failed stream policy, a
// commit, a restart and a refused doubtful chunk to the node's RecoveryPolicy, whose actions it
// carries out (fallback to the store, reload, overwrite repair, the sender filling the store):
// core/docs/fault-tolerance.md, "The shipped nodes".
//
// Thread safety: RunNode is self-contained; it calls its Receiver as receiver.h allows
// (ApplyRecord concurrently for distinct chunks; Begin and Commit never concurrent with anything).
#ifndef DCR_CORE_INCLUDE_DCR_NODE_H_
#define DCR_CORE_INCLUDE_DCR_NODE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dcr/delta.h"
#include "dcr/manifest.h"
#include "dcr/relay_policy.h"
#include "dcr/status.h"
#include "dcr/statusor.h"

namespace dcr {

// One version a long-lived node takes part in (NodePlan::versions).
struct NodeVersion {
  uint64_t version = 0;     // its number: every frame of it carries it (> the one before)
  std::string target_path;  // the checkpoint of this version (sender: the one it publishes)
  std::string verify_path;  // receiver: compare with this after the commit ("" = skip)
  std::string prefix;       // object store: the version's prefix ("" = plan.relay.prefix)
  std::string result_path;  // this version's node result JSON ("" = none)
};

// Everything one node process needs (serialised as JSON for `dcr node --plan`).
struct NodePlan {
  int rank = 0;                          // this node; 0 is the sender / uploader
  std::string transport = "relay_tree";  // "relay_tree" | "object_store"
  std::string method = "delta";          // "delta" | "full"
  std::vector<int> parents;              // topology (relay_tree): parents[0] == -1
  std::vector<std::string> addresses;    // "host:port" per rank (relay_tree)
  // Ids every relay-tree frame carries (the wire protocol's header, core/docs/transports.md): the
  // run this refit belongs to and the version number it delivers. A node refuses a parent's
  // connection whose hello names another run or version (it keeps listening for its real
  // parent) and stops at any later frame of another run or version. Every node of one refit
  // has the same two; MakePlans derives the run id from the run's store prefix and addresses.
  // Defaults 0 and 0.
  uint64_t run_id = 0;
  uint64_t version = 0;
  // Sender of a delta: the number of the version the delta is built from (its header carries
  // base_version -> version, or -> base_version + 1 in one refit); -1 (the default): version - 1
  // (one refit: 0 -> 1). A recovering delta receiver: the version its receiver_base_path holds.
  int64_t base_version = -1;
  // A long-lived node (empty: one refit, version `version`): the process takes part in these
  // versions one after another, in order, keeping its receiver's storage from one to the next;
  // between versions it listens for the next version's hello. The sender runs the joint commit
  // (CommitCoordinator, dcr/versioning.h) over the relay tree's per-receiver reports: it builds
  // each version's delta from the baseline -- the newest version every live receiver reported
  // committed, with its hash -- whose checkpoint is base_path (version 0) or the target_path of
  // that earlier version; a receiver whose report is missing or failed is declared dead. Over
  // the object store no report reaches the uploader and each version is built from the one
  // before. Every version takes the start barrier (ready_path, go_path): the first at those
  // paths, version k after it at the paths with ".v<k>" appended.
  // Without state_dir the first failure ends the node. With state_dir each version recovers as
  // a one-version node in <state_dir>/v<k> and a restarted process resumes at the version it
  // was in (core/src/node/version_state.h; delta receivers on device "cpu" only).
  std::vector<NodeVersion> versions;
  // Open-ended versions (a deployment): `versions` lists the first ones, and after the last
  // listed the node goes on with the next number, each version k + 1 named as k is with its
  // number changed (NextOpenVersion, node/versions.h: prefix ".../step-<k>", result path
  // "...-v<k>.json"; no target or verify path). A receiver takes versions until it is stopped;
  // the sender until its trainer ends the run (dcr/publisher_c.h). Not with region_receiver.
  bool open_versions = false;
  // Mutual TLS 1.3 on every relay-tree edge: the run's CA certificate, this node's certificate
  // and its private key (PEM files; the key must not be readable by group or others). A node
  // accepts a parent only with a sender or relay certificate of its run, a child only with a
  // relay or receiver certificate of its run, each for the rank it claims. All empty (the
  // default): plain TCP. `dcr run` sets them (a fresh CA per refit); `dcr keys` makes them for
  // a cluster.
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  // With tls_* set: false = the edges are plain TCP and the certificates only sign this node's
  // commit report and, at the sender, check every rank's (network.tls: false keeps reports
  // attributable). Default true.
  bool tls_links = true;
  // Signed deltas (dcr/signing.h). The sender signs its delta stream with `signing_key` (the
  // trainer's Ed25519 private key, PEM, 0600; empty: unsigned). A delta receiver with
  // `trust_key` (the trainer's public key, PEM) applies only what that key signed for this
  // plan's run_id and refuses an unsigned or forged delta; empty: unsigned deltas are applied.
  // `version_floor_path`: the receiver's version floor file (refuses a delta below the highest
  // version it committed; records each commit); empty: none. `freeze_after_s` > 0: a receiver
  // that commits no version for longer than this (since its last commit, else since it started)
  // says so in its result's `freeze` and on stderr. `dcr run` sets all of them (a fresh key per
  // run); `dcr keys` makes the key pair for a cluster. The full-checkpoint method is not signed.
  std::string signing_key;
  std::string trust_key;
  std::string version_floor_path;
  double freeze_after_s = 0;
  RelayOptions relay;  // pieces, windows, streams, applies, store parallelism, prefix
  // Liveness of relay-tree edges (core/docs/transports.md): every stream whose writer was given
  // nothing for heartbeat_interval_s carries a heartbeat frame (parent to child on each stream,
  // child to parent on stream 0), and a connection on which no byte moves for read_deadline_s is
  // a lost link, as if the peer had closed it: a dead host, a partition or a stopped process is
  // noticed within the deadline, not at timeout_s. REQUIRES: heartbeat_interval_s > 0,
  // read_deadline_s >= 2 * heartbeat_interval_s. Defaults 1 s and 10 s.
  double heartbeat_interval_s = 1.0;
  double read_deadline_s = 10.0;
  // Metrics and health endpoint ("host:port"; "" = none, the default): while the node runs it
  // answers HTTP GET /metrics in the Prometheus text format (version held, target, bytes
  // received and sent, chunks applied, lag, last error, up; core/docs/operations.md) and GET
  // /healthz (200 "ok", or 503 with the node's error). A port that cannot be bound fails the
  // node at its start.
  std::string metrics_address;
  // Long link (edges out of rank 0; uploads to the store) emulation. 0 bandwidth = unlimited.
  bool emulate_wan = true;
  double long_bandwidth_Bps = 0;
  double long_latency_s = 0;
  // Object store (object_store): an OpenObjectStore spec, e.g. "dir:/tmp/x" or
  // "s3://bucket?endpoint=http://127.0.0.1:8080" (credentials from the environment).
  std::string store;
  // Sender inputs.
  std::string base_path;    // delta base (the version receivers hold)
  std::string target_path;  // new version
  // A delta file of this version already built from base_path (the trainer's per-rank delta,
  // dcr/publisher_c.h): streamed as it is (signed on the way with signing_key) instead of one
  // being built. REQUIRES: its header names base_version, the content hash of base_path and
  // version (RunNodeVersions checks this before it sets the field). "" = build the delta.
  std::string delta_path;
  // Sums files (dcr/sums.h) of the sender's checkpoints. base_sums: base_path's; when base_path
  // still matches it byte for byte (XXH3 of every region, on build_threads workers) the delta's
  // base hash is its recorded content hash instead of one computed over every element; a sums
  // file that is missing, malformed or no longer matches is reported on stderr and the hash is
  // computed. target_sums: written (atomically) after a delta build, from the delta's target
  // hash, for the next version's base_sums. "" = neither. RunNodeVersions sets both for each
  // version it builds (under state_dir, or a temporary folder without one).
  std::string base_sums;
  std::string target_sums;
  uint64_t chunk_elems = uint64_t{1} << 22;
  int zstd_level = 1;
  // Context-coded chunks (DeltaOptions::context_coding). Default false.
  bool context_coding = false;
  // Their most exponent classes per chunk (DeltaOptions::context_classes).
  int context_classes = kContextClassesMax;
  // Edge relays (relay tree; core/docs/transports.md "Edge relays"): the ranks, children of the
  // sender, that hold the canonical base at receiver_base_path and transcode every context-coded
  // chunk arriving over the long link to its plain record (ContextChunkToPlain, at zstd_level)
  // before their policy acknowledges, applies and forwards it, so their subtree gets the plain
  // encoding. A sender with edge relays puts the plain form into the store when it fills it
  // (the tree failed or it restarted), so every receiver can recover from there. Empty = none.
  std::vector<int> edge_relays;
  // An edge relay of a split (dcr/edge_split.h; the edge relays then form a chain from the
  // sender in the order of `edge_relays`): it transcodes only the context-coded chunks whose ids
  // lie in [edge_range_first, edge_range_end) and forwards every other record as it is.
  // edge_range_end == 0 (the default): every chunk.
  uint64_t edge_range_first = 0;
  uint64_t edge_range_end = 0;
  // Sender with edge relays: the lag bound of each. Once the bytes it handed to the link for an
  // edge relay (SendDone) and that edge relay has not acknowledged exceed this, the edge relay
  // lags (it transcodes slower than the link delivers): the sender sends it the plain record of
  // every context-coded chunk it has not started on that edge, for the rest of the refit
  // (NodeResult::edge_switches). 0 = never. Default 0 (`dcr run`: relay_tree.edge_lag).
  uint64_t edge_lag_bytes = 0;
  int build_threads = 0;
  uint64_t full_slice_bytes = uint64_t{8} << 20;  // full reference: data bytes per chunk blob
  // Tests: when non-zero, the sender holds the chunks back and sends them in an order permuted
  // with this seed (header first, trailer last) instead of as they are built. Default 0.
  uint64_t shuffle_seed = 0;
  // Where this node holds the weights it diffs or applies (DeviceKind names, dcr/device.h):
  // "cpu" = host memory without the device interface (BufferReceiver; the sender's host diff);
  // "host" | "cuda" = the device path on OpenDevice(kind, device_index): a delta receiver is a
  // MakeDeviceReceiver, the sender diffs on the device. Default "cpu", device 0.
  std::string device = "cpu";
  int device_index = 0;
  // Receiver inputs.
  std::string receiver_base_path;  // checkpoint the receiver holds (delta)
  std::string verify_path;         // compare with this target after commit ("" = skip)
  double timeout_s = 600;
  // A receiver of a long-lived relay-tree run (version > 0): how long it waits for a version to
  // begin (its parent's connection, or with recovery the stream whole in the store) before
  // `timeout_s` starts counting, so the trainer's compute between versions is not part of the
  // version's deadline. < 0: no limit (the multi-host form: the node serves its committed
  // version until the next one begins or it is stopped); 0: the wait counts in `timeout_s`
  // (dcr run, whose supervisor starts every version). Default 0.
  double version_wait_s = 0;
  std::string result_path;  // node result JSON ("" = none)
  // Progress JSON ("" = none), rewritten (temporary + rename, so a reader never sees a partial
  // file) about once a second while the node runs: {"bytes_received", "bytes_sent",
  // "payload_bytes", "stream_complete"}, payload_bytes being the sender's stream bytes produced so
  // far and stream_complete whether that stream is whole (its trailer produced).
  std::string progress_path;
  // Start barrier (so that no node's setup -- loading and hashing its base -- overlaps the timed
  // refit): a non-sender creates `ready_path` once it is set up and connected; the sender waits
  // for `go_path` to exist before it starts building. Empty = no barrier.
  std::string ready_path;
  std::string go_path;
  // Recovery (core/docs/fault-tolerance.md, "The shipped nodes"). `state_dir`: this node's
  // durable state (its start count; a delta receiver's journal and version log, which make its
  // committed versions durable; its storage lives in the process); "" = none: the node neither
  // journals nor recovers (every fault ends it, as the old single-shot node). With `state_dir`
  // and `store` both set, every recovery decision comes from a RecoveryPolicy
  // (dcr/recovery_policy.h): a relay-tree node whose parent or stream fails falls back to
  // `store`; a restarted node (start count above one) recovers its storage from the version log
  // and repairs doubtful chunks by overwrite form; a restarted sender rebuilds the identical
  // delta and puts what `store` lacks.
  std::string state_dir;
  // A durable delta receiver (state_dir set): the directory of its version log
  // (core/src/receivers/version_log.h), the image and log of applied records that make its
  // committed versions durable and that a restart recovers the held version from. "" (the
  // default): <state_dir>/rank-<rank>.vlog. A node of several versions keeps one log for all
  // of them, in its own state_dir (not a version's).
  std::string version_log_dir;
  // Relay tree: this node (a child of the sender: the first hop in the rollout region) puts
  // every blob it receives whole into `store`, trailer last, so the region's recoveries read it
  // there instead of across the long link. Default false.
  bool mirror_to_store = false;
  // Retention of `store` (dcr/retention.h), by the sender of a plan with versions after each
  // version's commit: the newest `retain_versions` versions are kept, and the store's objects
  // under the versions' common prefix are held within `retain_budget_bytes` (0 = no budget)
  // as far as what is needed allows. retain_versions 0 (the default): no collection.
  int retain_versions = 0;
  uint64_t retain_budget_bytes = 0;
  // Fault points, honoured on the first start only (`dcr run`'s faults: block sets them), and
  // only by dcr-node-faults, the test build of the node (PlanAsksForFaults; the deployed
  // dcr-node refuses such a plan): a delta receiver SIGKILLs itself at its chunk application of
  // 0-based ordinal `fault_kill_chunk`, inside it (after its journal Begin record and its
  // writes, before End) when `fault_kill_inside`, else right after it; a relay when it holds
  // blob `fault_kill_blob` whole; the sender when it first sends (or puts) blob
  // `fault_kill_blob`. -1 = never.
  int64_t fault_kill_chunk = -1;
  bool fault_kill_inside = false;
  int64_t fault_kill_blob = -1;
  // A durable delta receiver SIGKILLs itself when its version log reaches this step of a commit
  // (receivers/version_log.h VersionLogStepName: "entries-synced", "marker-synced",
  // "image-half-written", "image-renamed"); "" = never. The image steps come only at a commit
  // that writes an image (version_log_image_every).
  std::string fault_kill_log_step;
  // A durable delta receiver's version log writes an image every this many versions (0, the
  // default: every 1024, or once the log holds 1.25 images: VersionLogOptions).
  uint64_t version_log_image_every = 0;
  // A long-lived node: the version whose first start the fault points apply to (0 = the first
  // version of `versions`); every other version runs without them.
  uint64_t fault_version = 0;
  // Versions over time in a long-lived relay-tree run (core/docs/fault-tolerance.md, "Catch-up
  // and late joiners"). Sender: `region_receivers` are ranks outside `parents` that follow the
  // versions from the in-region store `store` and leave their commit reports there; once the
  // tree committed a version the sender waits at most `receiver_deadline_s` for the report of
  // each live one and of each returning one (it reported the version before), and declares the
  // silent ones dead: they stop holding the baseline back until a report of a published version
  // re-admits them. Every recovering relay-tree node also waits at most `receiver_deadline_s` per
  // version for a child to come up (1 s for one this process already counted lost) before it
  // counts the child lost for that version: its subtree takes the version from the store.
  // Defaults none, 30 s.
  std::vector<int> region_receivers;
  // Sender, one version of a long-lived relay-tree run: the tree ranks its joint commit holds dead
  // (declared at an earlier version, not re-admitted). Their commit reports are taken when the
  // store has them, never waited for. Set by RunNodeVersions per version; empty otherwise.
  std::vector<int> dead_ranks;
  double receiver_deadline_s = 30;
  // Receiver (transport "object_store", with versions): follows the versions from `store`,
  // catching up when behind (catch_up.h PlanCatchUp, with these limits: replay at most
  // `catch_up_max_replay` missed deltas holding at most `catch_up_full_frame_fraction` of the
  // checkpoint's tensor bytes, else a full frame); `late_join`: it holds no version at its start
  // and takes a full frame first. Defaults false, false, 8, 0.5.
  bool region_receiver = false;
  bool late_join = false;
  int catch_up_max_replay = 8;
  double catch_up_full_frame_fraction = 0.5;
  // Applying relay-tree node of a long-lived run with `store` (the long-link relay): after each
  // version it commits, it serves pending full-frame requests by putting a full frame of its
  // storage into `store`. Default false.
  bool serve_full_frames = false;
};

// The policy `dcr node` hosts for `plan`: uploader (rank 0) or downloader for "object_store",
// else the rank's tree role in plan.parents with plan.relay. Errors: kInvalidArgument for an
// unknown transport, bad parents or a rank outside them.
StatusOr<std::unique_ptr<NodePolicy>> MakeNodePolicy(const NodePlan& plan);
// The policy a sender hosts when it fills the object store (its tree failed, or it restarted):
// an uploader with plan.relay that puts the plain form of every context-coded chunk
// (RelayOptions::store_plain) when the sender has edge relays on a delta, so that the store
// holds what every receiver applies, with or without the base.
std::unique_ptr<NodePolicy> MakeFillStorePolicy(const NodePlan& plan);

// One applying node's commit report (relay tree), as it travels up the tree to the sender: the
// rank, the run and version it applied, the commitment root (dcr/commitment.h) and the content
// hash (hash.h) of what its storage holds after the commit, or why it failed. The root is the
// proof a sender compares with the one it signed; the content hash is bookkeeping only (a
// checksum, forgeable). Full-stream receivers carry no content hash (zero) and a receiver that
// neither checked nor computed a root carries none (nullopt). Each node reports its own; relays
// forward their children's verbatim and never make one for another rank (wire form:
// core/src/node/commit_reports.h).
struct CommitReport {
  int rank = 0;
  uint64_t run = 0;
  uint64_t version = 0;
  Hash128 target_hash;
  std::optional<Sha256Digest> commitment;
  bool ok = false;
  StatusCode code = StatusCode::kOk;  // the failure's code when !ok
  std::string error;                  // the failure's message when !ok
};

// What a node measured. Times are wall-clock seconds (CLOCK_REALTIME) so that processes on one
// machine (or clock-synchronised hosts) can be compared; 0 = did not happen.
struct NodeResult {
  int rank = 0;
  int64_t pid = 0;  // the node's process id (a long-lived node: the same every version)
  std::string role;
  bool ok = false;
  std::string error;
  double t_start = 0;            // node ready (connections up / store opened)
  double t_first_blob = 0;       // sender: first blob built; others: first byte received
  double t_last_blob = 0;        // sender: trailer built; others: last blob complete
  double t_commit = 0;           // receiver: trailer applied; sender: tree committed / published
  double apply_seconds = 0;      // time inside Receiver calls (summed over threads)
  uint64_t bytes_sent = 0;       // payload bytes sent to children / put to the store
  uint64_t bytes_sent_long = 0;  // of which over the emulated long link
  uint64_t bytes_received = 0;   // payload bytes received / fetched
  uint64_t payload_bytes = 0;    // sender: total stream bytes
  uint64_t dense_bytes = 0;      // sender: tensor bytes of the target
  uint64_t blobs = 0;
  int receivers_committed = 0;  // sender (relay tree): subtree count
  // Relay tree: the commit reports this node received from its subtree, in arrival order (the
  // sender: one per applying node that reported; a relay: those of its subtree). A record that
  // names a rank outside the reporting child's subtree, a rank already reported, or another run
  // or version is refused and not listed.
  std::vector<CommitReport> reports;
  // Sender of a delta (relay tree): the content hash of the version it published (the
  // trailer's target hash), against which the reports' hashes are checked; a delta receiver
  // that committed: the content hash of what it holds. Zero otherwise.
  Hash128 target_hash;
  // Sender fed by the trainer's per-rank shards (dcr/publisher_c.h): true when the trainer's
  // delta went out; otherwise `trainer_delta_skipped` says why it did not (its base is not the
  // version the delta had to be built from) and the delta was built from the checkpoints.
  bool trainer_delta = false;
  std::string trainer_delta_skipped;
  // Sender of a delta of a long-lived run: the version the delta was built from; -1 otherwise.
  int64_t delta_base_version = -1;
  bool verified = false;
  std::string verify_message;
  // The commitment root (dcr/commitment.h, 64 hex digits) of the version: at the sender, the
  // one its final manifest signed; at a receiver, the trainer's signed root its storage was
  // found to hold at commit. Empty when none was signed or checked.
  std::string commitment;
  // A receiver whose last commit checked the commitment: how that pass was spent
  // (TrustedReceiver::last_commitment_pass): its storage's leaves, those left to the commit (not
  // hashed when it began), and the commit's wall seconds on them (waiting for the hashing pool,
  // hashing the rest, the root). Zeros otherwise.
  uint64_t commitment_leaves = 0;
  uint64_t commitment_tail_leaves = 0;
  double commitment_tail_seconds = 0;
  // Receiver with plan.freeze_after_s: why it reports a freeze (no new version within the
  // limit); empty: none.
  std::string freeze;
  // Recovery (NodePlan::state_dir): this process's start (1 = first), the recoveries its
  // RecoveryPolicy spent, and what they did in this process.
  int starts = 1;
  int recoveries = 0;
  uint64_t fallbacks = 0;          // FallBackToStore
  uint64_t reloads = 0;            // ReloadCommitted
  uint64_t overwrite_repairs = 0;  // doubtful chunks repaired by overwrite form
  uint64_t chunks_skipped = 0;     // chunks the journal showed applied (not written again)
  uint64_t mirror_puts = 0;        // blobs put into the store by mirror_to_store
  uint64_t mirror_put_failures =
      0;  // puts the store refused (blobs not mirrored; not in mirror_puts)
  // The node's store calls (puts, fetches, lists, reports) that failed, an absent object aside,
  // and of those the responses refused as not what the store's headers promised (kDataLoss: a
  // short or altered body, a put stored with another ETag).
  uint64_t store_failures = 0;
  uint64_t store_refused = 0;
  // Resume of interrupted blobs (a fallback to the store, a cut fetch): fetches that continued
  // from bytes the node held, and how many bytes they did not fetch again; every byte fetched
  // from the store; the sender's bytes put into the store after it left the tree or restarted
  // (with emulate_wan, the long-link bytes of the resumed transfer).
  uint64_t resumed_blobs = 0;
  uint64_t resumed_bytes = 0;
  uint64_t fetched_bytes = 0;
  uint64_t fill_bytes = 0;
  // A restarted receiver: the blobs (and their bytes) it read back from its state dir's spool
  // of the version in flight, which its download does not fetch again.
  uint64_t restored_blobs = 0;
  uint64_t restored_bytes = 0;
  // Edge relay (NodePlan::edge_relays): context-coded chunks transcoded to their plain records,
  // their bytes in both forms and the CPU seconds the transcoding took (summed over threads).
  uint64_t edge_chunks = 0;
  uint64_t edge_context_bytes = 0;
  uint64_t edge_plain_bytes = 0;
  double edge_cpu_seconds = 0;
  // Sender with edge relays (NodePlan::edge_lag_bytes): each time an edge relay was found
  // lagging, the unacknowledged bytes when it was and the chunks it was then sent in the plain
  // form; when it caught up again (resumed), the unacknowledged bytes then and the chunks not
  // yet started on its edge that went back to the context form.
  struct EdgeSwitch {
    int child = 0;
    uint64_t lag_bytes = 0;
    uint64_t plain_chunks = 0;
    bool resumed = false;
    uint64_t resume_bytes = 0;
    uint64_t context_chunks = 0;
  };
  std::vector<EdgeSwitch> edge_switches;
  bool storage_reattached = false;  // the mapped storage of an earlier start was re-attached
  // A durable delta receiver (NodePlan::state_dir): what making this version durable wrote
  // (the version log's entries and commit marker, and a full image when one was due) and what
  // the process wrote to disk from its start of the version to its end (write_bytes of
  // /proc/self/io, every file of the node included); the image written, if any; a restart's
  // recovery of the held version from its log (reading the image, replaying the log).
  uint64_t durable_log_bytes = 0;
  uint64_t durable_image_bytes = 0;
  uint64_t durable_write_bytes = 0;
  double durable_restore_s = 0;
  std::string recovery_log;  // the recovery actions taken, one per line
  // Retention (NodePlan::retain_versions; the sender of a plan with versions): the collection
  // after this version's commit (dcr/retention.h): objects and bytes it removed, the bytes
  // left under the versions' prefix, the versions kept and needed, and why a budget is not
  // met ("" when it is, or no collection ran: retention_runs 0).
  int retention_runs = 0;
  uint64_t retention_removed_objects = 0;
  uint64_t retention_removed_bytes = 0;
  uint64_t retention_store_bytes = 0;
  std::string retention_kept;  // "v3 kept, v4 needed, ..." (the versions left)
  std::string retention_error;
  // Region receiver (NodePlan::region_receiver): how it came to hold this version: "follow" (its
  // delta from the in-region store, in step), "replay" (a retained delta, taken behind),
  // "full_frame" (a full frame from the in-region store), "absent" (it did not hold this version:
  // not yet joined, or passed over by a full frame). Empty for other nodes.
  std::string catch_up;
  // Sender of a long-lived run: the receivers declared dead at this version ("<rank>: why") and
  // the ranks re-admitted by a report of it.
  std::vector<std::string> declared_dead;
  std::vector<int> readmitted;
  // Long-link relay (NodePlan::serve_full_frames): full-frame requests served after this version.
  int full_frames_served = 0;
};

// Whether `plan` asks for fault points (NodePlan::fault_kill_chunk, fault_kill_blob or
// fault_kill_log_step set): a
// plan only dcr-node-faults, the test build of the node, runs.
bool PlanAsksForFaults(const NodePlan& plan);

// Runs one node to completion (or failure / timeout). The returned Status is the node's error;
// `result` is filled either way (and written to plan.result_path when set). Errors also:
// kFailedPrecondition for a plan that asks for fault points (PlanAsksForFaults) in a process
// without them installed (the deployed dcr-node), naming dcr-node-faults.
Status RunNode(const NodePlan& plan, NodeResult* result);

// Allocator settings of a refit data-plane process (a dcr-node process, and `dcr bench pipeline`,
// which times the same code): glibc's malloc keeps buffers up to 32 MiB in its heaps instead of
// mmapping them and giving them back on free. BuildDelta scans and encodes window after window
// on fresh worker threads; with the default (dynamic) threshold a fresh sender process mapped,
// faulted in and unmapped those buffers again every window: ~25k extra page faults, ~0.08 s of
// CPU in a 0.35 s build of compare-small, which a long-lived process (or the bench's warm
// repetitions) never pays. Call once at process start.
void UseDataPlaneAllocator();

std::string NodePlanToJson(const NodePlan& plan);
StatusOr<NodePlan> NodePlanFromJson(const std::string& json);
std::string NodeResultToJson(const NodeResult& r);
StatusOr<NodeResult> NodeResultFromJson(const std::string& json);

// Rank from the launcher's environment: the first of RANK (torchrun), SLURM_PROCID,
// OMPI_COMM_WORLD_RANK, PMI_RANK that is set to a non-negative integer; -1 if none is (a variable
// set to anything else is passed over).
int RankFromEnvironment();

}  // namespace dcr

#endif  // DCR_CORE_INCLUDE_DCR_NODE_H_
