#include "internal/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace dcr::internal {
namespace {

// The process umask without changing it (umask(2) sets as it reads: racy with other threads).
mode_t CurrentUmask() {
  FILE* f = std::fopen("/proc/self/status", "re");
  mode_t mask = 022;
  if (f == nullptr) return mask;
  char line[256];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    unsigned m = 0;
    if (std::sscanf(line, "Umask: %o", &m) == 1) {
      mask = static_cast<mode_t>(m);
      break;
    }
  }
  std::fclose(f);
  return mask;
}

}  // namespace

StatusOr<std::unique_ptr<AtomicFile>> AtomicFile::Create(const std::string& path,
                                                         const std::string& tmp_name_prefix) {
  std::string tmp;
  if (tmp_name_prefix.empty()) {
    tmp = path + ".tmp.XXXXXX";
  } else {
    size_t slash = path.find_last_of('/');
    std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
    std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
    tmp = dir + "/" + tmp_name_prefix + base + ".XXXXXX";
  }
  std::vector<char> name(tmp.begin(), tmp.end());
  name.push_back('\0');
  int fd = ::mkostemp(name.data(), O_CLOEXEC);
  if (fd < 0) return ErrnoError("create a temporary for " + path, errno);
  tmp.assign(name.data());
  struct stat st;
  mode_t mode = 0644 & ~CurrentUmask();
  if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) mode = st.st_mode & 0777;
  if (::fchmod(fd, mode) != 0) {
    int e = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    return ErrnoError("chmod " + tmp, e);
  }
  return std::unique_ptr<AtomicFile>(new AtomicFile(path, std::move(tmp), fd));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

Status AtomicFile::Write(const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd_, p, std::min<size_t>(size, size_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("write " + tmp_, errno);
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return Status::OK();
}

Status AtomicFile::PWrite(const void* data, size_t size, uint64_t offset) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    ssize_t n = ::pwrite(fd_, p, std::min<size_t>(size, size_t{1} << 30),
                         static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("write " + tmp_, errno);
    }
    p += n;
    offset += static_cast<uint64_t>(n);
    size -= static_cast<size_t>(n);
  }
  return Status::OK();
}

Status AtomicFile::Reserve(uint64_t size) {
  if (size == 0) return Status::OK();
  int rc = ::posix_fallocate(fd_, 0, static_cast<off_t>(size));
  if (rc != 0) {
    return ErrnoError("reserve " + std::to_string(size) + " bytes for " + tmp_, rc);
  }
  return Status::OK();
}

Status AtomicFile::Commit() {
  if (::fsync(fd_) != 0) return ErrnoError("fsync " + tmp_, errno);
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) return ErrnoError("close " + tmp_, errno);
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) return ErrnoError("rename to " + path_, errno);
  committed_ = true;
  return Status::OK();
}

}  // namespace dcr::internal
