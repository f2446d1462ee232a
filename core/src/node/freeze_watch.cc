#include "node/freeze_watch.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>

#include "transport/net.h"

namespace dcr::internal {

std::string FreezeMessage(double now_unix, double limit_s, double last_commit_unix,
                          uint64_t last_version, double waiting_since_unix, double* frozen_s) {
  if (frozen_s != nullptr) *frozen_s = 0;
  if (limit_s <= 0) return "";
  const double since = last_commit_unix > 0 ? last_commit_unix : waiting_since_unix;
  if (since <= 0 || now_unix - since <= limit_s) return "";
  if (frozen_s != nullptr) *frozen_s = now_unix - since;
  char buf[256];
  if (last_commit_unix > 0) {
    std::snprintf(buf, sizeof(buf),
                  "freeze: no new version for %.0f s (limit %.0f s); the last committed is "
                  "version %" PRIu64,
                  now_unix - since, limit_s, last_version);
  } else {
    std::snprintf(buf, sizeof(buf),
                  "freeze: no version committed in %.0f s of waiting (limit %.0f s)",
                  now_unix - since, limit_s);
  }
  return buf;
}

FreezeWatch::FreezeWatch(double limit_s, double last_commit_unix, uint64_t last_version,
                         double waiting_since_unix, Callback callback)
    : limit_s_(limit_s),
      waiting_since_unix_(waiting_since_unix),
      callback_(std::move(callback)),
      last_commit_unix_(last_commit_unix),
      last_version_(last_version) {
  thread_ = std::thread([this] { Run(); });
}

FreezeWatch::~FreezeWatch() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void FreezeWatch::Committed(uint64_t version, double now_unix) {
  std::lock_guard<std::mutex> l(mu_);
  last_version_ = version;
  last_commit_unix_ = now_unix;
}

void FreezeWatch::Run() {
  const double tick = std::min(1.0, limit_s_);
  const double every = std::max(1.0, limit_s_);
  double said_at = -1;  // wall seconds of the last line of this freeze (-1: none yet)
  std::unique_lock<std::mutex> l(mu_);
  while (!cv_.wait_for(l, std::chrono::duration<double>(tick), [this] { return stop_; })) {
    const double now = WallNow();
    double frozen = 0;
    std::string message = FreezeMessage(now, limit_s_, last_commit_unix_, last_version_,
                                        waiting_since_unix_, &frozen);
    if (frozen <= 0) {
      said_at = -1;
    } else if (said_at < 0 || now - said_at >= every) {
      said_at = now;
    } else {
      message.clear();
    }
    l.unlock();
    callback_(frozen, message);
    l.lock();
  }
}

}  // namespace dcr::internal
