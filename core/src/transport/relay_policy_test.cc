// State-machine tests: a deterministic in-memory driver delivers actions as events in random
// (seeded) orders and checks the contract of dcr/relay_policy.h.
#include "dcr/relay_policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <random>
#include <set>

namespace dcr {
namespace {

TEST(Topology, FanOutShapes) {
  auto t = Topology::FanOut(8, 2, 1);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->children[0], (std::vector<NodeId>{1}));
  EXPECT_EQ(t->children[1], (std::vector<NodeId>{2, 3}));
  EXPECT_EQ(t->children[2], (std::vector<NodeId>{4, 5}));
  EXPECT_EQ(t->Depth(7), 3);
  EXPECT_EQ(t->SubtreeSize(0), 7);
  auto wide = Topology::FanOut(5, 1, 4);
  ASSERT_TRUE(wide.ok());
  EXPECT_EQ(wide->children[0].size(), 4u);
  EXPECT_FALSE(Topology::FanOut(0, 2).ok());
  EXPECT_FALSE(Topology::FanOut(3, 0).ok());
}

TEST(Topology, FromParentsValidates) {
  auto t = Topology::FromParents({-1, 0, 1, 1});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->children[1], (std::vector<NodeId>{2, 3}));
  auto bad = Topology::FromParents({-1, 0, 5});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("parents[2]"), std::string::npos);
  EXPECT_FALSE(Topology::FromParents({0, 0}).ok());
  auto cycle = Topology::FromParents({-1, 2, 1});
  ASSERT_FALSE(cycle.ok());
  EXPECT_NE(cycle.status().message().find("cycle"), std::string::npos);
}

TEST(ObjectKeys, RoundTrip) {
  BlobInfo b{42, BlobKind::kChunk, 0};
  std::string k = ObjectKey("refit/step-2", b);
  EXPECT_EQ(k, "refit/step-2/0000000042.chk");
  auto back = ParseObjectKey("refit/step-2", k);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->id, 42u);
  EXPECT_EQ(back->kind, BlobKind::kChunk);
  EXPECT_FALSE(ParseObjectKey("refit/step-2", "refit/step-2/00042.chk").ok());
  EXPECT_FALSE(ParseObjectKey("other", k).ok());
  EXPECT_LT(ObjectKey("p", {9, BlobKind::kChunk, 0}), ObjectKey("p", {10, BlobKind::kTrailer, 0}));
}

std::vector<BlobInfo> MakeStream(int chunks, uint64_t piece, std::mt19937_64* rng) {
  std::vector<BlobInfo> s;
  s.push_back({0, BlobKind::kHeader, 100});
  for (int i = 1; i <= chunks; ++i) {
    // Sizes around piece multiples, including empty and exact multiples.
    uint64_t size = (*rng)() % (3 * piece + 1);
    if (i == 2) size = 0;
    if (i == 3) size = 2 * piece;
    s.push_back({static_cast<BlobId>(i), BlobKind::kChunk, size});
  }
  s.push_back({static_cast<BlobId>(chunks + 1), BlobKind::kTrailer, 40});
  return s;
}

// Runs a whole tree with every pending completion delivered in random order.
struct TreeRun {
  int receivers_committed = -1;
  std::map<NodeId, std::vector<BlobId>> applied;  // apply order per node
  std::map<NodeId, std::map<BlobId, uint64_t>> received_bytes;
  std::map<NodeId, int> commits;
  std::map<NodeId, std::set<BlobId>> released;
  uint64_t max_inflight_seen = 0;
  bool failed = false;
};

