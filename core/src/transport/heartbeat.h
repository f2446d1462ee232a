// Internal: heartbeats on relay-tree edges. A Heartbeats object owns one thread that sends a
// kHeartbeat frame (net.h) on every writer it watches whenever that writer has been given nothing
// to send for the interval, so the reader at the other end, whose connection has an idle timeout
// (Conn::SetIdleTimeout, the read deadline), hears from a live peer at least once per interval
// however long the node has nothing else to say: while the sender loads its checkpoints, while a
// relay waits for its subtree's reports, between pieces on a stream the policy leaves unused.
// A peer that is gone without closing its connections (a dead host, a partition, a stopped
// process) then shows up at the reader as a lost link within the read deadline.
//
// Thread safety: Add, Start and Stop may be called from any thread (a writer may be added after
// Start); Stop (or the destructor) joins the thread, after which no heartbeat is queued. The
// writers must outlive Stop.
#ifndef DCR_CORE_SRC_TRANSPORT_HEARTBEAT_H_
#define DCR_CORE_SRC_TRANSPORT_HEARTBEAT_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dcr/status.h"
#include "transport/net.h"

namespace dcr::internal {

// The liveness settings of a tree edge. Defaults: a heartbeat after 1 s of silence, a link lost
// after 10 s without a byte.
struct LivenessOptions {
  double heartbeat_interval_s = 1.0;
  double read_deadline_s = 10.0;
};

// kInvalidArgument unless 0 < heartbeat_interval_s and 2 * heartbeat_interval_s <=
// read_deadline_s (a read deadline that one late heartbeat could miss would drop live links).
// `what` prefixes the message ("plan", "network").
Status CheckLiveness(const LivenessOptions& o, const std::string& what);

class Heartbeats {
 public:
  explicit Heartbeats(double interval_s) : interval_s_(interval_s) {}
  ~Heartbeats() { Stop(); }
  Heartbeats(const Heartbeats&) = delete;
  Heartbeats& operator=(const Heartbeats&) = delete;

  // Watches `writer`: `frame` (a header whose type is set to kHeartbeat and length to 0 here) is
  // sent on it after each interval in which it was given nothing. `sent` (may be null) runs on the
  // writer's thread when a heartbeat was accepted, with its status (for byte counters).
  void Add(FrameWriter* writer, FrameHeader frame, std::function<void(Status)> sent = nullptr);
  void Start();
  void Stop();
  // Heartbeats queued so far (all writers).
  uint64_t sent() const;

 private:
  struct Watched {
    FrameWriter* writer;
    FrameHeader frame;
    std::function<void(Status)> sent;
  };
  void Loop();

  const double interval_s_;
  std::vector<Watched> watched_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  uint64_t count_ = 0;
  std::thread thread_;
};

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_TRANSPORT_HEARTBEAT_H_
