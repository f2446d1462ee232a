// Scenarios: what `dcr run SCENARIO.yaml` executes, for real (mode: real) or simulated (mode: sim),
// and the result every run produces. The schema, units and defaults are documented key by key in
// scenarios/README.md; this header mirrors it. The library (dcr::scenario) has no SimGrid
// dependency: the real runner, the simulator and the reports all link it.
//
// Units accepted by the parser (case-sensitive suffixes, optional space, decimal numbers):
//   sizes      B, KB, MB, GB, TB (10^3 steps), KiB, MiB, GiB, TiB (2^10 steps); a bare number is
//              bytes.
//   bandwidth  bit/s, Kbit/s, Mbit/s, Gbit/s, Tbit/s (also bps, Kbps, Mbps, Gbps) and
//              B/s, KB/s, MB/s, GB/s, KiB/s, MiB/s, GiB/s; stored as bytes per second.
//   durations  ns, us, ms, s, min, h; a bare number is seconds.
//   rates      a fraction (0.03) or a percentage ("3%").
// Errors name the key path, e.g. "transport.relay_tree.window: bad size '8 MiBs'" or
// "network.long_link: unknown key 'bandwith'".
//
// Thread safety: plain data and pure functions.
#ifndef DCR_SIM_SCENARIO_INCLUDE_DCR_SCENARIO_H_
#define DCR_SIM_SCENARIO_INCLUDE_DCR_SCENARIO_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dcr/delta.h"
#include "dcr/relay_policy.h"
#include "dcr/status.h"
#include "dcr/statusor.h"

