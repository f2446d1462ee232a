// The node executables beside the running binary: what `dcr node` and `dcr run` start.
//
// Thread safety: pure functions of the file system.
#ifndef DCR_CORE_CLI_NODE_NODE_EXE_H_
#define DCR_CORE_CLI_NODE_NODE_EXE_H_

#include <string>

#include "dcr/node.h"
#include "dcr/statusor.h"

namespace dcr::cli {

// The dcr-node executable beside the running binary (/proc/self/exe's directory). kNotFound if
// it is not there or not executable.
StatusOr<std::string> NodeExe();
// The executable that runs `plan`: dcr-node-faults, the test build of the node, beside the
// running binary for a plan that asks for fault points (PlanAsksForFaults), else NodeExe().
// kNotFound as NodeExe.
StatusOr<std::string> NodeExe(const NodePlan& plan);

}  // namespace dcr::cli

#endif  // DCR_CORE_CLI_NODE_NODE_EXE_H_
