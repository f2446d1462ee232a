// Scenario YAML parser: every key is checked against the schema (scenarios/README.md); errors
// name the key path. yaml-cpp exceptions never leave this file.
#include "dcr/scenario.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>

#include "dcr/fault_kind.h"
#include "dcr/status_macros.h"

namespace dcr {
namespace {

std::string Trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

// Splits "12.5 MiB" into (12.5, "MiB"). False if there is no leading number.
bool SplitNumber(const std::string& text, double* value, std::string* unit) {
  std::string t = Trim(text);
  size_t i = 0;
  while (i < t.size() && (std::isdigit(static_cast<unsigned char>(t[i])) || t[i] == '.' ||
                          t[i] == 'e' || t[i] == 'E' || t[i] == '+' || t[i] == '-')) {
    // Stop at an 'e' that starts a unit word rather than an exponent.
    if ((t[i] == 'e' || t[i] == 'E') &&
        (i + 1 >= t.size() || !(std::isdigit(static_cast<unsigned char>(t[i + 1])) ||
                                t[i + 1] == '-' || t[i + 1] == '+'))) {
      break;
    }
    ++i;
  }
  if (i == 0) return false;
  std::string num = t.substr(0, i);
  char* end = nullptr;
  *value = std::strtod(num.c_str(), &end);
  if (end != num.c_str() + num.size() || !std::isfinite(*value)) return false;
  *unit = Trim(t.substr(i));
  return true;
}

Status BadUnit(const std::string& what, const std::string& kind, const std::string& text,
               const std::string& accepted) {
  return InvalidArgumentError(what + ": bad " + kind + " '" + text + "' (accepted: " + accepted +
                              ")");
}

}  // namespace

StatusOr<uint64_t> ParseSize(const std::string& text, const std::string& what) {
  static const std::map<std::string, double> kUnits = {{"", 1},
                                                       {"B", 1},
                                                       {"KB", 1e3},
                                                       {"MB", 1e6},
                                                       {"GB", 1e9},
                                                       {"TB", 1e12},
                                                       {"KiB", 1024.0},
                                                       {"MiB", 1048576.0},
                                                       {"GiB", 1073741824.0},
                                                       {"TiB", 1099511627776.0}};
  double v = 0;
  std::string unit;
  const char* accepted = "B, KB, MB, GB, TB, KiB, MiB, GiB, TiB";
  if (!SplitNumber(text, &v, &unit)) return BadUnit(what, "size", text, accepted);
  auto it = kUnits.find(unit);
  if (it == kUnits.end() || v < 0) return BadUnit(what, "size", text, accepted);
  double bytes = v * it->second;
  if (bytes > 1.8e19) return InvalidArgumentError(what + ": size '" + text + "' too large");
  return static_cast<uint64_t>(std::llround(bytes));
}

StatusOr<double> ParseBandwidth(const std::string& text, const std::string& what) {
  static const std::map<std::string, double> kUnits = {
      {"bit/s", 1 / 8.0},     {"Kbit/s", 1e3 / 8}, {"Mbit/s", 1e6 / 8}, {"Gbit/s", 1e9 / 8},
      {"Tbit/s", 1e12 / 8},   {"bps", 1 / 8.0},    {"Kbps", 1e3 / 8},   {"Mbps", 1e6 / 8},
      {"Gbps", 1e9 / 8},      {"B/s", 1},          {"KB/s", 1e3},       {"MB/s", 1e6},
      {"GB/s", 1e9},          {"TB/s", 1e12},      {"KiB/s", 1024.0},   {"MiB/s", 1048576.0},
      {"GiB/s", 1073741824.0}};
  double v = 0;
  std::string unit;
  const char* accepted =
      "bit/s, Kbit/s, Mbit/s, Gbit/s, Tbit/s, bps..Gbps, B/s, KB/s, MB/s, "
      "GB/s, TB/s, KiB/s, MiB/s, GiB/s";
  if (!SplitNumber(text, &v, &unit)) return BadUnit(what, "bandwidth", text, accepted);
  auto it = kUnits.find(unit);
  if (it == kUnits.end() || v < 0) return BadUnit(what, "bandwidth", text, accepted);
  return v * it->second;
}

StatusOr<double> ParseDuration(const std::string& text, const std::string& what) {
  static const std::map<std::string, double> kUnits = {
      {"", 1}, {"ns", 1e-9}, {"us", 1e-6}, {"ms", 1e-3}, {"s", 1}, {"min", 60}, {"h", 3600}};
  double v = 0;
  std::string unit;
  const char* accepted = "ns, us, ms, s, min, h (bare number: seconds)";
  if (!SplitNumber(text, &v, &unit)) return BadUnit(what, "duration", text, accepted);
  auto it = kUnits.find(unit);
  if (it == kUnits.end() || v < 0) return BadUnit(what, "duration", text, accepted);
  return v * it->second;
}

StatusOr<double> ParseRate(const std::string& text, const std::string& what) {
  double v = 0;
  std::string unit;
  if (!SplitNumber(text, &v, &unit) || !(unit.empty() || unit == "%")) {
    return InvalidArgumentError(what + ": bad rate '" + text + "' (a fraction like 0.03 or '3%')");
  }
  if (unit == "%") v /= 100.0;
  if (!(v >= 0 && v <= 1)) {
    return InvalidArgumentError(what + ": rate '" + text + "' outside [0, 1]");
  }
  return v;
}

namespace {

// Walks a YAML mapping, checking keys against the allowed set.
class MapReader {
 public:
  MapReader(const YAML::Node& node, std::string path) : node_(node), path_(std::move(path)) {}

  Status Init(const std::set<std::string>& allowed) {
    if (!node_.IsMap()) {
      return InvalidArgumentError(Where() + "expected a mapping");
    }
    for (const auto& kv : node_) {
      std::string key = kv.first.as<std::string>();
      if (!allowed.count(key)) {
        std::string list;
        for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
        return InvalidArgumentError((path_.empty() ? std::string("scenario") : path_) +
                                    ": unknown key '" + key + "' (known: " + list + ")");
      }
    }
    return OkStatus();
  }

