// A node's own state directory and the version floor in it (see state_dir.h).
#include "node/state_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "dcr/signing.h"
#include "dcr/status_macros.h"

namespace dcr::internal {

namespace {

std::string Octal(mode_t mode) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

}  // namespace

std::string DeploymentStateDir(const std::string& root, uint64_t run_id) {
  char id[40];
  std::snprintf(id, sizeof(id), "/deployment-%016llx", static_cast<unsigned long long>(run_id));
  return root + id;
}

Status OpenStateDir(const std::string& dir) {
  const size_t slash = dir.rfind('/');
  if (slash != std::string::npos && slash > 0 &&
      dir.compare(slash + 1, 11, "deployment-") == 0) {
    DCR_RETURN_IF_ERROR(OpenStateDir(dir.substr(0, slash)));
  }
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoError("state directory: mkdir " + dir, errno);
  }
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0) return ErrnoError("state directory " + dir, errno);
  if (!S_ISDIR(st.st_mode)) {
    return FailedPreconditionError("state directory " + dir +
                                   ": not a directory (a symlink or another file); refusing it");
  }
  const uid_t me = ::geteuid();
  const mode_t others = S_IRGRP | S_IWGRP | S_IROTH | S_IWOTH;
  if (st.st_uid != me || (st.st_mode & others) != 0) {
    return FailedPreconditionError(
        "state directory " + dir + ": owner uid " + std::to_string(st.st_uid) + ", mode " +
        Octal(st.st_mode) + "; a node's state must be owned by its user (uid " +
        std::to_string(me) +
        ") and neither readable nor writable by group or others (mode 0700): refusing to "
        "resume from or write to it");
  }
  return Status();
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