TreeRun RunTree(const Topology& topo, const RelayOptions& opt, const std::vector<BlobInfo>& stream,
                uint64_t seed, bool shuffle_production) {
  std::mt19937_64 rng(seed);
  const int n = topo.size();
  std::vector<std::unique_ptr<NodePolicy>> nodes;
  for (NodeId i = 0; i < n; ++i) nodes.push_back(MakeTreePolicy(topo, i, opt));
  // Pending deliveries: (node, event).
  std::vector<std::pair<NodeId, Event>> pending;
  std::map<std::pair<NodeId, NodeId>, std::map<int, uint64_t>> inflight;  // (from,to) -> stream
  TreeRun run;
  double now = 0;
  auto handle = [&](NodeId node, const Event& ev) {
    std::vector<Action> out;
    nodes[node]->Handle(now, ev, &out);
    for (auto& a : out) {
      if (auto* s = std::get_if<action::Send>(&a)) {
        EXPECT_EQ(topo.parent[s->to], node);
        uint64_t& f = inflight[{node, s->to}][s->stream];
        f += s->length;
        run.max_inflight_seen = std::max(run.max_inflight_seen, f);
        EXPECT_LE(f, opt.window_bytes);
        EXPECT_EQ(f, s->length) << "a second Send on a stream before SendDone";
        EXPECT_LT(s->stream, EdgeStreams(node, opt));
        pending.emplace_back(s->to, event::DataReceived{s->blob, s->offset, s->length});
        pending.emplace_back(node,
                             event::SendDone{s->to, s->stream, s->blob.id, s->offset, s->length});
        run.received_bytes[s->to][s->blob.id] += s->length;
      } else if (auto* ack = std::get_if<action::Ack>(&a)) {
        pending.emplace_back(ack->to, event::AckReceived{node, ack->blob});
      } else if (auto* ap = std::get_if<action::Apply>(&a)) {
        run.applied[node].push_back(ap->blob.id);
        pending.emplace_back(node, event::ApplyDone{ap->blob.id, true});
      } else if (auto* rc = std::get_if<action::ReportCommit>(&a)) {
        pending.emplace_back(rc->to, event::SubtreeCommitted{node, rc->receivers});
      } else if (std::holds_alternative<action::Commit>(a)) {
        run.commits[node]++;
      } else if (auto* tc = std::get_if<action::TreeCommitted>(&a)) {
        EXPECT_EQ(node, 0);
        run.receivers_committed = tc->receivers;
      } else if (auto* rel = std::get_if<action::Release>(&a)) {
        EXPECT_TRUE(run.released[node].insert(rel->blob).second) << "double release";
      } else if (std::holds_alternative<action::Fail>(a)) {
        run.failed = true;
      }
    }
  };
  for (NodeId i = 0; i < n; ++i) handle(i, event::Start{});
  std::vector<BlobInfo> order = stream;
  if (shuffle_production) std::shuffle(order.begin(), order.end(), rng);
  size_t produced = 0;
  for (int guard = 0; guard < 10000000; ++guard) {
    // Interleave production with deliveries.
    if (produced < order.size() && (pending.empty() || rng() % 4 == 0)) {
      handle(0, event::BlobProduced{order[produced++]});
      continue;
    }
    if (pending.empty()) break;
    size_t i = rng() % pending.size();
    auto [node, ev] = pending[i];
    pending.erase(pending.begin() + static_cast<long>(i));
    if (auto* sd = std::get_if<event::SendDone>(&ev))
      inflight[{node, sd->to}][sd->stream] -= sd->length;
    now += 0.001;
    handle(node, ev);
  }
  return run;
}

void CheckTree(const Topology& topo, const RelayOptions& opt, const std::vector<BlobInfo>& stream,
               const TreeRun& run) {
  ASSERT_FALSE(run.failed);
  EXPECT_EQ(run.receivers_committed, topo.size() - 1);
  for (NodeId i = 1; i < topo.size(); ++i) {
    EXPECT_EQ(run.commits.at(i), 1) << "node " << i;
    const auto& order = run.applied.at(i);
    ASSERT_EQ(order.size(), stream.size()) << "node " << i;
    EXPECT_EQ(order.front(), 0u) << "header first";
    EXPECT_EQ(order.back(), stream.back().id) << "trailer last";
    std::set<BlobId> uniq(order.begin(), order.end());
    EXPECT_EQ(uniq.size(), stream.size());
    for (const auto& b : stream) {
      EXPECT_EQ(run.received_bytes.at(i).count(b.id) ? run.received_bytes.at(i).at(b.id) : 0,
                b.size)
          << "node " << i << " blob " << b.id << " (each piece exactly once)";
    }
  }
  // Every node (sender included) releases every blob once.
  for (NodeId i = 0; i < topo.size(); ++i) {
    EXPECT_EQ(run.released.at(i).size(), stream.size()) << "node " << i;
  }
  EXPECT_LE(run.max_inflight_seen, opt.window_bytes);
}

