// Versions over time in a real long-lived `dcr run` (the scenario's `catch_up:` block): the region
// receivers it adds to the node set (a receiver down for some versions, a late joiner), the
// process actions that take them down and bring them in, and what their results say per step.
// Used by run_real.cc; see core/docs/fault-tolerance.md, "Catch-up and late joiners".
//
// Thread safety: pure functions over plans and results.
#ifndef DCR_CORE_CLI_RUN_CATCH_UP_H_
#define DCR_CORE_CLI_RUN_CATCH_UP_H_

#include <set>
#include <string>
#include <vector>

#include "dcr/node.h"
#include "dcr/scenario.h"
#include "dcr/status.h"

namespace dcr::cli {

// Something the runner does to node `rank` once the start signal of step `step` is given and
// `after_file` (when set) exists: start it (its first start), kill it (SIGKILL; it stays down,
// not restarted by supervision), or start it again (a restart with its plan).
struct StepAction {
  enum Kind { kStart, kKill, kRestart };
  Kind kind = kStart;
  int rank = 0;
  int step = 1;
  std::string after_file;
  bool done = false;
};

// For a scenario with a `catch_up:` block, a relay tree and the delta method: an in-region
// directory store `region_dir` that the sender's children fill (mirror_to_store; the first that
// applies also serves full frames), the sender's per-receiver deadline, and one region receiver
// plan (rank after the tree's) per key set, with the actions that kill, restart or start it.
// `plans` already have their versions. Nothing changes without a `catch_up:` block. Errors:
// kInvalidArgument when the run is not a long-lived relay-tree delta run, or no child of the
// sender applies the stream.
Status AddCatchUpNodes(const Scenario& s, TransportKind transport, Method method,
                       const std::string& run_dir, const std::string& region_dir,
                       std::vector<NodePlan>* plans, std::vector<StepAction>* actions);

// A region receiver's ReceiverResult at one step, from its result `r` (`have_result` false: it
// wrote none for this version, e.g. not yet started) and the sender's result `sender` of that
// version. Returns whether it counts towards the step's commit: not when it was absent (not yet
// joined, passed over by a full frame, down), nor while the sender counts it dead (declared
// dead at this version or before and not re-admitted: it no longer holds the baseline back; its
// own verification still counts).
// `dead`: the region ranks the sender counts out of the joint commit (late joiners until their
// first re-admission), updated here from the sender's declarations and re-admissions of this
// version (steps are collected in order).
bool CollectRegionReceiver(const NodeResult& sender, const NodeResult& r, bool have_result,
                           std::set<int>* dead, ReceiverResult* rec);

// The step's catch-up events: the sender's declarations and re-admissions, and the region
// receivers that replayed a retained delta or loaded a full frame (`results` in plan order,
// [0] the sender).
std::vector<CatchUpEvent> StepCatchUpEvents(const std::vector<NodePlan>& plans,
                                            const std::vector<NodeResult>& results);

}  // namespace dcr::cli

#endif  // DCR_CORE_CLI_RUN_CATCH_UP_H_
