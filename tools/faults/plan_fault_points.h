// The fault points of a node's plan (NodePlan::fault_kill_chunk, fault_kill_inside,
// fault_kill_blob, fault_kill_log_step): the process SIGKILLs itself where the plan says, on its
// first start only.
// Linked only into dcr-node-faults, the test build of the node that `dcr run`'s fault runners and
// the fault tests start; the deployed dcr-node carries none of it (tests/layout/link_test.sh).
//
// Thread safety: as FaultPoints (core/src/node/fault_points.h).
#ifndef DCR_TOOLS_FAULTS_PLAN_FAULT_POINTS_H_
#define DCR_TOOLS_FAULTS_PLAN_FAULT_POINTS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "node/fault_points.h"

namespace dcr::faults {

class PlanFaultPoints : public internal::FaultPoints {
 public:
  void Arm(const NodePlan& plan, int starts) override;
  std::unique_ptr<Receiver> ChunkLayer(Receiver* inner, bool inside) override;
  void BlobReached(uint64_t blob) override;
  void LogStep(internal::VersionLogStep step) override;
  // A chunk application of 0-based ordinal `ordinal` returned in a layer (ChunkLayer's
  // `inside`): the process ends when the plan's fault_kill_chunk and fault_kill_inside say so.
  void ChunkApplied(int64_t ordinal, bool inside);

 private:
  std::mutex mu_;
  std::string kill_log_step_;  // guarded by mu_
  std::atomic<int64_t> kill_chunk_{-1};
  std::atomic<bool> kill_inside_{false};
  std::atomic<int64_t> kill_blob_{-1};
};

// Installs one PlanFaultPoints for the process (InstallFaultPoints). Idempotent.
void InstallPlanFaultPoints();

}  // namespace dcr::faults

#endif  // DCR_TOOLS_FAULTS_PLAN_FAULT_POINTS_H_
