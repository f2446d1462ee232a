// Result JSON and Markdown of scenario runs (one schema for real and simulated runs).
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dcr/scenario.h"

namespace dcr {

namespace {
using nlohmann::json;

json LinkJson(const LinkBytes& l) { return json{{"name", l.name}, {"bytes", l.bytes}}; }

json RunJson(const ScenarioResult& r, const RunResult& run) {
  json j;
  j["method"] = MethodName(run.method);
  j["transport"] = TransportKindName(run.transport);
  j["change_rate"] = run.change_rate;
  if (run.configured_change_rate > 0) j["configured_change_rate"] = run.configured_change_rate;
  j["step"] = run.step;
  j["refit_seconds"] = run.refit_seconds;
  j["wire_bytes"] = run.wire_bytes;
  j["payload_bytes"] = run.payload_bytes;
  j["dense_bytes"] = run.dense_bytes;
  j["receivers"] = run.receivers;
  j["receivers_verified"] = run.receivers_verified;
  j["phases"] = json{{"build_s", run.phases.build_s},
                     {"transfer_s", run.phases.transfer_s},
                     {"apply_s", run.phases.apply_s},
                     {"commit_s", run.phases.commit_s}};
  json links = json::array();
  for (const auto& l : run.links) links.push_back(LinkJson(l));
  j["links"] = links;
  json recv = json::array();
  for (const auto& rr : run.receiver_results) {
    json x{{"node", rr.node},
           {"host", rr.host},
           {"committed", rr.committed},
           {"verified", rr.verified},
           {"verify_message", rr.verify_message},
           {"commit_at_s", rr.commit_at_s},
           {"bytes_received", rr.bytes_received}};
    if (rr.reported) {
      json rep{
          {"ok", rr.report_ok}, {"version", rr.report_version}, {"target_hash", rr.report_hash}};
      if (!rr.report_ok) rep["error"] = rr.report_error;
      x["report"] = rep;
    }
    if (!rr.catch_up.empty()) x["catch_up"] = rr.catch_up;
    recv.push_back(x);
  }
  j["receiver_results"] = recv;
  if (run.method == Method::kDelta) {
    double s = SpeedupVsFull(r, run);
    if (s > 0) j["speedup_vs_full"] = s;
  }
  if (!run.error.empty()) j["error"] = run.error;
  if (!run.recovery.empty()) j["recovery"] = run.recovery;
  if (!run.restarts.empty()) j["restarts"] = run.restarts;
  if (!run.retention.empty()) {
    j["retention"] = run.retention;
    j["retention_kept"] = run.retention_kept;
  }
  if (!run.catch_up.empty()) {
    json events = json::array();
    for (const CatchUpEvent& e : run.catch_up) {
      events.push_back({{"node", e.node},
                        {"event", e.event},
                        {"detail", e.detail},
                        {"store_bytes", e.store_bytes},
                        {"long_link_bytes", e.long_link_bytes}});
    }
    j["catch_up"] = events;
  }
  return j;
}

template <typename T>
T GetOr(const json& j, const char* key, T def) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  return it->get<T>();
}
}  // namespace

double SpeedupVsFull(const ScenarioResult& r, const RunResult& d) {
  if (!d.error.empty() || d.refit_seconds <= 0) return 0;
  for (const auto& f : r.runs) {
    if (f.method == Method::kFull && f.transport == d.transport && f.step == d.step &&
        f.error.empty() && std::abs(f.change_rate - d.change_rate) < 1e-12 &&
        std::abs(f.configured_change_rate - d.configured_change_rate) < 1e-12) {
      return f.refit_seconds / d.refit_seconds;
    }
  }
  return 0;
}

std::string ResultToJson(const ScenarioResult& r) {
  json j;
  j["scenario"] = r.scenario;
  j["mode"] = RunModeName(r.mode);
  j["model"] = r.model;
  j["model_bytes"] = r.model_bytes;
  json runs = json::array();
  for (const auto& run : r.runs) runs.push_back(RunJson(r, run));
  j["runs"] = runs;
  if (r.faults.enabled) {
    const FaultSummary& f = r.faults;
    j["faults"] = json{{"runs", f.runs},
                       {"faults_injected", f.faults_injected},
                       {"faults_survived", f.faults_survived},
                       {"receivers", f.receivers},
                       {"receivers_verified", f.receivers_verified},
                       {"injected_by_kind", f.injected_by_kind},
                       {"survived_by_kind", f.survived_by_kind},
                       {"overwrite_repairs", f.overwrite_repairs},
                       {"fallbacks_to_store", f.fallbacks_to_store},
                       {"restarts", f.restarts},
                       {"payloads_refused", f.payloads_refused},
                       {"corrupt_detected", f.corrupt_detected},
                       {"seconds", f.seconds},
                       {"errors", f.errors}};
  }
  j["setup"] = r.setup;
  return j.dump(2) + "\n";
}

