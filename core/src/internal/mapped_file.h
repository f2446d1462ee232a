// Read-only memory mapping of a whole file (internal).
#ifndef DCR_CORE_SRC_INTERNAL_MAPPED_FILE_H_
#define DCR_CORE_SRC_INTERNAL_MAPPED_FILE_H_

#include <cstdint>
#include <string>

#include "dcr/status.h"

namespace dcr::internal {

// Maps `path` read-only. On success *map is the mapping (nullptr for an empty file; release with
// munmap(*map, *size)) and *size the file size. Errors: kNotFound, kInvalidArgument (not a regular
// file), others from the system call (named with the path).
Status MapReadOnly(const std::string& path, void** map, uint64_t* size);

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_INTERNAL_MAPPED_FILE_H_
