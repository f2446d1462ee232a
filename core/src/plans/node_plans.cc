// Node plans (node_plans.h).
#include "node_plans.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <set>
#include <string>

#include "dcr/checkpoint.h"
#include "dcr/delta.h"
#include "dcr/device.h"
#include "dcr/edge_split.h"
#include "dcr/hash.h"
#include "dcr/relay_policy.h"
#include "dcr/signing.h"
#include "dcr/status_macros.h"
#include "node/state_dir.h"
#include "transport/net.h"
#include "transport/tls.h"

namespace dcr {

namespace {

// Listening addresses of `n` relay nodes: network.hosts, else loopback ports (network.base_port +
// rank, or free ports).
StatusOr<std::vector<std::string>> NodeAddresses(const Scenario& s, int n) {
  if (!s.network.hosts.empty()) return s.network.hosts;
  std::vector<std::string> addresses;
  for (int r = 0; r < n; ++r) {
    int port = 0;
    if (s.network.base_port > 0) {
      port = s.network.base_port + r;
    } else {
      // The kernel may hand a port it just gave out again (each probe closes its socket): a
      // repeat would put two nodes on one address.
      for (int tries = 0;; ++tries) {
        DCR_ASSIGN_OR_RETURN(port, internal::FreePort());
        const std::string a = "127.0.0.1:" + std::to_string(port);
        if (std::find(addresses.begin(), addresses.end(), a) == addresses.end() || tries > 100)
          break;
      }
    }
    addresses.push_back("127.0.0.1:" + std::to_string(port));
  }
  return addresses;
}

// The object store URL of the scenario (a directory under `work_dir` by default).
std::string StoreUrl(const Scenario& s, const std::string& work_dir) {
  const auto& os = s.transport.object_store;
  if (os.kind == StoreKind::kDir) return "dir:" + (os.path.empty() ? work_dir + "/store" : os.path);
  std::string store = "s3://" + os.bucket + "?endpoint=" + os.endpoint + "&region=" + os.region +
                      "&create_bucket=1";
  if (!os.credentials_file.empty()) store += "&credentials_file=" + os.credentials_file;
  if (!os.ca_file.empty()) store += "&ca_file=" + os.ca_file;
  if (os.allow_http) store += "&allow_http=1";
  if (os.read_deadline_s != 30) {
    char d[32];
    std::snprintf(d, sizeof(d), "%g", os.read_deadline_s);
    store += std::string("&read_deadline_s=") + d;
  }
  return store;
}

// The device index of receiver rank `r`: its local index's entry of receivers.devices for cuda;
// the host backend has the one device 0.
int ReceiverDeviceIndex(const Scenario& s, int r) {
  return ReceiverDevice(s, r) == "cuda" ? DeviceIndexFor(s, ReceiverLocalIndex(s, r)) : 0;
}

// ProbeDevice of device `name` number `index`, the error prefixed with `what`.
Status Probe(const std::string& name, int index, const std::string& what) {
  auto kind = ParseDeviceKind(name);
  if (!kind.ok()) return kind.status().WithContext(what);
  if (*kind == DeviceKind::kCpu) return Status();
  Status st = ProbeDevice(*kind, index);
  if (st.ok()) return st;
  return st.WithContext(what + " (device " + name + ":" + std::to_string(index) + ")");
}

}  // namespace

Status ProbeScenarioDevices(const Scenario& s) {
  // Only a delta's build uses the sender's device.
  if (std::find(s.methods.begin(), s.methods.end(), Method::kDelta) != s.methods.end()) {
    DCR_RETURN_IF_ERROR(Probe(s.sender.device, 0, "sender.device"));
  }
  std::set<int> probed;
  for (int r = 1; r <= s.receivers.count; ++r) {
    const int index = ReceiverDeviceIndex(s, r);
    const std::string& device = ReceiverDevice(s, r);
    if (device != "cpu" && !probed.insert(index).second) continue;
    DCR_RETURN_IF_ERROR(Probe(device, index, "receivers.device of receiver " + std::to_string(r)));
  }
  return Status();
}

Status ProbePlanDevice(const NodePlan& plan) {
  if (plan.rank == 0 && plan.method != "delta") return Status();  // the full stream uses none
  return Probe(plan.device, plan.device_index,
               plan.rank == 0 ? std::string("sender") : "receiver " + std::to_string(plan.rank));
}

StatusOr<std::vector<NodePlan>> MakePlans(const Scenario& s, Method method, TransportKind transport,
                                          const std::string& base, const std::string& target,
                                          const std::string& run_dir, const std::string& work_dir,
                                          const std::string& store_prefix) {
  const int n = s.receivers.count + 1;
  DCR_ASSIGN_OR_RETURN(Topology topo, TopologyFor(s));
  const std::vector<int> parents = topo.parent;
  std::vector<std::string> addresses;
  if (transport == TransportKind::kRelayTree) {
    DCR_ASSIGN_OR_RETURN(addresses, NodeAddresses(s, n));
  }
  const std::string store =
      transport == TransportKind::kObjectStore ? StoreUrl(s, work_dir) : std::string();
  // The run id: a hash of what names this refit's objects and nodes, so that every node of a
  // multi-host run (each making the plans from the same scenario and prefix) gets the same one.
  std::string ids = std::string(TransportKindName(transport)) + '\n' + store_prefix + '\n' + store;
  for (const std::string& a : addresses) ids += '\n' + a;
  const uint64_t run_id = BytesHash128(ids.data(), ids.size()).lo;
  // Edge relays split by chunk range: the ranges of the base's chunk grid (the grid is the
  // same for every version of the model).
  std::vector<EdgeRange> edge_ranges;
  const RelayTreeSpec& split_rt = s.transport.relay_tree;
  if (transport == TransportKind::kRelayTree && split_rt.edge_split && method == Method::kDelta) {
    auto ck = Checkpoint::Open(base);
    if (!ck.ok()) return ck.status().WithContext("transport.relay_tree.edge_split: the base");
    DeltaOptions grid_options;
    grid_options.chunk_elems = s.delta.chunk_elems;
    std::vector<uint64_t> dense;
    for (const GridCell& c : BuildGrid(Inventory::FromCheckpoint(**ck), grid_options)) {
      if (dense.size() <= c.chunk_id) dense.resize(c.chunk_id + 1, 0);
      dense[c.chunk_id] = c.num_elements * c.width;
    }
    auto ranges = SplitChunkRanges(dense, static_cast<int>(split_rt.edge_relays.size()));
    if (!ranges.ok()) return ranges.status().WithContext("transport.relay_tree.edge_split");
    edge_ranges = std::move(*ranges);
  }
  std::vector<NodePlan> plans;
  for (int r = 0; r < n; ++r) {
    NodePlan p;
    p.rank = r;
    p.run_id = run_id;
    p.transport = TransportKindName(transport);
    p.method = MethodName(method);
    p.parents = parents;
    p.addresses = addresses;
    p.relay = RelayOptionsFor(s, store_prefix);
    if (s.network.metrics_port > 0) {
      std::string host = "127.0.0.1";
      if (r < static_cast<int>(s.network.hosts.size())) {
        const std::string& a = s.network.hosts[r];
        host = a.substr(0, a.rfind(':'));
      }
      const int port = s.network.metrics_port + r;
      if (port > 65535) {
        return InvalidArgumentError("network.metrics_port: port " + std::to_string(port) +
                                    " of node " + std::to_string(r) + " is above 65535");
      }
      p.metrics_address = host + ":" + std::to_string(port);
    }
    if (s.retention.enabled) {
      p.retain_versions = s.retention.keep_versions;
      p.retain_budget_bytes = s.retention.budget_bytes;
    }
    p.heartbeat_interval_s = s.network.heartbeat_interval_s;
    p.read_deadline_s = ReadDeadlineFor(s);
    p.receiver_deadline_s = s.receivers.deadline_s;
    p.emulate_wan = s.network.emulation == WanEmulation::kTransport;
    p.long_bandwidth_Bps = s.network.long_link.bandwidth_Bps;
    p.long_latency_s = s.network.long_link.latency_s;
    p.store = store;
    p.base_path = base;
    p.target_path = target;
    p.chunk_elems = s.delta.chunk_elems;
    p.zstd_level = s.delta.zstd_level;
    p.context_coding = s.delta.wan_context;
    p.context_classes = s.delta.context_classes;
    if (transport == TransportKind::kRelayTree) {
      const RelayTreeSpec& rt = s.transport.relay_tree;
      p.edge_relays = rt.edge_relays;
      for (size_t k = 0; k < edge_ranges.size(); ++k) {
        if (rt.edge_relays[k] != r) continue;
        p.edge_range_first = edge_ranges[k].first;
        p.edge_range_end = edge_ranges[k].end;
      }
      if (!rt.edge_relays.empty()) {
        p.edge_lag_bytes = EdgeLagBytesFor(s, rt.window);
      }
    }
    p.build_threads = s.delta.threads;
    p.full_slice_bytes = s.delta.chunk_elems * 2;
    p.device = r == 0 ? s.sender.device : ReceiverDevice(s, r);
    p.device_index = r == 0 ? 0 : ReceiverDeviceIndex(s, r);
    p.receiver_base_path = base;
    p.verify_path = s.receivers.verify ? target : "";
    p.timeout_s = s.timeout_s;
    p.result_path = run_dir + "/node-" + std::to_string(r) + ".json";
    p.ready_path = run_dir + "/ready-" + std::to_string(r);
    p.go_path = run_dir + "/go";
    plans.push_back(std::move(p));
  }
  return plans;
}

namespace {

std::string WithRank(std::string path, int rank) {
  const std::string token = "{rank}";
  for (size_t at; (at = path.find(token)) != std::string::npos;) {
    path.replace(at, token.size(), std::to_string(rank));
  }
  return path;
}

}  // namespace

Status SetDeployment(const std::string& id, std::vector<NodePlan>* plans) {
  DCR_ASSIGN_OR_RETURN(const uint64_t run_id, internal::RunIdValue(id));
  for (NodePlan& p : *plans) p.run_id = run_id;
  return Status();
}

namespace {

// The deployment id in the file "deployment" of directory `dir` ("" when there is none).
StatusOr<std::string> DeploymentFile(const std::string& dir) {
  const std::string path = dir + "/deployment";
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    if (errno == ENOENT) return std::string();
    return ErrnoError("deployment id " + path, errno);
  }
  char buf[64] = {};
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  std::string id(buf, n);
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  auto v = internal::RunIdValue(id);
  if (!v.ok()) return v.status().WithContext(path);
  return id;
}

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

StatusOr<std::string> ScenarioDeployment(const Scenario& s, int rank) {
  std::string from_cert, from_file, file_dir;
  if (!s.network.tls.ca.empty() && !s.network.tls.cert.empty()) {
    const std::string cert = WithRank(s.network.tls.cert, rank);
    DCR_ASSIGN_OR_RETURN(from_cert, internal::CertificateRunId(cert));
    if (!internal::RunIdValue(from_cert).ok()) {
      return FailedPreconditionError(
          "TLS certificate " + cert + " names run '" + from_cert +
          "', not a deployment id of 16 hex digits: make the deployment's credentials again "
          "with `dcr keys`");
    }
  }
  const SigningSpec& g = s.network.signing;
  const std::string trust = !g.trust.empty() ? g.trust : g.key;
  if (g.enabled && !trust.empty()) {
    file_dir = DirOf(trust);
    DCR_ASSIGN_OR_RETURN(from_file, DeploymentFile(file_dir));
    if (from_file.empty() && from_cert.empty()) {
      return FailedPreconditionError(
          "network.signing: no deployment id: " + file_dir +
          "/deployment (written by `dcr keys` beside trainer.pub) is missing and the scenario "
          "names no certificates; the trainer signs the deployment id into every version, so "
          "make the keys with `dcr keys` (or copy its deployment file beside trainer.pub)");
    }
  }
  if (!from_cert.empty() && !from_file.empty() && from_cert != from_file) {
    return FailedPreconditionError("the certificates are of deployment " + from_cert + ", but " +
                                   file_dir + "/deployment names deployment " + from_file +
                                   ": the keys of two deployments are mixed");
  }
  return from_cert.empty() ? from_file : from_cert;
}

Status AddTls(const Scenario& s, const std::string& generate_dir, std::vector<NodePlan>* plans) {
  const TlsSpec& tls = s.network.tls;
  if (plans->empty() || (*plans)[0].transport != "relay_tree") return Status();
  std::string ca = tls.ca, cert = tls.cert, key = tls.key;
  // network.tls: false: plain TCP edges, but the run's certificates still sign every commit
  // report (generated by `dcr run`, or named), so the sender counts only what each rank signed.
  // A multi-host run that names none sends unsigned reports.
  if (!tls.enabled && ca.empty() && generate_dir.empty()) return Status();
  if (ca.empty()) {
    if (generate_dir.empty()) {
      return FailedPreconditionError(
          "network.tls: a multi-host relay tree needs its run's certificates: make them with "
          "`dcr keys SCENARIO -o DIR` and set network.tls {ca: DIR/ca.crt, cert: "
          "DIR/node-{rank}.crt, key: DIR/node-{rank}.key}, or turn TLS off with network.tls: "
          "false");
    }
    DCR_RETURN_IF_ERROR(internal::WriteRunCredentials(
        generate_dir, internal::RunIdText((*plans)[0].run_id),
        internal::TreeRoles((*plans)[0].parents), 7, /*replace=*/true));
    ca = generate_dir + "/ca.crt";
    cert = generate_dir + "/node-{rank}.crt";
    key = generate_dir + "/node-{rank}.key";
  }
  for (NodePlan& p : *plans) {
    p.tls_ca = ca;
    p.tls_cert = WithRank(cert, p.rank);
    p.tls_key = WithRank(key, p.rank);
    p.tls_links = tls.enabled;
  }
  return Status();
}

Status AddSigning(const Scenario& s, const std::string& generate_dir, const std::string& floor_dir,
                  std::vector<NodePlan>* plans) {
  const SigningSpec& g = s.network.signing;
  if (!g.enabled || plans->empty()) return Status();  // the delta, or the full stream signed
  std::string key = g.key, trust = g.trust;
  if (key.empty()) {
    if (generate_dir.empty()) return Status();  // multi-host without named keys: unsigned
    DCR_RETURN_IF_ERROR(internal::PrepareCredentialDir(generate_dir));
    key = generate_dir + "/trainer.key";
    trust = generate_dir + "/trainer.pub";
    std::remove(key.c_str());
    std::remove(trust.c_str());
    DCR_ASSIGN_OR_RETURN(auto k, SigningKey::Generate());
    DCR_RETURN_IF_ERROR(k->Write(key, trust));
  }
  for (NodePlan& p : *plans) {
    if (p.rank == 0) {
      p.signing_key = key;
    } else {
      p.trust_key = trust;
      if (!floor_dir.empty()) {
        p.version_floor_path = floor_dir + "/version-floor-" + std::to_string(p.rank);
      }
      p.freeze_after_s = g.freeze_after_s;
    }
  }
  return Status();
}

void AddVersions(const std::vector<std::string>& targets,
                 const std::function<std::string(int)>& prefix_of, const std::string& result_dir,
                 std::vector<NodePlan>* plans) {
  for (NodePlan& p : *plans) {
    for (size_t k = 1; k <= targets.size(); ++k) {
      NodeVersion v;
      v.version = k;
      v.target_path = targets[k - 1];
      v.verify_path = p.verify_path.empty() ? "" : targets[k - 1];
      v.prefix = prefix_of(static_cast<int>(k));
      v.result_path =
          result_dir + "/node-" + std::to_string(p.rank) + "-v" + std::to_string(k) + ".json";
      p.versions.push_back(v);
    }
  }
}

void AddRecovery(const std::string& state_dir, const std::string& region_store,
                 std::vector<NodePlan>* plans) {
  for (NodePlan& p : *plans) {
    p.state_dir = state_dir;
    if (p.transport == "relay_tree" && p.store.empty()) {
      p.store = region_store;
      // The first node in the region that holds the plain stream mirrors it: the sender's
      // child, or the last edge relay of a split's chain (the ones before it forward context
      // records of later ranges).
      const bool split = p.edge_relays.size() > 1 &&
                         p.parents[static_cast<size_t>(p.edge_relays[1])] == p.edge_relays[0];
      p.mirror_to_store =
          p.rank != 0 && (split ? p.rank == p.edge_relays.back() : p.parents[p.rank] == 0);
    }
  }
}

namespace {

// The one-refit form's state (HostPlanOptions::state_dir with a target): under `root` (its
// deployment's directory when `deployment`), opened as a node's own. A delta sender takes the
// next version of the deployment from it (NextPublishedVersion) and builds its delta from the
// version before (base_version); a signed delta receiver keeps its version floor there.
Status AddOneRefitState(const std::string& root, bool deployment, NodePlan* p) {
  const std::string dir = deployment ? internal::DeploymentStateDir(root, p->run_id) : root;
  DCR_RETURN_IF_ERROR(internal::OpenStateDir(dir));
  if (p->method != "delta") return Status();  // a full stream carries no version
  if (p->rank == 0) {
    DCR_ASSIGN_OR_RETURN(const uint64_t next, internal::NextPublishedVersion(dir, p->run_id));
    p->base_version = static_cast<int64_t>(next - 1);
  } else if (!p->trust_key.empty()) {
    DCR_RETURN_IF_ERROR(internal::OpenOneRefitFloor(dir, p->rank, p->run_id));
    p->version_floor_path = internal::StateFloorPath(dir, p->rank);
  }
  return Status();
}

}  // namespace

StatusOr<NodePlan> HostPlan(const Scenario& s, int rank, const HostPlanOptions& o) {
  if (rank < 0 || rank > s.receivers.count) {
    return InvalidArgumentError("--rank " + std::to_string(rank) + ": the scenario has ranks 0.." +
                                std::to_string(s.receivers.count));
  }
  const bool tree = o.transport == TransportKind::kRelayTree;
  if (tree && s.network.hosts.empty()) {
    return InvalidArgumentError(
        "network.hosts: a multi-host relay tree needs one host:port per rank");
  }
  // No default directory store: a fixed path in the system temp dir is one another local user can
  // create first and fill with objects of its choosing.
  const auto& os = s.transport.object_store;
  const bool named_store = os.kind != StoreKind::kDir || !os.path.empty();
  if (!tree && !named_store) {
    return InvalidArgumentError(
        "transport.object_store.path: a multi-host object-store run over a directory store needs "
        "its path (a directory every host reaches, writable only by the run's user)");
  }
  const bool long_lived = o.target.empty();
  std::string base = o.base;
  std::vector<std::string> targets;
  const bool open = long_lived && !s.model.base.empty();
  if (open) {
    // Open-ended: version 1 is listed, each next one follows it (NextOpenVersion).
    if (base.empty()) base = s.model.base;
    targets.assign(1, std::string());
  } else if (!long_lived && base.empty()) {
    base = s.model.base;
  } else if (long_lived) {
    const auto& ck = s.model.checkpoints;
    if (base.empty() && ck.empty()) {
      return InvalidArgumentError(
          "--base: a long-lived run of a preset model needs the base checkpoint every receiver "
          "holds (or give model.checkpoints)");
    }
    if (base.empty()) base = ck[0];
    if (!ck.empty()) {
      targets.assign(ck.begin() + 1, ck.end());
    } else {
      targets.assign(static_cast<size_t>(s.steps), std::string());
    }
  }
  DCR_ASSIGN_OR_RETURN(const std::string deployment, ScenarioDeployment(s, rank));
  // A long-lived deployment's versions live under a prefix of their own in the stores: versions
  // restart at 1 in a new deployment, and its nodes must never take the objects of an earlier
  // one that used the same store.
  std::string root = !o.prefix.empty() ? o.prefix : long_lived ? "refit" : "refit/step-1";
  if (long_lived && !deployment.empty()) root += "/deployment-" + deployment;
  auto prefix_of = [&root](int k) { return root + "/step-" + std::to_string(k); };
  DCR_ASSIGN_OR_RETURN(auto plans,
                       MakePlans(s, o.method, o.transport, base, long_lived ? targets[0] : o.target,
                                 o.work_dir, o.work_dir, long_lived ? prefix_of(1) : root));
  if (!deployment.empty()) DCR_RETURN_IF_ERROR(SetDeployment(deployment, &plans));
  DCR_RETURN_IF_ERROR(AddTls(s, "", &plans));
  DCR_RETURN_IF_ERROR(AddSigning(s, "", o.work_dir, &plans));
  if (long_lived && o.state_dir.empty() && rank != 0 && !plans[rank].trust_key.empty()) {
    return InvalidArgumentError(
        "--state: a long-lived signed receiver keeps its version floor and what it resumes from "
        "in its state directory: give --state DIR (a directory of its own, mode 0700; made when "
        "missing)");
  }
  if (long_lived) {
    // The state of this deployment: everything a node resumes from, and the per-version results,
    // so that a second deployment in the same --state never overwrites the first's.
    const std::string state = o.state_dir.empty() || deployment.empty()
                                  ? o.state_dir
                                  : internal::DeploymentStateDir(o.state_dir, plans[0].run_id);
    AddVersions(targets, prefix_of, state.empty() ? o.work_dir : state, &plans);
    for (NodePlan& p : plans) p.open_versions = open;
    if (!o.state_dir.empty()) {
      std::string region = o.store;
      if (region.empty() && tree) {
        if (!named_store) {
          return InvalidArgumentError(
              "--state: recovery over a relay tree needs an in-region store every node of the "
              "region reaches: give --store SPEC, or transport.object_store with a path or S3");
        }
        region = StoreUrl(s, o.work_dir);
      }
      AddRecovery(state, region, &plans);
    }
  }
  NodePlan p = plans[rank];
  if (!long_lived && !o.state_dir.empty()) {
    DCR_RETURN_IF_ERROR(AddOneRefitState(o.state_dir, !deployment.empty(), &p));
  }
  // One process per host rank: the launcher's local rank picks the device when it is set.
  const int local = LocalRankFromEnvironment();
  if (local >= 0 && p.device == "cuda") {
    p.device_index = rank == 0 ? local : DeviceIndexFor(s, local);
  }
  p.result_path = o.result_path;
  // A long-lived host serves its committed version for as long as the trainer takes to hand
  // the next one.
  if (long_lived) p.version_wait_s = -1;
  // No runner here: the start barrier is the connection set-up itself.
  p.ready_path.clear();
  p.go_path.clear();
  return p;
}

}  // namespace dcr
