// dcr_publisher_open_scenario (dcr/publisher_c.h): the trainer-side sender of a multi-host run,
// its plan made from a YAML scenario. In dcr::publisher_scenario, beside the YAML parser, so that
// the trainer-side library dcr::publisher links none: the plan is dcr::plans' HostPlan, the
// handle dcr::publisher's (publisher/publisher_open.h).
#include <string>

#include "dcr/node.h"
#include "dcr/publisher_c.h"
#include "dcr/scenario.h"
#include "dcr/status.h"
#include "dcr/status_macros.h"
#include "dcr/statusor.h"
#include "node_plans.h"
#include "publisher/publisher_open.h"

extern "C" int dcr_publisher_open_scenario(const char* scenario_path, int rank,
                                           const char* base_path, const char* state_dir,
                                           const char* work_dir, dcr_publisher** out) {
  auto make_plan = [&]() -> dcr::StatusOr<dcr::NodePlan> {
    if (scenario_path == nullptr || work_dir == nullptr) {
      return dcr::InvalidArgumentError("scenario_path and work_dir are required");
    }
    if (rank != 0) {
      return dcr::InvalidArgumentError(
          "rank " + std::to_string(rank) +
          " is a receiver of the run; the publisher is the sender, rank 0 (start receivers with "
          "dcr-node SCENARIO --rank R)");
    }
    DCR_ASSIGN_OR_RETURN(dcr::Scenario s, dcr::LoadScenario(scenario_path));
    dcr::HostPlanOptions o;
    o.base = base_path != nullptr ? base_path : "";
    o.state_dir = state_dir != nullptr ? state_dir : "";
    o.work_dir = work_dir;
    // The same store prefixes, run id and result files as `dcr-node SCENARIO --rank R` makes.
    dcr::StatusOr<dcr::NodePlan> plan = dcr::HostPlan(s, rank, o);
    if (!plan.ok()) return plan.status().WithContext(scenario_path);
    return plan;
  };
  return dcr::internal::OpenPublisher(make_plan, work_dir, "dcr_publisher_open_scenario", out);
}
