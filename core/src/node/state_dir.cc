// A node's own state directory and the version floor in it (see state_dir.h).
#include "node/state_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "dcr/signing.h"
#include "dcr/status_macros.h"
#include "internal/own_directory.h"

namespace dcr::internal {

std::string DeploymentStateDir(const std::string& root, uint64_t run_id) {
  char id[40];
  std::snprintf(id, sizeof(id), "/deployment-%016llx", static_cast<unsigned long long>(run_id));
  return root + id;
}

Status OpenStateDir(const std::string& dir) {
  const size_t slash = dir.rfind('/');
  if (slash != std::string::npos && slash > 0 && dir.compare(slash + 1, 11, "deployment-") == 0) {
    DCR_RETURN_IF_ERROR(OpenStateDir(dir.substr(0, slash)));
  }
  return CheckOwnDirectory(dir, "state directory", OthersMay::kNothing);
}

std::string StateFloorPath(const std::string& dir, int rank) {
  return dir + "/rank-" + std::to_string(rank) + ".floor";
}

Status OpenStateFloor(const std::string& dir, int rank, bool fresh, uint64_t run_id) {
  const std::string path = StateFloorPath(dir, rank);
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) return ErrnoError("version floor " + path, errno);
    if (!fresh) {
      return FailedPreconditionError(
          "version floor " + path + " is missing, but state directory " + dir +
          " records earlier starts of rank " + std::to_string(rank) +
          ": refusing to start over (a missing floor would accept a rollback; a fresh "
          "deployment starts from a fresh state directory)");
    }
    DCR_ASSIGN_OR_RETURN(VersionFloor floor, VersionFloor::Load(path, run_id));
    return floor.Record(0, 0);
  }
  return VersionFloor::Load(path, run_id).status();
}

}  // namespace dcr::internal
