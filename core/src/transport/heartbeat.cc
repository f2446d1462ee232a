#include "transport/heartbeat.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

namespace dcr::internal {

Status CheckLiveness(const LivenessOptions& o, const std::string& what) {
  if (!(o.heartbeat_interval_s > 0)) {
    return InvalidArgumentError(what + ": the heartbeat interval must be > 0");
  }
  if (!(2 * o.heartbeat_interval_s <= o.read_deadline_s)) {
    char text[160];
    std::snprintf(text, sizeof(text),
                  ": the read deadline (%g s) must be at least twice the heartbeat interval (%g s)",
                  o.read_deadline_s, o.heartbeat_interval_s);
    return InvalidArgumentError(what + text);
  }
  return Status();
}

void Heartbeats::Add(FrameWriter* writer, FrameHeader frame, std::function<void(Status)> sent) {
  frame.type = static_cast<uint8_t>(FrameType::kHeartbeat);
  frame.length = 0;
  std::lock_guard<std::mutex> lock(mu_);
  watched_.push_back(Watched{writer, frame, std::move(sent)});
}

void Heartbeats::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_ || thread_.joinable()) return;
  thread_ = std::thread([this] { Loop(); });
}

void Heartbeats::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

uint64_t Heartbeats::sent() const {
  std::lock_guard<std::mutex> lock(mu_);
  return count_;
}

void Heartbeats::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    const double now = SteadyNow();
    double next = now + interval_s_;
    for (Watched& w : watched_) {
      const double due = w.writer->last_send() + interval_s_;
      if (due <= now) {
        w.writer->Send(w.frame, nullptr, nullptr, w.sent);  // updates last_send
        ++count_;
        next = std::min(next, now + interval_s_);
      } else {
        next = std::min(next, due);
      }
    }
    cv_.wait_for(lock, std::chrono::duration<double>(std::max(0.001, next - SteadyNow())),
                 [&] { return stop_; });
  }
}

}  // namespace dcr::internal