TEST(TreePolicy, TreesOfManyShapesDeliverEverythingOnce) {
  std::mt19937_64 rng(7);
  for (int receivers : {1, 2, 3, 5, 8, 16}) {
    for (int fan_out : {1, 2, 3, 4}) {
      for (int streams : {1, 3}) {
        RelayOptions opt;
        opt.piece_bytes = 1000;
        opt.window_bytes = 2500;
        opt.root_streams = streams;
        auto topo = Topology::FanOut(receivers + 1, fan_out, 1 + receivers % 2);
        ASSERT_TRUE(topo.ok());
        auto stream = MakeStream(6, opt.piece_bytes, &rng);
        auto run = RunTree(*topo, opt, stream, rng(), /*shuffle_production=*/false);
        SCOPED_TRACE("receivers " + std::to_string(receivers) + " fan_out " +
                     std::to_string(fan_out) + " streams " + std::to_string(streams));
        CheckTree(*topo, opt, stream, run);
      }
    }
  }
}

TEST(TreePolicy, ChunkOrdersAndPureRelays) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 20; ++trial) {
    RelayOptions opt;
    opt.piece_bytes = 512;
    opt.window_bytes = 512;  // one piece in flight per stream
    opt.max_parallel_applies = 1 + trial % 3;
    auto topo = Topology::FromParents({-1, 0, 1, 1, 2, 2, 3});
    ASSERT_TRUE(topo.ok());
    auto stream = MakeStream(5 + trial % 4, opt.piece_bytes, &rng);
    auto run = RunTree(*topo, opt, stream, rng(), /*shuffle_production=*/true);
    CheckTree(*topo, opt, stream, run);
  }
  // A pure relay (apply = false) forwards and reports but does not count itself.
  RelayOptions opt;
  opt.apply = false;
  opt.piece_bytes = 100;
  auto topo = Topology::FanOut(3, 2, 1);
  auto stream = MakeStream(3, 100, &rng);
  auto run = RunTree(*topo, opt, stream, 3, false);
  EXPECT_FALSE(run.failed);
  EXPECT_EQ(run.receivers_committed, 0);
  EXPECT_TRUE(run.applied.empty());
}

TEST(TreePolicy, CutThroughForwardsBeforeBlobIsComplete) {
  RelayOptions opt;
  opt.piece_bytes = 10;
  auto topo = Topology::FanOut(3, 1, 1);  // 0 -> 1 -> 2
  auto relay = MakeTreePolicy(*topo, 1, opt);
  std::vector<Action> out;
  relay->Handle(0, event::Start{}, &out);
  relay->Handle(0, event::DataReceived{{1, BlobKind::kChunk, 35}, 10, 10}, &out);
  ASSERT_EQ(out.size(), 1u);
  auto* s = std::get_if<action::Send>(&out[0]);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->to, 2);
  EXPECT_EQ(s->offset, 10u);
  EXPECT_EQ(s->length, 10u);
  // Duplicate: nothing.
  out.clear();
  relay->Handle(0, event::DataReceived{{1, BlobKind::kChunk, 35}, 10, 10}, &out);
  EXPECT_TRUE(out.empty());
  // Misaligned piece: Fail with kDataLoss.
  relay->Handle(0, event::DataReceived{{1, BlobKind::kChunk, 35}, 15, 10}, &out);
  ASSERT_EQ(out.size(), 1u);
  auto* f = std::get_if<action::Fail>(&out[0]);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->code, StatusCode::kDataLoss);
  EXPECT_TRUE(relay->failed());
}

