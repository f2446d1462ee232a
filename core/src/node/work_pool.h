// A fixed pool of worker threads running closures (the node's apply and store pools).
//
// Thread safety: Submit and Drain from any thread; Start and Stop from the owning thread.
#ifndef DCR_CORE_SRC_NODE_WORK_POOL_H_
#define DCR_CORE_SRC_NODE_WORK_POOL_H_

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "dcr/relay_policy.h"

namespace dcr::internal {

class WorkPool {
 public:
  void Start(int n) {
    for (int i = 0; i < std::max(1, n); ++i) threads_.emplace_back([this] { Loop(); });
  }
  void Submit(std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(fn));
    cv_.notify_one();
  }
  // Waits until no job is queued or running.
  void Drain() {
    std::unique_lock<std::mutex> lock(mu_);
    idle_.wait(lock, [&] { return jobs_.empty() && running_ == 0; });
  }
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      cv_.notify_all();
    }
    for (auto& t : threads_) t.join();
    threads_.clear();
  }
  ~WorkPool() {
    if (!threads_.empty()) Stop();
  }

 private:
  void Loop() {
    while (true) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        fn = std::move(jobs_.front());
        jobs_.pop_front();
        ++running_;
      }
      fn();
      std::lock_guard<std::mutex> lock(mu_);
      --running_;
      idle_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_, idle_;
  int running_ = 0;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  bool stop_ = false;
};

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_NODE_WORK_POOL_H_
