// Internal: the sender's retention of its store in a long-lived run (NodePlan::retain_versions):
// after each version's commit, CollectStore (dcr/retention.h) over the versions' common prefix.
//
// Thread safety: self-contained.
#ifndef DCR_CORE_SRC_NODE_STORE_RETENTION_H_
#define DCR_CORE_SRC_NODE_STORE_RETENTION_H_

#include <cstdint>
#include <string>

#include "dcr/node.h"
#include "dcr/retention.h"
#include "dcr/status.h"

namespace dcr::internal {

// The longest '/'-bounded prefix shared by every version prefix of `plan` (plan.relay.prefix
// for a version without one): "run/step-1", "run/step-2" share "run". "" when they share none.
std::string VersionsRoot(const NodePlan& plan);

// Collects plan.store after version `committed` was committed (every live receiver holds it):
// keeps plan.retain_versions versions within plan.retain_budget_bytes under VersionsRoot(plan),
// and records the outcome in `result` (its retention_* fields) and on the process's metrics
// board. Errors: kFailedPrecondition when the versions share no prefix (the collection would
// reach beyond this run's objects); the store's; kResourceExhausted when the budget cannot be
// met without removing what is needed (nothing needed is removed).
Status CollectAfterVersion(const NodePlan& plan, uint64_t committed, NodeResult* result);

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_NODE_STORE_RETENTION_H_
