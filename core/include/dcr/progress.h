// Progress of long operations (BuildDelta, ApplyDeltaFile, ...), reported through a callback.
//
// Library code never prints: an operation that takes a ProgressCallback in its options calls it
// with the bytes done and the bytes to do of its current phase, and the caller renders that (the
// `dcr` CLI's progress line). Progress never changes what an operation computes or writes.
//
// Calls for one phase: first done_bytes == 0, then non-decreasing done_bytes, and, when the phase
// completes, one call with done_bytes == total_bytes. Phases follow one another (a phase never
// resumes after the next one started). An operation that fails stops calling.
//
// Thread safety: an operation calls its callback from the thread that called the operation,
// never concurrently, at most once per unit of work it finishes there (a build window, a chunk,
// a tensor), so the rate of calls is bounded by the work, not by a clock. The callback must not
// call back into the operation.
#ifndef DCR_CORE_INCLUDE_DCR_PROGRESS_H_
#define DCR_CORE_INCLUDE_DCR_PROGRESS_H_

#include <cstdint>
#include <functional>
#include <string_view>

namespace dcr {

struct ProgressUpdate {
  // What is being done, e.g. "hash base", "diff", "apply", "rehash"; a string with static
  // storage duration.
  std::string_view phase;
  uint64_t done_bytes = 0;
  uint64_t total_bytes = 0;
};

// Empty = no progress reporting (the default of every options struct that has one).
using ProgressCallback = std::function<void(const ProgressUpdate&)>;

}  // namespace dcr

#endif  // DCR_CORE_INCLUDE_DCR_PROGRESS_H_
