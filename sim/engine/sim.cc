#include "dcr/sim/sim.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>

#include "calibration.h"
#include "dcr/delta.h"
#include "dcr/edge_split.h"
#include "dcr/model.h"
#include "dcr/status_macros.h"
#include "dcr/wan_choice.h"
#include "driver.h"
#include "payload_model.h"
#include "plan.h"

namespace dcr::sim {

using internal::Calibration;
using internal::PayloadModel;

namespace {

constexpr double kUnlimitedBandwidth = 1e15;

std::string Num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

bool FileExists(const std::string& p) { return ::access(p.c_str(), R_OK) == 0; }

std::string DirName(const std::string& p) {
  size_t s = p.rfind('/');
  return s == std::string::npos ? "." : p.substr(0, s);
}

}  // namespace

namespace internal {

StatusOr<Extra> ParseExtra(const Scenario& s) {
  Extra e;
  for (const auto& [key, value] : s.sim.extra) {
    std::string path = "sim.extra." + key;
    if (key == "edge_relay_cores") {
      char* end = nullptr;
      long v = std::strtol(value.c_str(), &end, 10);
      if (end == value.c_str() || *end != '\0' || v < 1 || v > 4096) {
        return InvalidArgumentError(path + ": must be a core count in [1, 4096], got '" + value +
                                    "'");
      }
      e.edge_cores = static_cast<int>(v);
    } else if (key == "edge_relays") {
      char* end = nullptr;
      long v = std::strtol(value.c_str(), &end, 10);
      if (value == "auto") {
        e.edge_count = 0;
      } else if (end == value.c_str() || *end != '\0' || v < 1 || v > kMaxEdgeRelays) {
        return InvalidArgumentError(path + ": must be 'auto' or a count in [1, " +
                                    std::to_string(kMaxEdgeRelays) + "], got '" + value + "'");
      } else {
        e.edge_count = static_cast<int>(v);
      }
    } else if (key == "edge_relay_memory") {
      StatusOr<uint64_t> v = ParseSize(value, path);
      if (!v.ok()) return v.status();
      if (*v == 0) {
        return InvalidArgumentError(path + ": must be a size above 0, got '" + value + "'");
      }
      e.edge_memory = static_cast<double>(*v);
    } else if (key == "comm_budget" || key == "build_cores") {
      char* end = nullptr;
      double v = std::strtod(value.c_str(), &end);
      if (end == value.c_str() || *end != '\0' || !(v >= 1)) {
        return InvalidArgumentError(path + ": must be a number >= 1, got '" + value + "'");
      }
      if (key == "comm_budget")
        e.comm_budget = v;
      else
        e.build_cores = static_cast<int>(v);
    } else if (key == "calibration_clock") {
      if (value == "wall")
        e.wall_clock = true;
      else if (value == "cpu")
        e.wall_clock = false;
      else
        return InvalidArgumentError(path + ": must be 'cpu' or 'wall', got '" + value + "'");
    } else if (key == "shared_cpu") {
      // A one-machine run (dcr run on loopback): sender, relays and receivers share its cores.
      if (value == "host") {
        e.shared_cpu = static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
      } else {
        char* end = nullptr;
        long v = std::strtol(value.c_str(), &end, 10);
        if (end == value.c_str() || *end != '\0' || v < 1 || v > 4096) {
          return InvalidArgumentError(path + ": must be 'host' or a core count >= 1, got '" +
                                      value + "'");
        }
        e.shared_cpu = static_cast<int>(v);
      }
    } else if (key == "durable") {
      if (value == "true")
        e.durable = true;
      else if (value == "false")
        e.durable = false;
      else
        return InvalidArgumentError(path + ": must be 'true' or 'false', got '" + value + "'");
    } else if (key == "object_store_region") {
      if (value == "train" || value == "0")
        e.store_region = 0;
      else if (value == "rollout" || value == "1")
        e.store_region = 1;
      else
        return InvalidArgumentError(path + ": must be 'train' or 'rollout', got '" + value + "'");
    } else {
      return InvalidArgumentError(path +
                                  ": unknown key (known: comm_budget, build_cores, "
                                  "calibration_clock, object_store_region, shared_cpu, "
                                  "edge_relays, edge_relay_cores, edge_relay_memory, durable)");
    }
  }
  return e;
}

}  // namespace internal

namespace {

using internal::Extra;
using internal::Sizing;

// The calibration of a run: the option's path (a command-line path: as given), else the
// scenario's sim.calibration, a relative one taken against the scenario file's folder (against
// the current directory for a scenario parsed from text), else DefaultCalibrationPath().
StatusOr<std::string> ResolveCalibration(const Scenario& s, const SimOptions& o) {
  if (!o.calibration_path.empty()) return o.calibration_path;
  const std::string& p = s.sim.calibration;
  if (p.empty()) {
    std::string d = DefaultCalibrationPath();
    if (d.empty()) {
      return NotFoundError(
          "no default calibration: none in share/dcr/calibration/ beside this binary or up to "
          "three folders above it; set DCR_SIM_CALIBRATION or sim.calibration");
    }
    return d;
  }
  if (p[0] == '/' || s.source_path.empty()) return p;
  // LoadCalibration reports a missing file, by this path.
  return std::filesystem::path(DirName(s.source_path) + "/" + p).lexically_normal().string();
}

}  // namespace

namespace internal {

Sizing SizeRun(const Scenario& s, const Extra& extra, double payload, double header, double trailer,
               double dense, uint64_t grid_chunks, double build_Bps, double apply_Bps,
               int build_cores, int build_threads) {
  Sizing z;
  const RelayTreeSpec& rt = s.transport.relay_tree;
  uint64_t piece = std::max<uint64_t>(rt.chunk, 1);
  uint64_t window = std::max<uint64_t>(rt.window, piece);
  z.pieces_in_flight = static_cast<int>(std::max<uint64_t>(1, window / piece));
  double receivers = s.receivers.count;
  double f = std::ceil(receivers * payload / (static_cast<double>(piece) * extra.comm_budget));
  z.coarsen = std::max<uint64_t>(
      {1, static_cast<uint64_t>(f), static_cast<uint64_t>(std::max(1, s.sim.coarsen))});
  // Equal bytes in flight per stream: bigger pieces, fewer of them in flight (at least one).
  z.piece = piece * z.coarsen;
  z.pieces_in_flight = static_cast<int>(
      std::max<uint64_t>(1, static_cast<uint64_t>(z.pieces_in_flight) / z.coarsen));
  z.window = z.piece * static_cast<uint64_t>(z.pieces_in_flight);
  double body = std::max(0.0, payload - header - trailer);
  // Chunks: the real grid, merged so every receiver sees at most budget / 4 blobs (each blob is at
  // least one message per tree edge) and at most 4096.
  uint64_t k = std::max<uint64_t>(1, grid_chunks);
  uint64_t by_budget = static_cast<uint64_t>(extra.comm_budget / (4.0 * receivers));
  k = std::min<uint64_t>({k, std::max<uint64_t>(1, by_budget), 4096});
  z.chunks = k;
  // A merged chunk stands for grid / k cells that the real builder spreads over its threads: it
  // is built by min(cells, cores) cores at once, so the build throughput and the time to the
  // first chunks stay those of the real grid whatever the merging.
  const double cells = static_cast<double>(std::max<uint64_t>(1, grid_chunks)) / k;
  const int cores_per_chunk =
      std::max(1, static_cast<int>(std::min<double>(std::floor(cells), build_cores)));
  z.build_parallel = std::max(1, build_cores / cores_per_chunk);
  // BuildDelta's build windows (dcr/delta.h ProductionOrder), counted in merged chunks.
  z.build_window =
      static_cast<int>(ProductionOrder::ForMergedCells(k, cells, build_threads).window());
  uint64_t id = 0;
  internal::SimBlob h;
  h.info = BlobInfo{id++, BlobKind::kHeader, static_cast<uint64_t>(std::llround(header))};
  h.apply_flops = internal::ComputeFlops(header, apply_Bps);
  z.blobs.push_back(h);
  uint64_t body_bytes = static_cast<uint64_t>(std::llround(body));
  for (uint64_t i = 0; i < k; ++i) {
    internal::SimBlob c;
    uint64_t lo = body_bytes * i / k, hi = body_bytes * (i + 1) / k;
    c.info = BlobInfo{id++, BlobKind::kChunk, hi - lo};
    double dense_share = dense / static_cast<double>(k);
    c.build_flops =
        build_Bps > 0 ? internal::ComputeFlops(dense_share / cores_per_chunk, build_Bps) : 0;
    c.apply_flops = internal::ComputeFlops(dense_share, apply_Bps);
    z.blobs.push_back(c);
  }
  internal::SimBlob t;
  t.info = BlobInfo{id++, BlobKind::kTrailer, static_cast<uint64_t>(std::llround(trailer))};
  z.blobs.push_back(t);
  return z;
}

RunSpec PlanRun(const Scenario& s, const PlatformSpec& plat, const Topology& topo, const Sizing& z,
                TransportKind kind, double payload, double loopback_bandwidth) {
  RunSpec spec;
  spec.platform = plat;
  spec.platform.object_store = kind == TransportKind::kObjectStore;
  spec.object_store = spec.platform.object_store;
  spec.receivers = s.receivers.count;
  spec.receivers_per_host = std::max(1, s.receivers.per_node);
  spec.topology = topo;
  // The real runner's options, scaled: coarsened pieces, and polling at most ~200 times per
  // downloader over the expected transfer time (payload over the slower of long link and store).
  TransportScale scale;
  scale.piece_factor = z.coarsen;
  scale.min_poll_interval_s = payload / std::min(plat.wan_bandwidth, plat.store_bandwidth) / 200.0;
  spec.relay = RelayOptionsFor(s, "dcr", scale);
  // An edge relay's lag bound counts the bytes in flight per simulated stream.
  spec.edge_lag_bytes = EdgeLagBytesFor(s, z.window);
  spec.blobs = z.blobs;
  spec.build_parallel = z.build_parallel;
  spec.build_window = z.build_window;
  spec.tcp_gamma = s.sim.tcp_gamma;
  spec.real_window = static_cast<double>(
      std::max<uint64_t>(s.transport.relay_tree.window, s.transport.relay_tree.chunk));
  spec.pieces_in_flight = z.pieces_in_flight;
  spec.network_model = s.sim.network_model;
  spec.loopback_bandwidth = loopback_bandwidth;
  return spec;
}

}  // namespace internal

std::string DefaultCalibrationPath() {
  const char* env = std::getenv("DCR_SIM_CALIBRATION");
  if (env != nullptr && *env != '\0') return env;
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  std::string dir = DirName(std::string(buf, static_cast<size_t>(n)));
  for (int up = 0; up <= 3 && !dir.empty(); ++up) {
    const std::string p = dir + "/share/dcr/calibration/default.json";
    if (FileExists(p)) return p;
    if (dir == "/") break;
    dir = DirName(dir);
  }
  return "";
}

namespace {

using internal::Calibration;
using internal::PayloadModel;

// What every run of a scenario shares: the model, sim.extra, the calibration, the tree.
struct SimInputs {
  ModelConfig cfg;
  Extra extra;
  Calibration cal;
  Topology topo;
  int build_cores = 1;
};

// Checks what the simulator needs beyond the schema and loads the calibration.
StatusOr<SimInputs> LoadInputs(const Scenario& s, const SimOptions& options) {
  if (s.model.preset.empty()) {
    return InvalidArgumentError(
        "model.preset: the simulator needs a preset (checkpoint paths "
        "cannot be sized without materialising them)");
  }
  auto preset = GetPreset(s.model.preset);
  if (!preset.ok()) return preset.status().WithContext("model.preset");
  SimInputs in;
  in.cfg = ScaleModel(*preset, s.model.depth_div, s.model.width_div, s.model.expert_div);
  if (s.network.regions.size() != 2) {
    return InvalidArgumentError("network.regions: the simulator needs exactly two regions, got " +
                                std::to_string(s.network.regions.size()));
  }
  if (s.sim.network_model != "CM02" && s.sim.network_model != "LV08") {
    return InvalidArgumentError("sim.network_model: 'CM02' or 'LV08', got '" + s.sim.network_model +
                                "'");
  }
  if (s.sim.gpus_per_node < 1) return InvalidArgumentError("sim.gpus_per_node: must be >= 1");
  if (!(s.sim.tcp_gamma >= 0)) return InvalidArgumentError("sim.tcp_gamma: must be >= 0");
  if (s.receivers.count < 1) return InvalidArgumentError("receivers.count: must be >= 1");
  DCR_ASSIGN_OR_RETURN(in.extra, internal::ParseExtra(s));
  DCR_ASSIGN_OR_RETURN(std::string cal_path, ResolveCalibration(s, options));
  auto cal_or = internal::LoadCalibration(cal_path);
  if (!cal_or.ok()) return cal_or.status().WithContext("sim.calibration");
  in.cal = std::move(*cal_or);
  if (in.extra.wall_clock) in.cal.UseWallClock();
  if (s.delta.wan_context && !in.cal.has_context) {
    return InvalidArgumentError("delta.wan_context: the calibration " + in.cal.source +
                                " has no context_* keys per rate (dcr bench codec --json of the "
                                "context-coded delta)");
  }
  if (s.delta.wan_context && s.delta.context_classes != in.cal.context_classes) {
    return InvalidArgumentError(
        "delta.context_classes: " + std::to_string(s.delta.context_classes) +
        " classes, but the calibration " + in.cal.source +
        " measured the context-coded speeds at " + std::to_string(in.cal.context_classes) +
        " (dcr bench codec --context-classes " + std::to_string(s.delta.context_classes) +
        " --json FILE gives a calibration for it)");
  }
  DCR_ASSIGN_OR_RETURN(in.topo, TopologyFor(s));
  in.build_cores = in.extra.build_cores > 0 ? in.extra.build_cores : s.sim.gpus_per_node;
  return in;
}

// The two regions, the long link and the store of the scenario.
StatusOr<internal::PlatformSpec> MakePlatform(const Scenario& s, const SimInputs& in) {
  internal::PlatformSpec plat;
  const int per_host = std::max(1, s.receivers.per_node);
  const int rollout_hosts = (s.receivers.count + per_host - 1) / per_host;
  for (int r = 0; r < 2; ++r) {
    internal::RegionSpec reg;
    reg.name = s.network.regions[r].name;
    reg.nodes = r == 0 ? 1 : rollout_hosts;
    reg.cores_per_node =
        r == 0 ? in.build_cores : per_host * std::max(1, s.receivers.apply_threads);
    double bw = s.network.regions[r].intra.bandwidth_Bps;
    reg.nic_bandwidth = bw > 0 ? bw : kUnlimitedBandwidth;
    reg.nic_latency = s.network.regions[r].intra.latency_s;
    plat.regions.push_back(reg);
  }
  plat.wan_bandwidth = s.network.long_link.bandwidth_Bps > 0 ? s.network.long_link.bandwidth_Bps
                                                             : kUnlimitedBandwidth;
  plat.wan_latency = s.network.long_link.latency_s;
  const ObjectStoreSpec& os = s.transport.object_store;
  plat.store_region = in.extra.store_region;
  plat.store_bandwidth =
      os.sim_link.bandwidth_Bps > 0 ? os.sim_link.bandwidth_Bps : kUnlimitedBandwidth;
  plat.store_latency = os.sim_link.latency_s;
  plat.shared_cpu_cores = in.extra.shared_cpu;
  if (in.extra.shared_cpu > 0 && in.cal.available_cores > 0) {
    plat.shared_cpu_share = std::min(1.0, in.cal.available_cores / in.extra.shared_cpu);
  }
  internal::PlatformSpec check = plat;
  check.object_store = true;
  std::string err = internal::ValidatePlatformSpec(check);
  if (!err.empty()) return InvalidArgumentError(err);
  return plat;
}

// The setup line of the commitment (dcr/commitment.h): what signed delta runs are charged.
void DescribeCommitment(const Scenario& s, const Calibration& cal, ScenarioResult* result) {
  std::string& line = result->setup["commitment"];
  if (!s.network.signing.enabled) {
    line = "none: unsigned deltas carry no commitment (network.signing: false)";
  } else if (!cal.has_commitment()) {
    line =
        "not charged: the calibration has no commitment_bytes_per_s (dcr bench pipeline "
        "--json, dcr bench codec --json)";
  } else {
    line =
        "signed delta runs: SHA-256 Merkle leaves at " + Num(cal.commitment_bytes_per_s) +
        " B/s per core (" + cal.source +
        "); the sender hashes the target on its build threads before the first blob "
        "(outside the refit clock, as dcr run measures it); each receiver, relays "
        "included, hashes the leaves of its storage each chunk completes once the chunk "
        "is applied, on its host's cores (TrustOptions::hash_leaves_early: overlaps the "
        "transfer, competes for the cores), and after the trailer only the leaves no chunk covers "
        "(none in the payload model: every grid cell is a chunk), before its durable "
        "commit; edge relays do not check it; full-checkpoint runs carry none";
    if (s.receivers.device != "cpu") {
      line += "; receivers on " + s.receivers.device +
              " devices download each leaf in pieces to host memory and hash it on the host's "
              "cores (DeviceCommitmentLeavesOf): charged at the host rate, the download "
              "(device-to-host bandwidth, about 10x the per-core hash rate) not charged";
    }
  }
}

// The setup lines every simulated result carries (simulator, calibration, platform).
void DescribeSetup(const Scenario& s, const SimInputs& in, const internal::PlatformSpec& plat,
                   ScenarioResult* result) {
  const Calibration& cal = in.cal;
  const int per_host = std::max(1, s.receivers.per_node);
  result->setup["simulator"] = "SimGrid 3.32, network model " + s.sim.network_model +
                               ", per-stream TCP cap min(window, tcp_gamma)/RTT";
  result->setup["calibration.source"] = cal.source;
  result->setup["calibration.clock"] = in.extra.wall_clock ? "wall" : "cpu";
  result->setup["calibration.memcpy_bytes_per_s"] = Num(cal.memcpy_bytes_per_s);
  result->setup["calibration.json"] = cal.raw;
  result->setup["platform"] =
      "train: 1 sender host (" + std::to_string(in.build_cores) +
      " build cores); rollout: " + std::to_string(plat.regions[1].nodes) + " hosts x " +
      std::to_string(per_host) + " receivers; long link " + Num(plat.wan_bandwidth) + " B/s, " +
      Num(plat.wan_latency) + " s; store " + Num(plat.store_bandwidth) + " B/s, first byte " +
      Num(plat.store_latency) + " s in region " + plat.regions[plat.store_region].name +
      (in.extra.shared_cpu > 0
           ? "; every node computes on one shared " + std::to_string(in.extra.shared_cpu) +
                 "-core CPU (one machine), each core at " + Num(plat.shared_cpu_share) +
                 " of a core (calibration "
                 "available_cores)"
           : "");
  const std::string tcp =
      cal.tcp_send_s_per_byte > 0 || cal.tcp_recv_s_per_byte > 0
          ? "; the plain TCP sockets of every relay-tree endpoint are charged " +
                Num(cal.tcp_send_s_per_byte * 1e9) + " CPU-s per GB sent and " +
                Num(cal.tcp_recv_s_per_byte * 1e9) +
                " CPU-s per GB received (dcr_bench_tls, "
                "plain)"
          : "; plain TCP sockets not charged";
  if (!s.network.tls.enabled) {
    result->setup["tls"] = "off (network.tls: false): relay-tree edges are plain TCP" + tcp;
  } else if (!cal.has_tls) {
    result->setup["tls"] =
        "on (network.tls), not charged: the calibration has no 'tls' block "
        "(dcr_bench_tls --json)";
  } else {
    result->setup["tls"] = "on (network.tls): every relay-tree endpoint is charged " +
                           Num(cal.tls_send_s_per_byte * 1e9) + " CPU-s per GB sent and " +
                           Num(cal.tls_recv_s_per_byte * 1e9) +
                           " CPU-s per GB received (dcr_bench_tls: " + cal.tls_source +
                           ") over plain TCP" + tcp + "; object-store transfers are not charged";
  }
  if (!s.network.signing.enabled) {
    result->setup["signing"] = "off (network.signing: false): unsigned streams";
  } else if (!cal.has_signing) {
    result->setup["signing"] =
        "on (network.signing), not charged: the calibration has no "
        "'signing' block (dcr_bench_sign --json)";
  } else {
    result->setup["signing"] =
        "on (network.signing): delta runs are signed; the sender hashes every chunk record "
        "(SHA-256 at " +
        Num(1 / cal.sha256_s_per_byte) + " B/s per core) and signs one manifest per " +
        Num(cal.chunks_per_manifest) + " chunks (" + Num(cal.sign_s_per_manifest * 1e6) +
        " us each); every receiver hashes every record it applies and verifies every manifest (" +
        Num(cal.verify_s_per_manifest * 1e6) + " us each); the stream is " +
        Num(cal.signed_size_ratio) + "x the unsigned bytes (dcr_bench_sign: " + cal.signing_source +
        "); full checkpoints are signed per slice: the sender reads and "
        "hashes every slice on one thread and emits them in batches of 32 behind their "
        "manifest, every receiver hashes every slice";
  }
  {
    // The hardware the results assume, next to them.
    std::string hw = "sender: 1 host, " + std::to_string(in.build_cores) + " build cores; " +
                     "receivers: " + std::to_string(s.receivers.count) + " on " +
                     std::to_string(plat.regions[1].nodes) + " hosts, " +
                     std::to_string(plat.regions[1].cores_per_node) + " cores per host";
    if (!s.delta.wan_context) {
      hw += "; edge relays: none";
    } else if (in.extra.edge_count == 0) {
      hw += "; edge relays (relay-tree delta runs): the smallest set that keeps up, at most " +
            std::to_string(internal::kMaxEdgeRelays) + " hosts of at most " +
            std::to_string(in.extra.edge_cores) + " cores" +
            (in.extra.edge_memory > 0 ? " and " + Num(in.extra.edge_memory / 1e9) + " GB of base"
                                      : std::string()) +
            " each (chosen per run below)";
    } else {
      hw += "; edge relays (relay-tree delta runs): " + std::to_string(in.extra.edge_count) +
            (in.extra.edge_count == 1 ? " host, " : " hosts, ") +
            std::to_string(in.extra.edge_cores) + " cores each, memory: " +
            (in.extra.edge_count == 1 ? std::string("the whole canonical base")
                                      : "1/" + std::to_string(in.extra.edge_count) +
                                            " of the canonical base each (its chunk range)") +
            " (run.* states its size)";
    }
    if (in.extra.shared_cpu > 0) {
      hw += "; every node on one shared " + std::to_string(in.extra.shared_cpu) + "-core CPU";
    }
    result->setup["hardware"] = hw;
  }
  DescribeCommitment(s, cal, result);
  if (!in.extra.durable) {
    result->setup["durability"] =
        "off (sim.extra.durable: false): receivers without a state "
        "directory, no commit charged";
  } else if (!cal.has_commit()) {
    result->setup["durability"] =
        "durable receivers, commit not charged: the calibration has no "
        "commit_* keys (dcr bench pipeline --json)";
  } else {
    std::string pts;
    for (const internal::CommitPoint& c : cal.commit) {
      pts += (pts.empty() ? "" : ", ") + Num(c.change_rate) + ": " + Num(1 / c.s_per_storage_byte) +
             " B/s (plain write " + Num(c.plain_write_bytes_per_s) + " B/s)";
    }
    result->setup["durability"] =
        "durable receivers (state directory, as dcr run's): each delta commit waits for its "
        "version log (the version's records, trailer and commit marker fsynced; an image every "
        "1024 versions or 1.25 images of log), charged per byte of a receiver's storage at the "
        "commit rate measured at each change rate (" +
        pts + "; " + cal.commit_source +
        "), after the last apply (it adds); the image (the storage written at the plain write "
        "rate) in the one commit that writes it (costs.*); full-checkpoint runs: not charged";
  }
  if (s.steps > 1) {
    result->setup["steps"] =
        "simulated once per run (every step is alike), and once more for the step whose commit "
        "writes the durable receivers' version log image when one falls within the steps "
        "(its RunResult has that step)";
  }
  if (s.receivers.device != "cpu" || s.sender.device != "cpu") {
    result->setup["devices"] = "receivers.device " + s.receivers.device + ", sender.device " +
                               s.sender.device +
                               ": not simulated (build and apply at the calibration's host speeds)";
  }
}

// The payload model of every change rate (the real codec on sampled tensors).
StatusOr<std::map<double, PayloadModel>> MeasurePayloads(const Scenario& s, const SimInputs& in,
                                                         ScenarioResult* result) {
  internal::PayloadModelOptions pmo;
  pmo.sample_elems = static_cast<uint64_t>(std::max(1, s.sim.sample_tensors)) << 17;
  pmo.chunk_elems = s.delta.chunk_elems;
  pmo.zstd_level = s.delta.zstd_level;
  pmo.context_classes = s.delta.context_classes;
  pmo.seed = s.model.seed;
  std::map<double, PayloadModel> payloads;
  for (double rate : s.change_rates) {
    auto pm_start = std::chrono::steady_clock::now();
    auto pm = internal::MeasurePayload(in.cfg, rate, pmo);
    if (!pm.ok()) return pm.status().WithContext("payload model");
    double pm_wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - pm_start).count();
    std::string key = "payload_model." + Num(rate);
    result->setup[key] =
        "lr " + Num(pm->lr) + ", measured change " + Num(pm->measured_rate) + ", delta " +
        Num(pm->delta_bytes) + " B of " + Num(pm->dense_bytes) + " B dense (" +
        Num(pm->dense_bytes / pm->delta_bytes) + "x), " + std::to_string(pm->grid_chunks) +
        " grid chunks; context-coded " + Num(pm->context_delta_bytes) + " B (" +
        Num(pm->dense_bytes / pm->context_delta_bytes) + "x, chunks " +
        Num(pm->ContextChunkRatio()) + " of the plain ones); measured in " + Num(pm_wall) + " s";
    for (const internal::ClassPayload& c : pm->classes) {
      result->setup[key + "." + c.name] =
          std::to_string(c.elements) + " elements in " + std::to_string(c.tensors) +
          " tensors; sample " + std::to_string(c.sample_elems) + ", change " +
          Num(c.measured_rate) + ", " + Num(c.bytes_per_element) + " B/element, " +
          Num(c.context_bytes_per_element) + " context-coded";
    }
    payloads.emplace(rate, std::move(*pm));
  }
  return payloads;
}

// One simulated run: what it simulates and how it was sized.
struct Pending {
  internal::RunSpec spec;
  Sizing z;
  Method method;
  TransportKind kind;
  double rate;
  double payload;
  std::string wan;           // the long link's encoding and the edge relay, when wan_context
  std::string signing;       // the signing cost charged, when signed
  double storage_bytes = 0;  // one receiver's storage (its serving shard of the checkpoint)
  double build_cpu_s = 0;    // CPU seconds of every build job (sender, or edge relay's encode)
  double apply_cpu_s = 0;    // CPU seconds of one receiver's applies (signature checks included)
  double edge_cpu_s = 0;     // CPU seconds of the edge relays' transcoding (0: none)
  double wan_payload = 0;    // bytes the long link carries once
  double durable_apply_cpu_s = 0;  // of apply_cpu_s: what the durable storage adds
  std::string commitment;          // the commitment charged (ChargeCommitment), when charged
  int step = 1;                    // the version this run stands for (RunResult::step)
  // The version log's image (durable delta runs): every image_every versions one commit writes
  // it (0: not charged); image_seconds is what it adds to that commit.
  uint64_t image_every = 0;
  double image_seconds = 0;
  bool image_charged = false;  // this run's commit writes the image
};

// The version log of a durable receiver (core/src/receivers/version_log.h, VersionLogOptions
// defaults): an image is due once 1024 versions are logged since the last one or once the log
// holds 1.25 images; each version appends its records (the payload) and about 0.5% of entry
// framing. `payload`: the records one receiver applies per version; `storage`: its image. Returns
// the number of versions between images (>= 1).
uint64_t VersionsPerImage(double payload, double storage) {
  constexpr uint64_t kImageEveryVersions = 1024;
  constexpr double kLogBudgetImages = 1.25, kEntryFraming = 1.005;
  const double per_version = std::max(1.0, payload * kEntryFraming);
  const double n = std::ceil(kLogBudgetImages * storage / per_version);
  return static_cast<uint64_t>(std::clamp(n, 1.0, static_cast<double>(kImageEveryVersions)));
}

// A signed delta: every chunk grows by the manifest records' share; the sender hashes each chunk
// record and signs its share of the manifests (spread over the cores that build the chunk), each
// receiver hashes each record and verifies its share of the manifests in the chunk's apply (on one
// core). Returns the setup text.
std::string ChargeSigning(const Calibration& cal, const PayloadModel& pm, const Sizing& z,
                          int build_cores, int receivers, internal::RunSpec* spec) {
  const double chunks = static_cast<double>(z.chunks);
  const double manifests_per_chunk = static_cast<double>(std::max<uint64_t>(1, pm.grid_chunks)) /
                                     chunks / std::max(1.0, cal.chunks_per_manifest);
  const int cores_per_chunk = std::max(1, build_cores / std::max(1, z.build_parallel));
  double sender = 0, receiver = 0;
  for (internal::SimBlob& b : spec->blobs) {
    if (b.info.kind != BlobKind::kChunk) continue;
    b.info.size = static_cast<uint64_t>(
        std::llround(static_cast<double>(b.info.size) * cal.signed_size_ratio));
    const double hash = static_cast<double>(b.info.size) * cal.sha256_s_per_byte;
    const double build = hash + manifests_per_chunk * cal.sign_s_per_manifest;
    const double apply = hash + manifests_per_chunk * cal.verify_s_per_manifest;
    b.build_flops += build / cores_per_chunk * internal::kHostFlops;
    b.apply_flops += apply * internal::kHostFlops;
    sender += build;
    receiver += apply;
  }
  return "signing " + Num(sender) + " CPU-s at the sender, " + Num(receiver) +
         " CPU-s per receiver (" + std::to_string(receivers) + " receivers)";
}

// The relay tree's sockets, per byte at each end of an edge: plain TCP (the tls block's plain
// transfer) and, with network.tls, what TLS adds to it (the RunSpec's tls_*_s_per_byte carry
// both: one exec job per piece at each end).
void ChargeSockets(const Scenario& s, const Calibration& cal, internal::RunSpec* spec) {
  if (!cal.has_tls) return;
  const bool tls = s.network.tls.enabled;
  spec->tls_send_s_per_byte = cal.tcp_send_s_per_byte + (tls ? cal.tls_send_s_per_byte : 0);
  spec->tls_recv_s_per_byte = cal.tcp_recv_s_per_byte + (tls ? cal.tls_recv_s_per_byte : 0);
}

// A signed full checkpoint (FullStreamSigner, node/node_trust.h): the sender reads and hashes
// every slice on its one building thread and emits them in batches of 32 behind the manifest
// that lists them (a batch goes out once all of it is hashed); every receiver hashes every slice
// as it arrives, before applying it, and verifies one manifest per 32 slices (in the apply).
// Returns the setup text.
std::string ChargeFullSigning(const Calibration& cal, const Sizing& z, int receivers,
                              internal::RunSpec* spec) {
  constexpr double kSlicesPerManifest = 32;
  const double coarsen = static_cast<double>(std::max<uint64_t>(1, z.coarsen));
  spec->build_parallel = 1;
  spec->build_window = std::max(1, static_cast<int>(std::llround(kSlicesPerManifest / coarsen)));
  const double manifests_per_chunk = coarsen / kSlicesPerManifest;
  double sender = 0, receiver = 0;
  bool first = true;
  for (internal::SimBlob& b : spec->blobs) {
    if (b.info.kind != BlobKind::kChunk) continue;
    const double bytes = static_cast<double>(b.info.size);
    double build = bytes * (cal.sha256_s_per_byte + 1 / cal.memcpy_bytes_per_s) +
                   manifests_per_chunk * cal.sign_s_per_manifest;
    sender += build;
    // A merged chunk of more than one batch goes out batch by batch: only the first batch's
    // hashing holds the stream back (the later ones are hashed while the earlier go out).
    if (first && coarsen > kSlicesPerManifest) build *= kSlicesPerManifest / coarsen;
    first = false;
    // Over the relay tree the slices' hashes are checked as they arrive
    // (RunSpec::recv_hash_s_per_byte); a fetched object is whole when it lands: hashed in the
    // apply, with the manifests' signatures.
    const double apply = manifests_per_chunk * cal.verify_s_per_manifest +
                         (spec->object_store ? bytes * cal.sha256_s_per_byte : 0);
    b.build_flops += build * internal::kHostFlops;
    b.apply_flops += apply * internal::kHostFlops;
    receiver += apply + (spec->object_store ? 0 : bytes * cal.sha256_s_per_byte);
  }
  if (!spec->object_store) spec->recv_hash_s_per_byte = cal.sha256_s_per_byte;
  return "signing " + Num(sender) + " CPU-s at the sender (read + SHA-256 of every slice, " +
         "batches of 32 behind their manifest), " + Num(receiver) + " CPU-s per receiver (" +
         std::to_string(receivers) + " receivers)";
}

// `receivers.verify` (dcr run's default): each receiver compares what it holds (its serving
// shard) with the target file after it commits, on one core (RunSpec::verify_cpu_s).
void ChargeVerify(const Scenario& s, const Calibration& cal, const PayloadModel& pm,
                  internal::RunSpec* spec) {
  if (!s.receivers.verify || cal.verify_bytes_per_s <= 0) return;
  const double tp = s.serving.enabled && s.serving.tp > 1 ? s.serving.tp : 1;
  spec->verify_cpu_s = pm.dense_bytes / tp / cal.verify_bytes_per_s;
}

// A signed delta's commitment (dcr/commitment.h), as the real nodes compute it: the sender over
// the target's tensor bytes on its build threads before the first blob (SenderBuilder's signing
// options); every receiver (relays of the tree and store downloaders alike) over its storage's
// tensor bytes (its serving shard) leaf by leaf as the chunks complete them (TrustedReceiver,
// TrustOptions::hash_leaves_early): each chunk's share is a job started when its apply is done,
// on up to every core of the host (the receiver's hashing pool), competing with the applies, TLS
// and relaying of every node on the host while the transfer goes on. The commit waits for those
// jobs; after the trailer only the leaves no chunk covers are left (TrustedReceiver::Commit, on
// every core of the host): none here, since the payload model emits a chunk for every grid
// cell. Returns the text of the costs line ("" when not charged).
std::string ChargeCommitment(const Scenario& s, const SimInputs& in,
                             const internal::PlatformSpec& plat, const PayloadModel& pm,
                             internal::RunSpec* spec) {
  const Calibration& cal = in.cal;
  if (!s.network.signing.enabled || !cal.has_commitment()) return "";
  const double tp = s.serving.enabled && s.serving.tp > 1 ? s.serving.tp : 1;
  const double per_core = cal.commitment_bytes_per_s;
  const double total = pm.dense_bytes / tp / per_core;
  double chunks = 0;
  for (const internal::SimBlob& b : spec->blobs) chunks += b.info.kind == BlobKind::kChunk ? 1 : 0;
  if (chunks > 0) {
    for (internal::SimBlob& b : spec->blobs) {
      if (b.info.kind == BlobKind::kChunk) b.hash_flops = total / chunks * internal::kHostFlops;
    }
    spec->commitment_cpu_s = 0;
  } else {
    spec->commitment_cpu_s = total;
  }
  spec->commitment_threads =
      in.extra.shared_cpu > 0 ? in.extra.shared_cpu : plat.regions[1].cores_per_node;
  spec->sender_commitment_cpu_s = pm.dense_bytes / per_core;
  spec->sender_commitment_threads = s.delta.threads > 0 ? s.delta.threads : in.build_cores;
  return "commitment " + Num(total) + " CPU-s per receiver (" + Num(pm.dense_bytes / tp) +
         " B at " + Num(per_core) + " B/s per core), each chunk's leaves hashed once it is " +
         "applied on up to " + std::to_string(spec->commitment_threads) +
         " cores of its host (overlaps the transfer, competes for the cores), " +
         Num(spec->commitment_cpu_s) +
         " CPU-s after the trailer (leaves no chunk covers), before its durable commit; "
         "sender commitment " +
         Num(spec->sender_commitment_cpu_s) + " CPU-s on up to " +
         std::to_string(spec->sender_commitment_threads) +
         " cores before the first blob: outside the refit clock";
}

// wan_context on a relay-tree delta run: the context-coded stream on the long link to the edge
// relays (if they keep up, ChooseWanEncoding of dcr/wan_choice.h; else the run stays plain).
// sim.extra.edge_relays > 1 splits the base and the transcoding by chunk range over that many
// edge relays; `auto` takes the smallest set that keeps up (ChooseEdgeSplit, dcr/edge_split.h).
// Returns the setup text.
std::string PlanEdgeRelay(const SimInputs& in, const internal::PlatformSpec& plat,
                          const PayloadModel& pm, double rate, double build_Bps,
                          internal::RunSpec* spec) {
  const Calibration& cal = in.cal;
  // The context chunks' size against the plain ones, both measured on the payload model's samples.
  const double ratio = pm.ContextChunkRatio();
  const double transcode_Bps = cal.ContextTranscodeBytesPerS(rate);
  const double ctx_encode_Bps = cal.ContextEncodeBytesPerS(rate);
  std::vector<internal::SimBlob> wan = spec->blobs;
  const double chunks = static_cast<double>(wan.size() - 2);
  double context_payload = 0;
  for (internal::SimBlob& b : wan) {
    if (b.info.kind == BlobKind::kChunk) {
      b.info.size = static_cast<uint64_t>(std::llround(static_cast<double>(b.info.size) * ratio));
      b.build_flops = b.build_flops * build_Bps / ctx_encode_Bps;
    }
    context_payload += static_cast<double>(b.info.size);
  }
  std::string text = "context form " + Num(context_payload) + " B (" + Num(ratio) +
                     " of the plain chunks, measured by the payload model), encode " +
                     Num(ctx_encode_Bps) + " B/s per core; ";
  // How many edge relays, and their cores.
  int count = in.extra.edge_count, cores = in.extra.edge_cores;
  if (count == 0) {
    const EdgeSplitChoice split =
        ChooseEdgeSplit(plat.wan_bandwidth, pm.dense_bytes, context_payload, transcode_Bps,
                        internal::kMaxEdgeRelays, in.extra.edge_cores, in.extra.edge_memory);
    if (!split.context) {
      return text + "no set of at most " + std::to_string(internal::kMaxEdgeRelays) +
             " edge relays of " + std::to_string(in.extra.edge_cores) + " cores" +
             (in.extra.edge_memory > 0
                  ? " and " + Num(in.extra.edge_memory / 1e9) + " GB of base each"
                  : std::string()) +
             " at " + Num(transcode_Bps) + " B/s per core keeps up with the link (" +
             Num(split.link_dense_Bps) + " dense B/s each): the long link carries the plain form";
    }
    count = split.count;
    cores = split.cores;
    text += "smallest set that keeps up (sim.extra.edge_relays: auto, at most " +
            std::to_string(in.extra.edge_cores) + " cores" +
            (in.extra.edge_memory > 0 ? " and " + Num(in.extra.edge_memory / 1e9) + " GB of base"
                                      : std::string()) +
            " each): ";
  }
  if (static_cast<double>(count) > chunks) {
    return text + std::to_string(count) + " edge relays for " + Num(chunks) +
           " simulated chunks: one range each is impossible, the long link carries the plain form";
  }
  // A merged chunk stands for `cells` grid cells that an edge relay transcodes on its cores as
  // they arrive: it is transcoded by min(cells, cores) cores at once (as the sender builds it), so
  // the throughput and the time to transcode the last one stay those of the real grid.
  const double cells = static_cast<double>(std::max<uint64_t>(1, pm.grid_chunks)) / chunks;
  const int cores_per_chunk =
      std::max(1, static_cast<int>(std::min<double>(std::floor(cells), cores)));
  const int edge_parallel = std::max(1, cores / cores_per_chunk);
  for (internal::SimBlob& b : wan) {
    if (b.info.kind == BlobKind::kChunk) {
      b.apply_flops =
          internal::ComputeFlops(pm.dense_bytes / chunks / cores_per_chunk, transcode_Bps);
    }
  }
  // Each edge relay receives its range at its share of the link (ranges produced interleaved).
  const WanChoice choice =
      ChooseWanEncoding(plat.wan_bandwidth / count, pm.dense_bytes, context_payload,
                        edge_parallel * cores_per_chunk, transcode_Bps);
  text +=
      std::to_string(count) + (count == 1 ? " edge relay" : " edge relays") + " in region " +
      plat.regions[1].name + ", " + std::to_string(cores) + " cores each, holding " +
      (count == 1
           ? std::string("the canonical base (")
           : "its chunk range's share of the canonical base (1/" + std::to_string(count) + ": ") +
      Num(pm.dense_bytes / count / 1e9) +
      " GB in memory) and transcoding (context decode + "
      "apply + plain re-encode) at " +
      Num(transcode_Bps) + " B/s per core (" + std::to_string(edge_parallel) + " x " +
      std::to_string(cores_per_chunk) + " cores per merged chunk): " + Num(choice.edge_dense_Bps) +
      " dense B/s against the " + Num(choice.link_dense_Bps) + " the link delivers" +
      (count == 1 ? std::string() : " to its range (chunks produced interleaved by range)");
  if (!choice.context) return text + ": it would lag, the long link carries the plain form";
  if (count > 1) {
    const uint64_t per_chunk = static_cast<uint64_t>(pm.dense_bytes / chunks);
    auto ranges =
        SplitChunkRanges(std::vector<uint64_t>(static_cast<size_t>(chunks), per_chunk), count);
    if (!ranges.ok()) return text + ": " + ranges.status().message() + ", plain form";
    const std::vector<uint64_t> order = InterleavedChunkOrder(*ranges);
    spec->edge_range_of.assign(wan.size(), 0);
    for (size_t j = 0; j < order.size(); ++j) {
      spec->edge_range_of[j + 1] = EdgeRangeOf(*ranges, order[j]);
    }
  }
  spec->edge_relay = true;
  spec->platform.edge_cores = cores;
  spec->platform.edge_count = count;
  spec->edge_parallel = edge_parallel;
  spec->wan_blobs = std::move(wan);
  return text + ": it keeps up, the long link carries the context form";
}

// Every (rate x transport x method) run of the scenario, sized and planned.
std::vector<Pending> PlanRuns(const Scenario& s, const SimInputs& in,
                              const internal::PlatformSpec& plat,
                              const std::map<double, PayloadModel>& payloads) {
  std::vector<Pending> pending;
  const Calibration& cal = in.cal;
  for (double rate : s.change_rates) {
    const PayloadModel& pm = payloads.at(rate);
    for (TransportKind kind : s.transport.kinds) {
      for (Method method : s.methods) {
        bool delta = method == Method::kDelta;
        double trailer = 64.0 + 40.0 * static_cast<double>(pm.grid_chunks);
        double payload = delta ? pm.delta_bytes : pm.dense_bytes + pm.header_bytes + trailer;
        double build_Bps = delta ? cal.EncodeBytesPerS(rate) : 0;
        double apply_Bps = delta ? cal.DecodeApplyBytesPerS(rate) : cal.memcpy_bytes_per_s;
        // A receiver applies its serving shard: 1 / serving.tp of the checkpoint's bytes.
        if (s.serving.enabled && s.serving.tp > 1) apply_Bps *= s.serving.tp;
        Sizing z = internal::SizeRun(s, in.extra, payload, pm.header_bytes, trailer, pm.dense_bytes,
                                     pm.grid_chunks, build_Bps, apply_Bps, in.build_cores,
                                     s.delta.threads > 0 ? s.delta.threads : in.build_cores);
        internal::RunSpec spec =
            internal::PlanRun(s, plat, in.topo, z, kind, payload, cal.memcpy_bytes_per_s);
        if (kind == TransportKind::kRelayTree) ChargeSockets(s, cal, &spec);
        std::string signing;
        if (s.network.signing.enabled && cal.has_signing && delta) {
          signing = ChargeSigning(cal, pm, z, in.build_cores, s.receivers.count, &spec);
        } else if (s.network.signing.enabled && cal.has_signing) {
          signing = ChargeFullSigning(cal, z, s.receivers.count, &spec);
        }
        std::string wan;
        if (s.delta.wan_context && delta && kind == TransportKind::kRelayTree) {
          wan = PlanEdgeRelay(in, plat, pm, rate, build_Bps, &spec);
        }
        // A receiver's storage: its serving shard of the base's files (dense + header).
        const double storage = (pm.dense_bytes + pm.header_bytes) /
                               (s.serving.enabled && s.serving.tp > 1 ? s.serving.tp : 1);
        double durable_cpu = 0;
        if (delta && in.extra.durable && cal.has_commit()) {
          spec.commit_seconds = cal.CommitSPerStorageByte(rate) * storage;
          // The durable apply's own CPU (write faults, writeback started per chunk), spread over
          // the chunks as their share of the storage.
          durable_cpu = cal.DurableApplyCpuSPerStorageByte(rate) * storage;
          const double chunks = static_cast<double>(std::max<uint64_t>(1, z.chunks));
          for (internal::SimBlob& b : spec.blobs) {
            if (b.info.kind == BlobKind::kChunk) {
              b.apply_flops += durable_cpu / chunks * internal::kHostFlops;
            }
          }
        }
        std::string commitment;
        if (delta) commitment = ChargeCommitment(s, in, plat, pm, &spec);
        ChargeVerify(s, cal, pm, &spec);
        Pending p{std::move(spec), std::move(z), method, kind, rate, payload, wan, signing};
        p.commitment = std::move(commitment);
        p.storage_bytes = storage;
        p.durable_apply_cpu_s = durable_cpu;
        const auto& blobs = p.spec.edge_relay ? p.spec.wan_blobs : p.spec.blobs;
        // A delta chunk's build runs on build_cores / build_parallel cores; a full slice's
        // hashing on the one reading thread.
        const int build_cores_per_chunk =
            delta ? std::max(1, in.build_cores / std::max(1, p.z.build_parallel)) : 1;
        for (const internal::SimBlob& b : blobs) {
          p.build_cpu_s += b.build_flops / internal::kHostFlops * build_cores_per_chunk;
          p.wan_payload += static_cast<double>(b.info.size);
        }
        for (const internal::SimBlob& b : p.spec.blobs) {
          p.apply_cpu_s += b.apply_flops / internal::kHostFlops;
        }
        if (p.spec.edge_relay) {
          const int per_chunk =
              std::max(1, p.spec.platform.edge_cores / std::max(1, p.spec.edge_parallel));
          for (const internal::SimBlob& b : p.spec.wan_blobs) {
            if (b.info.kind == BlobKind::kChunk) {
              p.edge_cpu_s += b.apply_flops / internal::kHostFlops * per_chunk;
            }
          }
        }
        if (delta && in.extra.durable && cal.has_commit() && cal.PlainWriteBytesPerS(rate) > 0) {
          // The image: written (temporary, fsync, rename) in the one commit that makes it due, at
          // the plain write + fdatasync rate of the same bench; every other commit appends only.
          // A receiver logs the records it applies: its serving shard's share of the payload.
          p.image_every =
              VersionsPerImage(payload * storage / (pm.dense_bytes + pm.header_bytes), storage);
          p.image_seconds = storage / cal.PlainWriteBytesPerS(rate);
          if (p.image_every == 1) {
            p.spec.commit_seconds += p.image_seconds;
            p.image_charged = true;
          } else if (p.image_every <= static_cast<uint64_t>(std::max(1, s.steps))) {
            Pending with_image = p;
            with_image.step = static_cast<int>(p.image_every);
            with_image.spec.commit_seconds += p.image_seconds;
            with_image.image_charged = true;
            pending.push_back(std::move(p));
            pending.push_back(std::move(with_image));
            continue;
          }
        }
        pending.push_back(std::move(p));
      }
    }
  }
  return pending;
}

// The costs line's commitment part: what was charged, or why nothing was.
std::string CommitmentCost(const Scenario& s, const Pending& pr,
                           const internal::RunOutcome& outcome) {
  if (!pr.commitment.empty()) {
    return pr.commitment + " (the sender was ready " + Num(outcome.sender_ready) + " s in)";
  }
  if (pr.method != Method::kDelta) {
    return "commitment: none (a full checkpoint's signed manifests sign its slices)";
  }
  if (!s.network.signing.enabled) return "commitment: none (unsigned delta)";
  return "commitment not charged: the calibration has no commitment_bytes_per_s (dcr bench "
         "pipeline --json)";
}

// The RunResult of one simulated run.
RunResult CollectRun(const Scenario& s, const internal::PlatformSpec& plat, const Pending& pr,
                     const PayloadModel& pm, const internal::RunOutcome& outcome,
                     ScenarioResult* result) {
  const int per_host = std::max(1, s.receivers.per_node);
  const Sizing& z = pr.z;
  RunResult rr;
  rr.method = pr.method;
  rr.transport = pr.kind;
  rr.change_rate = pm.measured_rate;
  rr.configured_change_rate = pr.rate;
  rr.step = pr.step;
  rr.refit_seconds = outcome.refit_seconds;
  rr.wire_bytes = static_cast<uint64_t>(std::llround(outcome.wire_bytes));
  rr.payload_bytes = static_cast<uint64_t>(std::llround(pr.payload));
  rr.dense_bytes = static_cast<uint64_t>(std::llround(pm.dense_bytes));
  rr.receivers = s.receivers.count;
  rr.phases.build_s = std::max(0.0, outcome.last_built - outcome.first_built);
  rr.phases.commit_s = outcome.refit_seconds;
  double last_commit = 0, apply_sum = 0;
  for (size_t i = 0; i < outcome.receivers.size(); ++i) {
    const internal::NodeOutcome& n = outcome.receivers[i];
    ReceiverResult rcv;
    rcv.node = static_cast<int>(i) + 1;
    rcv.host = plat.regions[1].name + "-" + std::to_string(static_cast<int>(i) / per_host);
    rcv.committed = n.committed;
    rcv.verified = n.committed && n.complete;
    rcv.verify_message = rcv.verified ? "simulated: every blob applied once, committed"
                                      : (n.error.empty() ? "not committed" : n.error);
    rcv.commit_at_s = n.commit_at - outcome.first_built;
    rcv.bytes_received = n.bytes_received;
    if (rcv.verified) ++rr.receivers_verified;
    last_commit = std::max(last_commit, rcv.commit_at_s);
    rr.receiver_results.push_back(rcv);
  }
  for (const internal::SimBlob& b : z.blobs) apply_sum += b.apply_flops / internal::kHostFlops;
  rr.phases.apply_s = apply_sum;
  rr.phases.transfer_s = last_commit;
  rr.links.push_back({"long", rr.wire_bytes});
  if (pr.spec.object_store) {
    rr.links.push_back({"store_put", static_cast<uint64_t>(std::llround(outcome.store_put_bytes))});
    rr.links.push_back({"store_get", static_cast<uint64_t>(std::llround(outcome.store_get_bytes))});
  }
  rr.error = outcome.error;
  const std::string step_key = pr.step > 1 ? ".step" + std::to_string(pr.step) : "";
  std::string run_key = std::string("run.") + MethodName(pr.method) + "." +
                        TransportKindName(pr.kind) + "." + Num(pr.rate) + step_key;
  result->setup[run_key] =
      "simulated " + Num(outcome.sim_clock) + " s, " + std::to_string(outcome.comms) +
      " messages; " + std::to_string(z.chunks) + " chunks (grid " + std::to_string(pm.grid_chunks) +
      "), piece " + std::to_string(z.piece) + " B, window " + std::to_string(z.window) +
      " B (coarsened x" + std::to_string(z.coarsen) + "), builder window " +
      std::to_string(pr.spec.build_window) + " chunks" +
      (pr.spec.tls_send_s_per_byte > 0 || pr.spec.tls_recv_s_per_byte > 0
           ? "; sockets (" + std::string(s.network.tls.enabled ? "TCP + TLS" : "TCP") + ") " +
                 Num(outcome.tls_cpu_seconds) + " CPU-s on all endpoints"
           : "") +
      (pr.signing.empty() ? "" : "; " + pr.signing) +
      (pr.wan.empty() ? "" : "; long link: " + pr.wan) +
      (pr.spec.edge_relay
           ? "; edge lag bound " + std::to_string(pr.spec.edge_lag_bytes) +
                 " B: switched to the plain form " + std::to_string(outcome.edge_switches) +
                 " times (" + std::to_string(outcome.edge_plain_chunks) + " chunks plain)"
           : "");
  // What each cost amounts to on its own (CPU costs in CPU-seconds, spread over the cores that
  // pay them; the refit is shorter than their sum where they overlap the transfer).
  const std::string costs_key = std::string("costs.") + MethodName(pr.method) + "." +
                                TransportKindName(pr.kind) + "." + Num(pr.rate) + step_key;
  std::string costs = "refit " + Num(rr.refit_seconds) + " s; long link alone " +
                      Num(pr.wan_payload / plat.wan_bandwidth) + " s (" + Num(pr.wan_payload) +
                      " B)";
  if (pr.build_cpu_s > 0) costs += "; build " + Num(pr.build_cpu_s) + " CPU-s at the sender";
  if (pr.edge_cpu_s > 0) costs += "; edge transcoding " + Num(pr.edge_cpu_s) + " CPU-s";
  costs += "; apply " + Num(pr.apply_cpu_s) + " CPU-s per receiver";
  if (pr.durable_apply_cpu_s > 0) {
    costs += " (" + Num(pr.durable_apply_cpu_s) + " of it for the durable storage)";
  }
  if (outcome.tls_cpu_seconds > 0) {
    costs += "; sockets (" + std::string(s.network.tls.enabled ? "TCP + TLS" : "TCP") + ") " +
             Num(outcome.tls_cpu_seconds) + " CPU-s";
  }
  if (!pr.signing.empty()) costs += " (signing in build and apply)";
  costs += pr.spec.commit_seconds > 0
               ? "; durable commit " + Num(pr.spec.commit_seconds) + " s per receiver (" +
                     Num(pr.storage_bytes) + " B of storage), after its last apply: adds"
               : "; durable commit not charged";
  if (pr.image_every > 0) {
    const std::string image =
        Num(pr.image_seconds) + " s (" + Num(pr.storage_bytes) + " B written and fsynced)";
    if (pr.image_every == 1) {
      costs += "; version log image every version: " + image + " in each commit";
    } else if (pr.image_charged) {
      costs += "; this is version " + std::to_string(pr.step) + ", whose commit writes the " +
               "version log's image (every " + std::to_string(pr.image_every) +
               " versions): " + image + " in its commit";
    } else {
      costs +=
          "; version log image every " + std::to_string(pr.image_every) +
          " versions, not in this version's commit (" + image + " in the one that writes " + "it" +
          (pr.image_every <= static_cast<uint64_t>(std::max(1, s.steps))
               ? ": run step " + std::to_string(pr.image_every) + ")"
               : ", beyond the scenario's " + std::to_string(std::max(1, s.steps)) + " steps)");
    }
  }
  costs += "; " + CommitmentCost(s, pr, outcome);
  costs += pr.spec.verify_cpu_s > 0
               ? "; verify " + Num(pr.spec.verify_cpu_s) +
                     " CPU-s per receiver after its commit (competes, does not add)"
               : std::string(s.receivers.verify ? "; verify not charged: the calibration has no "
                                                  "verify_bytes_per_s"
                                                : "; verify: off (receivers.verify: false)");
  result->setup[costs_key] = costs;
  return rr;
}

}  // namespace

