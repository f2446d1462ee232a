// The node's event loop queue: events from every thread of a node (socket readers, writers, the
// apply and store pools, the builder) for the one thread that hosts its policy, with stream
// generations so that a stream left for another source drops what its threads still post.
//
// Thread safety: every method may be called from any thread.
#ifndef DCR_CORE_SRC_NODE_EVENT_QUEUE_H_
#define DCR_CORE_SRC_NODE_EVENT_QUEUE_H_

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <utility>

#include "dcr/recovery_policy.h"
#include "dcr/relay_policy.h"
#include "dcr/status.h"
#include "transport/net.h"

namespace dcr::internal {

// Events for the loop, or a fatal driver error (peer lost, builder failed, ...), or an event for
// the node's RecoveryPolicy (`recovery`; `blob` names the blob a ChunkDoubtful refused). `gen`:
// the stream generation it was posted in (Bump starts a new one; the loop drops older items).
struct QItem {
  bool fatal = false;
  Status status;
  Event event;
  bool is_recovery = false;
  recovery::Event recovery = recovery::TimerFired{};
  BlobId blob = 0;
  uint64_t gen = 0;
};

class EventQueue {
 public:
  void Post(Event e) {
    std::lock_guard<std::mutex> lock(mu_);
    q_.push_back(QItem{false, Status(), std::move(e), false, recovery::TimerFired{}, 0, gen_});
    cv_.notify_one();
  }
  void Fatal(Status s) {
    std::lock_guard<std::mutex> lock(mu_);
    q_.push_back(
        QItem{true, std::move(s), event::TimerFired{}, false, recovery::TimerFired{}, 0, gen_});
    cv_.notify_one();
  }
  void PostRecovery(recovery::Event e, BlobId blob = 0) {
    std::lock_guard<std::mutex> lock(mu_);
    q_.push_back(QItem{false, Status(), event::TimerFired{}, true, std::move(e), blob, gen_});
    cv_.notify_one();
  }
  // A new stream generation: items posted before are stale.
  uint64_t Bump() {
    std::lock_guard<std::mutex> lock(mu_);
    return ++gen_;
  }
  uint64_t gen() {
    std::lock_guard<std::mutex> lock(mu_);
    return gen_;
  }
  // Waits until an item arrives or `until` (steady seconds) passes.
  bool Wait(double until, QItem* out) {
    std::unique_lock<std::mutex> lock(mu_);
    while (q_.empty()) {
      double left = until - SteadyNow();
      if (left <= 0) return false;
      cv_.wait_for(lock, std::chrono::duration<double>(std::min(left, 1.0)));
    }
    *out = std::move(q_.front());
    q_.pop_front();
    return true;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<QItem> q_;
  uint64_t gen_ = 0;
};

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_NODE_EVENT_QUEUE_H_
