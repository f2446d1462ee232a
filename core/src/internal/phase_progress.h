// One phase of an operation's progress (dcr/progress.h), reported from the thread that started
// it while workers add the bytes they finish (internal).
//
// Thread safety: Add may be called from any thread; the callback runs only on the thread that
// constructed the PhaseProgress (inside its constructor, Add and Finish), so never concurrently.
#ifndef DCR_CORE_SRC_INTERNAL_PHASE_PROGRESS_H_
#define DCR_CORE_SRC_INTERNAL_PHASE_PROGRESS_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string_view>
#include <thread>

#include "dcr/progress.h"

namespace dcr::internal {

class PhaseProgress {
 public:
  // Reports {phase, 0, total}. `callback` (may be empty: then nothing is reported) must outlive
  // this object; `phase` must have static storage duration.
  PhaseProgress(const ProgressCallback& callback, std::string_view phase, uint64_t total)
      : callback_(callback), phase_(phase), total_(total), owner_(std::this_thread::get_id()) {
    if (callback_) callback_(ProgressUpdate{phase_, 0, total_});
  }
  PhaseProgress(const PhaseProgress&) = delete;
  PhaseProgress& operator=(const PhaseProgress&) = delete;

  // Adds `bytes` finished; on the constructing thread also reports the bytes done so far (capped
  // at the total).
  void Add(uint64_t bytes) {
    if (!callback_) return;
    const uint64_t done = done_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    if (std::this_thread::get_id() == owner_) {
      callback_(ProgressUpdate{phase_, std::min(done, total_), total_});
    }
  }
  // Reports {phase, total, total}. REQUIRES: called on the constructing thread, once the phase's
  // work is complete.
  void Finish() {
    if (callback_) callback_(ProgressUpdate{phase_, total_, total_});
  }

 private:
  const ProgressCallback& callback_;
  const std::string_view phase_;
  const uint64_t total_;
  const std::thread::id owner_;
  std::atomic<uint64_t> done_{0};
};

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_INTERNAL_PHASE_PROGRESS_H_
