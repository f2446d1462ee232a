#include "run_catch_up.h"

#include <filesystem>

#include "dcr/commitment.h"
#include "dcr/status_macros.h"
#include "transport/tls.h"

namespace dcr::cli {

Status AddCatchUpNodes(const Scenario& s, TransportKind transport, Method method,
                       const std::string& run_dir, const std::string& region_dir,
                       std::vector<NodePlan>* plans, std::vector<StepAction>* actions) {
  const CatchUpSpec& cu = s.catch_up;
  if (!cu.enabled) return Status();
  if (transport != TransportKind::kRelayTree || method != Method::kDelta || s.steps < 2) {
    return InvalidArgumentError(
        "catch_up: needs a long-lived relay-tree delta run (steps >= 2, transport relay_tree, "
        "method delta): its region receivers follow what the long-link relay puts in the "
        "in-region store");
  }
  std::error_code ec;
  std::filesystem::remove_all(region_dir, ec);
  std::filesystem::create_directories(region_dir, ec);
  if (ec) return InternalError("creating " + region_dir + ": " + ec.message());
  const std::string store = "dir:" + region_dir;
  int server = -1;
  for (NodePlan& p : *plans) {
    if (p.rank == 0 || p.parents[p.rank] != 0) continue;
    p.store = store;
    p.mirror_to_store = true;
    if (server < 0 && p.relay.apply) {
      p.serve_full_frames = true;
      server = p.rank;
    }
  }
  if (server < 0) {
    return InvalidArgumentError(
        "catch_up: no child of the sender applies the stream, so none "
        "holds a version to serve full frames from");
  }
  (*plans)[0].store = store;
  (*plans)[0].receiver_deadline_s = s.receivers.deadline_s;
  const NodePlan model = (*plans)[server];
  auto add = [&](bool late) -> StatusOr<int> {
    NodePlan p = model;
    p.rank = static_cast<int>(plans->size());
    p.transport = "object_store";
    p.store = store;
    p.region_receiver = true;
    p.late_join = late;
    // Its own device (receivers.device: a region rank is named by no node_devices key), not the
    // holder's whose plan it copies.
    p.device = ReceiverDevice(s, p.rank);
    p.device_index = p.device == "cuda" ? DeviceIndexFor(s, ReceiverLocalIndex(s, p.rank)) : 0;
    p.catch_up_max_replay = cu.max_replay;
    p.catch_up_full_frame_fraction = cu.full_frame_fraction;
    p.mirror_to_store = false;
    p.serve_full_frames = false;
    p.ready_path.clear();
    p.go_path.clear();
    p.tls_links = false;  // no tree edge: the certificate signs its commit reports only
    p.metrics_address.clear();
    p.fault_kill_chunk = p.fault_kill_blob = -1;
    p.fault_kill_log_step.clear();
    if (late) p.receiver_base_path.clear();
    p.result_path = run_dir + "/node-" + std::to_string(p.rank) + ".json";
    if (!p.progress_path.empty()) {
      p.progress_path = run_dir + "/progress-" + std::to_string(p.rank) + ".json";
    }
    for (NodeVersion& v : p.versions) {
      v.result_path =
          run_dir + "/node-" + std::to_string(p.rank) + "-v" + std::to_string(v.version) + ".json";
    }
    if (!p.tls_ca.empty()) {
      // Its own certificate of the run (rank p.rank): the sender counts a report in the store
      // only when that rank signed it. The scenario's files name it ("{rank}"); a run whose
      // credentials dcr run generated mints it beside the others.
      const std::string rank = std::to_string(p.rank);
      if (s.network.tls.ca.empty()) {
        const std::string dir = run_dir + "/tls";
        const Status minted =
            internal::WriteExtraCredential(dir, "receiver", p.rank, "node-" + rank, 7);
        if (!minted.ok()) return minted.WithContext("catch_up: certificate of rank " + rank);
        p.tls_cert = dir + "/node-" + rank + ".crt";
        p.tls_key = dir + "/node-" + rank + ".key";
      } else {
        auto with_rank = [&](std::string f) {
          for (size_t at; (at = f.find("{rank}")) != std::string::npos;) f.replace(at, 6, rank);
          return f;
        };
        p.tls_cert = with_rank(s.network.tls.cert);
        p.tls_key = with_rank(s.network.tls.key);
      }
    }
    plans->push_back(p);
    return p.rank;
  };
  if (cu.down_step > 0) {
    DCR_ASSIGN_OR_RETURN(const int r, add(false));
    (*plans)[0].region_receivers.push_back(r);
    // Killed once it committed the version before down_step and that step starts; started
    // again when step down_step + down_versions starts (from its journal when the run recovers:
    // holding the version it committed last; else holding its base).
    const std::string committed_before = plans->back().versions[cu.down_step - 2].result_path;
    actions->push_back(StepAction{StepAction::kKill, r, cu.down_step, committed_before});
    actions->push_back(StepAction{StepAction::kRestart, r, cu.down_step + cu.down_versions, ""});
  }
  if (cu.join_step > 0) {
    DCR_ASSIGN_OR_RETURN(const int r, add(true));
    actions->push_back(StepAction{StepAction::kStart, r, cu.join_step, ""});
  }
  return Status();
}

namespace {

// The sender's declaration of `rank` dead at its version ("" when none).
std::string DeclaredDead(const NodeResult& sender, int rank) {
  const std::string tag = std::to_string(rank) + ": ";
  for (const std::string& d : sender.declared_dead) {
    if (d.rfind(tag, 0) == 0) return d.substr(tag.size());
  }
  return "";
}

}  // namespace

bool CollectRegionReceiver(const NodeResult& sender, const NodeResult& r, bool have_result,
                           std::set<int>* dead_ranks, ReceiverResult* rec) {
  rec->node = r.rank;
  rec->host = "in-region store";
  std::string dead = DeclaredDead(sender, r.rank);
  if (!dead.empty()) dead_ranks->insert(r.rank);
  for (int back : sender.readmitted) {
    if (back == r.rank) dead_ranks->erase(r.rank);
  }
  if (dead.empty() && dead_ranks->count(r.rank)) {
    dead = "declared dead at an earlier version, or not yet joined";
  }
  if (!have_result || r.catch_up == "absent") {
    rec->catch_up = "absent";
    rec->verify_message = have_result ? r.verify_message : "did not hold this version";
    if (!dead.empty()) rec->verify_message += "; declared dead by the sender (" + dead + ")";
    return false;
  }
  rec->catch_up = r.catch_up;
  rec->committed = r.ok && r.t_commit > 0;
  rec->verified = r.verified;
  rec->verify_message = r.ok ? r.verify_message : r.error;
  rec->commit_at_s = r.t_commit > 0 ? r.t_commit - sender.t_first_blob : 0;
  rec->bytes_received = r.bytes_received;
  std::string report_root;
  for (const CommitReport& c : sender.reports) {
    if (c.rank != r.rank) continue;
    rec->reported = true;
    rec->report_ok = c.ok;
    rec->report_version = c.version;
    rec->report_hash = c.target_hash.ToHex();
    rec->report_error = c.error;
    report_root = c.commitment ? CommitmentHex(*c.commitment) : std::string();
  }
  if (!dead.empty()) {
    rec->verify_message += "; counted out of the joint commit by the sender (" + dead + ")";
    return false;
  }
  // The commitment root the sender signed is the proof; unsigned, the content hash it published.
  const bool hash_ok = sender.commitment.empty() ? rec->report_hash == sender.target_hash.ToHex()
                                                 : report_root == sender.commitment;
  if (!(rec->reported && rec->report_ok && hash_ok)) rec->committed = false;
  return true;
}

std::vector<CatchUpEvent> StepCatchUpEvents(const std::vector<NodePlan>& plans,
                                            const std::vector<NodeResult>& results) {
  std::vector<CatchUpEvent> out;
  if (results.empty()) return out;
  const NodeResult& sender = results[0];
  for (const std::string& d : sender.declared_dead) {
    const size_t colon = d.find(": ");
    CatchUpEvent e;
    e.node = std::atoi(d.c_str());
    e.event = "declared_dead";
    e.detail = colon == std::string::npos ? d : d.substr(colon + 2);
    out.push_back(e);
  }
  for (size_t i = 1; i < plans.size() && i < results.size(); ++i) {
    const NodeResult& r = results[i];
    if (!plans[i].region_receiver || (r.catch_up != "replay" && r.catch_up != "full_frame")) {
      continue;
    }
    CatchUpEvent e;
    e.node = plans[i].rank;
    e.event = r.catch_up;
    e.detail = r.recovery_log;
    e.store_bytes = r.bytes_received;
    // A region receiver's only source is the in-region store: its plan has no tree edge and no
    // link to the sender, so it moves no byte over the long link (the step's long-link bytes,
    // wire_bytes, are the sender's stream to its children alone).
    e.long_link_bytes = 0;
    out.push_back(e);
  }
  for (int rank : sender.readmitted) {
    CatchUpEvent e;
    e.node = rank;
    e.event = "readmitted";
    e.detail = "its commit report of this version reached the sender within the deadline";
    out.push_back(e);
  }
  return out;
}

}  // namespace dcr::cli
