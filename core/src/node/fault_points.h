// The seam of a node's fault points (NodePlan::fault_kill_chunk, fault_kill_inside,
// fault_kill_blob; core/docs/fault-tolerance.md): the places where a fault test ends a node's
// process. The node calls the installed FaultPoints at each; the deployed dcr-node installs none,
// and RunNode refuses a plan that asks for fault points there (PlanAsksForFaults), naming
// dcr-node-faults, the test build whose faults library (tools/faults) installs them before main.
//
// Thread safety: InstallFaultPoints before any node runs; InstalledFaultPoints from any thread.
// An implementation's Arm is called from a node's event thread before its receiver applies
// anything; ChunkLayer from the thread that opens a node's receiver; BlobReached from its event
// thread; its chunk layers are called as receiver.h says (ApplyRecord concurrently for distinct
// chunks).
#ifndef DCR_CORE_SRC_NODE_FAULT_POINTS_H_
#define DCR_CORE_SRC_NODE_FAULT_POINTS_H_

#include <cstdint>
#include <memory>

#include "dcr/node.h"
#include "dcr/receiver.h"
#include "receivers/version_log.h"

namespace dcr::internal {

class FaultPoints {
 public:
  virtual ~FaultPoints() = default;
  // A node of `plan` sets up; `starts` is its start count (1 = first start). Fault points apply
  // to the first start only.
  virtual void Arm(const NodePlan& plan, int starts) = 0;
  // A layer of a recovering delta receiver (node_recovery.h DurableReceiver) over `inner`, which
  // is not owned and outlives the layer: it forwards every call to `inner` and may end the
  // process when a chunk application returns (the 0-based ordinal of the ApplyRecord calls the
  // layer saw). `inside`: the layer is under the journal (a chunk's return there is after the
  // journal's Begin record and the chunk's writes, before its End record); else over it.
  virtual std::unique_ptr<Receiver> ChunkLayer(Receiver* inner, bool inside) = 0;
  // A relay holds blob `blob` whole, or the sender first sends (or puts) blob `blob`.
  virtual void BlobReached(uint64_t blob) = 0;
  // A durable receiver's version log reached `step` of a commit (receivers/version_log.h), from
  // the thread that commits. Default: nothing.
  virtual void LogStep(VersionLogStep step) { (void)step; }
};

// The process's fault points; null when none are installed (the deployed dcr-node).
FaultPoints* InstalledFaultPoints();
// Installs `points` for the process. REQUIRES: called before any node runs; `points` outlives
// every node.
void InstallFaultPoints(FaultPoints* points);

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_NODE_FAULT_POINTS_H_
