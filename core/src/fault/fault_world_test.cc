// The fault-injection harness: each fault kind alone, then seeded mixes; every run must end with
// every receiver committed and bit-exact.
#include <gtest/gtest.h>

#include "dcr/fault_injection.h"
#include "fault/fault_test_util.h"

namespace dcr {
namespace {

using testing::MakeCheckpoint;
using testing::Model;
using testing::NextVersion;
using testing::RandomModel;
using testing::SmallGrid;
using testing::TempDir;

struct Pair {
  std::unique_ptr<Checkpoint> base, target;
  Pair() {
    Model m0 = RandomModel(5, 2);
    base = MakeCheckpoint(m0);
    target = MakeCheckpoint(NextVersion(m0, 6, 0.03));
  }
};

FaultRunReport RunOne(const std::vector<FaultSpec>& faults, uint64_t seed, int receivers = 6) {
  static Pair p;
  TempDir dir;
  FaultRunOptions o;
  o.seed = seed;
  o.receivers = receivers;
  o.work_dir = dir / "run";
  auto r = RunFaultScenario(*p.base, *p.target, SmallGrid(0, 1), faults, o);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return {};
  if (!r->error.empty() || std::getenv("DCR_FAULT_LOG")) {
    for (const auto& l : r->log) std::fprintf(stderr, "  %s\n", l.c_str());
  }
  return std::move(r).value();
}

TEST(FaultWorldTest, NoFaultsCommitsEverywhere) {
  FaultRunReport r = RunOne({}, 1);
  EXPECT_EQ(r.error, "");
  EXPECT_EQ(r.receivers_committed, 6);
  EXPECT_EQ(r.receivers_verified, 6);
  EXPECT_TRUE(r.joint_commit_whole);
  EXPECT_EQ(r.faults_injected, 0);
}

class EachKind : public ::testing::TestWithParam<int> {};

TEST_P(EachKind, SurvivesAlone) {
  FaultSpec f;
  f.kind = static_cast<FaultKind>(GetParam());
  FaultRunReport r = RunOne({f}, 10 + GetParam());
  EXPECT_EQ(r.error, "") << FaultKindName(f.kind);
  EXPECT_EQ(r.faults_injected, 1) << FaultKindName(f.kind);
  EXPECT_EQ(r.faults_survived, 1);
  EXPECT_EQ(r.receivers_verified, 6);
  EXPECT_TRUE(r.joint_commit_whole);
  if (f.kind == FaultKind::kKillReceiverInsideChunk || f.kind == FaultKind::kKillRelay) {
    EXPECT_GE(r.overwrite_repairs, 1u) << "an interrupted chunk must be repaired by overwrite";
  }
  // Braced: gtest's EXPECT_* expand to an if/else of their own (-Wdangling-else).
  if (f.kind == FaultKind::kCorruptChunk) {
    EXPECT_GE(r.corrupt_detected, 1u);
  }
  if (f.kind == FaultKind::kStaleDelta) {
    EXPECT_GE(r.payloads_refused, 1u);
  }
  if (f.kind == FaultKind::kRestartSender) {
    EXPECT_TRUE(r.sender_rebuild_identical);
  }
}

INSTANTIATE_TEST_SUITE_P(AllKinds, EachKind, ::testing::Range(0, kNumFaultKinds),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::string(FaultKindName(static_cast<FaultKind>(i.param)));
                         });

TEST(FaultWorldTest, SeededMixOfFaults) {
  FaultRunReport r = RunOne(SeededFaults(3, 13), 3);
  EXPECT_EQ(r.error, "");
  EXPECT_GE(r.faults_injected, 10);
  EXPECT_EQ(r.faults_survived, r.faults_injected);
  EXPECT_EQ(r.receivers_verified, 6);
}

TEST(FaultWorldTest, FaultKindNamesRoundTrip) {
  for (int k = 0; k < kNumFaultKinds; ++k) {
    auto f = FaultKindFromName(FaultKindName(static_cast<FaultKind>(k)));
    ASSERT_TRUE(f.ok());
    EXPECT_EQ(static_cast<int>(*f), k);
  }
  auto bad = FaultKindFromName("meteor");
  EXPECT_TRUE(bad.status().IsInvalidArgument());
  EXPECT_NE(bad.status().message().find("kill_relay"), std::string::npos);
}

}  // namespace
}  // namespace dcr
