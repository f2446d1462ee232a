#include "internal/atomic_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "dcr/status_macros.h"

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
    ssize_t n =
        ::pwrite(fd_, p, std::min<size_t>(size, size_t{1} << 30), static_cast<off_t>(offset));
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

namespace {

bool IsCheckpointFileName(const std::string& n) {
  auto ends = [&](const char* suffix) {
    const size_t k = std::strlen(suffix);
    return n.size() >= k && n.compare(n.size() - k, k, suffix) == 0;
  };
  return ends(".safetensors") || ends(".safetensors.index.json");
}

// renameat2 through syscall(2): glibc 2.28+ has the wrapper, but not every libc does.
int Rename2(const std::string& from, const std::string& to, unsigned flags) {
  return static_cast<int>(
      ::syscall(SYS_renameat2, AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), flags));
}

constexpr unsigned kRenameNoReplace = 1u << 0;  // RENAME_NOREPLACE
constexpr unsigned kRenameExchange = 1u << 1;   // RENAME_EXCHANGE

Status FsyncPath(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open " + path, errno);
  int rc = ::fsync(fd);
  int e = errno;
  ::close(fd);
  if (rc != 0) return ErrnoError("fsync " + path, e);
  return Status::OK();
}

std::string ParentOf(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

void RemoveFlatDirectory(const std::string& dir) {
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n == "." || n == "..") continue;
      ::unlink((dir + "/" + n).c_str());
    }
    ::closedir(d);
  }
  ::rmdir(dir.c_str());
}

StatusOr<std::unique_ptr<AtomicDirectory>> AtomicDirectory::Create(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  bool replace = false;
  struct stat st;
  if (::lstat(p.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) {
      return FailedPreconditionError(
          p +
          " exists and is not a directory; a sharded checkpoint "
          "is written as a directory (remove it or choose another name)");
    }
    DIR* d = ::opendir(p.c_str());
    if (d == nullptr) return ErrnoError("open directory " + p, errno);
    std::string foreign;
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n == "." || n == "..") continue;
      struct stat fs;
      if (!IsCheckpointFileName(n) || ::lstat((p + "/" + n).c_str(), &fs) != 0 ||
          !S_ISREG(fs.st_mode)) {
        foreign = n;
        break;
      }
    }
    ::closedir(d);
    if (!foreign.empty()) {
      return FailedPreconditionError(
          p + " exists and holds '" + foreign +
          "', which is not a checkpoint file; dcr replaces "
          "an existing output directory only when it holds nothing but safetensors shards and "
          "their index (choose a new output name)");
    }
    replace = true;
  } else if (errno != ENOENT) {
    return ErrnoError("stat " + p, errno);
  }
  size_t slash = p.find_last_of('/');
  std::string base = slash == std::string::npos ? p : p.substr(slash + 1);
  std::string tmpl = ParentOf(p) + "/." + base + ".tmp.XXXXXX";
  std::vector<char> name(tmpl.begin(), tmpl.end());
  name.push_back('\0');
  if (::mkdtemp(name.data()) == nullptr)
    return ErrnoError("create a temporary directory for " + p, errno);
  // mkdtemp makes it 0700; the published checkpoint gets the usual directory mode.
  ::chmod(name.data(), 0777 & ~CurrentUmask());
  return std::unique_ptr<AtomicDirectory>(new AtomicDirectory(p, name.data(), replace));
}

AtomicDirectory::~AtomicDirectory() {
  if (!committed_) RemoveFlatDirectory(tmp_);
}

Status AtomicDirectory::Commit() {
  DCR_RETURN_IF_ERROR(FsyncPath(tmp_));
  if (replace_) {
    if (Rename2(tmp_, path_, kRenameExchange) != 0) {
      return ErrnoError("exchange " + tmp_ + " with " + path_, errno);
    }
    // tmp_ now names the replaced directory.
    committed_ = true;
    RemoveFlatDirectory(tmp_);
  } else {
    if (Rename2(tmp_, path_, kRenameNoReplace) != 0) {
      int e = errno;
      if (e == EEXIST) {
        return FailedPreconditionError(path_ +
                                       " appeared while it was being written; not replaced");
      }
      return ErrnoError("rename " + tmp_ + " to " + path_, e);
    }
    committed_ = true;
  }
  return FsyncPath(ParentOf(path_));
}

}  // namespace dcr::internal