  std::string Path(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  bool Has(const std::string& key) const { return static_cast<bool>(node_[key]); }
  YAML::Node Get(const std::string& key) const { return node_[key]; }

  Status Str(const std::string& key, std::string* out) const {
    YAML::Node n = node_[key];
    if (!n) return OkStatus();
    if (!n.IsScalar()) return InvalidArgumentError(Path(key) + ": expected a string");
    *out = n.as<std::string>();
    return OkStatus();
  }
  template <typename T>
  Status Int(const std::string& key, T* out, int64_t lo, int64_t hi) const {
    YAML::Node n = node_[key];
    if (!n) return OkStatus();
    std::string s = n.IsScalar() ? n.as<std::string>() : "";
    char* end = nullptr;
    long long v = std::strtoll(s.c_str(), &end, 10);
    if (!n.IsScalar() || s.empty() || *end != '\0') {
      return InvalidArgumentError(Path(key) + ": expected an integer, got '" + s + "'");
    }
    if (v < lo || v > hi) {
      return InvalidArgumentError(Path(key) + ": " + s + " outside [" + std::to_string(lo) + ", " +
                                  std::to_string(hi) + "]");
    }
    *out = static_cast<T>(v);
    return OkStatus();
  }
  Status Double(const std::string& key, double* out) const {
    YAML::Node n = node_[key];
    if (!n) return OkStatus();
    std::string s = n.IsScalar() ? n.as<std::string>() : "";
    char* end = nullptr;
    double v = std::strtod(s.c_str(), &end);
    if (!n.IsScalar() || s.empty() || *end != '\0' || !std::isfinite(v)) {
      return InvalidArgumentError(Path(key) + ": expected a number, got '" + s + "'");
    }
    *out = v;
    return OkStatus();
  }
  Status Bool(const std::string& key, bool* out) const {
    YAML::Node n = node_[key];
    if (!n) return OkStatus();
    std::string s = n.IsScalar() ? n.as<std::string>() : "";
    if (s == "true" || s == "yes" || s == "on") {
      *out = true;
    } else if (s == "false" || s == "no" || s == "off") {
      *out = false;
    } else {
      return InvalidArgumentError(Path(key) + ": expected true or false, got '" + s + "'");
    }
    return OkStatus();
  }
  Status Size(const std::string& key, uint64_t* out) const {
    YAML::Node n = node_[key];
    if (!n) return OkStatus();
    if (!n.IsScalar()) return InvalidArgumentError(Path(key) + ": expected a size");
    DCR_ASSIGN_OR_RETURN(*out, ParseSize(n.as<std::string>(), Path(key)));
    return OkStatus();
  }
  Status Bandwidth(const std::string& key, double* out) const {
    YAML::Node n = node_[key];
    if (!n) return OkStatus();
    if (!n.IsScalar()) return InvalidArgumentError(Path(key) + ": expected a bandwidth");
    DCR_ASSIGN_OR_RETURN(*out, ParseBandwidth(n.as<std::string>(), Path(key)));
    return OkStatus();
  }
  Status Duration(const std::string& key, double* out) const {
    YAML::Node n = node_[key];
    if (!n) return OkStatus();
    if (!n.IsScalar()) return InvalidArgumentError(Path(key) + ": expected a duration");
    DCR_ASSIGN_OR_RETURN(*out, ParseDuration(n.as<std::string>(), Path(key)));
    return OkStatus();
  }
  // A device name (kDeviceNames).
  Status Device(const std::string& key, std::string* out) const {
    YAML::Node n = node_[key];
    if (!n) return OkStatus();
    std::string s = n.IsScalar() ? n.as<std::string>() : "";
    for (const char* name : kDeviceNames) {
      if (s == name) {
        *out = s;
        return OkStatus();
      }
    }
    return InvalidArgumentError(Path(key) + ": unknown device '" + s + "' (cpu, host, cuda)");
  }
  // A scalar or a sequence of scalars.
  Status StrList(const std::string& key, std::vector<std::string>* out) const {
    YAML::Node n = node_[key];
    if (!n) return OkStatus();
    out->clear();
    if (n.IsScalar()) {
      out->push_back(n.as<std::string>());
      return OkStatus();
    }
    if (!n.IsSequence()) return InvalidArgumentError(Path(key) + ": expected a list");
    for (size_t i = 0; i < n.size(); ++i) {
      if (!n[i].IsScalar()) {
        return InvalidArgumentError(Path(key) + "[" + std::to_string(i) + "]: expected a scalar");
      }
      out->push_back(n[i].as<std::string>());
    }
    return OkStatus();
  }

 private:
  static Status OkStatus() { return Status(); }
  std::string Where() const { return (path_.empty() ? std::string("scenario") : path_) + ": "; }
  YAML::Node node_;
  std::string path_;
};

Status ParseLink(const YAML::Node& node, const std::string& path, LinkSpec* link) {
  MapReader r(node, path);
  DCR_RETURN_IF_ERROR(r.Init({"bandwidth", "latency"}));
  DCR_RETURN_IF_ERROR(r.Bandwidth("bandwidth", &link->bandwidth_Bps));
  DCR_RETURN_IF_ERROR(r.Duration("latency", &link->latency_s));
  return Status();
}

Status ParseModel(const MapReader& top, Scenario* s) {
  if (!top.Has("model")) return Status();
  YAML::Node n = top.Get("model");
  if (n.IsScalar()) {  // shorthand: model: tiny
    s->model.preset = n.as<std::string>();
    return Status();
  }
  MapReader r(n, "model");
  DCR_RETURN_IF_ERROR(r.Init({"preset", "depth_div", "width_div", "expert_div", "seed",
                              "checkpoints", "base", "work_dir"}));
  DCR_RETURN_IF_ERROR(r.Str("preset", &s->model.preset));
  DCR_RETURN_IF_ERROR(r.Int("depth_div", &s->model.depth_div, 1, 1 << 20));
  DCR_RETURN_IF_ERROR(r.Int("width_div", &s->model.width_div, 1, 1 << 20));
  DCR_RETURN_IF_ERROR(r.Int("expert_div", &s->model.expert_div, 1, 1 << 20));
  DCR_RETURN_IF_ERROR(r.Int("seed", &s->model.seed, 0, INT64_MAX));
  DCR_RETURN_IF_ERROR(r.StrList("checkpoints", &s->model.checkpoints));
  DCR_RETURN_IF_ERROR(r.Str("base", &s->model.base));
  DCR_RETURN_IF_ERROR(r.Str("work_dir", &s->model.work_dir));
  return Status();
}

Status ParseTransport(const MapReader& top, Scenario* s) {
  if (!top.Has("transport")) return Status();
  MapReader r(top.Get("transport"), "transport");
  DCR_RETURN_IF_ERROR(r.Init({"kinds", "object_store", "relay_tree"}));
  if (r.Has("kinds")) {
    std::vector<std::string> kinds;
    DCR_RETURN_IF_ERROR(r.StrList("kinds", &kinds));
    s->transport.kinds.clear();
    for (const auto& k : kinds) {
      if (k == "relay_tree") {
        s->transport.kinds.push_back(TransportKind::kRelayTree);
      } else if (k == "object_store") {
        s->transport.kinds.push_back(TransportKind::kObjectStore);
      } else {
        return InvalidArgumentError("transport.kinds: unknown transport '" + k +
                                    "' (relay_tree, object_store)");
      }
    }
  }
  if (r.Has("object_store")) {
    MapReader o(r.Get("object_store"), "transport.object_store");
    DCR_RETURN_IF_ERROR(o.Init({"kind", "path", "endpoint", "bucket", "region", "credentials_file",
                                "ca_file", "allow_http", "parallel", "poll", "read_deadline",
                                "sim_bandwidth", "sim_latency"}));
    auto& os = s->transport.object_store;
    std::string kind = "dir";
    DCR_RETURN_IF_ERROR(o.Str("kind", &kind));
    if (kind == "dir") {
      os.kind = StoreKind::kDir;
    } else if (kind == "s3") {
      os.kind = StoreKind::kS3;
    } else {
      return InvalidArgumentError("transport.object_store.kind: unknown store '" + kind +
                                  "' (dir, s3)");
    }
    DCR_RETURN_IF_ERROR(o.Str("path", &os.path));
    DCR_RETURN_IF_ERROR(o.Str("endpoint", &os.endpoint));
    DCR_RETURN_IF_ERROR(o.Str("bucket", &os.bucket));
    DCR_RETURN_IF_ERROR(o.Str("region", &os.region));
    DCR_RETURN_IF_ERROR(o.Str("credentials_file", &os.credentials_file));
    DCR_RETURN_IF_ERROR(o.Str("ca_file", &os.ca_file));
    DCR_RETURN_IF_ERROR(o.Bool("allow_http", &os.allow_http));
    DCR_RETURN_IF_ERROR(o.Int("parallel", &os.parallel, 1, 1024));
    DCR_RETURN_IF_ERROR(o.Duration("poll", &os.poll_s));
    DCR_RETURN_IF_ERROR(o.Duration("read_deadline", &os.read_deadline_s));
    if (!(os.read_deadline_s > 0) || os.read_deadline_s > 86400) {
      return InvalidArgumentError("transport.object_store.read_deadline: must be in (0, 24h]");
    }
    DCR_RETURN_IF_ERROR(o.Bandwidth("sim_bandwidth", &os.sim_link.bandwidth_Bps));
    DCR_RETURN_IF_ERROR(o.Duration("sim_latency", &os.sim_link.latency_s));
  }
  if (r.Has("relay_tree")) {
    MapReader t(r.Get("relay_tree"), "transport.relay_tree");
    DCR_RETURN_IF_ERROR(t.Init({"fan_out", "root_fan_out", "streams", "window", "chunk", "topology",
                                "edge_relays", "edge_split", "edge_lag"}));
    auto& rt = s->transport.relay_tree;
    DCR_RETURN_IF_ERROR(t.Int("fan_out", &rt.fan_out, 1, 1024));
    DCR_RETURN_IF_ERROR(t.Int("root_fan_out", &rt.root_fan_out, 1, 1024));
    DCR_RETURN_IF_ERROR(t.Int("streams", &rt.streams, 1, 64));
    DCR_RETURN_IF_ERROR(t.Size("window", &rt.window));
    DCR_RETURN_IF_ERROR(t.Size("chunk", &rt.chunk));
    DCR_RETURN_IF_ERROR(t.Size("edge_lag", &rt.edge_lag));
    DCR_RETURN_IF_ERROR(t.Bool("edge_split", &rt.edge_split));
    if (t.Has("topology")) {
      std::vector<std::string> parents;
      DCR_RETURN_IF_ERROR(t.StrList("topology", &parents));
      rt.topology.clear();
      for (size_t i = 0; i < parents.size(); ++i) {
        char* end = nullptr;
        long v = std::strtol(parents[i].c_str(), &end, 10);
        if (parents[i].empty() || *end != '\0') {
          return InvalidArgumentError("transport.relay_tree.topology[" + std::to_string(i) +
                                      "]: expected a parent node id, got '" + parents[i] + "'");
        }
        rt.topology.push_back(static_cast<int>(v));
      }
    }
    if (t.Has("edge_relays")) {
      std::vector<std::string> ids;
      DCR_RETURN_IF_ERROR(t.StrList("edge_relays", &ids));
      rt.edge_relays.clear();
      for (size_t i = 0; i < ids.size(); ++i) {
        char* end = nullptr;
        const long v = std::strtol(ids[i].c_str(), &end, 10);
        if (ids[i].empty() || *end != '\0' || v < 1 || v > (1 << 20)) {
          return InvalidArgumentError("transport.relay_tree.edge_relays[" + std::to_string(i) +
                                      "]: expected a receiver node id (>= 1), got '" + ids[i] +
                                      "'");
        }
        rt.edge_relays.push_back(static_cast<int>(v));
      }
    }
  }
  return Status();
}

Status ParseNetwork(const MapReader& top, Scenario* s) {
  auto& net = s->network;
  if (!top.Has("network")) return Status();
  MapReader r(top.Get("network"), "network");
  DCR_RETURN_IF_ERROR(r.Init({"regions", "long_link", "emulation", "hosts", "base_port", "tls",
                              "heartbeat", "read_deadline", "signing", "metrics_port"}));
  if (r.Has("regions")) {
    YAML::Node regions = r.Get("regions");
    if (!regions.IsSequence()) return InvalidArgumentError("network.regions: expected a list");
    net.regions.clear();
    for (size_t i = 0; i < regions.size(); ++i) {
      std::string path = "network.regions[" + std::to_string(i) + "]";
      MapReader g(regions[i], path);
      DCR_RETURN_IF_ERROR(g.Init({"name", "bandwidth", "latency"}));
      RegionSpec region;
      DCR_RETURN_IF_ERROR(g.Str("name", &region.name));
      if (region.name.empty()) return InvalidArgumentError(path + ".name: required");
      DCR_RETURN_IF_ERROR(g.Bandwidth("bandwidth", &region.intra.bandwidth_Bps));
      DCR_RETURN_IF_ERROR(g.Duration("latency", &region.intra.latency_s));
      net.regions.push_back(region);
    }
  }
  if (r.Has("long_link")) {
    DCR_RETURN_IF_ERROR(ParseLink(r.Get("long_link"), "network.long_link", &net.long_link));
  }
  std::string emulation = "transport";
  DCR_RETURN_IF_ERROR(r.Str("emulation", &emulation));
  if (emulation == "transport") {
    net.emulation = WanEmulation::kTransport;
  } else if (emulation == "netns") {
    net.emulation = WanEmulation::kNetns;
  } else if (emulation == "none") {
    net.emulation = WanEmulation::kNone;
  } else {
    return InvalidArgumentError("network.emulation: unknown '" + emulation +
                                "' (transport, netns, none)");
  }
  DCR_RETURN_IF_ERROR(r.StrList("hosts", &net.hosts));
  DCR_RETURN_IF_ERROR(r.Int("base_port", &net.base_port, 0, 65535));
  DCR_RETURN_IF_ERROR(r.Int("metrics_port", &net.metrics_port, 0, 65535));
  DCR_RETURN_IF_ERROR(r.Duration("heartbeat", &net.heartbeat_interval_s));
  DCR_RETURN_IF_ERROR(r.Duration("read_deadline", &net.read_deadline_s));
  if (!(net.heartbeat_interval_s > 0)) {
    return InvalidArgumentError("network.heartbeat: must be > 0");
  }
  if (r.Has("read_deadline") && !(net.read_deadline_s >= 2 * net.heartbeat_interval_s)) {
    return InvalidArgumentError("network.read_deadline: must be at least twice network.heartbeat");
  }
  if (r.Has("tls")) {
    if (r.Get("tls").IsScalar()) {
      DCR_RETURN_IF_ERROR(r.Bool("tls", &net.tls.enabled));
    } else {
      MapReader t(r.Get("tls"), "network.tls");
      DCR_RETURN_IF_ERROR(t.Init({"enabled", "ca", "cert", "key"}));
      DCR_RETURN_IF_ERROR(t.Bool("enabled", &net.tls.enabled));
      DCR_RETURN_IF_ERROR(t.Str("ca", &net.tls.ca));
      DCR_RETURN_IF_ERROR(t.Str("cert", &net.tls.cert));
      DCR_RETURN_IF_ERROR(t.Str("key", &net.tls.key));
      const int named = !net.tls.ca.empty() + !net.tls.cert.empty() + !net.tls.key.empty();
      if (named != 0 && named != 3) {
        return InvalidArgumentError("network.tls: give all of ca, cert and key, or none");
      }
    }
  }
  if (r.Has("signing")) {
    if (r.Get("signing").IsScalar()) {
      DCR_RETURN_IF_ERROR(r.Bool("signing", &net.signing.enabled));
    } else {
      MapReader g(r.Get("signing"), "network.signing");
      DCR_RETURN_IF_ERROR(g.Init({"enabled", "key", "trust", "freeze_after_s"}));
      DCR_RETURN_IF_ERROR(g.Bool("enabled", &net.signing.enabled));
      DCR_RETURN_IF_ERROR(g.Str("key", &net.signing.key));
      DCR_RETURN_IF_ERROR(g.Str("trust", &net.signing.trust));
      DCR_RETURN_IF_ERROR(g.Double("freeze_after_s", &net.signing.freeze_after_s));
      if (net.signing.freeze_after_s < 0) {
        return InvalidArgumentError("network.signing.freeze_after_s: must be >= 0");
      }
      if (net.signing.key.empty() != net.signing.trust.empty()) {
        return InvalidArgumentError("network.signing: give both key and trust, or neither");
      }
    }
  }
  return Status();
}

void FlattenExtra(const YAML::Node& n, const std::string& path,
                  std::map<std::string, std::string>* out) {
  if (n.IsMap()) {
    for (const auto& kv : n) {
      FlattenExtra(
          kv.second,
          path.empty() ? kv.first.as<std::string>() : path + "." + kv.first.as<std::string>(), out);
    }
  } else if (n.IsScalar()) {
    (*out)[path] = n.as<std::string>();
  } else if (n.IsSequence()) {
    for (size_t i = 0; i < n.size(); ++i) FlattenExtra(n[i], path + "." + std::to_string(i), out);
  }
}

Status ParseTop(const YAML::Node& root, Scenario* s) {
  MapReader top(root, "");
  DCR_RETURN_IF_ERROR(
      top.Init({"name",      "description", "mode",    "model",    "change_rate", "change_rates",
                "steps",     "methods",     "delta",   "training", "serving",     "transport",
                "receivers", "sender",      "network", "sim",      "timeout",     "progress",
                "faults",    "retention",   "catch_up"}));
  DCR_RETURN_IF_ERROR(top.Str("name", &s->name));
  DCR_RETURN_IF_ERROR(top.Str("description", &s->description));
  std::string mode = "real";
  DCR_RETURN_IF_ERROR(top.Str("mode", &mode));
  if (mode == "real") {
    s->mode = RunMode::kReal;
  } else if (mode == "sim") {
    s->mode = RunMode::kSim;
  } else {
    return InvalidArgumentError("mode: unknown mode '" + mode + "' (real, sim)");
  }
  DCR_RETURN_IF_ERROR(ParseModel(top, s));
  if (top.Has("change_rate") && top.Has("change_rates")) {
    return InvalidArgumentError("change_rate: give either change_rate or change_rates, not both");
  }
  for (const char* key : {"change_rate", "change_rates"}) {
    if (!top.Has(key)) continue;
    std::vector<std::string> rates;
    DCR_RETURN_IF_ERROR(top.StrList(key, &rates));
    s->change_rates.clear();
    for (size_t i = 0; i < rates.size(); ++i) {
      DCR_ASSIGN_OR_RETURN(double v,
                           ParseRate(rates[i], std::string(key) + "[" + std::to_string(i) + "]"));
      s->change_rates.push_back(v);
    }
  }
  DCR_RETURN_IF_ERROR(top.Int("steps", &s->steps, 1, 1000000));
  if (top.Has("methods")) {
    std::vector<std::string> methods;
    DCR_RETURN_IF_ERROR(top.StrList("methods", &methods));
    s->methods.clear();
    for (const auto& m : methods) {
      if (m == "delta") {
        s->methods.push_back(Method::kDelta);
      } else if (m == "full") {
        s->methods.push_back(Method::kFull);
      } else {
        return InvalidArgumentError("methods: unknown method '" + m + "' (delta, full)");
      }
    }
  }
  if (top.Has("delta")) {
    MapReader d(top.Get("delta"), "delta");
    DCR_RETURN_IF_ERROR(
        d.Init({"chunk_elems", "zstd_level", "threads", "wan_context", "context_classes"}));
    DCR_RETURN_IF_ERROR(d.Bool("wan_context", &s->delta.wan_context));
    DCR_RETURN_IF_ERROR(d.Int("context_classes", &s->delta.context_classes, 1, kContextClassesMax));
    if (d.Has("context_classes") && !s->delta.wan_context) {
      return InvalidArgumentError(
          "delta.context_classes: only context-coded chunks have classes; set "
          "delta.wan_context: true or drop it");
    }
    DCR_RETURN_IF_ERROR(d.Int("chunk_elems", &s->delta.chunk_elems, 1, INT64_MAX));
    DCR_RETURN_IF_ERROR(d.Int("zstd_level", &s->delta.zstd_level, -7, 22));
    DCR_RETURN_IF_ERROR(d.Int("threads", &s->delta.threads, 0, 1024));
  }
  if (top.Has("faults")) {
    MapReader f(top.Get("faults"), "faults");
    DCR_RETURN_IF_ERROR(f.Init({"runs", "per_run", "kinds", "seed", "chunk_elems", "detect_timeout",
                                "restart_delay", "only", "process_runs", "process_kills",
                                "proxy_runs", "proxy_faults", "proxy_kinds", "partition", "delay",
                                "store_fail", "s3_runs", "s3_faults", "s3_kinds"}));
    s->faults.enabled = true;
    DCR_RETURN_IF_ERROR(f.Int("runs", &s->faults.runs, 0, 100000));
    DCR_RETURN_IF_ERROR(f.Int("per_run", &s->faults.per_run, 0, 10000));
    DCR_RETURN_IF_ERROR(f.StrList("kinds", &s->faults.kinds));
    for (size_t i = 0; i < s->faults.kinds.size(); ++i) {
      StatusOr<FaultKind> k = FaultKindFromName(s->faults.kinds[i]);
      if (!k.ok()) {
        return InvalidArgumentError("faults.kinds[" + std::to_string(i) +
                                    "]: " + k.status().message());
      }
    }
    DCR_RETURN_IF_ERROR(f.Int("seed", &s->faults.seed, 0, INT64_MAX));
    DCR_RETURN_IF_ERROR(f.Int("chunk_elems", &s->faults.chunk_elems, 0, INT64_MAX));
    DCR_RETURN_IF_ERROR(f.Duration("detect_timeout", &s->faults.detect_timeout_s));
    DCR_RETURN_IF_ERROR(f.Duration("restart_delay", &s->faults.restart_delay_s));
    DCR_RETURN_IF_ERROR(f.Bool("only", &s->faults.only));
    DCR_RETURN_IF_ERROR(f.Int("process_runs", &s->faults.process_runs, 0, 100000));
    DCR_RETURN_IF_ERROR(f.Int("process_kills", &s->faults.process_kills, 0, 1000));
    DCR_RETURN_IF_ERROR(f.Int("proxy_runs", &s->faults.proxy_runs, 0, 100000));
    DCR_RETURN_IF_ERROR(f.Int("proxy_faults", &s->faults.proxy_faults, 1, 64));
    DCR_RETURN_IF_ERROR(f.StrList("proxy_kinds", &s->faults.proxy_kinds));
    for (size_t i = 0; i < s->faults.proxy_kinds.size(); ++i) {
      static const char* const kKinds[] = {"corrupt", "duplicate", "reorder",         "delay",
                                           "drop",    "partition", "store_write_fail"};
      const std::string& k = s->faults.proxy_kinds[i];
      if (std::find(std::begin(kKinds), std::end(kKinds), k) == std::end(kKinds)) {
        return InvalidArgumentError("faults.proxy_kinds[" + std::to_string(i) +
                                    "]: unknown kind '" + k +
                                    "' (corrupt, duplicate, reorder, delay, drop, partition, "
                                    "store_write_fail)");
      }
    }
    DCR_RETURN_IF_ERROR(f.Duration("partition", &s->faults.partition_s));
    DCR_RETURN_IF_ERROR(f.Duration("delay", &s->faults.delay_s));
    DCR_RETURN_IF_ERROR(f.Duration("store_fail", &s->faults.store_fail_s));
    DCR_RETURN_IF_ERROR(f.Int("s3_runs", &s->faults.s3_runs, 0, 100000));
    DCR_RETURN_IF_ERROR(f.Int("s3_faults", &s->faults.s3_faults, 1, 64));
    DCR_RETURN_IF_ERROR(f.StrList("s3_kinds", &s->faults.s3_kinds));
    for (size_t i = 0; i < s->faults.s3_kinds.size(); ++i) {
      static const char* const kKinds[] = {"5xx", "cut", "stall", "truncate", "bad_etag"};
      const std::string& k = s->faults.s3_kinds[i];
      if (std::find(std::begin(kKinds), std::end(kKinds), k) == std::end(kKinds)) {
        return InvalidArgumentError("faults.s3_kinds[" + std::to_string(i) + "]: unknown kind '" +
                                    k + "' (5xx, cut, stall, truncate, bad_etag)");
      }
    }
  }
  if (top.Has("catch_up")) {
    MapReader c(top.Get("catch_up"), "catch_up");
    DCR_RETURN_IF_ERROR(
        c.Init({"down_step", "down_versions", "join_step", "max_replay", "full_frame_fraction"}));
    s->catch_up.enabled = true;
    DCR_RETURN_IF_ERROR(c.Int("down_step", &s->catch_up.down_step, 0, 1000000));
    DCR_RETURN_IF_ERROR(c.Int("down_versions", &s->catch_up.down_versions, 1, 1000000));
    DCR_RETURN_IF_ERROR(c.Int("join_step", &s->catch_up.join_step, 0, 1000000));
    DCR_RETURN_IF_ERROR(c.Int("max_replay", &s->catch_up.max_replay, 0, 1000000));
    DCR_RETURN_IF_ERROR(c.Double("full_frame_fraction", &s->catch_up.full_frame_fraction));
    const CatchUpSpec& cu = s->catch_up;
    if (cu.down_step == 1 || cu.join_step == 1) {
      return InvalidArgumentError(
          "catch_up: down_step and join_step start at step 2 (step 1 is "
          "the first version every receiver takes)");
    }
    if (cu.down_step > 0 && cu.down_step + cu.down_versions > s->steps) {
      return InvalidArgumentError(
          "catch_up: a receiver down from step " + std::to_string(cu.down_step) + " for " +
          std::to_string(cu.down_versions) + " versions comes back at step " +
          std::to_string(cu.down_step + cu.down_versions) +
          ", after the last (steps: " + std::to_string(s->steps) + ")");
    }
    if (cu.join_step > s->steps) {
      return InvalidArgumentError("catch_up.join_step: " + std::to_string(cu.join_step) +
                                  " is after the last step (steps: " + std::to_string(s->steps) +
                                  ")");
    }
    if (cu.full_frame_fraction < 0) {
      return InvalidArgumentError("catch_up.full_frame_fraction: must be >= 0");
    }
  }
  if (top.Has("training")) {
    MapReader t(top.Get("training"), "training");
    DCR_RETURN_IF_ERROR(t.Init({"tp", "pp", "ep", "distributed_optimizer"}));
    s->training.enabled = true;
    DCR_RETURN_IF_ERROR(t.Int("tp", &s->training.tp, 1, 4096));
    DCR_RETURN_IF_ERROR(t.Int("pp", &s->training.pp, 1, 4096));
    DCR_RETURN_IF_ERROR(t.Int("ep", &s->training.ep, 1, 4096));
    DCR_RETURN_IF_ERROR(t.Bool("distributed_optimizer", &s->training.distributed_optimizer));
  }
  if (top.Has("serving")) {
    MapReader t(top.Get("serving"), "serving");
    DCR_RETURN_IF_ERROR(t.Init({"tp", "fp8", "buffers"}));
    s->serving.enabled = true;
    DCR_RETURN_IF_ERROR(t.Int("tp", &s->serving.tp, 1, 4096));
    DCR_RETURN_IF_ERROR(t.Bool("fp8", &s->serving.fp8));
    DCR_RETURN_IF_ERROR(t.Bool("buffers", &s->serving.buffers));
  }
  DCR_RETURN_IF_ERROR(ParseTransport(top, s));
  if (top.Has("receivers")) {
    YAML::Node n = top.Get("receivers");
    if (n.IsScalar()) {  // shorthand: receivers: 4
      DCR_RETURN_IF_ERROR(top.Int("receivers", &s->receivers.count, 1, 1 << 20));
    } else {
      MapReader r(n, "receivers");
      DCR_RETURN_IF_ERROR(r.Init({"count", "per_node", "apply_threads", "verify", "device",
                                  "devices", "node_devices", "deadline"}));
      DCR_RETURN_IF_ERROR(r.Duration("deadline", &s->receivers.deadline_s));
      DCR_RETURN_IF_ERROR(r.Int("count", &s->receivers.count, 1, 1 << 20));
      DCR_RETURN_IF_ERROR(r.Int("per_node", &s->receivers.per_node, 1, 1024));
      DCR_RETURN_IF_ERROR(r.Int("apply_threads", &s->receivers.apply_threads, 1, 1024));
      DCR_RETURN_IF_ERROR(r.Bool("verify", &s->receivers.verify));
      DCR_RETURN_IF_ERROR(r.Device("device", &s->receivers.device));
      if (r.Has("devices")) {
        std::vector<std::string> devices;
        DCR_RETURN_IF_ERROR(r.StrList("devices", &devices));
        if (devices.empty()) return InvalidArgumentError("receivers.devices: empty list");
        s->receivers.devices.clear();
        for (size_t i = 0; i < devices.size(); ++i) {
          char* end = nullptr;
          const long v = std::strtol(devices[i].c_str(), &end, 10);
          if (devices[i].empty() || *end != '\0' || v < 0 || v > 1023) {
            return InvalidArgumentError("receivers.devices[" + std::to_string(i) +
                                        "]: expected a device index in [0, 1023], got '" +
                                        devices[i] + "'");
          }
          s->receivers.devices.push_back(static_cast<int>(v));
        }
      }
      if (r.Has("node_devices")) {
        YAML::Node m = r.Get("node_devices");
        if (!m.IsMap()) {
          return InvalidArgumentError(
              "receivers.node_devices: expected a map of node id to device");
        }
        s->receivers.node_devices.clear();
        for (const auto& kv : m) {
          const std::string key = kv.first.IsScalar() ? kv.first.as<std::string>() : "";
          char* end = nullptr;
          const long v = std::strtol(key.c_str(), &end, 10);
          if (key.empty() || *end != '\0' || v < 1 || v > (1 << 20)) {
            return InvalidArgumentError(
                "receivers.node_devices: expected a receiver node id (>= 1), got '" + key + "'");
          }
          MapReader d(m, "receivers.node_devices");
          std::string dev;
          DCR_RETURN_IF_ERROR(d.Device(key, &dev));
          s->receivers.node_devices[static_cast<int>(v)] = dev;
        }
      }
    }
  }
  if (top.Has("retention")) {
    MapReader r(top.Get("retention"), "retention");
    DCR_RETURN_IF_ERROR(r.Init({"keep_versions", "budget"}));
    s->retention.enabled = true;
    DCR_RETURN_IF_ERROR(r.Int("keep_versions", &s->retention.keep_versions, 1, 1 << 20));
    DCR_RETURN_IF_ERROR(r.Size("budget", &s->retention.budget_bytes));
  }
  if (top.Has("sender")) {
    MapReader r(top.Get("sender"), "sender");
    DCR_RETURN_IF_ERROR(r.Init({"device"}));
    DCR_RETURN_IF_ERROR(r.Device("device", &s->sender.device));
  }
  DCR_RETURN_IF_ERROR(ParseNetwork(top, s));
  if (top.Has("sim")) {
    MapReader m(top.Get("sim"), "sim");
    DCR_RETURN_IF_ERROR(m.Init({"network_model", "calibration", "sample_tensors", "coarsen",
                                "gpus_per_node", "tcp_gamma", "extra"}));
    DCR_RETURN_IF_ERROR(m.Str("network_model", &s->sim.network_model));
    DCR_RETURN_IF_ERROR(m.Str("calibration", &s->sim.calibration));
    DCR_RETURN_IF_ERROR(m.Int("sample_tensors", &s->sim.sample_tensors, 1, 1 << 20));
    DCR_RETURN_IF_ERROR(m.Int("coarsen", &s->sim.coarsen, 1, 1 << 20));
    DCR_RETURN_IF_ERROR(m.Int("gpus_per_node", &s->sim.gpus_per_node, 1, 1024));
    if (m.Has("tcp_gamma")) {
      uint64_t g = 0;
      DCR_RETURN_IF_ERROR(m.Size("tcp_gamma", &g));
      s->sim.tcp_gamma = static_cast<double>(g);
    }
    if (m.Has("extra")) FlattenExtra(m.Get("extra"), "", &s->sim.extra);
  }
  DCR_RETURN_IF_ERROR(top.Duration("timeout", &s->timeout_s));
  DCR_RETURN_IF_ERROR(top.Bool("progress", &s->progress));
  return Status();
}

// transport.relay_tree.edge_split: the edge relays form a chain from the sender, each but the last
// with the next as its only child, all cpu receivers.
Status ValidateEdgeSplit(const Scenario& s, const Topology& topo) {
  const std::vector<int>& e = s.transport.relay_tree.edge_relays;
  const std::string key = "transport.relay_tree.edge_split: ";
  if (e.size() < 2) {
    return InvalidArgumentError(key +
                                "needs at least 2 edge relays in "
                                "transport.relay_tree.edge_relays, got " +
                                std::to_string(e.size()));
  }
  for (size_t k = 0; k < e.size(); ++k) {
    if (e[k] > s.receivers.count) {
      return InvalidArgumentError(key + "edge relay " + std::to_string(e[k]) +
                                  " is not a receiver (1.." + std::to_string(s.receivers.count) +
                                  ")");
    }
    const int parent = k == 0 ? 0 : e[k - 1];
    if (topo.parent[e[k]] != parent) {
      return InvalidArgumentError(
          key + "edge relay " + std::to_string(e[k]) + " must be a child of " +
          (k == 0 ? std::string("the sender") : "edge relay " + std::to_string(parent)) +
          " (the edge relays form a chain in the order listed)");
    }
    if (k + 1 < e.size() && topo.children[e[k]] != std::vector<NodeId>{e[k + 1]}) {
      return InvalidArgumentError(key + "edge relay " + std::to_string(e[k]) +
                                  " must have edge relay " + std::to_string(e[k + 1]) +
                                  " as its only child (it forwards other ranges' chunks "
                                  "context-coded)");
    }
    if (ReceiverDevice(s, e[k]) != "cpu") {
      return InvalidArgumentError(key + "edge relay " + std::to_string(e[k]) + " on device " +
                                  ReceiverDevice(s, e[k]) +
                                  " cannot apply the other ranges' context-coded chunks; "
                                  "it must be a cpu receiver");
    }
  }
  return Status();
}

}  // namespace

Status ValidateScenario(const Scenario& s) {
  const int given = !s.model.preset.empty() + !s.model.checkpoints.empty() + !s.model.base.empty();
  if (given == 0) return InvalidArgumentError("model: give a preset, checkpoints or a base");
  if (given > 1) {
    return InvalidArgumentError("model: give one of a preset, checkpoints or a base, not several");
  }
  if (!s.model.checkpoints.empty() && s.model.checkpoints.size() < 2) {
    return InvalidArgumentError("model.checkpoints: need a base and at least one target");
  }
  if (s.change_rates.empty()) return InvalidArgumentError("change_rates: empty list");
  for (double r : s.change_rates) {
    if (!(r > 0 && r <= 1))
      return InvalidArgumentError("change_rates: every rate must be in (0, 1]");
  }
  if (s.methods.empty()) return InvalidArgumentError("methods: empty list");
  if (s.transport.kinds.empty()) return InvalidArgumentError("transport.kinds: empty list");
  const auto& rt = s.transport.relay_tree;
  if (rt.chunk == 0) return InvalidArgumentError("transport.relay_tree.chunk: must be > 0");
  if (rt.window < rt.chunk) {
    return InvalidArgumentError("transport.relay_tree.window: must be >= chunk");
  }
  if (!rt.topology.empty() && static_cast<int>(rt.topology.size()) != s.receivers.count + 1) {
    return InvalidArgumentError(
        "transport.relay_tree.topology: " + std::to_string(rt.topology.size()) + " entries for " +
        std::to_string(s.receivers.count) +
        " receivers (need receivers + 1: node 0 is the sender)");
  }
  const auto& os = s.transport.object_store;
  bool uses_store = false;
  for (auto k : s.transport.kinds) uses_store |= k == TransportKind::kObjectStore;
  if (uses_store && os.kind == StoreKind::kS3) {
    if (os.endpoint.empty())
      return InvalidArgumentError("transport.object_store.endpoint: required for s3");
    if (os.bucket.empty())
      return InvalidArgumentError("transport.object_store.bucket: required for s3");
    if (s.mode == RunMode::kReal && os.endpoint.compare(0, 7, "http://") == 0 && !os.allow_http) {
      return InvalidArgumentError(
          "transport.object_store.endpoint: '" + os.endpoint +
          "' is plain http (requests, signatures and objects unencrypted): use https://, or set "
          "transport.object_store.allow_http: true for a local test server");
    }
  }
  if (!s.network.hosts.empty() &&
      static_cast<int>(s.network.hosts.size()) != s.receivers.count + 1) {
    return InvalidArgumentError("network.hosts: " + std::to_string(s.network.hosts.size()) +
                                " hosts for " + std::to_string(s.receivers.count) +
                                " receivers (need receivers + 1: rank 0 is the sender)");
  }
  if (s.network.long_link.bandwidth_Bps < 0) {
    return InvalidArgumentError("network.long_link.bandwidth: must be >= 0");
  }
  auto known_device = [](const std::string& d) {
    return std::find_if(std::begin(kDeviceNames), std::end(kDeviceNames),
                        [&](const char* n) { return d == n; }) != std::end(kDeviceNames);
  };
  if (!known_device(s.receivers.device)) {
    return InvalidArgumentError("receivers.device: unknown device '" + s.receivers.device +
                                "' (cpu, host, cuda)");
  }
  if (!known_device(s.sender.device)) {
    return InvalidArgumentError("sender.device: unknown device '" + s.sender.device +
                                "' (cpu, host, cuda)");
  }
  for (size_t i = 0; i < s.receivers.devices.size(); ++i) {
    if (s.receivers.devices[i] < 0) {
      return InvalidArgumentError("receivers.devices[" + std::to_string(i) + "]: must be >= 0");
    }
  }
  for (const auto& [node, device] : s.receivers.node_devices) {
    if (node > s.receivers.count) {
      return InvalidArgumentError("receivers.node_devices: node " + std::to_string(node) +
                                  " is not a receiver (1.." + std::to_string(s.receivers.count) +
                                  ")");
    }
  }
  if (!rt.edge_relays.empty()) {
    if (!s.delta.wan_context) {
      return InvalidArgumentError(
          "transport.relay_tree.edge_relays: an edge relay transcodes the context-coded long "
          "link; set delta.wan_context: true");
    }
    DCR_ASSIGN_OR_RETURN(Topology topo, TopologyFor(s));
    std::set<int> edges;
    if (rt.edge_split) DCR_RETURN_IF_ERROR(ValidateEdgeSplit(s, topo));
    for (int e : rt.edge_relays) {
      // A split's chain: only its first edge relay is the sender's child (ValidateEdgeSplit).
      if (!rt.edge_split && (e > s.receivers.count || topo.parent[e] != 0)) {
        return InvalidArgumentError("transport.relay_tree.edge_relays: node " + std::to_string(e) +
                                    " is not a child of the sender (an edge relay takes the long "
                                    "link)");
      }
      edges.insert(e);
    }
    // The sender sends one encoding on the long link: the context-coded one, to edge relays.
    for (int c : topo.children[0]) {
      if (edges.count(c) == 0) {
        return InvalidArgumentError("transport.relay_tree.edge_relays: the sender's child node " +
                                    std::to_string(c) +
                                    " is not an edge relay (every long-link child must be one)");
      }
    }
  } else if (rt.edge_split) {
    return InvalidArgumentError(
        "transport.relay_tree.edge_split: name the edge relays that split the base in "
        "transport.relay_tree.edge_relays");
  } else if (s.delta.wan_context && s.mode == RunMode::kReal) {
    for (int r = 1; r <= s.receivers.count; ++r) {
      if (ReceiverDevice(s, r) != "cpu") {
        const bool tree = std::find(s.transport.kinds.begin(), s.transport.kinds.end(),
                                    TransportKind::kRelayTree) != s.transport.kinds.end();
        return InvalidArgumentError(
            "receivers.device: receiver node " + std::to_string(r) + " on device " +
            ReceiverDevice(s, r) + " cannot decode context-coded chunks (delta.wan_context); " +
            (tree ? "name the sender's children in transport.relay_tree.edge_relays so they "
                    "forward the plain encoding"
                  : "an object-store run stores the context-coded delta, which only cpu "
                    "receivers (holding the base) decode"));
      }
    }
  }
  return Status();
}

StatusOr<Scenario> ParseScenario(const std::string& yaml_text, const std::string& name_hint) {
  Scenario s;
  s.network.regions = {RegionSpec{"train", {}}, RegionSpec{"rollout", {}}};
  try {
    YAML::Node root = YAML::Load(yaml_text);
    if (!root || root.IsNull()) return InvalidArgumentError("scenario: empty document");
    DCR_RETURN_IF_ERROR(ParseTop(root, &s));
  } catch (const YAML::Exception& e) {
    return InvalidArgumentError(std::string("scenario: YAML error: ") + e.what());
  }
  if (s.name.empty()) s.name = name_hint.empty() ? "scenario" : name_hint;
  DCR_RETURN_IF_ERROR(ValidateScenario(s));
  return s;
}

StatusOr<Scenario> LoadScenario(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError("scenario file not found: " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string stem = path;
  size_t slash = stem.find_last_of('/');
  if (slash != std::string::npos) stem = stem.substr(slash + 1);
  size_t dot = stem.find_last_of('.');
  if (dot != std::string::npos) stem = stem.substr(0, dot);
  auto s = ParseScenario(ss.str(), stem);
  if (!s.ok()) return s.status().WithContext(path);
  s->source_path = path;
  return s;
}

}  // namespace dcr
