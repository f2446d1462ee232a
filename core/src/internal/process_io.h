// The calling process's storage writes, as the kernel's per-process I/O accounting counts them.
//
// Thread safety: each call reads the counter afresh; safe from any thread.
#ifndef DCR_CORE_SRC_INTERNAL_PROCESS_IO_H_
#define DCR_CORE_SRC_INTERNAL_PROCESS_IO_H_

#include <cstdint>
#include <fstream>
#include <string>

namespace dcr::internal {

// Bytes written to storage on behalf of this process since it started; 0 where that count is not
// kept. The difference of two calls is what was written in between.
inline uint64_t ProcessWriteBytes() {
  std::ifstream f("/proc/self/io");
  std::string key;
  uint64_t v = 0;
  while (f >> key >> v) {
    if (key == "write_bytes:") return v;
  }
  return 0;
}

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_INTERNAL_PROCESS_IO_H_
