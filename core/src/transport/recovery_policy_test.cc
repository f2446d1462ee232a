// Recovery policy tests: every event in every mode and the actions it must give (rules R1-R9 of
// dcr/recovery_policy.h), the budget, and deterministic replay of seeded event sequences.
#include "dcr/recovery_policy.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace dcr {
namespace {

using recovery::Action;
using recovery::Event;

// Runs `events` (time, event) through `p` and returns every action as a string, one per action,
// each prefixed with the time of the event that produced it.
std::vector<std::string> Feed(RecoveryPolicy* p,
                              const std::vector<std::pair<double, Event>>& events) {
  std::vector<std::string> out;
  for (const auto& [t, e] : events) {
    std::vector<Action> acts;
    p->Handle(t, e, &acts);
    for (const Action& a : acts) out.push_back(recovery::ToString(a));
  }
  return out;
}

std::vector<std::string> One(RecoveryPolicy* p, double t, const Event& e) {
  return Feed(p, {{t, e}});
}

using Strings = std::vector<std::string>;

RecoveryOptions Opts() {
  RecoveryOptions o;
  o.detect_timeout_s = 0.25;
  o.max_recoveries = 12;
  o.prefix = "refit";
  return o;
}

TEST(RecoveryPolicy, OverwriteKeyAndNames) {
  EXPECT_EQ(OverwriteKey("refit-v1", 17), "ow/refit-v1/17");
  EXPECT_STREQ(RecoveryModeName(RecoveryPolicy::Mode::kStore), "store");
  EXPECT_EQ(recovery::ToString(Event{recovery::ParentLost{2, 0}}), "ParentLost{2 adopter 0}");
  EXPECT_EQ(recovery::ToString(Event{
                recovery::StreamFailed{recovery::Stream::kDownload, StatusCode::kDataLoss, "bad"}}),
            "StreamFailed{download DATA_LOSS: bad}");
  EXPECT_EQ(recovery::ToString(Action{recovery::SetTimer{1.5}}), "SetTimer{1.5000}");
}

// R1 + R2 + R4: a lost parent is declared dead after the deadline, then the store, with backoff.
TEST(RecoveryPolicy, LostParentFallsBackToTheStoreAfterTheDeadline) {
  RecoveryPolicy p(RecoveryRole::kReceiver, Opts());
  EXPECT_EQ(p.mode(), RecoveryPolicy::Mode::kTree);
  EXPECT_EQ(One(&p, 1.0, recovery::ParentLost{3, kNoNode}), Strings{"SetTimer{1.2500}"});
  EXPECT_TRUE(p.parent_suspected());
  // A second report keeps the first deadline.
  EXPECT_EQ(One(&p, 1.1, recovery::ParentLost{3, kNoNode}), Strings{});
  EXPECT_EQ(One(&p, 1.25, recovery::TimerFired{}),
            (Strings{"FallBackToStore{parent lost}", "LeaveTree", "SetTimer{1.2600}"}));
  EXPECT_EQ(p.mode(), RecoveryPolicy::Mode::kStore);
  EXPECT_EQ(p.recoveries(), 1);
  EXPECT_FALSE(p.parent_suspected());
  // Out of the tree: a lost parent means nothing.
  EXPECT_EQ(One(&p, 1.255, recovery::ParentLost{3, kNoNode}), Strings{});
  EXPECT_EQ(One(&p, 1.26, recovery::TimerFired{}), Strings{"StartDownload"});
  // A late or spurious timer does nothing.
  EXPECT_EQ(One(&p, 1.3, recovery::TimerFired{}), Strings{});
}

TEST(RecoveryPolicy, ParentHeardCancelsTheDeadline) {
  RecoveryPolicy p(RecoveryRole::kReceiver, Opts());
  EXPECT_EQ(One(&p, 0, recovery::ParentLost{1, kNoNode}), Strings{"SetTimer{0.2500}"});
  EXPECT_EQ(One(&p, 0.1, recovery::ParentHeard{2}), Strings{});  // another node: still suspected
  EXPECT_TRUE(p.parent_suspected());
  EXPECT_EQ(One(&p, 0.1, recovery::ParentHeard{1}), Strings{});
  EXPECT_FALSE(p.parent_suspected());
  EXPECT_EQ(One(&p, 0.25, recovery::TimerFired{}), Strings{});
  EXPECT_EQ(p.mode(), RecoveryPolicy::Mode::kTree);
  EXPECT_EQ(p.recoveries(), 0);
  // The deadline can be armed again.
  EXPECT_EQ(One(&p, 0.5, recovery::ParentLost{1, kNoNode}), Strings{"SetTimer{0.7500}"});
}

// R2: the grandparent when offered (not the sender), once; the second loss goes to the store.
TEST(RecoveryPolicy, ReparentsToAnOfferedGrandparentOnce) {
  RecoveryPolicy p(RecoveryRole::kReceiver, Opts());
  One(&p, 0, recovery::ParentLost{4, 1});
  EXPECT_EQ(One(&p, 0.25, recovery::TimerFired{}), Strings{"Reparent{1}"});
  EXPECT_EQ(p.mode(), RecoveryPolicy::Mode::kTree);
  EXPECT_EQ(p.recoveries(), 1);
  One(&p, 1, recovery::ParentLost{1, 7});
  EXPECT_EQ(One(&p, 1.25, recovery::TimerFired{}),
            (Strings{"FallBackToStore{parent lost}", "LeaveTree", "SetTimer{1.2700}"}));
  EXPECT_EQ(p.recoveries(), 2);
}

TEST(RecoveryPolicy, NeverReparentsToTheSender) {
  RecoveryPolicy p(RecoveryRole::kReceiver, Opts());
  One(&p, 0, recovery::ParentLost{1, 0});
  EXPECT_EQ(One(&p, 0.25, recovery::TimerFired{}),
            (Strings{"FallBackToStore{parent lost}", "LeaveTree", "SetTimer{0.2600}"}));
}

// R3 + R4: a failed stream falls back at once; only a tree node leaves the tree; backoff doubles
// and is capped.
TEST(RecoveryPolicy, FailedStreamsFallBackWithDoublingBackoff) {
  RecoveryPolicy p(RecoveryRole::kReceiver, Opts());
  EXPECT_EQ(One(&p, 2,
                recovery::StreamFailed{recovery::Stream::kTree, StatusCode::kDataLoss,
                                       "chunk blob 3: checksum"}),
            (Strings{"FallBackToStore{chunk blob 3: checksum}", "LeaveTree", "SetTimer{2.0100}"}));
  const double want[] = {0.02, 0.04, 0.08, 0.16, 0.32, 0.5, 0.5};
  for (double w : want) {
    std::vector<Action> acts;
    p.Handle(10,
             recovery::StreamFailed{recovery::Stream::kDownload, StatusCode::kUnavailable,
                                    "list failed"},
             &acts);
    ASSERT_EQ(acts.size(), 2u);
    EXPECT_EQ(recovery::ToString(acts[0]), "FallBackToStore{list failed}");
    ASSERT_TRUE(std::holds_alternative<recovery::SetTimer>(acts[1]));
    EXPECT_DOUBLE_EQ(std::get<recovery::SetTimer>(acts[1]).at, 10 + w);
  }
  EXPECT_EQ(p.recoveries(), 8);
}

// R7: the budget spans fallbacks, re-parents and restarts; GiveUp is terminal.
TEST(RecoveryPolicy, GivesUpWhenTheBudgetIsSpent) {
  RecoveryOptions o = Opts();
  o.max_recoveries = 2;
  RecoveryPolicy p(RecoveryRole::kReceiver, o);
  const recovery::StreamFailed fail{recovery::Stream::kTree, StatusCode::kUnavailable, "x"};
  EXPECT_EQ(One(&p, 0, fail).size(), 3u);
  EXPECT_EQ(One(&p, 1, recovery::Restarted{}), Strings{"SetTimer{1.0000}"});
  EXPECT_EQ(One(&p, 2, fail), Strings{"GiveUp{too many recoveries (2 allowed; x)}"});
  EXPECT_EQ(p.mode(), RecoveryPolicy::Mode::kGaveUp);
  EXPECT_EQ(One(&p, 3, fail), Strings{});
  EXPECT_EQ(One(&p, 3, recovery::Restarted{}), Strings{});
  EXPECT_EQ(One(&p, 3, recovery::TimerFired{}), Strings{});
  EXPECT_EQ(One(&p, 3, recovery::ChunkDoubtful{1}), Strings{});

  // Recoveries spent before (a supervisor's count) are charged.
  RecoveryPolicy q(RecoveryRole::kReceiver, o, /*in_tree=*/true, /*recoveries_spent=*/2);
  EXPECT_EQ(One(&q, 0, recovery::Restarted{}),
            Strings{"GiveUp{too many recoveries (2 allowed; restart)}"});
}

// R5: restart with storage kept, storage lost, target already committed.
TEST(RecoveryPolicy, RestartResumesFromTheJournal) {
  RecoveryPolicy kept(RecoveryRole::kReceiver, Opts());
  EXPECT_EQ(One(&kept, 5, recovery::Restarted{false, false, 7, 1}), Strings{"SetTimer{5.0000}"});
  EXPECT_EQ(kept.mode(), RecoveryPolicy::Mode::kStore);
  EXPECT_EQ(One(&kept, 5, recovery::TimerFired{}), Strings{"StartDownload"});
  EXPECT_EQ(kept.recoveries(), 1);

  RecoveryPolicy lost(RecoveryRole::kReceiver, Opts());
  EXPECT_EQ(One(&lost, 5, recovery::Restarted{true, false, 7, 1}),
            (Strings{"ReloadCommitted", "SetTimer{5.0000}"}));

  RecoveryPolicy done(RecoveryRole::kReceiver, Opts());
  EXPECT_EQ(One(&done, 5, recovery::Restarted{false, true, 0, 0}), Strings{});
  EXPECT_EQ(done.mode(), RecoveryPolicy::Mode::kCommitted);
  RecoveryPolicy done_lost(RecoveryRole::kReceiver, Opts());
  EXPECT_EQ(One(&done_lost, 5, recovery::Restarted{true, true, 0, 0}), Strings{"ReloadCommitted"});
  EXPECT_EQ(done_lost.mode(), RecoveryPolicy::Mode::kCommitted);
}

TEST(RecoveryPolicy, RestartForgetsAPendingDeadline) {
  RecoveryPolicy p(RecoveryRole::kReceiver, Opts());
  One(&p, 0, recovery::ParentLost{1, kNoNode});
  EXPECT_EQ(One(&p, 0.1, recovery::Restarted{}), Strings{"SetTimer{0.1000}"});
  EXPECT_FALSE(p.parent_suspected());
  EXPECT_EQ(One(&p, 0.1, recovery::TimerFired{}), Strings{"StartDownload"});
  EXPECT_EQ(One(&p, 0.25, recovery::TimerFired{}), Strings{});
}

// R6: every refusal of a doubtful chunk asks for its overwrite form, in any mode.
TEST(RecoveryPolicy, DoubtfulChunksAskForTheirOverwriteForm) {
  RecoveryPolicy p(RecoveryRole::kReceiver, Opts());
  EXPECT_EQ(One(&p, 0, recovery::ChunkDoubtful{9}), Strings{"RequestOverwrite{9 ow/refit/9}"});
  EXPECT_EQ(One(&p, 0, recovery::ChunkDoubtful{9}), Strings{"RequestOverwrite{9 ow/refit/9}"});
  One(&p, 1, recovery::Restarted{});
  EXPECT_EQ(One(&p, 1, recovery::ChunkDoubtful{4}), Strings{"RequestOverwrite{4 ow/refit/4}"});
  EXPECT_EQ(p.recoveries(), 1);  // a repair is not a recovery
}

// R8: a committed node only leaves the tree.
TEST(RecoveryPolicy, CommittedNodesDoNotRecover) {
  RecoveryPolicy p(RecoveryRole::kReceiver, Opts());
  One(&p, 0, recovery::ParentLost{1, kNoNode});
  EXPECT_EQ(One(&p, 0.1, recovery::Committed{}), Strings{});
  EXPECT_EQ(p.mode(), RecoveryPolicy::Mode::kCommitted);
  EXPECT_EQ(One(&p, 0.25, recovery::TimerFired{}), Strings{});
  EXPECT_EQ(One(&p, 0.3, recovery::ParentLost{1, kNoNode}), Strings{});
  EXPECT_EQ(One(&p, 0.4,
                recovery::StreamFailed{recovery::Stream::kTree, StatusCode::kUnavailable,
                                       "send to 5 failed"}),
            Strings{"LeaveTree"});
  EXPECT_EQ(
      One(&p, 0.4,
          recovery::StreamFailed{recovery::Stream::kDownload, StatusCode::kUnavailable, "late"}),
      Strings{});
  EXPECT_EQ(p.recoveries(), 0);
}

TEST(RecoveryPolicy, StoreStartedNodesIgnoreTheTree) {
  RecoveryPolicy p(RecoveryRole::kReceiver, Opts(), /*in_tree=*/false);
  EXPECT_EQ(p.mode(), RecoveryPolicy::Mode::kStore);
  EXPECT_EQ(One(&p, 0, recovery::ParentLost{1, 2}), Strings{});
  EXPECT_EQ(One(&p, 0,
                recovery::StreamFailed{recovery::Stream::kDownload, StatusCode::kDeadlineExceeded,
                                       "poll timeout"}),
            (Strings{"FallBackToStore{poll timeout}", "SetTimer{0.0100}"}));
}

// R9: the sender leaves the tree, stops uploading, re-publishes; no budget, no tree events.
TEST(RecoveryPolicy, SenderDecisions) {
  RecoveryOptions o = Opts();
  o.max_recoveries = 0;
  RecoveryPolicy s(RecoveryRole::kSender, o);
  EXPECT_EQ(One(&s, 0,
                recovery::StreamFailed{recovery::Stream::kTree, StatusCode::kUnavailable,
                                       "long link partitioned"}),
            Strings{"LeaveTree"});
  EXPECT_EQ(One(&s, 0,
                recovery::StreamFailed{recovery::Stream::kUpload, StatusCode::kUnavailable,
                                       "put failed"}),
            Strings{"StopUpload"});
  EXPECT_EQ(One(&s, 1, recovery::Restarted{}), Strings{"Republish"});
  EXPECT_EQ(One(&s, 2, recovery::Restarted{}), Strings{"Republish"});
  EXPECT_EQ(One(&s, 2, recovery::ParentLost{1, kNoNode}), Strings{});
  EXPECT_EQ(One(&s, 2, recovery::ChunkDoubtful{1}), Strings{});
  EXPECT_EQ(One(&s, 2, recovery::TimerFired{}), Strings{});
  EXPECT_EQ(s.role(), RecoveryRole::kSender);
}

// Records each environment call as the action's ToString form.
class RecordingEnv : public RecoveryEnvironment {
 public:
  Strings calls;
  void SetTimer(TimePoint at) override { Add(recovery::SetTimer{at}); }
  void FallBackToStore(const std::string& r) override { Add(recovery::FallBackToStore{r}); }
  void LeaveTree() override { Add(recovery::LeaveTree{}); }
  void StartDownload() override { Add(recovery::StartDownload{}); }
  void Reparent(NodeId to) override { Add(recovery::Reparent{to}); }
  void ReloadCommitted() override { Add(recovery::ReloadCommitted{}); }
  void RequestOverwrite(uint64_t id, const std::string& key) override {
    Add(recovery::RequestOverwrite{id, key});
  }
  void StopUpload() override { Add(recovery::StopUpload{}); }
  void Republish() override { Add(recovery::Republish{}); }
  void GiveUp(const std::string& m) override { Add(recovery::GiveUp{m}); }

