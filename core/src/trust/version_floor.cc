// VersionFloor: the highest committed version, in a small file rewritten atomically.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>

#include "dcr/signing.h"
#include "dcr/status_macros.h"
#include "internal/atomic_file.h"

namespace dcr {

StatusOr<VersionFloor> VersionFloor::Load(const std::string& path, uint64_t deployment) {
  VersionFloor f;
  f.path_ = path;
  f.deployment_ = deployment;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    if (errno == ENOENT) return f;
    return ErrnoError("open version floor " + path, errno);
  }
  char buf[512];
  ssize_t n;
  do {
    n = ::read(fd, buf, sizeof(buf) - 1);
  } while (n < 0 && errno == EINTR);
  const int err = errno;
  ::close(fd);
  if (n < 0) return ErrnoError("read version floor " + path, err);
  buf[n] = '\0';
  unsigned long long version = 0, owner = 0;
  double when = 0;
  int magic = 0;
  const bool parsed =
      std::sscanf(buf, "dcr-version-floor %d\n", &magic) == 1 &&
      ((magic == 2 && std::sscanf(buf,
                                  "dcr-version-floor 2\ndeployment %16llx\nversion %llu\n"
                                  "committed_unix %lf\n",
                                  &owner, &version, &when) == 3) ||
       (magic == 1 && std::sscanf(buf, "dcr-version-floor 1\nversion %llu\ncommitted_unix %lf\n",
                                  &version, &when) == 2));
  if (!parsed) {
    return DataLossError("version floor " + path +
                         " does not parse (expected 'dcr-version-floor 2', 'deployment ID', "
                         "'version N', 'committed_unix T')");
  }
  if (deployment != 0 && owner != deployment) {
    f.other_deployment_ = true;  // a fresh start: nothing of this deployment was committed here
    return f;
  }
  f.deployment_ = owner;
  f.version_ = version;
  f.committed_unix_ = when;
  return f;
}

Status VersionFloor::Check(uint64_t target_version) const {
  if (target_version < version_) {
    return FailedPreconditionError(
        "rollback refused: the delta targets version " + std::to_string(target_version) +
        ", below version " + std::to_string(version_) +
        " that this receiver committed (a deliberate rollback is published as a new, higher "
        "version)");
  }
  return Status();
}

Status VersionFloor::Record(uint64_t version, double now_unix) {
  if (version < version_) return Check(version);
  if (path_.empty()) return InvalidArgumentError("version floor without a file");
  char text[160];
  std::snprintf(text, sizeof(text),
                "dcr-version-floor 2\ndeployment %016" PRIx64 "\nversion %" PRIu64
                "\ncommitted_unix %.3f\n",
                deployment_, version, now_unix);
  DCR_ASSIGN_OR_RETURN(auto file, internal::AtomicFile::Create(path_));
  DCR_RETURN_IF_ERROR(file->Write(text, std::strlen(text)));
  DCR_RETURN_IF_ERROR(file->Commit());
  version_ = version;
  committed_unix_ = now_unix;
  return Status();
}

std::string VersionFloor::FreezeReport(double now_unix, double limit_s, double since_unix) const {
  if (limit_s <= 0) return "";
  const double since = committed_unix_ > 0 ? committed_unix_ : since_unix;
  if (since <= 0 || now_unix - since <= limit_s) return "";
  char buf[256];
  if (committed_unix_ > 0) {
    std::snprintf(buf, sizeof(buf),
                  "freeze: no new version for %.0f s (limit %.0f s); the last committed is "
                  "version %" PRIu64,
                  now_unix - since, limit_s, version_);
  } else {
    std::snprintf(buf, sizeof(buf),
                  "freeze: no version committed in %.0f s of waiting (limit %.0f s)",
                  now_unix - since, limit_s);
  }
  return buf;
}

}  // namespace dcr
