// The JSON forms of NodePlan and NodeResult (dcr/node.h): `dcr node --plan` and result files.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/commitment.h"
#include "dcr/context.h"
#include "dcr/node.h"
#include "dcr/status.h"
#include "dcr/status_macros.h"
#include "dcr/statusor.h"
#include "node/commit_reports.h"

namespace dcr {
namespace {

// Hash128::ToHex's inverse: 32 hex digits, hi first.
StatusOr<Hash128> HashFromHex(const std::string& hex) {
  Hash128 h;
  if (hex.size() != 32) return InvalidArgumentError("hash '" + hex + "': expected 32 hex digits");
  if (!Hash128::FromHex(hex, &h)) return InvalidArgumentError("hash '" + hex + "': not hex");
  return h;
}

nlohmann::json CommitReportJson(const CommitReport& c) {
  nlohmann::json j{{"rank", c.rank},
                   {"run", c.run},
                   {"version", c.version},
                   {"target_hash", c.target_hash.ToHex()},
                   {"ok", c.ok}};
  if (c.commitment) j["commitment"] = CommitmentHex(*c.commitment);
  if (!c.ok) {
    j["code"] = std::string(StatusCodeName(c.code));
    j["error"] = c.error;
  }
  return j;
}

StatusOr<CommitReport> CommitReportFromJson(const nlohmann::json& j) {
  CommitReport c;
  c.rank = j.at("rank").get<int>();
  c.run = j.at("run").get<uint64_t>();
  c.version = j.at("version").get<uint64_t>();
  DCR_ASSIGN_OR_RETURN(c.target_hash, HashFromHex(j.at("target_hash").get<std::string>()));
  c.ok = j.at("ok").get<bool>();
  if (j.contains("commitment")) {
    const std::string hex = j["commitment"].get<std::string>();
    c.commitment = internal::RootOfHex(hex);
    if (!c.commitment) return InvalidArgumentError("commitment '" + hex + "': not 64 hex digits");
  }
  if (!c.ok) {
    c.code = StatusCode::kInternal;
    const std::string name = j.value("code", std::string());
    for (int k = 1; k <= static_cast<int>(StatusCode::kAborted); ++k) {
      if (StatusCodeName(static_cast<StatusCode>(k)) == name) c.code = static_cast<StatusCode>(k);
    }
    c.error = j.value("error", std::string());
  }
  return c;
}

}  // namespace

std::string NodePlanToJson(const NodePlan& p) {
  nlohmann::json j;
  j["rank"] = p.rank;
  j["transport"] = p.transport;
  j["method"] = p.method;
  j["parents"] = p.parents;
  j["addresses"] = p.addresses;
  j["run_id"] = p.run_id;
  j["version"] = p.version;
  if (p.base_version >= 0) j["base_version"] = p.base_version;
  if (!p.versions.empty()) {
    nlohmann::json vs = nlohmann::json::array();
    for (const NodeVersion& v : p.versions) {
      vs.push_back({{"version", v.version},
                    {"target_path", v.target_path},
                    {"verify_path", v.verify_path},
                    {"prefix", v.prefix},
                    {"result_path", v.result_path}});
    }
    j["versions"] = vs;
  }
  if (p.open_versions) j["open_versions"] = true;
  if (!p.tls_ca.empty() || !p.tls_cert.empty() || !p.tls_key.empty()) {
    j["tls"] = {{"ca", p.tls_ca}, {"cert", p.tls_cert}, {"key", p.tls_key}};
    if (!p.tls_links) j["tls"]["links"] = false;
  }
  if (!p.signing_key.empty()) j["signing_key"] = p.signing_key;
  if (!p.trust_key.empty()) j["trust_key"] = p.trust_key;
  if (!p.version_floor_path.empty()) j["version_floor_path"] = p.version_floor_path;
  if (p.freeze_after_s > 0) j["freeze_after_s"] = p.freeze_after_s;
  j["relay"] = {{"piece_bytes", p.relay.piece_bytes},
                {"window_bytes", p.relay.window_bytes},
                {"root_streams", p.relay.root_streams},
                {"apply", p.relay.apply},
                {"max_parallel_applies", p.relay.max_parallel_applies},
                {"max_parallel_puts", p.relay.max_parallel_puts},
                {"max_parallel_fetches", p.relay.max_parallel_fetches},
                {"prefix", p.relay.prefix},
                {"poll_interval_s", p.relay.poll_interval_s},
                {"poll_timeout_s", p.relay.poll_timeout_s},
                {"retry_backoff_s", p.relay.retry_backoff_s},
                {"max_retries", p.relay.max_retries}};
  if (!p.metrics_address.empty()) j["metrics_address"] = p.metrics_address;
  j["heartbeat_interval_s"] = p.heartbeat_interval_s;
  j["read_deadline_s"] = p.read_deadline_s;
  j["emulate_wan"] = p.emulate_wan;
  j["long_bandwidth_Bps"] = p.long_bandwidth_Bps;
  j["long_latency_s"] = p.long_latency_s;
  j["store"] = p.store;
  j["base_path"] = p.base_path;
  j["target_path"] = p.target_path;
  if (!p.delta_path.empty()) j["delta_path"] = p.delta_path;
  j["chunk_elems"] = p.chunk_elems;
  j["zstd_level"] = p.zstd_level;
  j["context_coding"] = p.context_coding;
  j["context_classes"] = p.context_classes;
  if (!p.edge_relays.empty()) j["edge_relays"] = p.edge_relays;
  if (p.edge_lag_bytes > 0) j["edge_lag_bytes"] = p.edge_lag_bytes;
  if (p.edge_range_end > 0) {
    j["edge_range_first"] = p.edge_range_first;
    j["edge_range_end"] = p.edge_range_end;
  }
  j["build_threads"] = p.build_threads;
  j["full_slice_bytes"] = p.full_slice_bytes;
  j["shuffle_seed"] = p.shuffle_seed;
  j["device"] = p.device;
  j["device_index"] = p.device_index;
  j["receiver_base_path"] = p.receiver_base_path;
  j["verify_path"] = p.verify_path;
  j["timeout_s"] = p.timeout_s;
  if (p.version_wait_s != 0) j["version_wait_s"] = p.version_wait_s;
  j["result_path"] = p.result_path;
  if (!p.progress_path.empty()) j["progress_path"] = p.progress_path;
  j["ready_path"] = p.ready_path;
  j["go_path"] = p.go_path;
  if (!p.state_dir.empty()) j["state_dir"] = p.state_dir;
  if (!p.version_log_dir.empty()) j["version_log_dir"] = p.version_log_dir;
  if (!p.base_sums.empty()) j["base_sums"] = p.base_sums;
  if (!p.target_sums.empty()) j["target_sums"] = p.target_sums;
  if (p.mirror_to_store) j["mirror_to_store"] = true;
  if (p.retain_versions > 0) j["retain_versions"] = p.retain_versions;
  if (p.retain_budget_bytes > 0) j["retain_budget_bytes"] = p.retain_budget_bytes;
  if (!p.region_receivers.empty()) j["region_receivers"] = p.region_receivers;
  if (!p.dead_ranks.empty()) j["dead_ranks"] = p.dead_ranks;
  j["receiver_deadline_s"] = p.receiver_deadline_s;
  if (p.region_receiver) {
    j["region_receiver"] = {{"late_join", p.late_join},
                            {"max_replay", p.catch_up_max_replay},
                            {"full_frame_fraction", p.catch_up_full_frame_fraction}};
  }
  if (p.serve_full_frames) j["serve_full_frames"] = true;
  if (p.fault_kill_chunk >= 0 || p.fault_kill_blob >= 0 || !p.fault_kill_log_step.empty()) {
    j["fault"] = {{"kill_chunk", p.fault_kill_chunk},
                  {"kill_inside", p.fault_kill_inside},
                  {"kill_blob", p.fault_kill_blob},
                  {"version", p.fault_version}};
    if (!p.fault_kill_log_step.empty()) j["fault"]["kill_log_step"] = p.fault_kill_log_step;
  }
  if (p.version_log_image_every > 0) j["version_log_image_every"] = p.version_log_image_every;
  return j.dump(1);
}

StatusOr<NodePlan> NodePlanFromJson(const std::string& text) {
  NodePlan p;
  try {
    auto j = nlohmann::json::parse(text);
    p.rank = j.at("rank").get<int>();
    p.transport = j.at("transport").get<std::string>();
    p.method = j.at("method").get<std::string>();
    p.parents = j.at("parents").get<std::vector<int>>();
    p.addresses = j.at("addresses").get<std::vector<std::string>>();
    if (j.contains("run_id")) p.run_id = j["run_id"].get<uint64_t>();
    if (j.contains("version")) p.version = j["version"].get<uint64_t>();
    if (j.contains("base_version")) p.base_version = j["base_version"].get<int64_t>();
    if (j.contains("versions")) {
      for (const auto& v : j["versions"]) {
        NodeVersion nv;
        nv.version = v.at("version").get<uint64_t>();
        nv.target_path = v.at("target_path").get<std::string>();
        nv.verify_path = v.value("verify_path", std::string());
        nv.prefix = v.value("prefix", std::string());
        nv.result_path = v.value("result_path", std::string());
        p.versions.push_back(std::move(nv));
      }
    }
    if (j.contains("open_versions")) p.open_versions = j["open_versions"].get<bool>();
    if (j.contains("tls")) {
      const auto& t = j["tls"];
      p.tls_ca = t.at("ca").get<std::string>();
      p.tls_cert = t.at("cert").get<std::string>();
      p.tls_key = t.at("key").get<std::string>();
      if (t.contains("links")) p.tls_links = t["links"].get<bool>();
    }
    if (j.contains("signing_key")) p.signing_key = j["signing_key"].get<std::string>();
    if (j.contains("trust_key")) p.trust_key = j["trust_key"].get<std::string>();
    if (j.contains("version_floor_path")) {
      p.version_floor_path = j["version_floor_path"].get<std::string>();
    }
    if (j.contains("freeze_after_s")) p.freeze_after_s = j["freeze_after_s"].get<double>();
    const auto& r = j.at("relay");
    p.relay.piece_bytes = r.at("piece_bytes").get<uint64_t>();
    p.relay.window_bytes = r.at("window_bytes").get<uint64_t>();
    p.relay.root_streams = r.at("root_streams").get<int>();
    p.relay.apply = r.at("apply").get<bool>();
    p.relay.max_parallel_applies = r.at("max_parallel_applies").get<int>();
    p.relay.max_parallel_puts = r.at("max_parallel_puts").get<int>();
    p.relay.max_parallel_fetches = r.at("max_parallel_fetches").get<int>();
    p.relay.prefix = r.at("prefix").get<std::string>();
    p.relay.poll_interval_s = r.at("poll_interval_s").get<double>();
    p.relay.poll_timeout_s = r.at("poll_timeout_s").get<double>();
    p.relay.retry_backoff_s = r.at("retry_backoff_s").get<double>();
    p.relay.max_retries = r.at("max_retries").get<int>();
    if (j.contains("heartbeat_interval_s")) {
      p.heartbeat_interval_s = j["heartbeat_interval_s"].get<double>();
    }
    if (j.contains("read_deadline_s")) p.read_deadline_s = j["read_deadline_s"].get<double>();
    if (j.contains("metrics_address")) p.metrics_address = j["metrics_address"].get<std::string>();
    p.emulate_wan = j.at("emulate_wan").get<bool>();
    p.long_bandwidth_Bps = j.at("long_bandwidth_Bps").get<double>();
    p.long_latency_s = j.at("long_latency_s").get<double>();
    p.store = j.at("store").get<std::string>();
    p.base_path = j.at("base_path").get<std::string>();
    p.target_path = j.at("target_path").get<std::string>();
    if (j.contains("delta_path")) p.delta_path = j["delta_path"].get<std::string>();
    p.chunk_elems = j.at("chunk_elems").get<uint64_t>();
    p.zstd_level = j.at("zstd_level").get<int>();
    if (j.contains("context_coding")) p.context_coding = j["context_coding"].get<bool>();
    if (j.contains("context_classes")) p.context_classes = j["context_classes"].get<int>();
    if (j.contains("edge_relays")) p.edge_relays = j["edge_relays"].get<std::vector<int>>();
    if (j.contains("edge_lag_bytes")) p.edge_lag_bytes = j["edge_lag_bytes"].get<uint64_t>();
    if (j.contains("edge_range_end")) {
      p.edge_range_first = j.at("edge_range_first").get<uint64_t>();
      p.edge_range_end = j["edge_range_end"].get<uint64_t>();
    }
    p.build_threads = j.at("build_threads").get<int>();
    p.full_slice_bytes = j.at("full_slice_bytes").get<uint64_t>();
    if (j.contains("shuffle_seed")) p.shuffle_seed = j["shuffle_seed"].get<uint64_t>();
    if (j.contains("device")) p.device = j["device"].get<std::string>();
    if (j.contains("device_index")) p.device_index = j["device_index"].get<int>();
    p.receiver_base_path = j.at("receiver_base_path").get<std::string>();
    p.verify_path = j.at("verify_path").get<std::string>();
    p.timeout_s = j.at("timeout_s").get<double>();
    if (j.contains("version_wait_s")) p.version_wait_s = j["version_wait_s"].get<double>();
    p.result_path = j.at("result_path").get<std::string>();
    if (j.contains("ready_path")) p.ready_path = j["ready_path"].get<std::string>();
    if (j.contains("progress_path")) p.progress_path = j["progress_path"].get<std::string>();
    if (j.contains("go_path")) p.go_path = j["go_path"].get<std::string>();
    if (j.contains("state_dir")) p.state_dir = j["state_dir"].get<std::string>();
    if (j.contains("version_log_dir")) {
      p.version_log_dir = j["version_log_dir"].get<std::string>();
    }
    if (j.contains("base_sums")) p.base_sums = j["base_sums"].get<std::string>();
    if (j.contains("target_sums")) p.target_sums = j["target_sums"].get<std::string>();
    if (j.contains("mirror_to_store")) p.mirror_to_store = j["mirror_to_store"].get<bool>();
    if (j.contains("retain_versions")) p.retain_versions = j["retain_versions"].get<int>();
    if (j.contains("retain_budget_bytes")) {
      p.retain_budget_bytes = j["retain_budget_bytes"].get<uint64_t>();
    }
    if (j.contains("region_receivers")) {
      p.region_receivers = j["region_receivers"].get<std::vector<int>>();
    }
    if (j.contains("dead_ranks")) p.dead_ranks = j["dead_ranks"].get<std::vector<int>>();
    if (j.contains("receiver_deadline_s")) {
      p.receiver_deadline_s = j["receiver_deadline_s"].get<double>();
    }
    if (j.contains("region_receiver")) {
      const auto& c = j["region_receiver"];
      p.region_receiver = true;
      p.late_join = c.value("late_join", false);
      p.catch_up_max_replay = c.value("max_replay", 8);
      p.catch_up_full_frame_fraction = c.value("full_frame_fraction", 0.5);
    }
    if (j.contains("serve_full_frames")) p.serve_full_frames = j["serve_full_frames"].get<bool>();
    if (j.contains("fault")) {
      const auto& f = j["fault"];
      p.fault_kill_chunk = f.at("kill_chunk").get<int64_t>();
      p.fault_kill_inside = f.at("kill_inside").get<bool>();
      p.fault_kill_blob = f.at("kill_blob").get<int64_t>();
      p.fault_version = f.value("version", uint64_t{0});
      p.fault_kill_log_step = f.value("kill_log_step", std::string());
    }
    p.version_log_image_every = j.value("version_log_image_every", uint64_t{0});
  } catch (const std::exception& e) {
    return InvalidArgumentError(std::string("node plan JSON: ") + e.what());
  }
  if (Status s = CheckContextClasses(p.context_classes); !s.ok()) {
    return InvalidArgumentError("node plan JSON: " + s.message());
  }
  return p;
}

std::string NodeResultToJson(const NodeResult& r) {
  nlohmann::json j;
  j["rank"] = r.rank;
  j["pid"] = r.pid;
  j["role"] = r.role;
  j["ok"] = r.ok;
  j["error"] = r.error;
  j["t_start"] = r.t_start;
  j["t_first_blob"] = r.t_first_blob;
  j["t_last_blob"] = r.t_last_blob;
  j["t_commit"] = r.t_commit;
  j["apply_seconds"] = r.apply_seconds;
  j["bytes_sent"] = r.bytes_sent;
  j["bytes_sent_long"] = r.bytes_sent_long;
  j["bytes_received"] = r.bytes_received;
  j["payload_bytes"] = r.payload_bytes;
  j["dense_bytes"] = r.dense_bytes;
  j["blobs"] = r.blobs;
  j["receivers_committed"] = r.receivers_committed;
  nlohmann::json reports = nlohmann::json::array();
  for (const CommitReport& c : r.reports) reports.push_back(CommitReportJson(c));
  j["reports"] = reports;
  j["target_hash"] = r.target_hash.ToHex();
  if (!r.commitment.empty()) j["commitment"] = r.commitment;
  if (r.commitment_leaves > 0) {
    j["commitment_pass"] = {{"leaves", r.commitment_leaves},
                            {"tail_leaves", r.commitment_tail_leaves},
                            {"tail_seconds", r.commitment_tail_seconds}};
  }
  if (r.trainer_delta) j["trainer_delta"] = true;
  if (r.delta_base_version >= 0) j["delta_base_version"] = r.delta_base_version;
  if (!r.trainer_delta_skipped.empty()) j["trainer_delta_skipped"] = r.trainer_delta_skipped;
  j["verified"] = r.verified;
  j["verify_message"] = r.verify_message;
  if (!r.freeze.empty()) j["freeze"] = r.freeze;
  if (r.edge_chunks > 0 || r.edge_cpu_seconds > 0) {
    j["edge"] = {{"chunks", r.edge_chunks},
                 {"context_bytes", r.edge_context_bytes},
                 {"plain_bytes", r.edge_plain_bytes},
                 {"cpu_seconds", r.edge_cpu_seconds}};
  }
  if (!r.edge_switches.empty()) {
    nlohmann::json sw = nlohmann::json::array();
    for (const NodeResult::EdgeSwitch& e : r.edge_switches) {
      nlohmann::json one = {
          {"child", e.child}, {"lag_bytes", e.lag_bytes}, {"plain_chunks", e.plain_chunks}};
      if (e.resumed) {
        one["resume_bytes"] = e.resume_bytes;
        one["context_chunks"] = e.context_chunks;
      }
      sw.push_back(one);
    }
    j["edge_switches"] = sw;
  }
  j["recovery"] = {{"starts", r.starts},
                   {"recoveries", r.recoveries},
                   {"fallbacks", r.fallbacks},
                   {"reloads", r.reloads},
                   {"overwrite_repairs", r.overwrite_repairs},
                   {"chunks_skipped", r.chunks_skipped},
                   {"mirror_puts", r.mirror_puts},
                   {"mirror_put_failures", r.mirror_put_failures},
                   {"store_failures", r.store_failures},
                   {"store_refused", r.store_refused},
                   {"resumed_blobs", r.resumed_blobs},
                   {"resumed_bytes", r.resumed_bytes},
                   {"restored_blobs", r.restored_blobs},
                   {"restored_bytes", r.restored_bytes},
                   {"fetched_bytes", r.fetched_bytes},
                   {"fill_bytes", r.fill_bytes},
                   {"storage_reattached", r.storage_reattached},
                   {"log", r.recovery_log}};
  if (r.durable_log_bytes > 0 || r.durable_write_bytes > 0 || r.durable_restore_s > 0) {
    j["durable"] = {{"log_bytes", r.durable_log_bytes},
                    {"image_bytes", r.durable_image_bytes},
                    {"write_bytes", r.durable_write_bytes},
                    {"restore_s", r.durable_restore_s}};
  }
  if (r.retention_runs > 0) {
    j["retention"] = {{"runs", r.retention_runs},
                      {"removed_objects", r.retention_removed_objects},
                      {"removed_bytes", r.retention_removed_bytes},
                      {"store_bytes", r.retention_store_bytes},
                      {"kept", r.retention_kept},
                      {"error", r.retention_error}};
  }
  if (!r.catch_up.empty()) j["catch_up"] = r.catch_up;
  if (!r.declared_dead.empty()) j["declared_dead"] = r.declared_dead;
  if (!r.readmitted.empty()) j["readmitted"] = r.readmitted;
  if (r.full_frames_served > 0) j["full_frames_served"] = r.full_frames_served;
  return j.dump(1);
}

StatusOr<NodeResult> NodeResultFromJson(const std::string& text) {
  NodeResult r;
  try {
    auto j = nlohmann::json::parse(text);
    r.rank = j.at("rank").get<int>();
    r.role = j.at("role").get<std::string>();
    r.pid = j.value("pid", int64_t{0});
    r.ok = j.at("ok").get<bool>();
    r.error = j.at("error").get<std::string>();
    r.t_start = j.at("t_start").get<double>();
    r.t_first_blob = j.at("t_first_blob").get<double>();
    r.t_last_blob = j.at("t_last_blob").get<double>();
    r.t_commit = j.at("t_commit").get<double>();
    r.apply_seconds = j.at("apply_seconds").get<double>();
    r.bytes_sent = j.at("bytes_sent").get<uint64_t>();
    r.bytes_sent_long = j.at("bytes_sent_long").get<uint64_t>();
    r.bytes_received = j.at("bytes_received").get<uint64_t>();
    r.payload_bytes = j.at("payload_bytes").get<uint64_t>();
    r.dense_bytes = j.at("dense_bytes").get<uint64_t>();
    r.blobs = j.at("blobs").get<uint64_t>();
    r.receivers_committed = j.at("receivers_committed").get<int>();
    if (j.contains("reports")) {
      for (const auto& c : j["reports"]) {
        DCR_ASSIGN_OR_RETURN(CommitReport rep, CommitReportFromJson(c));
        r.reports.push_back(std::move(rep));
      }
    }
    if (j.contains("target_hash")) {
      DCR_ASSIGN_OR_RETURN(r.target_hash, HashFromHex(j["target_hash"].get<std::string>()));
    }
    r.commitment = j.value("commitment", std::string());
    if (j.contains("commitment_pass")) {
      const auto& c = j["commitment_pass"];
      r.commitment_leaves = c.value("leaves", uint64_t{0});
      r.commitment_tail_leaves = c.value("tail_leaves", uint64_t{0});
      r.commitment_tail_seconds = c.value("tail_seconds", 0.0);
    }
    r.trainer_delta = j.value("trainer_delta", false);
    r.delta_base_version = j.value("delta_base_version", int64_t{-1});
    r.trainer_delta_skipped = j.value("trainer_delta_skipped", std::string());
    r.verified = j.at("verified").get<bool>();
    r.verify_message = j.at("verify_message").get<std::string>();
    if (j.contains("freeze")) r.freeze = j["freeze"].get<std::string>();
    if (j.contains("edge")) {
      const auto& e = j["edge"];
      r.edge_chunks = e.value("chunks", uint64_t{0});
      r.edge_context_bytes = e.value("context_bytes", uint64_t{0});
      r.edge_plain_bytes = e.value("plain_bytes", uint64_t{0});
      r.edge_cpu_seconds = e.value("cpu_seconds", 0.0);
    }
    if (j.contains("edge_switches")) {
      for (const auto& e : j["edge_switches"]) {
        NodeResult::EdgeSwitch sw;
        sw.child = e.value("child", 0);
        sw.lag_bytes = e.value("lag_bytes", uint64_t{0});
        sw.plain_chunks = e.value("plain_chunks", uint64_t{0});
        sw.resumed = e.contains("resume_bytes");
        sw.resume_bytes = e.value("resume_bytes", uint64_t{0});
        sw.context_chunks = e.value("context_chunks", uint64_t{0});
        r.edge_switches.push_back(sw);
      }
    }
    if (j.contains("recovery")) {
      const auto& v = j["recovery"];
      r.starts = v.value("starts", 1);
      r.recoveries = v.value("recoveries", 0);
      r.fallbacks = v.value("fallbacks", uint64_t{0});
      r.reloads = v.value("reloads", uint64_t{0});
      r.overwrite_repairs = v.value("overwrite_repairs", uint64_t{0});
      r.chunks_skipped = v.value("chunks_skipped", uint64_t{0});
      r.mirror_puts = v.value("mirror_puts", uint64_t{0});
      r.mirror_put_failures = v.value("mirror_put_failures", uint64_t{0});
      r.store_failures = v.value("store_failures", uint64_t{0});
      r.store_refused = v.value("store_refused", uint64_t{0});
      r.resumed_blobs = v.value("resumed_blobs", uint64_t{0});
      r.resumed_bytes = v.value("resumed_bytes", uint64_t{0});
      r.restored_blobs = v.value("restored_blobs", uint64_t{0});
      r.restored_bytes = v.value("restored_bytes", uint64_t{0});
      r.fetched_bytes = v.value("fetched_bytes", uint64_t{0});
      r.fill_bytes = v.value("fill_bytes", uint64_t{0});
      r.storage_reattached = v.value("storage_reattached", false);
      r.recovery_log = v.value("log", std::string());
    }
    if (j.contains("durable")) {
      const auto& v = j["durable"];
      r.durable_log_bytes = v.value("log_bytes", uint64_t{0});
      r.durable_image_bytes = v.value("image_bytes", uint64_t{0});
      r.durable_write_bytes = v.value("write_bytes", uint64_t{0});
      r.durable_restore_s = v.value("restore_s", 0.0);
    }
    if (j.contains("retention")) {
      const auto& v = j["retention"];
      r.retention_runs = v.value("runs", 0);
      r.retention_removed_objects = v.value("removed_objects", uint64_t{0});
      r.retention_removed_bytes = v.value("removed_bytes", uint64_t{0});
      r.retention_store_bytes = v.value("store_bytes", uint64_t{0});
      r.retention_kept = v.value("kept", std::string());
      r.retention_error = v.value("error", std::string());
    }
    r.catch_up = j.value("catch_up", std::string());
    if (j.contains("declared_dead")) {
      r.declared_dead = j["declared_dead"].get<std::vector<std::string>>();
    }
    if (j.contains("readmitted")) r.readmitted = j["readmitted"].get<std::vector<int>>();
    r.full_frames_served = j.value("full_frames_served", 0);
  } catch (const std::exception& e) {
    return InvalidArgumentError(std::string("node result JSON: ") + e.what());
  }
  return r;
}

}  // namespace dcr
