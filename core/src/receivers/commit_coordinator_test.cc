// CommitCoordinator: the baseline only advances to versions every live receiver committed.
#include <gtest/gtest.h>

#include "dcr/versioning.h"

namespace dcr {
namespace {

VersionId V(uint64_t n) { return VersionId{n, Hash128{n * 31 + 1, n * 17 + 3}}; }

TEST(CommitCoordinatorTest, BaselineAdvancesOnlyWhenAllCommitted) {
  CommitCoordinator cc(V(0));
  ASSERT_TRUE(cc.AddReceiver("a", V(0)).ok());
  ASSERT_TRUE(cc.AddReceiver("b", V(0)).ok());
  EXPECT_EQ(cc.baseline(), V(0));
  ASSERT_TRUE(cc.Publish(V(0), V(1)).ok());
  EXPECT_EQ(cc.baseline(), V(0));
  EXPECT_FALSE(cc.LatestWhole());
  ASSERT_TRUE(cc.OnCommitted("a", V(1)).ok());
  EXPECT_EQ(cc.baseline(), V(0));  // b has not committed: the next delta still starts at v0
  // The trainer may not publish v2 yet, from either base.
  EXPECT_TRUE(cc.Publish(V(1), V(2)).IsFailedPrecondition());
  EXPECT_TRUE(cc.Publish(V(0), V(2)).IsFailedPrecondition());
  ASSERT_TRUE(cc.OnCommitted("b", V(1)).ok());
  EXPECT_EQ(cc.baseline(), V(1));
  EXPECT_TRUE(cc.LatestWhole());
  EXPECT_TRUE(cc.Publish(V(0), V(2)).IsFailedPrecondition());  // stale base
  EXPECT_TRUE(cc.Publish(V(1), V(2)).ok());
}

TEST(CommitCoordinatorTest, RefusesBogusReports) {
  CommitCoordinator cc(V(0));
  ASSERT_TRUE(cc.AddReceiver("a", V(0)).ok());
  EXPECT_TRUE(cc.OnCommitted("zz", V(0)).IsNotFound());
  EXPECT_TRUE(cc.OnCommitted("a", V(5)).IsFailedPrecondition());  // never published
  VersionId forged = V(0);
  forged.hash.lo ^= 1;
  EXPECT_TRUE(cc.OnCommitted("a", forged).IsFailedPrecondition());  // wrong hash
  ASSERT_TRUE(cc.Publish(V(0), V(1)).ok());
  ASSERT_TRUE(cc.OnCommitted("a", V(1)).ok());
  EXPECT_TRUE(cc.OnCommitted("a", V(0)).IsFailedPrecondition());  // going back
  EXPECT_TRUE(cc.AddReceiver("a", V(1)).IsInvalidArgument());
  VersionId poisoned = V(1);
  poisoned.hash.hi ^= 4;
  EXPECT_TRUE(cc.AddReceiver("p", poisoned).IsFailedPrecondition());
}

TEST(CommitCoordinatorTest, DeadReceiverReleasesTheBaselineAndRejoinsWithCatchUp) {
  CommitOptions o;
  o.retained_versions = 4;
  CommitCoordinator cc(V(0), o);
  ASSERT_TRUE(cc.AddReceiver("a", V(0)).ok());
  ASSERT_TRUE(cc.AddReceiver("b", V(0)).ok());
  ASSERT_TRUE(cc.Publish(V(0), V(1)).ok());
  ASSERT_TRUE(cc.OnCommitted("a", V(1)).ok());
  ASSERT_TRUE(cc.RemoveReceiver("b").ok());  // b died mid-refit
  EXPECT_EQ(cc.baseline(), V(1));
  for (uint64_t v = 2; v <= 3; ++v) {
    ASSERT_TRUE(cc.Publish(V(v - 1), V(v)).ok());
    ASSERT_TRUE(cc.OnCommitted("a", V(v)).ok());
  }
  // b comes back with its journaled v0: 3 versions behind, retained -> catch-up.
  ASSERT_TRUE(cc.AddReceiver("b", V(0)).ok());
  ReceiverPlan p = cc.PlanFor("b");
  EXPECT_EQ(p.kind, ReceiverPlan::kCatchUp);
  EXPECT_EQ(p.from, V(0));
  EXPECT_EQ(p.to, V(3));
  EXPECT_EQ(p.versions_behind, 3);
  EXPECT_EQ(cc.baseline(), V(0));  // b holds the baseline back until it catches up
  EXPECT_TRUE(cc.Publish(V(3), V(4)).IsFailedPrecondition());
  ASSERT_TRUE(cc.OnCommitted("b", V(3)).ok());
  EXPECT_EQ(cc.PlanFor("b").kind, ReceiverPlan::kUpToDate);
  EXPECT_TRUE(cc.Publish(V(3), V(4)).ok());
  EXPECT_EQ(cc.PlanFor("a").kind, ReceiverPlan::kDelta);
  // A fresh receiver joins with a full frame and does not hold the baseline.
  ASSERT_TRUE(cc.AddReceiver("c", std::nullopt).ok());
  EXPECT_EQ(cc.PlanFor("c").kind, ReceiverPlan::kFullFrame);
  EXPECT_EQ(cc.baseline(), V(3));
}

TEST(CommitCoordinatorTest, VersionsPastRetentionNeedAFullFrame) {
  CommitOptions o;
  o.retained_versions = 3;
  CommitCoordinator cc(V(0), o);
  ASSERT_TRUE(cc.AddReceiver("a", V(0)).ok());
  for (uint64_t v = 1; v <= 6; ++v) {
    ASSERT_TRUE(cc.Publish(V(v - 1), V(v)).ok());
    ASSERT_TRUE(cc.OnCommitted("a", V(v)).ok());
  }
  EXPECT_EQ(cc.history().size(), 3u);
  EXPECT_EQ(cc.history().front(), V(4));
  ASSERT_TRUE(cc.AddReceiver("old", V(1)).ok());
  EXPECT_EQ(cc.PlanFor("old").kind, ReceiverPlan::kFullFrame);
  EXPECT_EQ(cc.baseline(), V(6));
  ASSERT_TRUE(cc.AddReceiver("mid", V(5)).ok());
  EXPECT_EQ(cc.PlanFor("mid").kind, ReceiverPlan::kDelta);
  EXPECT_EQ(cc.baseline(), V(5));
}

TEST(CommitCoordinatorTest, CheckDeltaBaseRefusesOtherBases) {
  CommitCoordinator cc(V(2));
  ASSERT_TRUE(cc.AddReceiver("a", V(2)).ok());
  FileHeader h;
  h.base_version = 2;
  h.base_hash = V(2).hash;
  EXPECT_TRUE(cc.CheckDeltaBase(h).ok());
  h.base_version = 1;
  h.base_hash = V(1).hash;
  Status s = cc.CheckDeltaBase(h);
  EXPECT_TRUE(s.IsFailedPrecondition());
  EXPECT_NE(s.message().find("baseline"), std::string::npos);
  h.flags = kFlagNoBase;
  EXPECT_TRUE(cc.CheckDeltaBase(h).ok());
}

}  // namespace
}  // namespace dcr
