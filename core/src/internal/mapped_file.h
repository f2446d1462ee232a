// Read-only memory mapping of a whole file (internal).
#ifndef DCR_CORE_SRC_INTERNAL_MAPPED_FILE_H_
#define DCR_CORE_SRC_INTERNAL_MAPPED_FILE_H_

#include <cstdint>
#include <string>

#include "dcr/status.h"

namespace dcr::internal {

// Maps `path` read-only. On success *map is the mapping (nullptr for an empty file; release with
// munmap(*map, *size)) and *size the file size. Errors: kNotFound, kInvalidArgument (a directory,
// named as such, or another non-regular file), others from the system call (named with the path).
Status MapReadOnly(const std::string& path, void** map, uint64_t* size);

// Makes `size` bytes of a read-only mapping at `data` resident: reads the file pages into the
// page cache (from disk if the kernel evicted them) and fills this process's page tables, so
// later reads of the range take no page faults and no I/O. MADV_POPULATE_READ where the kernel
// has it (5.14+), else one read per page. Errors: ENOMEM (the range is not mapped) or EFAULT (an
// I/O error reading the file) from madvise, named with `what`.
Status MakeResident(const void* data, uint64_t size, const std::string& what);

// Access hints for a range that is read once, front to back, with a bounded working set (diff and
// apply over checkpoints larger than memory). Both only advise the kernel: they never change the
// bytes, are harmless on memory that is not a file mapping, and a kernel without the advice
// ignores it.
//
// AdviseSequential: the range will be read sequentially (MADV_SEQUENTIAL): aggressive readahead,
// and pages read through it are not promoted to the active list, so the page cache they fill is
// the first reclaimed under memory pressure (a memory cgroup's limit) instead of growing the
// working set.
void AdviseSequential(const void* data, uint64_t size);
// AdviseDone: the range is processed and will not be read again soon (MADV_COLD on the pages
// that lie wholly inside it, so a neighbour's partial page stays as it is): its pages become the
// first candidates for reclaim, while staying cached when memory is plentiful.
void AdviseDone(const void* data, uint64_t size);

// The memory limit of the calling process's memory cgroup, in bytes: the smallest memory.max of
// its cgroup v2 directory and their ancestors, or cgroup v1's hierarchical_memory_limit; UINT64_MAX
// when there is none (or it cannot be read). The page cache of files the process reads is charged
// against it, so e.g. making checkpoints resident beyond it only evicts them again.
uint64_t MemoryCgroupLimit();

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_INTERNAL_MAPPED_FILE_H_
