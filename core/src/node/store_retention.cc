#include "node/store_retention.h"

#include "dcr/object_store.h"
#include "dcr/signing.h"
#include "dcr/status_macros.h"
#include "node/metrics.h"

namespace dcr::internal {

std::string VersionsRoot(const NodePlan& plan) {
  std::vector<std::string> prefixes;
  for (const NodeVersion& v : plan.versions) {
    prefixes.push_back(v.prefix.empty() ? plan.relay.prefix : v.prefix);
  }
  if (prefixes.empty()) prefixes.push_back(plan.relay.prefix);
  // Each prefix's directory ("a/b/step-1" -> "a/b"), then their common '/'-bounded prefix.
  std::string root = prefixes[0].substr(
      0, prefixes[0].rfind('/') == std::string::npos ? 0 : prefixes[0].rfind('/'));
  for (const std::string& p : prefixes) {
    while (!root.empty() && p.compare(0, root.size() + 1, root + "/") != 0) {
      const size_t slash = root.rfind('/');
      root = slash == std::string::npos ? "" : root.substr(0, slash);
    }
  }
  return root;
}

Status CollectAfterVersion(const NodePlan& plan, uint64_t committed, NodeResult* result) {
  RetentionOptions o;
  o.root = VersionsRoot(plan);
  o.keep_versions = plan.retain_versions;
  o.budget_bytes = plan.retain_budget_bytes;
  o.committed = committed;
  ++result->retention_runs;
  if (o.root.empty()) {
    Status s = FailedPreconditionError(
        "retention: the versions' store prefixes share no common prefix; not collecting (it "
        "would reach beyond this run's objects)");
    result->retention_error = s.ToString();
    return s;
  }
  if (!plan.signing_key.empty()) {
    // The trainer's own versions only: what it signed for this deployment.
    auto key = SigningKey::Load(plan.signing_key);
    if (!key.ok()) {
      result->retention_error = key.status().ToString();
      return key.status();
    }
    auto trust = TrustKey::FromRaw((*key)->public_key());
    if (!trust.ok()) {
      result->retention_error = trust.status().ToString();
      return trust.status();
    }
    o.trust = *trust;
    o.run_id = plan.run_id;
  }
  auto store = OpenObjectStore(plan.store);
  if (!store.ok()) {
    result->retention_error = store.status().ToString();
    return store.status();
  }
  RetentionReport rep;
  Status s = CollectStore(store->get(), o, &rep);
  result->retention_removed_objects = rep.removed_objects;
  result->retention_removed_bytes = rep.removed_bytes;
  result->retention_store_bytes = rep.bytes_after;
  result->retention_kept.clear();
  for (const RetainedVersion& v : rep.versions) {
    if (v.decision == "removed") continue;
    if (!result->retention_kept.empty()) result->retention_kept += ", ";
    result->retention_kept += "v" + std::to_string(v.target) + " " + v.decision;
  }
  result->retention_error = s.ok() ? "" : s.ToString();
  MetricsBoard::Process().AddCollection(rep.removed_objects, rep.removed_bytes,
                                        s.code() == StatusCode::kResourceExhausted,
                                        rep.bytes_after);
  return s;
}

}  // namespace dcr::internal