TEST(TreePolicy, OnePiecePerStreamUntilSendDone) {
  RelayOptions opt;
  opt.piece_bytes = 10;
  opt.window_bytes = 20;
  auto topo = Topology::FanOut(3, 2, 2);  // sender with two children
  auto sender = MakeTreePolicy(*topo, 0, opt);
  std::vector<Action> out;
  sender->Handle(0, event::BlobProduced{{0, BlobKind::kHeader, 50}}, &out);
  // One piece per child: its only stream is busy until the transport accepts it.
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(std::get<action::Send>(out[0]).to, 1);
  EXPECT_EQ(std::get<action::Send>(out[1]).to, 2);
  out.clear();
  sender->Handle(0, event::SendDone{1, 0, 0, 0, 10}, &out);
  ASSERT_EQ(out.size(), 1u);  // one more piece to child 1 only: a slow child 2 does not block 1
  EXPECT_EQ(std::get<action::Send>(out[0]).to, 1);
  EXPECT_EQ(std::get<action::Send>(out[0]).offset, 10u);
}

TEST(TreePolicy, RootStreamsTakePiecesLowestIdleStreamFirst) {
  RelayOptions opt;
  opt.piece_bytes = 10;
  opt.root_streams = 3;
  auto topo = Topology::FanOut(3, 1, 1);  // 0 -> 1 -> 2
  auto sender = MakeTreePolicy(*topo, 0, opt);
  auto relay = MakeTreePolicy(*topo, 1, opt);
  EXPECT_EQ(sender->links(), (std::vector<Link>{{1, true, 3}}));
  EXPECT_EQ(relay->links(), (std::vector<Link>{{0, false, 3}, {2, true, 1}}));
  EXPECT_EQ(EdgeStreams(0, opt), 3);
  EXPECT_EQ(EdgeStreams(1, opt), 1);
  std::vector<Action> out;
  sender->Handle(0, event::BlobProduced{{0, BlobKind::kHeader, 45}}, &out);
  ASSERT_EQ(out.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(std::get<action::Send>(out[i]).stream, i);
    EXPECT_EQ(std::get<action::Send>(out[i]).offset, 10u * i);
  }
  out.clear();
  sender->Handle(0, event::SendDone{1, 1, 0, 10, 10}, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(std::get<action::Send>(out[0]).stream, 1);
  EXPECT_EQ(std::get<action::Send>(out[0]).offset, 30u);
}

// A sender with an edge relay (RelayOptions::edge_lag_bytes) and an ordinary child, each edge one
// stream, driven by hand: every Send is accepted at once; acknowledgements and the answers to
// Transcode come when the test says.
class EdgeLagSender {
 public:
  explicit EdgeLagSender(uint64_t bound) {
    RelayOptions opt;
    opt.piece_bytes = 10;
    opt.edge_relays = {1};
    opt.edge_lag_bytes = bound;
    topo_ = *Topology::FanOut(3, 2, 2);  // sender with children 1 (edge relay) and 2
    policy_ = MakeTreePolicy(topo_, 0, opt);
  }
  // Feeds `e`, accepts every Send until none is left; returns every action but Send and
  // Release, as ToString lines, and records the Sends.
  std::vector<std::string> Feed(const Event& e) {
    std::vector<Action> out;
    policy_->Handle(0, e, &out);
    std::vector<std::string> lines;
    while (!out.empty()) {
      std::vector<Action> actions;
      actions.swap(out);
      for (const Action& a : actions) {
        const auto* s = std::get_if<action::Send>(&a);
        if (s == nullptr) {
          if (!std::holds_alternative<action::Release>(a)) lines.push_back(ToString(a));
          continue;
        }
        sent[s->to][s->blob.id].push_back({s->offset, s->length, s->blob.size, s->plain});
        policy_->Handle(0, event::SendDone{s->to, s->stream, s->blob.id, s->offset, s->length},
                        &out);
      }
    }
    return lines;
  }
  struct Piece {
    uint64_t offset, length, size;
    bool plain;
    bool operator==(const Piece& o) const {
      return offset == o.offset && length == o.length && size == o.size && plain == o.plain;
    }
  };
  std::map<NodeId, std::map<BlobId, std::vector<Piece>>> sent;

 private:
  Topology topo_;
  std::unique_ptr<NodePolicy> policy_;
};

using Lines = std::vector<std::string>;

// Past the bound of bytes accepted and not acknowledged, the edge relay lags: every chunk it has
// not started, and every chunk produced later, goes to it in the plain form once the driver
// answers (a blob without one goes as produced); a blob started keeps its form, and the other
// child gets everything as produced. Acknowledged down to half the bound, it has caught up: the
// chunks not started go as produced again, and a late answer is ignored.
TEST(TreePolicy, EdgeRelayThatLagsGetsThePlainFormUntilItCatchesUp) {
  EdgeLagSender s(40);
  using P = EdgeLagSender::Piece;
  EXPECT_EQ(s.Feed(event::BlobProduced{{0, BlobKind::kHeader, 25}}), Lines{});
  // 45 > 40 on chunk 1's second piece: chunk 1, started, keeps its form.
  EXPECT_EQ(s.Feed(event::BlobProduced{{1, BlobKind::kChunk, 30}}),
            Lines{"EdgeLag{to 1 lags 45/40, 0 chunks}"});
  EXPECT_EQ(s.sent[1][1].size(), 3u);
  // Chunks 2 and 3 are produced while it lags.
  EXPECT_EQ(s.Feed(event::BlobProduced{{2, BlobKind::kChunk, 30}}), Lines{"Transcode{to 1 2}"});
  EXPECT_EQ(s.Feed(event::BlobProduced{{3, BlobKind::kChunk, 30}}), Lines{"Transcode{to 1 3}"});
  EXPECT_TRUE(s.sent[1][2].empty());
  EXPECT_EQ(s.sent[2][3].size(), 3u);  // the other child is not held back
  // Chunk 2 has a plain form of 15 bytes; chunk 3 none.
  EXPECT_EQ(s.Feed(event::BlobReencoded{1, {2, BlobKind::kChunk, 15}, true}), Lines{});
  EXPECT_EQ(s.Feed(event::BlobReencoded{1, {3, BlobKind::kChunk, 30}, false}), Lines{});
  EXPECT_EQ(s.sent[1][2], (std::vector<P>{{0, 10, 15, true}, {10, 5, 15, true}}));
  EXPECT_EQ(s.sent[1][3],
            (std::vector<P>{{0, 10, 30, false}, {10, 10, 30, false}, {20, 10, 30, false}}));
  // An answer nobody asked for, or for a blob started, changes nothing.
  EXPECT_EQ(s.Feed(event::BlobReencoded{1, {1, BlobKind::kChunk, 5}, true}), Lines{});
  EXPECT_EQ(s.Feed(event::BlobReencoded{2, {3, BlobKind::kChunk, 5}, true}), Lines{});
  EXPECT_EQ(s.sent[1][1].size(), 3u);
  // Chunk 4 is asked for; before the answer, acknowledgements bring 100 bytes down to 0.
  EXPECT_EQ(s.Feed(event::BlobProduced{{4, BlobKind::kChunk, 20}}), Lines{"Transcode{to 1 4}"});
  EXPECT_EQ(s.Feed(event::AckReceived{1, 0}), Lines{});  // 75
  EXPECT_EQ(s.Feed(event::AckReceived{1, 1}), Lines{});  // 45
  EXPECT_EQ(s.Feed(event::AckReceived{1, 2}), Lines{});  // 30: above half the bound
  EXPECT_EQ(s.Feed(event::AckReceived{1, 3}), Lines{"EdgeLag{to 1 caught up 0/40, 1 chunks}"});
  EXPECT_EQ(s.sent[1][4], (std::vector<P>{{0, 10, 20, false}, {10, 10, 20, false}}));
  EXPECT_EQ(s.Feed(event::BlobReencoded{1, {4, BlobKind::kChunk, 7}, true}), Lines{});
  EXPECT_EQ(s.sent[1][4].size(), 2u);
  // Chunk 5 goes as produced; the trailer too.
  EXPECT_EQ(s.Feed(event::BlobProduced{{5, BlobKind::kChunk, 10}}), Lines{});
  EXPECT_EQ(s.sent[1][5], (std::vector<P>{{0, 10, 10, false}}));
}

// Acknowledged bytes no longer count, a duplicate acknowledgement changes nothing; bound 0, or a
// child not named an edge relay, never lags.
TEST(TreePolicy, EdgeLagCountsEachBlobOnceAndOnlyOnEdgeRelays) {
  EdgeLagSender s(25);
  s.Feed(event::BlobProduced{{0, BlobKind::kHeader, 20}});
  s.Feed(event::AckReceived{1, 0});
  s.Feed(event::AckReceived{1, 0});
  // The header's 20 bytes were acknowledged: only chunk 1's 20 count (20 <= 25).
  EXPECT_EQ(s.Feed(event::BlobProduced{{1, BlobKind::kChunk, 20}}), Lines{});
  EXPECT_EQ(s.Feed(event::BlobProduced{{2, BlobKind::kChunk, 10}}),
            Lines{"EdgeLag{to 1 lags 30/25, 0 chunks}"});  // child 2 got 50: not watched
  EdgeLagSender never(0);
  never.Feed(event::BlobProduced{{0, BlobKind::kHeader, 20}});
  EXPECT_EQ(never.Feed(event::BlobProduced{{1, BlobKind::kChunk, 1000}}), Lines{});
}

TEST(TreePolicy, FailuresAreTerminal) {
  RelayOptions opt;
  auto topo = Topology::FanOut(2, 1, 1);
  auto sender = MakeTreePolicy(*topo, 0, opt);
  std::vector<Action> out;
  sender->Handle(0, event::SendFailed{1, "connection reset"}, &out);
  ASSERT_EQ(out.size(), 1u);
  auto& f = std::get<action::Fail>(out[0]);
  EXPECT_NE(f.message.find("node 1"), std::string::npos);
  EXPECT_NE(f.message.find("connection reset"), std::string::npos);
  out.clear();
  sender->Handle(0, event::BlobProduced{{0, BlobKind::kHeader, 5}}, &out);
  EXPECT_TRUE(out.empty());
  EXPECT_TRUE(sender->done());

  auto recv = MakeTreePolicy(*topo, 1, opt);
  recv->Handle(0, event::DataReceived{{0, BlobKind::kHeader, 5}, 0, 5}, &out);
  out.clear();
  recv->Handle(0, event::ApplyDone{0, false, StatusCode::kFailedPrecondition, "wrong base"}, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(std::get<action::Fail>(out[0]).code, StatusCode::kFailedPrecondition);
}

// ---- object store roles against an in-test store with injected failures ----

struct StoreRun {
  std::vector<BlobId> applied;
  std::vector<std::string> put_order;
  bool committed = false, published = false, failed = false;
  std::string fail_message;
  int put_failures = 0, fetch_failures = 0;
};

StoreRun RunStore(const std::vector<BlobInfo>& stream, uint64_t seed, double fail_prob,
                  int max_retries) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  RelayOptions opt;
  opt.prefix = "p";
  opt.max_retries = max_retries;
  opt.max_parallel_puts = 3;
  opt.max_parallel_fetches = 2;
  auto up = MakeUploaderPolicy(opt);
  auto down = MakeDownloaderPolicy(opt);
  std::map<std::string, BlobInfo> store;
  StoreRun run;
  double now = 0;
  double up_timer = -1, down_timer = -1;
  // Pending completions: (0 = uploader, 1 = downloader, event, key for puts).
  struct P {
    int who;
    Event ev;
    std::string key;
    BlobInfo blob;
  };
  std::vector<P> pending;
  std::function<void(int, const Event&)> handle = [&](int who, const Event& ev) {
    std::vector<Action> out;
    (who == 0 ? up : down)->Handle(now, ev, &out);
    for (auto& a : out) {
      if (auto* p = std::get_if<action::Put>(&a)) {
        bool ok = u(rng) >= fail_prob;
        if (!ok) ++run.put_failures;
        pending.push_back(
            {0, event::PutDone{p->blob.id, ok, ok ? "" : "503"}, ok ? p->key : "", p->blob});
      } else if (std::holds_alternative<action::Published>(a)) {
        run.published = true;
      } else if (auto* l = std::get_if<action::List>(&a)) {
        event::ListDone ld;
        ld.ok = u(rng) >= fail_prob;
        if (ld.ok) {
          for (auto& [k, b] : store) {
            auto parsed = ParseObjectKey(l->prefix, k);
            EXPECT_TRUE(parsed.ok());
            BlobInfo bi = *parsed;
            bi.size = b.size;
            ld.blobs.push_back(bi);
          }
        }
        pending.push_back({1, ld, "", {}});
      } else if (auto* f = std::get_if<action::Fetch>(&a)) {
        EXPECT_TRUE(store.count(f->key)) << "fetch of an unlisted key " << f->key;
        bool ok = u(rng) >= fail_prob;
        if (!ok) ++run.fetch_failures;
        pending.push_back({1, event::FetchDone{f->blob.id, ok, ok ? "" : "timeout"}, "", {}});
      } else if (auto* ap = std::get_if<action::Apply>(&a)) {
        run.applied.push_back(ap->blob.id);
        pending.push_back({1, event::ApplyDone{ap->blob.id, true}, "", {}});
      } else if (std::holds_alternative<action::Commit>(a)) {
        run.committed = true;
      } else if (auto* t = std::get_if<action::SetTimer>(&a)) {
        EXPECT_GE(t->at, now);
        (who == 0 ? up_timer : down_timer) = t->at;
      } else if (auto* fl = std::get_if<action::Fail>(&a)) {
        run.failed = true;
        run.fail_message = fl->message;
      }
    }
  };
  handle(0, event::Start{});
  handle(1, event::Start{});
  size_t produced = 0;
  for (int guard = 0; guard < 1000000 && !run.failed; ++guard) {
    if (produced < stream.size() && rng() % 3 == 0) {
      handle(0, event::BlobProduced{stream[produced++]});
      continue;
    }
    if (!pending.empty()) {
      size_t i = rng() % pending.size();
      P p = pending[i];
      pending.erase(pending.begin() + static_cast<long>(i));
      if (!p.key.empty()) {
        store[p.key] = p.blob;
        run.put_order.push_back(p.key);
      }
      now += 0.001;
      handle(p.who, p.ev);
      continue;
    }
    // Nothing pending: advance the clock to the next timer.
    double next = -1;
    for (double t : {up_timer, down_timer}) {
      if (t >= 0 && (next < 0 || t < next)) next = t;
    }
    if (next < 0) {
      if (produced < stream.size()) continue;
      break;
    }
    now = std::max(now, next);
    if (up_timer >= 0 && up_timer <= now) {
      up_timer = -1;
      handle(0, event::TimerFired{});
    }
    if (down_timer >= 0 && down_timer <= now) {
      down_timer = -1;
      handle(1, event::TimerFired{});
    }
  }
  return run;
}

TEST(StorePolicies, UploadThenDownloadWithRetries) {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 20; ++trial) {
    auto stream = MakeStream(4 + trial % 5, 1000, &rng);
    auto run = RunStore(stream, 100 + trial, trial % 2 ? 0.2 : 0.0, 20);
    SCOPED_TRACE("trial " + std::to_string(trial));
    ASSERT_FALSE(run.failed) << run.fail_message;
    EXPECT_TRUE(run.published);
    EXPECT_TRUE(run.committed);
    ASSERT_EQ(run.applied.size(), stream.size());
    EXPECT_EQ(run.applied.front(), 0u);
    EXPECT_EQ(run.applied.back(), stream.back().id);
    // The trailer is stored last: it publishes the stream.
    EXPECT_EQ(run.put_order.back(), ObjectKey("p", stream.back()));
    if (trial % 2) {
      EXPECT_GT(run.put_failures + run.fetch_failures, 0);
    }
  }
}

