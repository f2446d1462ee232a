// FreezeMessage's thresholds and wording; FreezeWatch reports a freeze while the node waits and
// stops once a version is committed.
#include "node/freeze_watch.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "transport/net.h"

namespace dcr::internal {
namespace {

TEST(FreezeMessage, ThresholdsAndWording) {
  double frozen = -1;
  EXPECT_EQ(FreezeMessage(100, 10, 95, 3, 0, &frozen), "");
  EXPECT_EQ(frozen, 0);
  EXPECT_EQ(FreezeMessage(100, 0, 1, 3, 0, &frozen), "");  // no limit: never
  const std::string m = FreezeMessage(100, 10, 80, 3, 0, &frozen);
  EXPECT_EQ(frozen, 20);
  EXPECT_NE(m.find("freeze: no new version for 20 s (limit 10 s)"), std::string::npos) << m;
  EXPECT_NE(m.find("version 3"), std::string::npos) << m;
  // Never committed: the waiting time counts.
  const std::string w = FreezeMessage(100, 10, 0, 0, 70, &frozen);
  EXPECT_EQ(frozen, 30);
  EXPECT_NE(w.find("no version committed in 30 s of waiting"), std::string::npos) << w;
  EXPECT_EQ(FreezeMessage(100, 10, 0, 0, 0, &frozen), "");  // neither known
}

TEST(FreezeWatch, ReportsWhileWaitingAndStopsAtACommit) {
  std::mutex mu;
  std::vector<std::pair<double, std::string>> calls;
  auto seen = [&](auto pred) {
    for (int i = 0; i < 100; ++i) {  // up to 10 s on a loaded machine
      {
        std::lock_guard<std::mutex> l(mu);
        for (const auto& c : calls) {
          if (pred(c)) return true;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  };
  // Committed version 4 an hour ago; the limit is 0.2 s.
  FreezeWatch w(0.2, WallNow() - 3600, 4, WallNow(), [&](double f, const std::string& m) {
    std::lock_guard<std::mutex> l(mu);
    calls.emplace_back(f, m);
  });
  EXPECT_TRUE(seen([](const auto& c) {
    return c.first >= 3600 && c.second.find("the last committed is version 4") != std::string::npos;
  }));
  w.Committed(5, WallNow());
  {
    std::lock_guard<std::mutex> l(mu);
    calls.clear();
  }
  // The clock started again: past the limit, a new freeze of seconds, not an hour, names version 5.
  EXPECT_TRUE(seen([](const auto& c) {
    return c.first > 0 && c.first < 600 && c.second.find("version 5") != std::string::npos;
  }));
}

}  // namespace
}  // namespace dcr::internal
