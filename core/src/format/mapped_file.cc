#include "internal/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

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

}  // namespace dcr::internal
