// PlanFaultPoints (plan_fault_points.h).
#include "plan_fault_points.h"

#include <signal.h>

namespace dcr::faults {

void PlanFaultPoints::Arm(const NodePlan& plan, int starts) {
  const bool first = starts == 1;
  kill_chunk_ = first ? plan.fault_kill_chunk : -1;
  kill_inside_ = first && plan.fault_kill_inside;
  kill_blob_ = first ? plan.fault_kill_blob : -1;
  std::lock_guard<std::mutex> l(mu_);
  kill_log_step_ = first ? plan.fault_kill_log_step : std::string();
}

void PlanFaultPoints::LogStep(internal::VersionLogStep step) {
  std::lock_guard<std::mutex> l(mu_);
  if (!kill_log_step_.empty() && kill_log_step_ == internal::VersionLogStepName(step)) {
    ::raise(SIGKILL);
  }
}

void PlanFaultPoints::ChunkApplied(int64_t ordinal, bool inside) {
  if (ordinal == kill_chunk_.load() && inside == kill_inside_.load()) ::raise(SIGKILL);
}

void PlanFaultPoints::BlobReached(uint64_t blob) {
  const int64_t at = kill_blob_.load();
  if (at >= 0 && blob >= static_cast<uint64_t>(at)) ::raise(SIGKILL);
}

void InstallPlanFaultPoints() {
  static PlanFaultPoints points;
  internal::InstallFaultPoints(&points);
}

}  // namespace dcr::faults
