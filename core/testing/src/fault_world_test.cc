// The fault-injection harness: each fault kind alone, then seeded mixes; every run must end with
// every receiver committed and bit-exact.
#include <gtest/gtest.h>

#include <algorithm>

#include "dcr/testing/fault_injection.h"
#include "dcr/testing/fault_test_util.h"

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

FaultRunReport RunOne(const std::vector<FaultSpec>& faults, uint64_t seed, int receivers = 6,
                      bool record_trace = false) {
  static Pair p;
  TempDir dir;
  FaultRunOptions o;
  o.seed = seed;
  o.receivers = receivers;
  o.record_trace = record_trace;
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
  EXPECT_TRUE(r.trace.empty());
}

bool SameTrace(const std::vector<FaultTraceEntry>& a, const std::vector<FaultTraceEntry>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].time != b[i].time || a[i].node != b[i].node || a[i].policy != b[i].policy ||
        a[i].event != b[i].event || a[i].actions != b[i].actions) {
      return false;
    }
  }
  return true;
}

size_t Count(const std::vector<FaultTraceEntry>& trace, int node, const std::string& policy,
             const std::string& event_prefix, const std::string& action = "") {
  size_t n = 0;
  for (const FaultTraceEntry& e : trace) {
    if (node >= 0 && e.node != node) continue;
    if (e.policy != policy || e.event.rfind(event_prefix, 0) != 0) continue;
    const bool has = std::find(e.actions.begin(), e.actions.end(), action) != e.actions.end();
    if (action.empty() || has) ++n;
  }
  return n;
}

// The trace is what the policies decided: the same run gives the same trace, and a relay kill
// shows the recovery policy's decisions (the children's deadlines and fallbacks, the restart).
TEST(FaultWorldTest, TraceRecordsEveryPolicyDecisionDeterministically) {
  FaultSpec kill;
  kill.kind = FaultKind::kKillRelay;
  FaultRunReport a = RunOne({kill}, 14, 6, /*record_trace=*/true);
  FaultRunReport b = RunOne({kill}, 14, 6, /*record_trace=*/true);
  ASSERT_EQ(a.error, "");
  ASSERT_FALSE(a.trace.empty());
  EXPECT_TRUE(SameTrace(a.trace, b.trace));
  // Each receiver's tree policy starts once; the sender sees every blob produced.
  EXPECT_EQ(Count(a.trace, 0, "sender", "Start"), 1u);
  EXPECT_GE(Count(a.trace, 0, "sender", "BlobProduced"), 3u);
  EXPECT_EQ(Count(a.trace, 0, "uploader", "BlobProduced"),
            Count(a.trace, 0, "sender", "BlobProduced"));
  // The killed relay restarts and downloads; its children's deadlines end in fallbacks.
  EXPECT_EQ(Count(a.trace, -1, "recovery", "Restarted"), 1u);
  EXPECT_GE(Count(a.trace, -1, "recovery", "ParentLost"), 1u);
  EXPECT_EQ(Count(a.trace, -1, "recovery", "TimerFired", "FallBackToStore{parent lost}"),
            a.fallbacks_to_store);
  EXPECT_GE(Count(a.trace, -1, "recovery", "TimerFired", "StartDownload"),
            a.fallbacks_to_store + 1);
  EXPECT_GE(Count(a.trace, -1, "recovery", "ChunkDoubtful"), a.overwrite_repairs);
  EXPECT_GE(Count(a.trace, -1, "downloader", "Start"), 1u);
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

TEST(FaultWorldTest, PolicyConfigIsTheRunsConfig) {
  FaultRunOptions o;
  o.receivers = 5;
  o.fan_out = 3;
  o.root_fan_out = 2;
  o.relay.piece_bytes = 512;
  o.detect_timeout_s = 0.1;
  o.max_recoveries = 4;
  auto c = FaultRunPolicyConfig(o);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->topology.size(), 6);
  EXPECT_EQ(c->topology.children[0], (std::vector<NodeId>{1, 2}));
  EXPECT_EQ(c->relay.piece_bytes, 512u);
  EXPECT_EQ(c->relay.prefix, c->recovery.prefix);
  EXPECT_DOUBLE_EQ(c->recovery.detect_timeout_s, 0.1);
  EXPECT_EQ(c->recovery.max_recoveries, 4);
  o.receivers = 0;
  EXPECT_TRUE(FaultRunPolicyConfig(o).status().IsInvalidArgument());
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
