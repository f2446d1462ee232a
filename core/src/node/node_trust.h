// Internal: what a node plan says about signed deltas (dcr/signing.h), applied to a node's
// receiver: the trusted key, the run, the version floor, freeze reporting.
//
// Thread safety: free functions; the returned objects follow their own contracts.
#ifndef DCR_CORE_SRC_NODE_NODE_TRUST_H_
#define DCR_CORE_SRC_NODE_NODE_TRUST_H_

#include <memory>
#include <string>

#include "dcr/receiver.h"
#include "dcr/signing.h"
#include "dcr/statusor.h"
#include "dcr/transport.h"

namespace dcr::internal {

// `receiver` inside a TrustedReceiver for `plan`: trusting plan.trust_key (PEM) for plan.run_id
// when set, with the version floor of plan.version_floor_path (loaded into `*floor`, which must
// outlive the receiver) when set. Errors: those of TrustKey::Load and VersionFloor::Load, with
// the plan field named.
StatusOr<std::unique_ptr<Receiver>> WithPlanTrust(const NodePlan& plan,
                                                  std::unique_ptr<Receiver> receiver,
                                                  std::unique_ptr<VersionFloor>* floor);

// The freeze report of a receiver that committed nothing in this run (VersionFloor::FreezeReport
// with plan.freeze_after_s, waiting since `t_start_unix`); empty when freeze reporting is off or
// the limit was not passed. `floor` may be null (then only the waiting time counts).
std::string PlanFreezeReport(const NodePlan& plan, const VersionFloor* floor, double t_start_unix);

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_NODE_NODE_TRUST_H_
