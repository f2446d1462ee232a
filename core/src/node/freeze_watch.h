// Internal: freeze reporting while a receiver waits. A receiver that commits no new version for
// longer than its limit (NodePlan::freeze_after_s) is frozen: the trainer, a relay or the store
// withholds versions (The Update Framework's freeze attack), or the run stalled. FreezeWatch
// checks once a second on its own thread, from before the node has a parent until it ends, so a
// long-lived node that keeps waiting says so while it waits, not only when it ends.
//
// Thread safety: Committed may be called from any thread; the callback runs on the watch's thread.
#ifndef DCR_CORE_SRC_NODE_FREEZE_WATCH_H_
#define DCR_CORE_SRC_NODE_FREEZE_WATCH_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace dcr::internal {

// The freeze message of a receiver at `now_unix`: "" unless more than `limit_s` seconds passed
// since `last_commit_unix` (when it committed `last_version`) or, when it never committed
// (last_commit_unix <= 0), since `waiting_since_unix`. `*frozen_s` (may be null) receives those
// seconds when frozen, else 0. limit_s <= 0: never frozen.
std::string FreezeMessage(double now_unix, double limit_s, double last_commit_unix,
                          uint64_t last_version, double waiting_since_unix, double* frozen_s);

class FreezeWatch {
 public:
  // Called on the watch's thread after every check: `frozen_s` as FreezeMessage gives it (0 when
  // not frozen), and `message`, its text, when a line is due (when the freeze is first seen, then
  // every max(1 s, limit_s) while it lasts), else empty.
  using Callback = std::function<void(double frozen_s, const std::string& message)>;

  // Starts the thread, which checks every min(1 s, limit_s). `last_commit_unix` / `last_version`:
  // the receiver's version floor (0: it never committed); `waiting_since_unix`: when the node
  // started waiting. REQUIRES: limit_s > 0.
  FreezeWatch(double limit_s, double last_commit_unix, uint64_t last_version,
              double waiting_since_unix, Callback callback);
  // Stops and joins the thread (no callback runs after it returns).
  ~FreezeWatch();
  FreezeWatch(const FreezeWatch&) = delete;
  FreezeWatch& operator=(const FreezeWatch&) = delete;

  // The receiver committed `version` at `now_unix`: the clock starts again.
  void Committed(uint64_t version, double now_unix);

 private:
  void Run();

  const double limit_s_;
  const double waiting_since_unix_;
  const Callback callback_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  double last_commit_unix_;
  uint64_t last_version_;
  std::thread thread_;
};

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_NODE_FREEZE_WATCH_H_
