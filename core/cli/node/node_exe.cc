// NodeExe (node_exe.h).
#include "node/node_exe.h"

#include <unistd.h>

#include <cerrno>
#include <string>

#include "dcr/status.h"

namespace dcr::cli {

namespace {

// The executable `name` beside the running binary. kNotFound if it is not there.
StatusOr<std::string> ExeBeside(const std::string& name) {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ErrnoError("readlink /proc/self/exe", errno);
  buf[n] = '\0';
  std::string exe(buf);
  const size_t slash = exe.rfind('/');
  std::string node =
      (slash == std::string::npos ? std::string(".") : exe.substr(0, slash)) + "/" + name;
  if (access(node.c_str(), X_OK) != 0) {
    return NotFoundError(name + " not found beside " + exe + " (build the " + name + " target)");
  }
  return node;
}

}  // namespace

StatusOr<std::string> NodeExe() { return ExeBeside("dcr-node"); }

StatusOr<std::string> NodeExe(const NodePlan& plan) {
  return ExeBeside(PlanAsksForFaults(plan) ? "dcr-node-faults" : "dcr-node");
}

}  // namespace dcr::cli
