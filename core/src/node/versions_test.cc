// Long-lived nodes: one RunNode per rank (threads, real TCP on 127.0.0.1) taking part in several
// versions, every receiver verified byte for byte at every version; and the sender's joint commit
// over per-receiver reports.
#include "node/versions.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <thread>

#include "dcr/checkpoint.h"
#include "dcr/commitment.h"
#include "dcr/object_store.h"
#include "dcr/relay_policy.h"
#include "dcr/sums.h"
#include "node/catch_up.h"
#include "transport/net.h"

namespace dcr::internal {
namespace {

// v0 .. v<n>: each version changes ~3% of the bytes of the one before.
std::vector<std::string> VersionChain(const std::string& dir, int n) {
  std::mt19937_64 rng(7);
  std::vector<uint8_t> a(128 * 384 * 2), b(1000 * 4);
  for (auto& x : a) x = static_cast<uint8_t>(rng());
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  std::vector<std::string> paths;
  for (int k = 0; k <= n; ++k) {
    if (k > 0) {
      for (size_t i = 0; i < a.size(); i += 2) {
        if (rng() % 100 < 3) a[i] ^= static_cast<uint8_t>(1 + rng() % 255);
      }
      b[rng() % b.size()] ^= 1;
    }
    std::vector<TensorView> views = {{"a.weight", "BF16", {128, 384}, a.data(), a.size()},
                                     {"b.bias", "F32", {1000}, b.data(), b.size()}};
    paths.push_back(dir + "/v" + std::to_string(k) + ".safetensors");
    EXPECT_TRUE(WriteSafetensors(paths.back(), views).ok());
  }
  return paths;
}

TEST(SenderJointCommit, BaselineFollowsEveryLiveReceiverAndDropsTheDead) {
  const VersionId v0{0, Hash128{1, 1}}, v1{1, Hash128{2, 2}}, v2{2, Hash128{3, 3}};
  SenderJointCommit c({1, 2, 3}, v0);
  EXPECT_EQ(c.baseline(), v0);
  auto ok = [](int rank, const VersionId& v) {
    CommitReport r;
    r.rank = rank;
    r.version = v.number;
    r.target_hash = v.hash;
    r.ok = true;
    return r;
  };
  auto dead = c.Published(v0, v1, {ok(1, v1), ok(2, v1), ok(3, v1)}, std::nullopt);
  ASSERT_TRUE(dead.ok()) << dead.status();
  EXPECT_TRUE(dead->empty());
  EXPECT_EQ(c.baseline(), v1);
  // A base other than the baseline is refused.
  EXPECT_TRUE(c.Published(v0, v2, {}, std::nullopt).status().IsFailedPrecondition());
  // Rank 2 reports a wrong hash, rank 3 nothing: both declared dead; rank 1 holds the baseline.
  CommitReport wrong = ok(2, v2);
  wrong.target_hash = Hash128{9, 9};
  dead = c.Published(v1, v2, {ok(1, v2), wrong}, std::nullopt);
  ASSERT_TRUE(dead.ok()) << dead.status();
  ASSERT_EQ(dead->size(), 2u);
  EXPECT_EQ((*dead)[0].first, 2);
  EXPECT_NE((*dead)[0].second.find("content hash"), std::string::npos) << (*dead)[0].second;
  EXPECT_EQ((*dead)[1].first, 3);
  EXPECT_EQ(c.live(), (std::vector<int>{1}));
  EXPECT_EQ(c.baseline(), v2);
}

TEST(SenderJointCommit, SignedVersionCountsOnlyReportsOfItsCommitmentRoot) {
  const VersionId v0{0, Hash128{1, 1}}, v1{1, Hash128{2, 2}};
  Sha256Digest root{}, other{};
  root[0] = 1;
  other[0] = 2;
  SenderJointCommit c({1, 2, 3, 4}, v0);
  auto report = [&](int rank, std::optional<Sha256Digest> commitment) {
    CommitReport r;
    r.rank = rank;
    r.version = v1.number;
    r.target_hash = v1.hash;  // the right content hash every time: it proves nothing
    r.commitment = commitment;
    r.ok = true;
    return r;
  };
  std::vector<int> back;
  auto dead = c.Published(v0, v1, {report(1, root), report(2, other), report(3, std::nullopt)},
                          root, &back);
  ASSERT_TRUE(dead.ok()) << dead.status();
  ASSERT_EQ(dead->size(), 3u);
  EXPECT_EQ((*dead)[0].first, 2);
  EXPECT_NE((*dead)[0].second.find("reported commitment " + CommitmentHex(other)),
            std::string::npos)
      << (*dead)[0].second;
  EXPECT_NE((*dead)[0].second.find("not the signed root " + CommitmentHex(root)),
            std::string::npos);
  EXPECT_EQ((*dead)[1].first, 3);
  EXPECT_NE((*dead)[1].second.find("no commitment root"), std::string::npos) << (*dead)[1].second;
  EXPECT_EQ((*dead)[2].first, 4);
  EXPECT_EQ(c.live(), (std::vector<int>{1}));
  EXPECT_TRUE(back.empty());
}

// One plan per rank of the tree `parents` (threads on 127.0.0.1) taking versions 1..last of
// `ckpt` from ckpt[0], each version's result in <dir>/result-<rank>-v<k>.json.
std::vector<NodePlan> TreePlans(const std::string& dir, const std::vector<std::string>& ckpt,
                                const std::vector<int>& parents, int last) {
  std::vector<std::string> addresses;
  for (size_t r = 0; r < parents.size(); ++r) {
    addresses.push_back("127.0.0.1:" + std::to_string(FreePort().value()));
  }
  std::vector<NodePlan> plans;
  for (int r = 0; r < static_cast<int>(parents.size()); ++r) {
    NodePlan p;
    p.rank = r;
    p.parents = parents;
    p.addresses = addresses;
    p.relay.piece_bytes = 8 << 10;
    p.relay.window_bytes = 32 << 10;
    p.relay.root_streams = 2;
    p.emulate_wan = false;
    p.run_id = 0xabc;
    p.base_path = ckpt[0];
    p.receiver_base_path = ckpt[0];
    p.chunk_elems = 4096;
    p.timeout_s = 30;
    for (int k = 1; k <= last; ++k) {
      NodeVersion v;
      v.version = static_cast<uint64_t>(k);
      v.target_path = ckpt[k];
      v.verify_path = ckpt[k];
      v.result_path = dir + "/result-" + std::to_string(r) + "-v" + std::to_string(k) + ".json";
      p.versions.push_back(v);
    }
    plans.push_back(p);
  }
  return plans;
}

// Runs every plan on its own thread; the statuses.
std::vector<Status> RunAll(const std::vector<NodePlan>& plans) {
  std::vector<Status> status(plans.size());
  std::vector<NodeResult> results(plans.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < plans.size(); ++i) {
    threads.emplace_back([&, i] { status[i] = RunNode(plans[i], &results[i]); });
  }
  for (auto& t : threads) t.join();
  return status;
}

// Every rank's result of version k (1-based).
std::vector<NodeResult> ResultsOf(const std::vector<NodePlan>& plans, int k) {
  std::vector<NodeResult> at;
  for (const NodePlan& p : plans) {
    auto res = ReadResultFile(p.versions[k - 1].result_path);
    EXPECT_TRUE(res.ok()) << "rank " << p.rank << " v" << k << ": " << res.status();
    at.push_back(res.ok() ? *res : NodeResult{});
  }
  return at;
}

TEST(LongLivedNodes, OneSetOfNodesAppliesThreeVersionsOverARelayTree) {
  char tmpl[] = "/tmp/dcr_versions_XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::vector<std::string> ckpt = VersionChain(dir, 3);
  const std::vector<int> parents = {-1, 0, 0, 1, 1, 2};  // two relays, three leaves
  const std::vector<NodePlan> plans = TreePlans(dir, ckpt, parents, 3);
  const std::vector<Status> status = RunAll(plans);
  for (size_t i = 0; i < plans.size(); ++i) EXPECT_TRUE(status[i].ok()) << i << ": " << status[i];
  for (int k = 1; k <= 3; ++k) {
    const std::vector<NodeResult> at = ResultsOf(plans, k);
    const NodeResult& sender = at[0];
    EXPECT_TRUE(sender.ok) << "v" << k << ": " << sender.error;
    ASSERT_EQ(sender.reports.size(), parents.size() - 1) << "v" << k;
    for (const CommitReport& c : sender.reports) {
      EXPECT_TRUE(c.ok) << "v" << k << " rank " << c.rank;
      EXPECT_EQ(c.version, static_cast<uint64_t>(k));
      EXPECT_EQ(c.target_hash, sender.target_hash);
    }
    auto want = Checkpoint::Open(ckpt[k]);
    ASSERT_TRUE(want.ok());
    EXPECT_EQ(sender.target_hash, (*want)->ContentHash());
    for (size_t r = 1; r < at.size(); ++r) {
      EXPECT_TRUE(at[r].verified) << "v" << k << " rank " << r << ": " << at[r].verify_message;
    }
    // Each version's delta carries only that version's changes, not the way from v0.
    EXPECT_LT(sender.payload_bytes, (*want)->total_tensor_bytes() / 4) << "v" << k;
  }
}

// A sender with a state_dir writes the sums of every version it builds and takes the next
// version's base hash from them: the sums of the last version are its checkpoint's, and those
// of versions no build can start from again are gone.
TEST(LongLivedNodes, TheSenderKeepsTheSumsOfTheVersionsItBuilds) {
  char tmpl[] = "/tmp/dcr_versions_XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::vector<std::string> ckpt = VersionChain(dir, 3);
  std::vector<NodePlan> plans = TreePlans(dir, ckpt, {-1, 0, 0}, 3);
  plans[0].state_dir = dir + "/sender-state";
  ASSERT_EQ(::mkdir(plans[0].state_dir.c_str(), 0700), 0);
  const std::vector<Status> status = RunAll(plans);
  for (size_t i = 0; i < plans.size(); ++i) EXPECT_TRUE(status[i].ok()) << i << ": " << status[i];
  for (int k = 1; k <= 3; ++k) {
    const std::vector<NodeResult> at = ResultsOf(plans, k);
    for (size_t r = 1; r < at.size(); ++r) {
      EXPECT_TRUE(at[r].verified) << "v" << k << " rank " << r << ": " << at[r].verify_message;
    }
  }
  const std::string sums_dir = plans[0].state_dir + "/sender-sums";
  auto v3 = Checkpoint::Open(ckpt[3]);
  ASSERT_TRUE(v3.ok());
  auto sums = ReadSums(sums_dir + "/v3.sums");
  ASSERT_TRUE(sums.ok()) << sums.status();
  EXPECT_EQ(sums->content_hash, (*v3)->ContentHash());
  EXPECT_TRUE(CheckSums(**v3, *sums, 1).ok());
  EXPECT_EQ(::access((sums_dir + "/v2.sums").c_str(), F_OK), 0);  // the base of v3
  EXPECT_NE(::access((sums_dir + "/v1.sums").c_str(), F_OK), 0);
}

// Without a folder for its sums (here: TMPDIR names none) the sender hashes every base in full,
// and the versions still reach every receiver exactly.
TEST(LongLivedNodes, ASenderWithoutASumsFolderStillRefitsEveryVersion) {
  char tmpl[] = "/tmp/dcr_versions_XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::vector<std::string> ckpt = VersionChain(dir, 2);
  const std::vector<NodePlan> plans = TreePlans(dir, ckpt, {-1, 0}, 2);
  const char* old = std::getenv("TMPDIR");
  const std::string saved = old != nullptr ? old : "";
  ASSERT_EQ(::setenv("TMPDIR", (dir + "/no-such-folder").c_str(), 1), 0);
  const std::vector<Status> status = RunAll(plans);
  if (old != nullptr) {
    ::setenv("TMPDIR", saved.c_str(), 1);
  } else {
    ::unsetenv("TMPDIR");
  }
  for (size_t i = 0; i < plans.size(); ++i) EXPECT_TRUE(status[i].ok()) << i << ": " << status[i];
  for (int k = 1; k <= 2; ++k) {
    EXPECT_TRUE(ResultsOf(plans, k)[1].verified) << "v" << k;
  }
}

// NodePlan::base_sums for the plan's base: a sums file that matches the base gives the delta's
// base hash (a forged content hash over the right regions is what the sender sends, and every
// receiver refuses it); one that no longer matches is not used, and the refit is exact.
TEST(LongLivedNodes, TheSenderUsesBaseSumsOnlyWhileTheBaseMatchesThem) {
  char tmpl[] = "/tmp/dcr_versions_XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::vector<std::string> ckpt = VersionChain(dir, 1);
  auto v0 = Checkpoint::Open(ckpt[0]);
  auto v1 = Checkpoint::Open(ckpt[1]);
  ASSERT_TRUE(v0.ok() && v1.ok());
  // Stale: v1's sums given as v0's.
  const std::string stale = dir + "/stale.sums";
  ASSERT_TRUE(WriteSums(stale, ComputeSums(**v1, (*v1)->ContentHash(), 1)).ok());
  std::vector<NodePlan> plans = TreePlans(dir, ckpt, {-1, 0}, 1);
  plans[0].base_sums = stale;
  std::vector<Status> status = RunAll(plans);
  EXPECT_TRUE(status[0].ok()) << status[0];
  EXPECT_TRUE(status[1].ok()) << status[1];
  EXPECT_TRUE(ResultsOf(plans, 1)[1].verified) << ResultsOf(plans, 1)[1].verify_message;
  // Forged: v0's regions with another content hash.
  const std::string forged = dir + "/forged.sums";
  ASSERT_TRUE(WriteSums(forged, ComputeSums(**v0, Hash128{1, 2}, 1)).ok());
  plans = TreePlans(dir, ckpt, {-1, 0}, 1);
  plans[0].base_sums = forged;
  plans[0].timeout_s = 10;
  plans[1].timeout_s = 10;
  status = RunAll(plans);
  EXPECT_TRUE(status[1].IsFailedPrecondition()) << status[1];
  EXPECT_NE(status[1].ToString().find("delta is for base " + Hash128{1, 2}.ToHex()),
            std::string::npos)
      << status[1];
  EXPECT_FALSE(ResultsOf(plans, 1)[1].verified);
}

TEST(LongLivedNodes, VersionNumbersMustIncrease) {
  NodePlan p;
  p.rank = 1;
  p.versions = {NodeVersion{2, "a", "", "", ""}, NodeVersion{2, "b", "", "", ""}};
  NodeResult r;
  Status s = RunNode(p, &r);
  EXPECT_TRUE(s.IsInvalidArgument()) << s;
}

// An open-ended plan's next version: the number, the prefix's last step-<k> and the result
// path's last -v<k>.json move on by one; nothing else is carried.
TEST(NextOpenVersion, RenumbersThePrefixAndTheResultPath) {
  NodeVersion v;
  v.version = 9;
  v.prefix = "step-3/refit/step-9";
  v.result_path = "/s-v9/state/node-2-v9.json";
  v.target_path = "/t/step9.safetensors";
  v.verify_path = "/t/step9.safetensors";
  const NodeVersion n = NextOpenVersion(v);
  EXPECT_EQ(n.version, 10u);
  EXPECT_EQ(n.prefix, "step-3/refit/step-10");
  EXPECT_EQ(n.result_path, "/s-v9/state/node-2-v10.json");
  EXPECT_TRUE(n.target_path.empty());
  EXPECT_TRUE(n.verify_path.empty());
  EXPECT_EQ(NextOpenVersion(n).prefix, "step-3/refit/step-11");
}

// The sender's collection of reports that tree receivers held dead leave in the in-region store
// (restarted hosts, late returners), fed into the joint commit as RunNodeVersions does.
class ReturningReportsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dcr-returning-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto store = OpenObjectStore("dir:" + dir_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    plan_.run_id = 77;
    plan_.parents = {-1, 0, 1, 1, 2, 2};  // tree receivers 1..5
    plan_.receiver_deadline_s = 0.6;
    root1_[0] = 1;
    root2_[0] = 2;
    wrong_[0] = 3;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  static CommitReport Committed(int rank, const VersionId& v, const Sha256Digest& root) {
    CommitReport r;
    r.rank = rank;
    r.run = 77;
    r.version = v.number;
    r.target_hash = v.hash;
    r.commitment = root;
    r.ok = true;
    return r;
  }
  double Collect(const std::vector<int>& live, const std::vector<CommitReport>& tree,
                 std::vector<CommitReport>* got) {
    const auto t0 = std::chrono::steady_clock::now();
    *got = CollectReturningTreeReports(store_.get(), plan_, "d/step-2", 2, "d/step-1", 1, live,
                                       tree, nullptr);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  static std::vector<int> Ranks(const std::vector<CommitReport>& reports) {
    std::vector<int> out;
    for (const CommitReport& c : reports) out.push_back(c.rank);
    std::sort(out.begin(), out.end());
    return out;
  }

  std::string dir_;
  std::unique_ptr<ObjectStore> store_;
  NodePlan plan_;
  const VersionId v0_{0, Hash128{1, 1}}, v1_{1, Hash128{2, 2}}, v2_{2, Hash128{3, 3}};
  Sha256Digest root1_{}, root2_{}, wrong_{};
};

TEST_F(ReturningReportsTest, DeadRankBackByTheStoreCountsAndAWrongRootDoesNot) {
  // Version 1: only rank 1 reports; ranks 2..5 are declared dead.
  SenderJointCommit commit({1, 2, 3, 4, 5}, v0_);
  auto dead = commit.Published(v0_, v1_, {Committed(1, v1_, root1_)}, root1_);
  ASSERT_TRUE(dead.ok()) << dead.status();
  ASSERT_EQ(dead->size(), 4u);
  ASSERT_EQ(commit.live(), (std::vector<int>{1}));
  // Version 2: rank 2 came back and left its report of version 2 in the store; rank 3 left one
  // with another commitment root; rank 5 left nothing of either version (an absent host: no
  // wait); rank 4 is silent too.
  ASSERT_TRUE(PutRegionReport(store_.get(), "d/step-2", 2, 77, 2, v2_.hash, root2_).ok());
  ASSERT_TRUE(PutRegionReport(store_.get(), "d/step-2", 3, 77, 2, v2_.hash, wrong_).ok());
  // Another run's report of rank 4 is not taken.
  ASSERT_TRUE(PutRegionReport(store_.get(), "d/step-2", 4, 78, 2, v2_.hash, root2_).ok());
  const std::vector<CommitReport> tree = {Committed(1, v2_, root2_)};
  std::vector<CommitReport> got;
  const double s = Collect(commit.live(), tree, &got);
  EXPECT_LT(s, 0.5) << "no rank committed version 1, so none is waited for";
  EXPECT_EQ(Ranks(got), (std::vector<int>{2, 3}));
  // The joint commit re-admits rank 2 and not rank 3 (wrong root) or the silent ones.
  std::vector<CommitReport> all = tree;
  all.insert(all.end(), got.begin(), got.end());
  std::vector<int> readmitted;
  dead = commit.Published(v1_, v2_, all, root2_, &readmitted);
  ASSERT_TRUE(dead.ok()) << dead.status();
  EXPECT_TRUE(dead->empty());
  EXPECT_EQ(readmitted, (std::vector<int>{2}));
  EXPECT_EQ(commit.live(), (std::vector<int>{1, 2}));
  EXPECT_EQ(commit.baseline(), v2_);
}

TEST_F(ReturningReportsTest, RankThatCommittedTheVersionBeforeIsWaitedForAtMostTheDeadline) {
  // Rank 4 committed version 1 by the store (it is one version behind, on its way back) and
  // reports nothing of version 2: the collection waits the per-receiver deadline for it, no
  // longer, and returns without it.
  ASSERT_TRUE(PutRegionReport(store_.get(), "d/step-1", 4, 77, 1, v1_.hash, root1_).ok());
  std::vector<CommitReport> got;
  double s = Collect({1}, {Committed(1, v2_, root2_)}, &got);
  EXPECT_TRUE(got.empty());
  EXPECT_GE(s, plan_.receiver_deadline_s);
  EXPECT_LT(s, plan_.receiver_deadline_s + 2.0);
  // A live rank, or one whose committed report the tree already brought, is not waited for.
  s = Collect({1, 4}, {Committed(1, v2_, root2_)}, &got);
  EXPECT_TRUE(got.empty());
  EXPECT_LT(s, 0.5);
  s = Collect({1}, {Committed(1, v2_, root2_), Committed(4, v2_, root2_)}, &got);
  EXPECT_TRUE(got.empty());
  EXPECT_LT(s, 0.5);
  // Its report of version 2 arriving during the wait ends it early, and it is counted.
  plan_.receiver_deadline_s = 20;
  std::thread late([this] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_TRUE(PutRegionReport(store_.get(), "d/step-2", 4, 77, 2, v2_.hash, root2_).ok());
  });
  s = Collect({1}, {Committed(1, v2_, root2_)}, &got);
  late.join();
  EXPECT_EQ(Ranks(got), (std::vector<int>{4}));
  EXPECT_GE(s, 0.25);
  EXPECT_LT(s, 10.0);
}

}  // namespace
}  // namespace dcr::internal
