// Compiled into dcr-node-faults only: installs the plan's fault points (plan_fault_points.h)
// before main, so that the node's main runs plans with fault points unchanged.
#include "plan_fault_points.h"

namespace {

[[maybe_unused]] const bool kInstalled = [] {
  dcr::faults::InstallPlanFaultPoints();
  return true;
}();

}  // namespace