namespace dcr {

enum class RunMode : uint8_t { kReal, kSim };
enum class Method : uint8_t { kDelta, kFull };
enum class TransportKind : uint8_t { kRelayTree, kObjectStore };
enum class StoreKind : uint8_t { kDir, kS3 };
// How the long link is emulated in mode real: in the transport layer (token bucket + delay on
// every long-link socket), by network namespaces (tests; needs root), or not at all.
enum class WanEmulation : uint8_t { kTransport, kNetns, kNone };

const char* RunModeName(RunMode m);              // "real", "sim"
const char* MethodName(Method m);                // "delta", "full"
const char* TransportKindName(TransportKind k);  // "relay_tree", "object_store"
const char* StoreKindName(StoreKind k);          // "dir", "s3"

struct LinkSpec {
  double bandwidth_Bps = 0;  // bytes per second; 0 = unlimited
  double latency_s = 0;      // one-way
};

struct ModelSpec {
  // Either a preset (synthetic checkpoints via `dcr synth` machinery) ...
  std::string preset;  // e.g. "tiny", "llama3-8b"; empty when checkpoints are given
  int64_t depth_div = 1, width_div = 1, expert_div = 1;
  uint64_t seed = 1;
  // ... or explicit checkpoints: base then one target per step ...
  std::vector<std::string> checkpoints;
  // ... or only the base every receiver holds: a deployment, whose versions the trainer hands
  // while it runs, as many as it decides (open-ended; `dcr-node SCENARIO` and the publisher of
  // dcr/publisher_c.h, not `dcr run` or `dcr sim`).
  std::string base;
  // Where synthetic checkpoints are written. Default "" = a fresh temporary directory.
  std::string work_dir;
};

struct DeltaSpec {
  uint64_t chunk_elems = uint64_t{1} << 22;  // grid cell, elements (DeltaOptions)
  int zstd_level = 1;
  int threads = 0;  // 0 = hardware concurrency
  // Context-coded chunks (DeltaOptions::context_coding, format version 8). Default false.
  bool wan_context = false;
  // With wan_context: the most exponent classes per context-coded chunk
  // (DeltaOptions::context_classes, 1..kContextClassesMax).
  int context_classes = kContextClassesMax;
};

// Training-side layout (per-shard delta construction). Defaults: one rank, canonical export.
struct TrainingLayout {
  int tp = 1, pp = 1, ep = 1;
  bool distributed_optimizer = false;
  bool enabled = false;  // true when the scenario has a `training` block
};

// Serving-side layout (the receiver runtime). Defaults: receivers apply to safetensors copies.
struct ServingLayout {
  int tp = 1;
  bool fp8 = false;
  bool buffers = false;
  bool enabled = false;  // true when the scenario has a `serving` block
};

struct ObjectStoreSpec {
  StoreKind kind = StoreKind::kDir;
  std::string path;      // dir: root directory ("" = <work_dir>/store)
  std::string endpoint;  // s3
  std::string bucket;    // s3
  std::string region = "us-east-1";
  std::string credentials_file;
  std::string ca_file;          // s3: CAs for the https endpoint's certificate ("" = the system's)
  bool allow_http = false;      // s3: accept a plain http:// endpoint (a local test server only)
  double read_deadline_s = 30;  // s3: a request that moves no byte this long is aborted
  int parallel = 4;             // concurrent puts / fetches per node
  double poll_s = 0.05;         // downloader list interval
  // Simulation: store bandwidth and first-byte latency (ignored by mode real).
  LinkSpec sim_link{1.25e9, 0.02};
};

struct RelayTreeSpec {
  int fan_out = 2;                      // children per relay
  int root_fan_out = 1;                 // long-link children of the sender
  int streams = 1;                      // parallel TCP streams per long-link edge
  uint64_t window = uint64_t{8} << 20;  // bytes a stream keeps on the link (RelayOptions)
  uint64_t chunk = uint64_t{1} << 20;   // cut-through piece size, bytes
  std::vector<int> topology;            // explicit parents (node 0 = sender, -1); empty = fan-out
  // Edge relays (mode real, delta.wan_context): nodes, children of the sender, that hold the
  // canonical base and forward the plain encoding of every context-coded chunk to their
  // subtrees (NodePlan::edge_relays). Empty = none: every receiver decodes the context-coded
  // delta against its own base.
  std::vector<int> edge_relays;
  // The edge relays split the base's decoding by chunk range (dcr/edge_split.h): they form a
  // chain in the order listed (the first the sender's only child, each next the only child of
  // the one before), edge relay k transcodes only the context-coded chunks of range k (ranges
  // balanced by dense bytes, NodePlan::edge_range_first/end) and forwards the others as they
  // are; the last one's subtree gets the plain stream. Each must be a cpu receiver (it applies
  // the records of later ranges in their context form against its own base). Default false.
  bool edge_split = false;
  // Lag bound of an edge relay (NodePlan::edge_lag_bytes): bytes the sender handed to the link
  // for it that it has not acknowledged; past it the sender sends the plain form of every chunk
  // not yet started on that edge. 0 (default) = 4 x window x streams.
  uint64_t edge_lag = 0;
};

struct TransportSpec {
  // Transports to run; every (method x transport x change rate) combination is one run.
  std::vector<TransportKind> kinds{TransportKind::kRelayTree};
  ObjectStoreSpec object_store;
  RelayTreeSpec relay_tree;
};

// Where a node keeps the weights it diffs or applies (dcr/device.h DeviceKind by name): "cpu" =
// host memory through the plain host receiver and sender (no device interface); "host" = the
// device path on the host backend (every device operation run by the CPU over host memory);
// "cuda" = the CUDA backend. Real mode only; the simulator ignores it.
inline constexpr const char* kDeviceNames[] = {"cpu", "host", "cuda"};

struct ReceiversSpec {
  int count = 4;
  int per_node = 1;            // receivers sharing a host (sim: GPUs per node)
  int apply_threads = 2;       // parallel chunk applies per receiver
  bool verify = true;          // compare every receiver's bytes with the target after the run
  std::string device = "cpu";  // "cpu" | "host" | "cuda" (kDeviceNames)
  // Device indices a host's receivers use: its receiver with local index k (ReceiverLocalIndex)
  // opens devices[k % devices.size()]. Empty = device k. Ignored with device "cpu".
  std::vector<int> devices;
  // Per-node overrides of `device` (receiver node id -> "cpu" | "host" | "cuda"). Empty = none.
  std::map<int, std::string> node_devices;
  // Per-receiver deadline of a long-lived run (`receivers.deadline`): once the tree committed a
  // version, the sender waits this long for a region receiver's commit report, then declares it
  // dead (it stops holding the baseline back). Default 30 s.
  double deadline_s = 30;
};

// Versions over time in a real multi-step relay-tree run (`catch_up:` block; scenarios/README.md,
// core/docs/fault-tolerance.md "Catch-up and late joiners"). Each key set adds one receiver in
// the rollout region that follows the versions from the in-region store (ranks after the tree's).
struct CatchUpSpec {
  bool enabled = false;
  // A region receiver that is down for `down_versions` versions: its process is killed (SIGKILL)
  // when step `down_step` starts (once it committed the version before) and started again when
  // step down_step + down_versions starts. 0 = none.
  int down_step = 0;
  int down_versions = 2;
  // A late joiner: a region receiver whose process starts when step `join_step` starts, holding
  // no version (its first is a full frame from inside the region). 0 = none.
  int join_step = 0;
  // Catch-up limits (NodePlan::catch_up_max_replay, catch_up_full_frame_fraction).
  int max_replay = 8;
  double full_frame_fraction = 0.5;
};

// Retention of the store's versions in a long-lived run (`retention:` block; dcr/retention.h):
// the sender keeps the newest `keep_versions` versions and holds the store within
// `budget_bytes` (0 = no budget) after each version's commit, never removing what is needed.
struct RetentionSpec {
  bool enabled = false;  // true when the scenario has a `retention` block
  int keep_versions = 2;
  uint64_t budget_bytes = 0;
};

struct SenderSpec {
  std::string device = "cpu";  // "cpu" | "host" | "cuda": where the delta's diff runs
};

// Fault injection (`faults:` block; docs in scenarios/README.md). For each change rate, `dcr run`
// adds `runs` fault-injection refits of the same checkpoints, tree shape and long link: the real
// transport state machines, codec, object store and journaled receivers on a deterministic clock
// (dcr/testing/fault_injection.h), `per_run` faults each. Results: ScenarioResult::faults.
struct FaultsSpec {
  bool enabled = false;            // true when the scenario has a `faults` block
  int runs = 1;                    // seeded fault runs per change rate
  int per_run = 13;                // faults injected per run (kinds cycled)
  std::vector<std::string> kinds;  // fault kind names; empty = every kind
  uint64_t seed = 1;
  uint64_t chunk_elems = 0;        // grid cell for the fault runs; 0 = delta.chunk_elems
  double detect_timeout_s = 0.25;  // a child notices a dead parent after this long
  double restart_delay_s = 0.2;    // a killed receiver restarts after this long
  bool only = false;               // skip the ordinary runs (fault runs only)
  // Real process kills: refits through the shipped dcr-node processes, each with
  // `process_kills` nodes SIGKILLed at seeded points (receivers between and inside chunks,
  // relays mid-stream, the sender, a kill -9 from outside at a seeded moment); `dcr run`'s
  // supervisor restarts them. 0 = none.
  int process_runs = 0;
  int process_kills = 3;
  // Frame-level faults from a fault proxy (`dcr fault-proxy`, tools/faults/fault_proxy.h): refits
  // through the shipped dcr-node processes with a proxy process on seeded relay-tree edges, each
  // injecting `proxy_faults` faults (kinds cycled over `proxy_kinds`, empty = every kind:
  // corrupt, duplicate, reorder, delay, drop, partition, store_write_fail). 0 = none.
  int proxy_runs = 0;
  int proxy_faults = 2;
  std::vector<std::string> proxy_kinds;
  double partition_s = 2.0;   // how long a partition blackholes its edge
  double delay_s = 0.3;       // how long a delayed frame is held
  double store_fail_s = 1.0;  // how long the in-region store refuses writes
  // HTTP faults from an S3 fault proxy (`dcr s3-fault-proxy`, tools/faults/s3_fault_proxy.h) in
  // front of the scenario's S3 endpoint: object-store refits through the shipped dcr-node
  // processes, each injecting `s3_faults` faults, cycled over the (kind, direction) pairs of
  // `s3_kinds` (empty = every kind: 5xx, cut, stall, truncate, bad_etag) x (upload, download).
  // A stall holds its connection for the store's read deadline + 1 s. 0 = none.
  int s3_runs = 0;
  int s3_faults = 2;
  std::vector<std::string> s3_kinds;
};

struct RegionSpec {
  std::string name;
  LinkSpec intra{12.5e9, 0.0001};  // links inside the region: default 100 Gbit/s, 0.1 ms
};

// Mutual TLS 1.3 on relay-tree edges (`network.tls`; transport/tls.h in the core describes the
// trust model). On by default. `dcr run` makes a fresh CA and node certificates for every refit
// unless ca/cert/key name files; `dcr node SCENARIO --rank R` (multi-host) needs the files,
// written by `dcr keys`. "{rank}" in cert and key is replaced by the node's rank.
struct TlsSpec {
  bool enabled = true;
  std::string ca;    // the run's CA certificate
  std::string cert;  // this node's certificate, e.g. keys/node-{rank}.crt
  std::string key;   // its private key (mode 0600), e.g. keys/node-{rank}.key
};

// Signed deltas (network.signing): the trainer's Ed25519 key pair and receivers' freeze limit.
struct SigningSpec {
  bool enabled = true;
  std::string key;            // the trainer's private key (rank 0; mode 0600), from `dcr keys`
  std::string trust;          // its public key (every receiver)
  double freeze_after_s = 0;  // receivers report a freeze past this many seconds (0 = off)
};

struct NetworkSpec {
  std::vector<RegionSpec> regions;    // default: "train", "rollout"
  LinkSpec long_link{12.5e6, 0.035};  // inter-region: default 100 Mbit/s, 35 ms
  WanEmulation emulation = WanEmulation::kTransport;
  // Multi-host (`dcr node`): "host:port" per rank (rank 0 = sender). Empty: loopback ports.
  std::vector<std::string> hosts;
  int base_port = 0;  // loopback: first port (0 = pick free ports)
  TlsSpec tls;
  // Liveness of relay-tree edges (real mode): a heartbeat on every stream silent for
  // `heartbeat_interval_s`; a link without a byte for `read_deadline_s` is lost. 0 read deadline
  // (unset) = the larger of 10 s and four times what one 64 KiB segment per long-link stream
  // takes at the long link's rate, plus its latency (ReadDeadlineFor).
  double heartbeat_interval_s = 1.0;
  double read_deadline_s = 0;
  SigningSpec signing;
  // Metrics endpoint of every node (real mode; 0 = none): node r serves HTTP on port
  // metrics_port + r of its host (network.hosts[r]'s host, else 127.0.0.1).
  int metrics_port = 0;
};

// Simulator-only settings (mode: sim); parsed here, interpreted by dcr::sim.
struct SimSpec {
  std::string network_model = "CM02";
  std::string calibration;  // calibration file from `dcr bench` ("" = built-in defaults)
  int sample_tensors = 8;   // tensors sampled through the real codec for payload sizes
  int coarsen = 1;          // merge this many chunks per simulated message
  int gpus_per_node = 8;
  double tcp_gamma = 4194304;  // SimGrid network/TCP-gamma, bytes
  // Extra free-form settings for the simulator ("key: value" strings), so it can grow without a
  // schema change here. Keys are dotted paths under `sim.extra`.
  std::map<std::string, std::string> extra;
};

struct Scenario {
  std::string name;  // default: file stem
  std::string description;
  RunMode mode = RunMode::kReal;
  ModelSpec model;
  std::vector<double> change_rates{0.03};
  int steps = 1;  // refits per run (consecutive versions)
  std::vector<Method> methods{Method::kDelta, Method::kFull};
  DeltaSpec delta;
  TrainingLayout training;
  ServingLayout serving;
  TransportSpec transport;
  ReceiversSpec receivers;
  SenderSpec sender;
  NetworkSpec network;
  FaultsSpec faults;
  RetentionSpec retention;
  CatchUpSpec catch_up;
  SimSpec sim;
  double timeout_s = 600;   // whole run
  bool progress = true;     // progress display on stderr
  std::string source_path;  // file it was parsed from ("" for strings)
};

// Parses YAML text. `name_hint` names the scenario when it has no `name` key.
// Errors: kInvalidArgument with the key path (unknown key, wrong type, bad unit, bad value).
StatusOr<Scenario> ParseScenario(const std::string& yaml_text, const std::string& name_hint = "");
// Reads and parses a file. kNotFound if it does not exist.
StatusOr<Scenario> LoadScenario(const std::string& path);
// Checks cross-field constraints (receivers >= 1, rates in (0, 1], topology size == receivers+1,
// s3 needs endpoint and bucket, ...). ParseScenario calls it.
Status ValidateScenario(const Scenario& s);

// The relay tree of `s`, one shape for `dcr run`, `dcr node` and the simulator:
//   * transport.relay_tree.topology when given;
//   * else, with receivers.per_node = P > 1, a host-aware tree in which the payload crosses between
//     hosts once per host. Receiver node i (1-based) is on host (i - 1) / P (ReceiverHost); the
//     first receiver of each host, its leader, takes part in a fan-out tree of the sender and the
//     leaders (Topology::FanOut over hosts + 1 nodes with root_fan_out and fan_out, leaders in host
//     order), and the host's other receivers are children of its leader (loopback);
//   * else (P = 1) Topology::FanOut over receivers.count + 1 nodes with fan_out and root_fan_out.
// Errors: kInvalidArgument naming the key.
StatusOr<Topology> TopologyFor(const Scenario& s);

// The rollout host of receiver node `node` (1-based; node 0 is the sender): (node - 1) /
// receivers.per_node. The simulator places receivers so, and TopologyFor's tree follows it.
int ReceiverHost(const Scenario& s, int node);
// The index of receiver node `node` among the receivers of its host: (node - 1) %
// receivers.per_node (0 for the sender).
int ReceiverLocalIndex(const Scenario& s, int node);
// The device receiver node `node` holds its weights on: receivers.node_devices[node], else
// receivers.device.
const std::string& ReceiverDevice(const Scenario& s, int node);
// The device index receiver `node` opens when its local index on the host is `local_index`:
// receivers.devices[local_index % size], or local_index when the list is empty.
// REQUIRES: local_index >= 0.
int DeviceIndexFor(const Scenario& s, int local_index);

// How the simulator scales a run's transport so that its message count stays within budget:
// pieces of piece_factor x relay_tree.chunk bytes, downloader polls at least min_poll_interval_s
// apart. The real runner uses the defaults (no scaling).
struct TransportScale {
  uint64_t piece_factor = 1;  // >= 1
  double min_poll_interval_s = 0;
};

// The RelayOptions of every node of a run of `s` -- one derivation for `dcr run` / `dcr node`
// and the simulator: piece_bytes = relay_tree.chunk x scale.piece_factor, window_bytes =
// relay_tree.window, root_streams = relay_tree.streams, max_parallel_applies =
// receivers.apply_threads, max_parallel_puts / _fetches = object_store.parallel (each at least
// 1), poll_interval_s = max(object_store.poll_s, scale.min_poll_interval_s), poll_timeout_s =
// timeout_s, prefix = `prefix`; apply, retry_backoff_s and max_retries keep their defaults.
RelayOptions RelayOptionsFor(const Scenario& s, const std::string& prefix,
                             const TransportScale& scale = {});

// The lag bound of each edge relay of `s` (NodePlan::edge_lag_bytes, RelayOptions::edge_lag_bytes):
// transport.relay_tree.edge_lag when set, else 4 x `window_bytes` x relay_tree.streams (the
// real runner passes relay_tree.window, the simulator the bytes in flight per simulated stream).
uint64_t EdgeLagBytesFor(const Scenario& s, uint64_t window_bytes);

// The read deadline of the relay-tree edges of `s` (NodePlan::read_deadline_s):
// network.read_deadline when set; else the largest of 10 s, twice network.heartbeat and 4 x (64 KiB
// x root_fan_out x streams / long-link bandwidth + long-link latency), so that a stream waiting its
// turn for the shared long link is never mistaken for a silent one.
double ReadDeadlineFor(const Scenario& s);

// Unit parsers (exposed for tests and the CLI). `what` prefixes errors.
StatusOr<uint64_t> ParseSize(const std::string& text, const std::string& what);
StatusOr<double> ParseBandwidth(const std::string& text, const std::string& what);  // bytes/s
StatusOr<double> ParseDuration(const std::string& text, const std::string& what);   // seconds
StatusOr<double> ParseRate(const std::string& text, const std::string& what);       // fraction

// ---- results (the same struct for real and simulated runs) ----

struct PhaseTimes {
  double build_s = 0;     // first to last chunk built (sender)
  double transfer_s = 0;  // first byte sent to last byte received by the last receiver
  double apply_s = 0;     // sum over receivers of time spent applying, / receivers
  double commit_s = 0;    // first chunk built -> tree committed (= refit_seconds)
};

struct ReceiverResult {
  int node = 0;
  std::string host;
  bool committed = false;
  bool verified = false;       // byte-for-byte equal to the target
  std::string verify_message;  // first difference or error
  double commit_at_s = 0;      // since the first chunk was built
  uint64_t bytes_received = 0;
  // Relay tree (real runs): the receiver's commit report as the sender received it up the tree
  // (reported false: none reached the sender). report_hash is its content hash in hex (zeros for
  // the full stream), report_error its failure when !report_ok.
  bool reported = false;
  bool report_ok = false;
  uint64_t report_version = 0;
  std::string report_hash;
  std::string report_error;
  // A region receiver of a `catch_up:` run (NodeResult::catch_up): "follow", "replay",
  // "full_frame" or "absent" (it did not hold this version and is not counted in `receivers`).
  std::string catch_up;
};

// One catch-up event of a real long-lived run (`catch_up:` block), at the step it happened.
struct CatchUpEvent {
  int node = 0;
  // "declared_dead" (the sender's deadline passed without its report), "replay" (it took a
  // missed version's retained delta from the in-region store), "full_frame" (it loaded a full
  // frame from the in-region store), "readmitted" (its report of this version reached the
  // sender, which counts it in the joint commit again).
  std::string event;
  std::string detail;
  uint64_t store_bytes = 0;      // bytes it read from the in-region store for this step
  uint64_t long_link_bytes = 0;  // bytes it caused over the long link
};

struct LinkBytes {
  std::string name;  // "long", "local", "store_put", "store_get"
  uint64_t bytes = 0;
};

struct RunResult {
  Method method = Method::kDelta;
  TransportKind transport = TransportKind::kRelayTree;
  // Measured fraction of the elements that differ between the step's base and target: the changed
  // elements of the delta built from them (real runs: counted over the checkpoints, for delta and
  // full runs alike; simulations: the payload model's sampled delta).
  double change_rate = 0;
  // The change rate the synthetic trainer was asked for (scenario `change_rates`); 0 when the
  // scenario gives its checkpoints (model.checkpoints). An input, never a measurement.
  double configured_change_rate = 0;
  int step = 1;
  double refit_seconds = 0;    // first chunk built -> last receiver committed
  uint64_t wire_bytes = 0;     // bytes over the long link
  uint64_t payload_bytes = 0;  // stream bytes (delta or full checkpoint)
  uint64_t dense_bytes = 0;    // checkpoint tensor bytes
  int receivers = 0;
  int receivers_verified = 0;
  PhaseTimes phases;
  std::vector<LinkBytes> links;
  std::vector<ReceiverResult> receiver_results;
  std::string error;  // empty on success
  // Real runs: what the nodes recovered from (summed over every node's last process: fallbacks,
  // reloads, overwrite_repairs, chunks_skipped, mirror_puts, node_restarts), and one line per
  // node process that died and was restarted ("node 3: killed by signal 9; restart 1").
  std::map<std::string, uint64_t> recovery;
  std::vector<std::string> restarts;
  // Long-lived runs with a `retention:` block: the sender's collection of the store after this
  // step's commit (removed_objects, removed_bytes, store_bytes), and the versions left with
  // why ("v3 kept, v4 needed"), followed by the collection's error when it had one.
  std::map<std::string, uint64_t> retention;
  std::string retention_kept;
  std::vector<CatchUpEvent> catch_up;  // real long-lived runs with a `catch_up:` block
};

// Totals of the fault-injection runs of a scenario (`faults:`); absent from the JSON when the
// scenario has no faults block.
struct FaultSummary {
  bool enabled = false;
  int runs = 0;
  int faults_injected = 0;
  int faults_survived = 0;     // injected in runs that ended bit-exact and committed everywhere
  int receivers = 0;           // summed over runs
  int receivers_verified = 0;  // byte-equal to the target and committed
  std::map<std::string, int> injected_by_kind;
  std::map<std::string, int> survived_by_kind;  // real process kills (process_runs)
  uint64_t overwrite_repairs = 0;
  uint64_t fallbacks_to_store = 0;
  uint64_t restarts = 0;
  uint64_t payloads_refused = 0;
  uint64_t corrupt_detected = 0;
  double seconds = 0;               // wall time of the fault runs
  std::vector<std::string> errors;  // one per failed run
};

struct ScenarioResult {
  std::string scenario;
  RunMode mode = RunMode::kReal;
  std::string model;  // preset name or checkpoint file name
  uint64_t model_bytes = 0;
  std::vector<RunResult> runs;
  FaultSummary faults;
  // Free-form facts about the setup (host, commit, calibration, emulation), reported verbatim.
  std::map<std::string, std::string> setup;
};

// The result JSON (keys: scenario, mode, model, runs[{method, transport, change_rate (measured),
// configured_change_rate (the synthetic trainer's input, absent for given checkpoints),
// refit_seconds, wire_bytes, receivers, receivers_verified, ...}], plus speedups and setup).
std::string ResultToJson(const ScenarioResult& r);
// Parses ResultToJson output (reports, comparisons). kInvalidArgument on malformed JSON.
StatusOr<ScenarioResult> ResultFromJson(const std::string& json);
// A Markdown table, one row per run, with the delta-vs-full speedup per (transport, rate).
std::string ResultToMarkdown(const ScenarioResult& r);
// Speedup of the delta run over the full run with the same transport, rate and step (0 if
// either is missing or failed).
double SpeedupVsFull(const ScenarioResult& r, const RunResult& delta_run);

}  // namespace dcr

#endif  // DCR_SIM_SCENARIO_INCLUDE_DCR_SCENARIO_H_
