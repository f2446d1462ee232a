#include "internal/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

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

}  // namespace dcr::internal
