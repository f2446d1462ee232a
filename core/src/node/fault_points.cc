// The installed fault points (fault_points.h) and the plan check of dcr/node.h.
#include "node/fault_points.h"

#include <atomic>

namespace dcr {
namespace internal {
namespace {

std::atomic<FaultPoints*> g_fault_points{nullptr};

}  // namespace

FaultPoints* InstalledFaultPoints() { return g_fault_points.load(std::memory_order_acquire); }

void InstallFaultPoints(FaultPoints* points) {
  g_fault_points.store(points, std::memory_order_release);
}

}  // namespace internal

bool PlanAsksForFaults(const NodePlan& plan) {
  return plan.fault_kill_chunk >= 0 || plan.fault_kill_blob >= 0 ||
         !plan.fault_kill_log_step.empty();
}

}  // namespace dcr