StatusOr<ScenarioResult> ResultFromJson(const std::string& text) {
  ScenarioResult r;
  try {
    json j = json::parse(text);
    r.scenario = GetOr<std::string>(j, "scenario", "");
    r.mode = GetOr<std::string>(j, "mode", "real") == "sim" ? RunMode::kSim : RunMode::kReal;
    r.model = GetOr<std::string>(j, "model", "");
    r.model_bytes = GetOr<uint64_t>(j, "model_bytes", 0);
    if (j.contains("setup")) r.setup = j["setup"].get<std::map<std::string, std::string>>();
    if (j.contains("faults")) {
      const json& f = j["faults"];
      r.faults.enabled = true;
      r.faults.runs = GetOr<int>(f, "runs", 0);
      r.faults.faults_injected = GetOr<int>(f, "faults_injected", 0);
      r.faults.faults_survived = GetOr<int>(f, "faults_survived", 0);
      r.faults.receivers = GetOr<int>(f, "receivers", 0);
      r.faults.receivers_verified = GetOr<int>(f, "receivers_verified", 0);
      if (f.contains("injected_by_kind")) {
        r.faults.injected_by_kind = f["injected_by_kind"].get<std::map<std::string, int>>();
      }
      if (f.contains("survived_by_kind")) {
        r.faults.survived_by_kind = f["survived_by_kind"].get<std::map<std::string, int>>();
      }
      r.faults.overwrite_repairs = GetOr<uint64_t>(f, "overwrite_repairs", 0);
      r.faults.fallbacks_to_store = GetOr<uint64_t>(f, "fallbacks_to_store", 0);
      r.faults.restarts = GetOr<uint64_t>(f, "restarts", 0);
      r.faults.payloads_refused = GetOr<uint64_t>(f, "payloads_refused", 0);
      r.faults.corrupt_detected = GetOr<uint64_t>(f, "corrupt_detected", 0);
      r.faults.seconds = GetOr<double>(f, "seconds", 0);
      if (f.contains("errors")) r.faults.errors = f["errors"].get<std::vector<std::string>>();
    }
    for (const auto& rj : j.at("runs")) {
      RunResult run;
      run.method = rj.at("method").get<std::string>() == "full" ? Method::kFull : Method::kDelta;
      run.transport = rj.at("transport").get<std::string>() == "object_store"
                          ? TransportKind::kObjectStore
                          : TransportKind::kRelayTree;
      run.change_rate = rj.at("change_rate").get<double>();
      run.configured_change_rate = GetOr<double>(rj, "configured_change_rate", 0.0);
      run.step = GetOr<int>(rj, "step", 1);
      run.refit_seconds = rj.at("refit_seconds").get<double>();
      run.wire_bytes = rj.at("wire_bytes").get<uint64_t>();
      run.payload_bytes = GetOr<uint64_t>(rj, "payload_bytes", 0);
      run.dense_bytes = GetOr<uint64_t>(rj, "dense_bytes", 0);
      run.receivers = rj.at("receivers").get<int>();
      run.receivers_verified = rj.at("receivers_verified").get<int>();
      if (rj.contains("phases")) {
        const auto& p = rj["phases"];
        run.phases.build_s = GetOr<double>(p, "build_s", 0);
        run.phases.transfer_s = GetOr<double>(p, "transfer_s", 0);
        run.phases.apply_s = GetOr<double>(p, "apply_s", 0);
        run.phases.commit_s = GetOr<double>(p, "commit_s", 0);
      }
      if (rj.contains("links")) {
        for (const auto& l : rj["links"]) {
          run.links.push_back(
              LinkBytes{l.at("name").get<std::string>(), l.at("bytes").get<uint64_t>()});
        }
      }
      if (rj.contains("receiver_results")) {
        for (const auto& x : rj["receiver_results"]) {
          ReceiverResult rr;
          rr.node = GetOr<int>(x, "node", 0);
          rr.host = GetOr<std::string>(x, "host", "");
          rr.committed = GetOr<bool>(x, "committed", false);
          rr.verified = GetOr<bool>(x, "verified", false);
          rr.verify_message = GetOr<std::string>(x, "verify_message", "");
          rr.commit_at_s = GetOr<double>(x, "commit_at_s", 0);
          rr.bytes_received = GetOr<uint64_t>(x, "bytes_received", 0);
          if (x.contains("report") && x["report"].is_object()) {
            const json& rep = x["report"];
            rr.reported = true;
            rr.report_ok = GetOr<bool>(rep, "ok", false);
            rr.report_version = GetOr<uint64_t>(rep, "version", 0);
            rr.report_hash = GetOr<std::string>(rep, "target_hash", "");
            rr.report_error = GetOr<std::string>(rep, "error", "");
          }
          rr.catch_up = GetOr<std::string>(x, "catch_up", "");
          run.receiver_results.push_back(rr);
        }
      }
      run.error = GetOr<std::string>(rj, "error", "");
      if (rj.contains("recovery"))
        run.recovery = rj["recovery"].get<std::map<std::string, uint64_t>>();
      if (rj.contains("restarts")) run.restarts = rj["restarts"].get<std::vector<std::string>>();
      if (rj.contains("retention")) {
        run.retention = rj["retention"].get<std::map<std::string, uint64_t>>();
        run.retention_kept = GetOr<std::string>(rj, "retention_kept", "");
      }
      if (rj.contains("catch_up")) {
        for (const auto& x : rj["catch_up"]) {
          CatchUpEvent e;
          e.node = GetOr<int>(x, "node", 0);
          e.event = GetOr<std::string>(x, "event", "");
          e.detail = GetOr<std::string>(x, "detail", "");
          e.store_bytes = GetOr<uint64_t>(x, "store_bytes", 0);
          e.long_link_bytes = GetOr<uint64_t>(x, "long_link_bytes", 0);
          run.catch_up.push_back(e);
        }
      }
      r.runs.push_back(run);
    }
  } catch (const std::exception& e) {
    return InvalidArgumentError(std::string("result JSON: ") + e.what());
  }
  return r;
}