 private:
  void Add(const Action& a) { calls.push_back(recovery::ToString(a)); }
};

TEST(RecoveryPolicy, PerformRecoveryMakesOneCallPerActionInOrder) {
  const std::vector<Action> all = {recovery::SetTimer{2},
                                   recovery::FallBackToStore{"why"},
                                   recovery::LeaveTree{},
                                   recovery::StartDownload{},
                                   recovery::Reparent{3},
                                   recovery::ReloadCommitted{},
                                   recovery::RequestOverwrite{5, "ow/p/5"},
                                   recovery::StopUpload{},
                                   recovery::Republish{},
                                   recovery::GiveUp{"spent"}};
  RecordingEnv env;
  PerformRecovery(all, &env);
  Strings want;
  for (const Action& a : all) want.push_back(recovery::ToString(a));
  EXPECT_EQ(env.calls, want);
  // Reversed order in, reversed calls out.
  RecordingEnv rev;
  PerformRecovery(std::vector<Action>(all.rbegin(), all.rend()), &rev);
  EXPECT_EQ(rev.calls, Strings(want.rbegin(), want.rend()));
}

// Seeded random event sequences: the same events give the same actions, the budget holds, GiveUp
// is terminal, and every StartDownload follows a timer the policy set.
TEST(RecoveryPolicy, DeterministicReplayOfSeededTraces) {
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    std::mt19937_64 rng(seed);
    std::vector<std::pair<double, Event>> events;
    double t = 0;
    for (int i = 0; i < 60; ++i) {
      t += static_cast<double>(rng() % 100) / 100;
      switch (rng() % 7) {
        case 0:
          events.emplace_back(t, recovery::ParentLost{1, static_cast<NodeId>(rng() % 3) - 1});
          break;
        case 1:
          events.emplace_back(t, recovery::ParentHeard{static_cast<NodeId>(rng() % 2)});
          break;
        case 2:
          events.emplace_back(t, recovery::StreamFailed{static_cast<recovery::Stream>(rng() % 3),
                                                        StatusCode::kUnavailable, "f"});
          break;
        case 3:
          if (rng() % 8 == 0) events.emplace_back(t, recovery::Committed{});
          break;
        case 4:
          events.emplace_back(t, recovery::Restarted{rng() % 2 == 0, rng() % 10 == 0, 3, 1});
          break;
        case 5:
          events.emplace_back(t, recovery::ChunkDoubtful{rng() % 5});
          break;
        default:
          events.emplace_back(t, recovery::TimerFired{});
      }
    }
    RecoveryOptions o = Opts();
    o.max_recoveries = static_cast<int>(rng() % 6);
    RecoveryPolicy a(RecoveryRole::kReceiver, o), b(RecoveryRole::kReceiver, o);
    const Strings first = Feed(&a, events);
    EXPECT_EQ(first, Feed(&b, events)) << "seed " << seed;
    EXPECT_LE(a.recoveries(), o.max_recoveries + 1) << "seed " << seed;
    int give_ups = 0;
    bool timer_set = false;
    for (size_t i = 0; i < first.size(); ++i) {
      if (first[i].rfind("GiveUp", 0) == 0) {
        ++give_ups;
        EXPECT_EQ(i + 1, first.size()) << "GiveUp is terminal, seed " << seed;
      }
      if (first[i].rfind("SetTimer", 0) == 0) timer_set = true;
      if (first[i] == "StartDownload") {
        EXPECT_TRUE(timer_set) << "seed " << seed;
        timer_set = false;
      }
    }
    EXPECT_LE(give_ups, 1);
    EXPECT_EQ(give_ups == 1, a.mode() == RecoveryPolicy::Mode::kGaveUp) << "seed " << seed;
  }
}

}  // namespace
}  // namespace dcr