TEST(StorePolicies, RetriesExhaustedFailWithKey) {
  std::mt19937_64 rng(9);
  auto stream = MakeStream(3, 1000, &rng);
  auto run = RunStore(stream, 1, 1.0, 2);
  EXPECT_TRUE(run.failed);
  EXPECT_NE(run.fail_message.find("failed 3 times"), std::string::npos) << run.fail_message;
}

// One store retry schedule: StoreRetryDelay doubles from retry_backoff_s and ends past
// max_retries, and an uploader whose put keeps failing arms its timer exactly that far ahead
// before each retry, then fails.
TEST(StorePolicies, RetriesFollowTheStoreRetrySchedule) {
  RelayOptions opt;
  opt.retry_backoff_s = 0.25;
  opt.max_retries = 3;
  EXPECT_EQ(StoreRetryDelay(opt, 0), std::nullopt);
  EXPECT_EQ(StoreRetryDelay(opt, 1), 0.25);
  EXPECT_EQ(StoreRetryDelay(opt, 2), 0.5);
  EXPECT_EQ(StoreRetryDelay(opt, 3), 1.0);
  EXPECT_EQ(StoreRetryDelay(opt, 4), std::nullopt);
  auto up = MakeUploaderPolicy(opt);
  std::vector<Action> out;
  double now = 10;
  up->Handle(now, event::Start{}, &out);
  up->Handle(now, event::BlobProduced{{0, BlobKind::kHeader, 100}}, &out);
  for (int attempt = 1; attempt <= opt.max_retries + 1; ++attempt) {
    const action::Put* put = nullptr;
    for (const Action& a : out) {
      if (const auto* p = std::get_if<action::Put>(&a)) put = p;
    }
    ASSERT_NE(put, nullptr) << "attempt " << attempt;
    const BlobId blob = put->blob.id;
    out.clear();
    up->Handle(now, event::PutDone{blob, false, "refused"}, &out);
    const std::optional<double> delay = StoreRetryDelay(opt, attempt);
    if (!delay) {
      ASSERT_TRUE(up->failed());
      EXPECT_EQ(std::get<action::Fail>(out.back()).code, StatusCode::kUnavailable);
      return;
    }
    const action::SetTimer* timer = nullptr;
    for (const Action& a : out) {
      if (const auto* t = std::get_if<action::SetTimer>(&a)) timer = t;
    }
    ASSERT_NE(timer, nullptr) << "attempt " << attempt;
    EXPECT_DOUBLE_EQ(timer->at, now + *delay) << "attempt " << attempt;
    now = timer->at;
    out.clear();
    up->Handle(now, event::TimerFired{}, &out);
  }
  FAIL() << "the uploader never gave up";
}

TEST(StorePolicies, DownloaderTimesOutWithoutTrailer) {
  RelayOptions opt;
  opt.poll_interval_s = 1;
  opt.poll_timeout_s = 5;
  auto down = MakeDownloaderPolicy(opt);
  std::vector<Action> out;
  down->Handle(0, event::Start{}, &out);
  ASSERT_TRUE(std::holds_alternative<action::List>(out.at(0)));
  double now = 0;
  for (int i = 0; i < 10 && !down->failed(); ++i) {
    down->Handle(now, event::ListDone{true, "", {}}, &out);
    now += 1;
    down->Handle(now, event::TimerFired{}, &out);
  }
  ASSERT_TRUE(down->failed());
  EXPECT_GE(now, 5);
  ASSERT_FALSE(out.empty());
  EXPECT_EQ(std::get<action::Fail>(out.back()).code, StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace dcr
