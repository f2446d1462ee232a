// The sender's lag watch: bytes the link accepted and the edge relay did not acknowledge, a
// bound passed once, and only on the edges watched.
#include "node/edge_lag.h"

#include <gtest/gtest.h>

namespace dcr::internal {
namespace {

TEST(EdgeLagWatchTest, LagsOnceWhenUnacknowledgedBytesPassTheBound) {
  EdgeLagWatch w({1, 2}, 100);
  EXPECT_TRUE(w.watches(1));
  EXPECT_FALSE(w.watches(3));
  w.Sent(1, 5);
  EXPECT_TRUE(w.started(1, 5));
  EXPECT_FALSE(w.started(2, 5));
  EXPECT_FALSE(w.Accepted(1, 5, 60));
  EXPECT_FALSE(w.Accepted(1, 6, 40));  // 100: at the bound, not past it
  EXPECT_EQ(w.unacked(1), 100u);
  w.Acked(1, 5);  // a relay that keeps up acknowledges
  EXPECT_EQ(w.unacked(1), 40u);
  EXPECT_FALSE(w.Accepted(1, 7, 60));
  EXPECT_TRUE(w.Accepted(1, 8, 1));  // 101
  EXPECT_TRUE(w.lagging(1));
  EXPECT_FALSE(w.Accepted(1, 9, 500));  // once
  EXPECT_FALSE(w.lagging(2));
  EXPECT_EQ(w.lagging_children(), std::vector<NodeId>{1});
  // Other edges and unknown children do not count.
  EXPECT_FALSE(w.Accepted(3, 1, 1000));
  EXPECT_EQ(w.unacked(3), 0u);
}

TEST(EdgeLagWatchTest, AckBeforeTheLinksAnswerAndDuplicateAcksCountOnce) {
  EdgeLagWatch w({1}, 10);
  w.Acked(1, 4);
  EXPECT_FALSE(w.Accepted(1, 4, 50));  // acknowledged already: not a backlog
  EXPECT_EQ(w.unacked(1), 0u);
  EXPECT_FALSE(w.Accepted(1, 5, 8));
  w.Acked(1, 5);
  w.Acked(1, 5);
  EXPECT_EQ(w.unacked(1), 0u);
}

TEST(EdgeLagWatchTest, CatchesUpAtHalfTheBoundAndCanLagAgain) {
  EdgeLagWatch w({1, 2}, 100);
  EXPECT_EQ(w.resume_bound(), 50u);
  EXPECT_FALSE(w.Accepted(1, 1, 60));
  EXPECT_FALSE(w.Accepted(1, 2, 10));
  EXPECT_TRUE(w.Accepted(1, 3, 50));  // 120
  EXPECT_FALSE(w.Acked(2, 1));        // another edge
  EXPECT_FALSE(w.Acked(1, 4));        // never accepted: 120 left
  EXPECT_FALSE(w.Acked(1, 2));        // 110 left: still lagging
  EXPECT_TRUE(w.lagging(1));
  EXPECT_TRUE(w.Acked(1, 1));  // 50 left: half the bound, caught up
  EXPECT_FALSE(w.lagging(1));
  EXPECT_TRUE(w.lagging_children().empty());
  EXPECT_EQ(w.unacked(1), 50u);
  EXPECT_FALSE(w.Acked(1, 1));  // a duplicate changes nothing
  EXPECT_FALSE(w.Acked(1, 3));  // caught up already: no second answer
  EXPECT_EQ(w.unacked(1), 0u);
  EXPECT_FALSE(w.Accepted(1, 5, 100));
  EXPECT_TRUE(w.Accepted(1, 6, 1));  // past the bound again: lags again
  EXPECT_TRUE(w.lagging(1));
}

TEST(EdgeLagWatchTest, BoundZeroNeverLags) {
  EdgeLagWatch w({1}, 0);
  EXPECT_FALSE(w.Accepted(1, 1, uint64_t{1} << 40));
  EXPECT_FALSE(w.lagging(1));
}

}  // namespace
}  // namespace dcr::internal
