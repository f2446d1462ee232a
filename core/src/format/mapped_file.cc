#include "internal/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

namespace dcr::internal {

Status MapReadOnly(const std::string& path, void** map, uint64_t* size) {
  *map = nullptr;
  *size = 0;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open " + path, errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return ErrnoError("stat " + path, e);
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return InvalidArgumentError(path +
                                " is a directory; a checkpoint is one .safetensors file (sharded "
                                "checkpoint directories are read only by `dcr verify`)");
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgumentError(path + ": not a regular file");
  }
  const uint64_t n = static_cast<uint64_t>(st.st_size);
  if (n > 0) {
    void* m = ::mmap(nullptr, n, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      return ErrnoError("mmap " + path, e);
    }
    *map = m;
  }
  ::close(fd);
  *size = n;
  return Status::OK();
}

Status MakeResident(const void* data, uint64_t size, const std::string& what) {
  if (data == nullptr || size == 0) return Status::OK();
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data) & ~(page - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(data) + size;
#ifdef MADV_POPULATE_READ
  if (::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_READ) == 0) {
    return Status::OK();
  }
  if (errno == EFAULT || errno == ENOMEM) {
    return ErrnoError("madvise(MADV_POPULATE_READ) " + what, errno);
  }
#endif
  // Older kernels (EINVAL), or interrupted (EINTR, EAGAIN): read one byte of every page
  // (mappings are page-granular, so the page holding `data` is mapped from its start).
  uint8_t acc = 0;
  for (uintptr_t p = begin; p < end; p += page) {
    acc ^= *reinterpret_cast<const volatile uint8_t*>(p);
  }
  volatile uint8_t sink = acc;
  (void)sink;
  return Status::OK();
}

void AdviseSequential(const void* data, uint64_t size) {
  if (data == nullptr || size == 0) return;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data) & ~(page - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(data) + size;
  (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_SEQUENTIAL);
}

void AdviseDone(const void* data, uint64_t size) {
#ifdef MADV_COLD
  if (data == nullptr || size == 0) return;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + page - 1) & ~(page - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + size) & ~(page - 1);
  if (end > begin) (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_COLD);
#else
  (void)data;
  (void)size;
#endif
}

namespace {

// The mount point of the first mount of filesystem type `fstype` whose options include `option`
// (any options when empty); empty when there is none.
std::string MountPoint(const std::string& fstype, const std::string& option) {
  std::ifstream mounts("/proc/mounts");
  std::string dev, dir, type, opts;
  while (mounts >> dev >> dir >> type >> opts) {
    std::string rest;
    std::getline(mounts, rest);
    if (type != fstype) continue;
    if (option.empty() || ("," + opts + ",").find("," + option + ",") != std::string::npos) {
      return dir;
    }
  }
  return "";
}

// The first number in `path` (after `key` and a space when key is not empty); UINT64_MAX when
// absent or "max".
uint64_t ReadLimit(const std::string& path, const std::string& key) {
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    std::string value = line;
    if (!key.empty()) {
      if (line.compare(0, key.size() + 1, key + " ") != 0) continue;
      value = line.substr(key.size() + 1);
    }
    if (value.empty() || value[0] < '0' || value[0] > '9') return UINT64_MAX;
    return std::stoull(value);
  }
  return UINT64_MAX;
}

}  // namespace

uint64_t MemoryCgroupLimit() {
  std::ifstream self("/proc/self/cgroup");
  std::string line;
  uint64_t limit = UINT64_MAX;
  while (std::getline(self, line)) {
    // "hierarchy-id:controllers:path"
    const size_t a = line.find(':');
    const size_t b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    std::string path = line.substr(b + 1);
    if (line.compare(0, a, "0") == 0 && controllers.empty()) {
      const std::string root = MountPoint("cgroup2", "");
      if (root.empty()) continue;
      while (true) {
        limit = std::min(limit, ReadLimit(root + path + "/memory.max", ""));
        if (path.empty() || path == "/") break;
        path = path.substr(0, path.find_last_of('/'));
      }
    } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {
      const std::string root = MountPoint("cgroup", "memory");
      if (root.empty()) continue;
      limit = std::min(limit, ReadLimit(root + path + "/memory.stat", "hierarchical_memory_limit"));
    }
  }
  // cgroup v1 reports "no limit" as the largest page-aligned signed value.
  if (limit >= (uint64_t{1} << 62)) return UINT64_MAX;
  return limit;
}

}  // namespace dcr::internal
