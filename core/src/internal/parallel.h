// Minimal parallel-for over an index range (internal). Items are handed out dynamically; callers
// must make results independent of which thread ran which item.
#ifndef DCR_CORE_SRC_INTERNAL_PARALLEL_H_
#define DCR_CORE_SRC_INTERNAL_PARALLEL_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace dcr::internal {

inline int ResolveThreads(int threads) {
  if (threads > 0) return threads;
  unsigned hc = std::thread::hardware_concurrency();
  return hc == 0 ? 1 : static_cast<int>(hc);
}

// Calls fn(i) for every i in [0, n) on up to `threads` workers. fn returns false to stop early
// (items not yet started are skipped).
inline void ParallelFor(uint64_t n, int threads, const std::function<bool(uint64_t)>& fn) {
  uint64_t t = std::min<uint64_t>(ResolveThreads(threads), std::max<uint64_t>(n, 1));
  if (t <= 1) {
    for (uint64_t i = 0; i < n; ++i)
      if (!fn(i)) return;
    return;
  }
  std::atomic<uint64_t> next{0};
  std::atomic<bool> stop{false};
  auto worker = [&]() {
    while (!stop.load(std::memory_order_relaxed)) {
      uint64_t i = next.fetch_add(1);
      if (i >= n) return;
      if (!fn(i)) stop = true;
    }
  };
  std::vector<std::thread> pool;
  for (uint64_t k = 1; k < t; ++k) pool.emplace_back(worker);
  worker();
  for (auto& th : pool) th.join();
}

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_INTERNAL_PARALLEL_H_