namespace {
std::string HumanBytes(uint64_t b) {
  char buf[64];
  if (b >= (uint64_t{1} << 30)) {
    std::snprintf(buf, sizeof(buf), "%.2f GiB", b / 1073741824.0);
  } else if (b >= (uint64_t{1} << 20)) {
    std::snprintf(buf, sizeof(buf), "%.2f MiB", b / 1048576.0);
  } else if (b >= 1024) {
    std::snprintf(buf, sizeof(buf), "%.1f KiB", b / 1024.0);
  } else {
    std::snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(b));
  }
  return buf;
}
}  // namespace

std::string ResultToMarkdown(const ScenarioResult& r) {
  std::ostringstream o;
  o << "Scenario `" << r.scenario << "` (mode " << RunModeName(r.mode) << ", model " << r.model
    << ", " << HumanBytes(r.model_bytes) << ")\n\n";
  o << "| method | transport | change (measured) | trainer rate | step | refit s | build s | "
       "transfer s | wire bytes | payload | verified | speedup vs full |\n";
  o << "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  char buf[512];
  for (const auto& run : r.runs) {
    double sp = run.method == Method::kDelta ? SpeedupVsFull(r, run) : 0;
    std::string speed =
        sp > 0 ? (std::to_string(sp).substr(0, std::to_string(sp).find('.') + 2) + "x") : "-";
    char trainer[32] = "-";
    if (run.configured_change_rate > 0) {
      std::snprintf(trainer, sizeof(trainer), "%.2f%%", run.configured_change_rate * 100);
    }
    std::snprintf(buf, sizeof(buf),
                  "| %s | %s | %.2f%% | %s | %d | %.3f | %.3f | %.3f | %s | %s | %d/%d | %s |\n",
                  MethodName(run.method), TransportKindName(run.transport), run.change_rate * 100,
                  trainer, run.step, run.refit_seconds, run.phases.build_s, run.phases.transfer_s,
                  HumanBytes(run.wire_bytes).c_str(), HumanBytes(run.payload_bytes).c_str(),
                  run.receivers_verified, run.receivers, speed.c_str());
    o << buf;
  }
  for (const auto& run : r.runs) {
    if (!run.error.empty()) {
      o << "\n"
        << MethodName(run.method) << " / " << TransportKindName(run.transport) << " / step "
        << run.step << " failed: " << run.error << "\n";
    }
  }
  if (r.faults.enabled) {
    const FaultSummary& f = r.faults;
    o << "\nFault injection: " << f.runs << " runs, " << f.faults_injected << " faults injected, "
      << f.faults_survived << " survived; " << f.receivers_verified << "/" << f.receivers
      << " receivers bit-exact and committed (" << f.overwrite_repairs << " overwrite repairs, "
      << f.fallbacks_to_store << " fallbacks to the object store, " << f.restarts
      << " restarts).\n\n| fault | injected | survived |\n|---|---|---|\n";
    for (const auto& [k, v] : f.injected_by_kind) {
      auto sv = f.survived_by_kind.find(k);
      o << "| " << k << " | " << v << " | "
        << (sv == f.survived_by_kind.end() ? std::string("-") : std::to_string(sv->second))
        << " |\n";
    }
    for (const auto& e : f.errors) o << "\nfault run failed: " << e << "\n";
  }
  return o.str();
}

}  // namespace dcr