StatusOr<ScenarioResult> Simulate(const Scenario& s, const SimOptions& options) {
  // Wall time and message count are reported (setup "wall_seconds", "messages"), never used.
  const auto wall_start = std::chrono::steady_clock::now();
  DCR_ASSIGN_OR_RETURN(SimInputs in, LoadInputs(s, options));
  DCR_ASSIGN_OR_RETURN(internal::PlatformSpec plat, MakePlatform(s, in));
  ScenarioResult result;
  result.scenario = s.name;
  result.mode = RunMode::kSim;
  result.model = in.cfg.name;
  DescribeSetup(s, in, plat, &result);
  DCR_ASSIGN_OR_RETURN(auto payloads, MeasurePayloads(s, in, &result));
  result.model_bytes = static_cast<uint64_t>(payloads.begin()->second.dense_bytes);

  std::vector<Pending> pending = PlanRuns(s, in, plat, payloads);
  // The edge relays each run was planned with, next to the hardware the results assume.
  for (const Pending& p : pending) {
    if (!p.spec.edge_relay) continue;
    const int count = std::max(1, p.spec.platform.edge_count);
    result.setup["hardware"] +=
        "; edge relays of run." + std::string(MethodName(p.method)) + "." +
        TransportKindName(p.kind) + "." + Num(p.rate) + ": " + std::to_string(count) +
        (count == 1 ? " host of " : " hosts of ") + std::to_string(p.spec.platform.edge_cores) +
        " cores, " + Num(payloads.at(p.rate).dense_bytes / count / 1e9) + " GB of the base each";
  }
  auto t0 = std::chrono::steady_clock::now();
  std::vector<internal::RunSpec> specs;
  for (const Pending& p : pending) specs.push_back(p.spec);
  auto outcomes = internal::RunForkedAll(specs, 0);
  if (!outcomes.ok()) return outcomes.status();
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  result.setup["simulation_wall_seconds"] = Num(wall) + " (runs in parallel child processes)";
  uint64_t messages = 0;
  for (const internal::RunOutcome& o : *outcomes) messages += o.comms;
  result.setup["messages"] = std::to_string(messages) + " simulated messages in " +
                             std::to_string(outcomes->size()) + " runs";
  result.setup["wall_seconds"] =
      Num(std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count()) +
      " (payload model + simulation, this machine)";
  for (size_t pi = 0; pi < pending.size(); ++pi) {
    const Pending& pr = pending[pi];
    const internal::RunOutcome& outcome = (*outcomes)[pi];
    RunResult rr = CollectRun(s, plat, pr, payloads.at(pr.rate), outcome, &result);
    if (options.progress) {
      std::fprintf(stderr,
                   "dcr sim: %s %s %s rate %g: refit %.2f s (%d/%d verified), "
                   "%llu messages\n",
                   s.name.c_str(), MethodName(pr.method), TransportKindName(pr.kind), pr.rate,
                   rr.refit_seconds, rr.receivers_verified, rr.receivers,
                   static_cast<unsigned long long>(outcome.comms));
    }
    result.runs.push_back(std::move(rr));
  }
  return result;
}

}  // namespace dcr::sim
