// A node's own state directory and the version floor in it (see state_dir.h).
#include "node/state_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "dcr/checkpoint.h"
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

StatusOr<uint64_t> NextPublishedVersion(const std::string& dir, uint64_t run_id) {
  const std::string path = dir + "/rank-0.published";
  uint64_t last = 0;
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    DCR_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadFile(path));
    const std::string text(bytes.begin(), bytes.end());
    unsigned long long owner = 0, version = 0;
    int end = 0;
    if (!S_ISREG(st.st_mode) || text.size() > 256 ||
        std::sscanf(text.c_str(), "dcr-published 1\ndeployment %16llx\nversion %llu\n%n", &owner,
                    &version, &end) != 2 ||
        static_cast<size_t>(end) != text.size()) {
      return DataLossError("published versions " + path +
                           " does not parse (expected 'dcr-published 1', 'deployment ID', "
                           "'version N')");
    }
    if (owner != run_id) {
      char want[20];
      std::snprintf(want, sizeof(want), "%016llx", static_cast<unsigned long long>(run_id));
      return FailedPreconditionError("published versions " + path +
                                     " belong to another deployment than " + want);
    }
    last = version;
  } else if (errno != ENOENT) {
    return ErrnoError("published versions " + path, errno);
  }
  if (last == UINT64_MAX) return DataLossError("published versions " + path + ": no next version");
  const uint64_t next = last + 1;
  char text[96];
  const int n =
      std::snprintf(text, sizeof(text), "dcr-published 1\ndeployment %016llx\nversion %llu\n",
                    static_cast<unsigned long long>(run_id), static_cast<unsigned long long>(next));
  DCR_RETURN_IF_ERROR(WriteFileAtomic(path, text, static_cast<size_t>(n)));
  return next;
}

Status OpenOneRefitFloor(const std::string& dir, int rank, uint64_t run_id) {
  const std::string started = dir + "/rank-" + std::to_string(rank) + ".started";
  struct stat st;
  bool fresh = false;
  if (::lstat(started.c_str(), &st) != 0) {
    if (errno != ENOENT) return ErrnoError(started, errno);
    fresh = true;
  }
  DCR_RETURN_IF_ERROR(OpenStateFloor(dir, rank, fresh, run_id));
  if (fresh) DCR_RETURN_IF_ERROR(WriteFileAtomic(started, "", 0));
  return Status();
}

}  // namespace dcr::internal
