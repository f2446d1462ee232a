// Read-only memory mapping of a whole file (internal).
#ifndef DCR_CORE_SRC_INTERNAL_MAPPED_FILE_H_
#define DCR_CORE_SRC_INTERNAL_MAPPED_FILE_H_

#include <cstdint>
#include <string>

#include "dcr/status.h"

namespace dcr::internal {

// Maps `path` read-only. On success *map is the mapping (nullptr for an empty file; release with
// munmap(*map, *size)) and *size the file size. Errors: kNotFound, kInvalidArgument (a directory, named as
// such, or another non-regular file), others from the system call (named with the path).
Status MapReadOnly(const std::string& path, void** map, uint64_t* size);

// Makes `size` bytes of a read-only mapping at `data` resident: reads the file pages into the
// page cache (from disk if the kernel evicted them) and fills this process's page tables, so
// later reads of the range take no page faults and no I/O. MADV_POPULATE_READ where the kernel
// has it (5.14+), else one read per page. Errors: ENOMEM (the range is not mapped) or EFAULT (an
// I/O error reading the file) from madvise, named with `what`.
Status MakeResident(const void* data, uint64_t size, const std::string& what);

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_INTERNAL_MAPPED_FILE_H_
