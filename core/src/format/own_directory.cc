// A directory only its user can change (see internal/own_directory.h).
#include "internal/own_directory.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "dcr/status_macros.h"

namespace dcr::internal {

namespace {

Status MakeDirectory(const std::string& dir, bool make_parents) {
  if (make_parents) {
    const size_t slash = dir.find_last_of('/');
    if (slash != std::string::npos && slash > 0) {
      struct stat st;
      const std::string parent = dir.substr(0, slash);
      if (::stat(parent.c_str(), &st) != 0) {
        if (errno != ENOENT) return ErrnoError(parent, errno);
        DCR_RETURN_IF_ERROR(MakeDirectory(parent, true));
      }
    }
  }
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoError("mkdir " + dir, errno);
  }
  return Status();
}

}  // namespace

Status CheckOwnDirectory(const std::string& dir, std::string_view what, OthersMay others,
                         bool make_parents) {
  const std::string name = std::string(what) + " " + dir;
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0) {
    if (errno != ENOENT) return ErrnoError(name, errno);
    DCR_RETURN_IF_ERROR(MakeDirectory(dir, make_parents));
    if (::lstat(dir.c_str(), &st) != 0) return ErrnoError(name, errno);
  }
  if (!S_ISDIR(st.st_mode)) {
    return FailedPreconditionError(name +
                                   ": not a directory (a symlink or another file); refusing it");
  }
  char mode[8];
  std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
  const std::string found =
      name + ": owner uid " + std::to_string(st.st_uid) + ", mode " + mode + ": ";
  const uid_t me = ::geteuid();
  if (st.st_uid != me) {
    return FailedPreconditionError(found + "owned by another user, not by this user (uid " +
                                   std::to_string(me) + "); refusing its contents");
  }
  if (others == OthersMay::kNothing && (st.st_mode & 066) != 0) {
    return FailedPreconditionError(found +
                                   "lets other users read or write it; it must be private "
                                   "(mode 0700): refusing to read or write anything in it");
  }
  if ((st.st_mode & 022) != 0) {
    return FailedPreconditionError(found + "lets other users write into it; chmod go-w it first");
  }
  return Status();
}

}  // namespace dcr::internal
