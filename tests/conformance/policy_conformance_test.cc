// One event trace, three drivers: the policy `dcr node` hosts for a rank of the real runner's
// plans (MakePlans -> MakeNodePolicy), the policy the simulator hosts for that node of its run
// plan (SizeRun / PlanRun -> MakeSimPolicy) and the one the fault harness hosts for that node of
// its run options (FaultRunOptionsFor -> MakeFaultRunTreePolicy), all from one scenario, must
// answer the trace with the same actions, in the same order. A driver that builds its policy
// differently (other stream counts, pieces, parallelism) or decides on its own fails here. The
// store retries are traced too: an uploader whose puts fail once each is answered with the same
// retry timers (StoreRetryDelay) by `dcr node`'s and the simulator's object-store sender. So is
// the edge-lag switch: a sender whose edge relay lags and catches up asks for the same plain forms
// and switches back at the same points in `dcr node` and in the simulator.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "dcr/node.h"
#include "dcr/policy_host.h"
#include "dcr/relay_policy.h"
#include "dcr/scenario.h"
#include "driver.h"
#include "node_plans.h"
#include "plan.h"
#include "run_faults.h"
#include "run_real.h"

namespace dcr {
namespace {

// Records nothing and completes nothing: the replayed trace carries every completion.
class ReplayEnvironment : public NodeEnvironment {
 public:
  void SetTimer(TimePoint) override {}
  void Send(const action::Send&) override {}
  void Ack(const action::Ack&) override {}
  void ReportCommit(const action::ReportCommit&) override {}
  void Apply(const action::Apply&) override {}
  void Release(BlobId) override {}
  void Put(const action::Put&) override {}
  void List(const action::List&) override {}
  void Fetch(const action::Fetch&) override {}
  void Committed() override {}
  void TreeCommitted(int) override {}
  void Published() override {}
  void Transcode(const action::Transcode&) override {}
  void EdgeLag(const action::EdgeLag&) override {}
  void Failed(const Status&) override {}
};

// Drives one node's policy through a refit and records the trace: the stream arrives (sender:
// is produced) piece by piece, and after each event every outstanding send is accepted, every
// apply finishes, and a child acknowledges a blob once every piece of it was sent to it; the
// children report their subtrees committed at the end.
class TraceRecorder : public NodeEnvironment {
 public:
  TraceRecorder(const Topology& topo, NodeId self, const RelayOptions& relay,
                std::vector<BlobInfo> stream)
      : topo_(topo),
        self_(self),
        relay_(relay),
        stream_(std::move(stream)),
        host_(MakeTreePolicy(topo, self, relay), this) {
    host_.set_trace(&trace_);
  }

  std::vector<TraceStep> Record() {
    double now = 0;
    host_.Handle(now, event::Start{});
    for (const BlobInfo& b : stream_) {
      if (self_ == 0) {
        Feed(&now, event::BlobProduced{b});
        continue;
      }
      for (uint64_t p = 0; p < NumPieces(b.size, relay_.piece_bytes); ++p) {
        const uint64_t off = p * relay_.piece_bytes;
        const uint64_t len = std::min(relay_.piece_bytes, b.size - std::min(b.size, off));
        Feed(&now, event::DataReceived{b, off, len});
      }
    }
    for (int guard = 0; guard < 100000 && !completions_.empty(); ++guard) Drain(&now);
    for (NodeId c : topo_.children[self_]) {
      Feed(&now, event::SubtreeCommitted{c, 1 + topo_.SubtreeSize(c)});
    }
    return trace_;
  }

  bool done() const { return host_.done(); }
  std::vector<Link> links() const { return host_.links(); }

  void SetTimer(TimePoint) override {}
  void Send(const action::Send& s) override {
    completions_.push_back(event::SendDone{s.to, s.stream, s.blob.id, s.offset, s.length});
    if ((sent_[{s.to, s.blob.id}] += 1) == NumPieces(s.blob.size, relay_.piece_bytes)) {
      completions_.push_back(event::AckReceived{s.to, s.blob.id});
    }
  }
  void Ack(const action::Ack&) override {}
  void ReportCommit(const action::ReportCommit&) override {}
  void Apply(const action::Apply& a) override {
    completions_.push_back(event::ApplyDone{a.blob.id, true});
  }
  void Release(BlobId) override {}
  void Put(const action::Put&) override {}
  void List(const action::List&) override {}
  void Fetch(const action::Fetch&) override {}
  void Committed() override {}
  void TreeCommitted(int) override {}
  void Published() override {}
  void Transcode(const action::Transcode& t) override { ADD_FAILURE() << ToString(Action(t)); }
  void EdgeLag(const action::EdgeLag& l) override { ADD_FAILURE() << ToString(Action(l)); }
  void Failed(const Status& s) override { ADD_FAILURE() << s.ToString(); }

 private:
  void Feed(double* now, const Event& e) {
    *now += 0.001;
    host_.Handle(*now, e);
    Drain(now);
  }
  void Drain(double* now) {
    std::vector<Event> batch;
    batch.swap(completions_);
    for (const Event& e : batch) {
      *now += 0.001;
      host_.Handle(*now, e);
    }
  }

  const Topology& topo_;
  NodeId self_;
  RelayOptions relay_;
  std::vector<BlobInfo> stream_;
  PolicyHost host_;
  std::vector<TraceStep> trace_;
  std::vector<Event> completions_;
  std::map<std::pair<NodeId, BlobId>, uint64_t> sent_;
};

// Drives an uploader through a store upload whose every blob's first put fails (and, for an
// uploader with RelayOptions::store_plain, whose chunks each have a plain form): the stream is
// produced blob by blob, a put completes (failed the first time, stored the second) after each
// event, and a timer the policy sets fires when nothing else is pending.
class StoreRetryRecorder : public NodeEnvironment {
 public:
  StoreRetryRecorder(const RelayOptions& relay, std::vector<BlobInfo> stream)
      : stream_(std::move(stream)), host_(MakeUploaderPolicy(relay), this) {
    host_.set_trace(&trace_);
  }

  std::vector<TraceStep> Record() {
    double now = 0;
    host_.Handle(now, event::Start{});
    for (const BlobInfo& b : stream_) Feed(&now, event::BlobProduced{b});
    for (int guard = 0; guard < 10000 && !host_.done(); ++guard) {
      if (!completions_.empty()) {
        std::vector<Event> batch;
        batch.swap(completions_);
        for (const Event& e : batch) Feed(&now, e);
      } else if (timer_ >= 0) {
        now = std::max(now, timer_);
        timer_ = -1;
        Feed(&now, event::TimerFired{});
      } else {
        break;
      }
    }
    return trace_;
  }

  bool published() const { return published_; }
  int failed_puts() const { return failed_puts_; }

  void SetTimer(TimePoint at) override { timer_ = at; }
  void Send(const action::Send&) override {}
  void Ack(const action::Ack&) override {}
  void ReportCommit(const action::ReportCommit&) override {}
  void Apply(const action::Apply&) override {}
  void Release(BlobId) override {}
  void Put(const action::Put& p) override {
    const bool ok = !first_put_.insert(p.blob.id).second;
    failed_puts_ += ok ? 0 : 1;
    completions_.push_back(event::PutDone{p.blob.id, ok, ok ? "" : "refused"});
  }
  void List(const action::List&) override {}
  void Fetch(const action::Fetch&) override {}
  void Committed() override {}
  void TreeCommitted(int) override {}
  void Published() override { published_ = true; }
  // An uploader filling the store with plain forms (RelayOptions::store_plain): every chunk has
  // one of twice its size.
  void Transcode(const action::Transcode& t) override {
    ++transcodes_;
    BlobInfo plain = t.blob;
    plain.size *= 2;
    host_.Post(now_, event::BlobReencoded{t.to, plain, true});
  }
  void EdgeLag(const action::EdgeLag& l) override { ADD_FAILURE() << ToString(Action(l)); }
  void Failed(const Status& s) override { ADD_FAILURE() << s.ToString(); }
  int transcodes() const { return transcodes_; }

 private:
  void Feed(double* now, const Event& e) {
    *now += 0.001;
    now_ = *now;
    host_.Handle(*now, e);
  }

  std::vector<BlobInfo> stream_;
  PolicyHost host_;
  std::vector<TraceStep> trace_;
  std::vector<Event> completions_;
  std::set<BlobId> first_put_;
  double timer_ = -1;
  double now_ = 0;
  bool published_ = false;
  int failed_puts_ = 0;
  int transcodes_ = 0;
};

// Drives a sender whose only child, node 1, is an edge relay that falls behind and catches up:
// the first blobs are produced and every piece accepted while the edge relay acknowledges
// nothing (it lags: the sender asks for the plain form of the chunks it has not started, which
// the driver answers with a form of twice the size, the trailer having none); then it
// acknowledges every blob it has whole (it catches up), and the rest of the stream flows with
// acknowledgements as blobs complete.
class EdgeLagRecorder : public NodeEnvironment {
 public:
  EdgeLagRecorder(const Topology& topo, const RelayOptions& relay, std::vector<BlobInfo> stream,
                  size_t slow_blobs)
      : relay_(relay),
        stream_(std::move(stream)),
        slow_blobs_(slow_blobs),
        host_(MakeTreePolicy(topo, 0, relay), this) {
    host_.set_trace(&trace_);
  }

  std::vector<TraceStep> Record() {
    double now = 0;
    host_.Handle(now, event::Start{});
    for (size_t i = 0; i < stream_.size(); ++i) {
      if (i == slow_blobs_) {  // it caught up: every blob it holds whole is acknowledged
        acking_ = true;
        for (const auto& [blob, pieces] : sent_) {
          if (pieces.first == pieces.second) completions_.push_back(event::AckReceived{1, blob});
        }
        Drain(&now);
      }
      Feed(&now, event::BlobProduced{stream_[i]});
    }
    for (int guard = 0; guard < 100000 && !completions_.empty(); ++guard) Drain(&now);
    Feed(&now, event::SubtreeCommitted{1, 4});
    return trace_;
  }

  bool done() const { return host_.done(); }
  std::vector<Link> links() const { return host_.links(); }

  void SetTimer(TimePoint) override {}
  void Send(const action::Send& s) override {
    completions_.push_back(event::SendDone{s.to, s.stream, s.blob.id, s.offset, s.length});
    auto& [got, of] = sent_[s.blob.id];
    of = NumPieces(s.blob.size, relay_.piece_bytes);
    if (++got == of && acking_) completions_.push_back(event::AckReceived{s.to, s.blob.id});
  }
  void Ack(const action::Ack&) override {}
  void ReportCommit(const action::ReportCommit&) override {}
  void Apply(const action::Apply&) override {}
  void Release(BlobId) override {}
  void Put(const action::Put&) override {}
  void List(const action::List&) override {}
  void Fetch(const action::Fetch&) override {}
  void Committed() override {}
  void TreeCommitted(int) override {}
  void Published() override {}
  void Transcode(const action::Transcode& t) override {
    const bool chunk = t.blob.kind == BlobKind::kChunk;
    BlobInfo plain = t.blob;
    if (chunk) plain.size *= 2;
    host_.Post(now_, event::BlobReencoded{t.to, plain, chunk});
  }
  void EdgeLag(const action::EdgeLag&) override {}
  void Failed(const Status& s) override { ADD_FAILURE() << s.ToString(); }

 private:
  void Feed(double* now, const Event& e) {
    *now += 0.001;
    now_ = *now;
    host_.Handle(*now, e);
    Drain(now);
  }
  void Drain(double* now) {
    while (!completions_.empty()) {
      std::vector<Event> batch;
      batch.swap(completions_);
      for (const Event& e : batch) {
        *now += 0.001;
        now_ = *now;
        host_.Handle(*now, e);
      }
    }
  }

  RelayOptions relay_;
  std::vector<BlobInfo> stream_;
  size_t slow_blobs_;
  PolicyHost host_;
  std::vector<TraceStep> trace_;
  std::vector<Event> completions_;
  std::map<BlobId, std::pair<uint64_t, uint64_t>> sent_;  // pieces sent, of how many
  bool acking_ = false;
  double now_ = 0;
};

std::vector<std::string> LinkLines(const std::vector<Link>& links) {
  std::vector<std::string> lines;
  for (const Link& l : links) {
    lines.push_back(std::string(l.to_child ? "Link{to " : "Link{from ") + std::to_string(l.peer) +
                    " x" + std::to_string(l.streams) + "}");
  }
  return lines;
}

// The edges `policy` opens, then the actions it answers `trace` with.
std::vector<std::string> Replay(std::unique_ptr<NodePolicy> policy,
                                const std::vector<TraceStep>& trace) {
  if (policy == nullptr) return {"no policy"};
  ReplayEnvironment env;
  PolicyHost host(std::move(policy), &env);
  std::vector<std::string> lines = LinkLines(host.links());
  std::vector<TraceStep> got;
  host.set_trace(&got);
  for (const TraceStep& step : trace) host.Handle(step.now, step.event);
  for (std::string& a : ActionLines(got)) lines.push_back(std::move(a));
  return lines;
}

// What the recording host opened and did.
std::vector<std::string> Expected(const std::vector<Link>& links,
                                  const std::vector<TraceStep>& trace) {
  std::vector<std::string> lines = LinkLines(links);
  for (std::string& a : ActionLines(trace)) lines.push_back(std::move(a));
  return lines;
}

class Conformance : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = LoadScenario("scenarios/compare-small.yaml");
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    scenario_ = *s;
    auto topo = TopologyFor(scenario_);
    ASSERT_TRUE(topo.ok()) << topo.status().ToString();
    topo_ = *topo;
    // Header, five chunks of 2.5 pieces, trailer.
    const uint64_t piece = scenario_.transport.relay_tree.chunk;
    stream_.push_back({0, BlobKind::kHeader, 300});
    for (BlobId i = 1; i <= 5; ++i) stream_.push_back({i, BlobKind::kChunk, piece * 5 / 2});
    stream_.push_back({6, BlobKind::kTrailer, 264});
  }

  // `dcr node`: the real runner's plan of rank `node`.
  std::unique_ptr<NodePolicy> SocketPolicy(NodeId node,
                                           TransportKind transport = TransportKind::kRelayTree) {
    const std::string dir = ::testing::TempDir();
    auto plans = MakePlans(scenario_, Method::kDelta, transport, dir + "/base.safetensors",
                           dir + "/target.safetensors", dir, dir, "conformance");
    EXPECT_TRUE(plans.ok()) << plans.status().ToString();
    if (!plans.ok()) return nullptr;
    auto p = MakeNodePolicy((*plans)[node]);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return p.ok() ? std::move(*p) : nullptr;
  }

  // The simulator: node `node` of the run plan of the scenario's delta relay-tree run.
  std::unique_ptr<NodePolicy> SimPolicy(NodeId node,
                                        TransportKind transport = TransportKind::kRelayTree) {
    auto extra = sim::internal::ParseExtra(scenario_);
    EXPECT_TRUE(extra.ok()) << extra.status().ToString();
    if (!extra.ok()) return nullptr;
    double payload = 0;
    for (const BlobInfo& b : stream_) payload += static_cast<double>(b.size);
    sim::internal::Sizing z =
        sim::internal::SizeRun(scenario_, *extra, payload, 300, 264, 1e8, 5, 1e9, 1e9, 2, 2);
    sim::internal::PlatformSpec plat;
    plat.wan_bandwidth = scenario_.network.long_link.bandwidth_Bps;
    plat.store_bandwidth = 1e15;
    sim::internal::RunSpec spec =
        sim::internal::PlanRun(scenario_, plat, topo_, z, transport, payload, 1e10);
    return sim::internal::MakeSimPolicy(spec, node);
  }

  // The simulator's sender of the long-link stream to an edge relay, of the run plan of the
  // scenario's delta relay-tree run.
  std::unique_ptr<NodePolicy> SimEdgeSenderPolicy() {
    auto extra = sim::internal::ParseExtra(scenario_);
    EXPECT_TRUE(extra.ok()) << extra.status().ToString();
    if (!extra.ok()) return nullptr;
    double payload = 0;
    for (const BlobInfo& b : stream_) payload += static_cast<double>(b.size);
    sim::internal::Sizing z =
        sim::internal::SizeRun(scenario_, *extra, payload, 300, 264, 1e8, 5, 1e9, 1e9, 2, 2);
    sim::internal::PlatformSpec plat;
    plat.wan_bandwidth = scenario_.network.long_link.bandwidth_Bps;
    plat.store_bandwidth = 1e15;
    sim::internal::RunSpec spec =
        sim::internal::PlanRun(scenario_, plat, topo_, z, TransportKind::kRelayTree, payload, 1e10);
    return sim::internal::MakeSimEdgeSenderPolicy(spec);
  }

  // The fault harness: node `node` of the scenario's first fault-injection run.
  std::unique_ptr<NodePolicy> HarnessPolicy(NodeId node) {
    FaultRunOptions o = cli::FaultRunOptionsFor(scenario_, 0.03, 0, ::testing::TempDir());
    auto p = MakeFaultRunTreePolicy(o, node);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return p.ok() ? std::move(*p) : nullptr;
  }

  void CheckNode(NodeId node) {
    TraceRecorder rec(topo_, node, RelayOptionsFor(scenario_, "conformance"), stream_);
    const std::vector<TraceStep> trace = rec.Record();
    ASSERT_TRUE(rec.done()) << "the recorded refit did not finish";
    const std::vector<std::string> expect = Expected(rec.links(), trace);
    ASSERT_GT(ActionLines(trace).size(), 20u);
    const std::vector<std::string> socket = Replay(SocketPolicy(node), trace);
    const std::vector<std::string> simulated = Replay(SimPolicy(node), trace);
    const std::vector<std::string> harness = Replay(HarnessPolicy(node), trace);
    EXPECT_EQ(socket, expect) << "dcr node, node " << node;
    EXPECT_EQ(simulated, expect) << "simulator, node " << node;
    EXPECT_EQ(harness, expect) << "fault harness, node " << node;
  }

  Scenario scenario_;
  Topology topo_;
  std::vector<BlobInfo> stream_;
};

TEST_F(Conformance, SenderOnTheLongLink) { CheckNode(0); }
TEST_F(Conformance, RelayBetweenLongAndShortLinks) { CheckNode(1); }
TEST_F(Conformance, Leaf) { CheckNode(topo_.size() - 1); }

// The action lines with each object key's prefix dropped ("Put{run/0000000001.chk}" as
// "Put{0000000001.chk}"): the drivers name their stores' prefixes differently.
std::vector<std::string> WithoutKeyPrefixes(std::vector<std::string> lines) {
  for (std::string& l : lines) {
    const size_t open = l.find('{'), slash = l.find('/');
    if (open != std::string::npos && slash != std::string::npos && slash > open) {
      l.erase(open + 1, slash - open);
    }
  }
  return lines;
}

// The object-store sender of `dcr node` and of the simulator retry every failed put on the same
// schedule (StoreRetryDelay: the timers in the trace); the trace of a schedule with another
// backoff differs (so the comparison sees the retries).
TEST_F(Conformance, StoreUploaderRetriesOnOneSchedule) {
  const RelayOptions relay = RelayOptionsFor(scenario_, "conformance");
  StoreRetryRecorder rec(relay, stream_);
  const std::vector<TraceStep> trace = rec.Record();
  ASSERT_TRUE(rec.published()) << "the recorded upload did not publish";
  ASSERT_EQ(rec.failed_puts(), static_cast<int>(stream_.size()));
  const std::vector<std::string> expect = WithoutKeyPrefixes(Expected({}, trace));
  int timers = 0;
  for (const std::string& a : expect) timers += a.rfind("SetTimer", 0) == 0;
  ASSERT_GT(timers, 0);
  EXPECT_EQ(WithoutKeyPrefixes(Replay(SocketPolicy(0, TransportKind::kObjectStore), trace)), expect)
      << "dcr node";
  EXPECT_EQ(WithoutKeyPrefixes(Replay(SimPolicy(0, TransportKind::kObjectStore), trace)), expect)
      << "simulator";
  RelayOptions slower = relay;
  slower.retry_backoff_s *= 2;
  StoreRetryRecorder slow(slower, stream_);
  EXPECT_NE(WithoutKeyPrefixes(Expected({}, slow.Record())), expect);
}

// An edge relay that lags and catches up: the sender of `dcr node` (the real runner's plan of a
// scenario with an edge relay, delta.wan_context and an edge_lag) and the simulator's sender of
// the long-link stream decide the switch to the plain form, which chunks go plain, and the switch
// back at the same points of one trace. A sender with another bound, or one that watches no
// edge relay, answers the trace differently (so the comparison sees the decisions).
TEST_F(Conformance, EdgeRelayLagSwitchesAtTheSamePoints) {
  scenario_.delta.wan_context = true;
  scenario_.transport.relay_tree.edge_relays = {1};
  scenario_.transport.relay_tree.edge_lag = 3 * scenario_.transport.relay_tree.chunk;
  RelayOptions relay = RelayOptionsFor(scenario_, "conformance");
  relay.edge_relays = {1};
  relay.edge_lag_bytes = scenario_.transport.relay_tree.edge_lag;
  // Header, three chunks while it lags, then two chunks and the trailer once it caught up.
  EdgeLagRecorder rec(topo_, relay, stream_, 4);
  const std::vector<TraceStep> trace = rec.Record();
  ASSERT_TRUE(rec.done()) << "the recorded refit did not finish";
  const std::vector<std::string> expect = Expected(rec.links(), trace);
  auto count = [&](const std::string& prefix, const std::string& has = "") {
    return std::count_if(expect.begin(), expect.end(), [&](const std::string& l) {
      return l.rfind(prefix, 0) == 0 && l.find(has) != std::string::npos;
    });
  };
  ASSERT_EQ(count("EdgeLag{to 1 lags"), 1);
  ASSERT_EQ(count("EdgeLag{to 1 caught up"), 1);
  ASSERT_GT(count("Transcode{to 1"), 0);
  ASSERT_GT(count("Send{to 1", " plain"), 0);
  ASSERT_GT(count("Send{to 1", "") - count("Send{to 1", " plain"), 0);
  EXPECT_EQ(Replay(SocketPolicy(0), trace), expect) << "dcr node";
  EXPECT_EQ(Replay(SimEdgeSenderPolicy(), trace), expect) << "simulator";
  RelayOptions other = relay;
  other.edge_lag_bytes *= 2;
  EXPECT_NE(Replay(MakeTreePolicy(topo_, 0, other), trace), expect);
  RelayOptions unwatched = relay;
  unwatched.edge_relays.clear();
  EXPECT_NE(Replay(MakeTreePolicy(topo_, 0, unwatched), trace), expect);
}

// A sender with an edge relay that fills the store (its tree failed, or it restarted) puts the
// plain form of every chunk: the uploader `dcr node` hosts then (MakeFillStorePolicy of the real
// runner's plan) asks for the same plain forms and puts the same objects, in the same order and
// on the same retry schedule, as the trace. The fill policy of a sender without edge relays puts
// the produced forms and answers the trace differently. (The simulator models no failing tree,
// so no store filling.)
TEST_F(Conformance, SenderFillingTheStorePutsThePlainForms) {
  scenario_.delta.wan_context = true;
  scenario_.transport.relay_tree.edge_relays = {1};
  RelayOptions relay = RelayOptionsFor(scenario_, "conformance");
  relay.store_plain = true;
  StoreRetryRecorder rec(relay, stream_);
  const std::vector<TraceStep> trace = rec.Record();
  ASSERT_TRUE(rec.published()) << "the recorded upload did not publish";
  ASSERT_EQ(rec.transcodes(), 5);
  const std::vector<std::string> expect = WithoutKeyPrefixes(Expected({}, trace));
  // Five chunks, each put twice (the first put fails), in the plain form.
  ASSERT_EQ(std::count_if(
                expect.begin(), expect.end(),
                [](const std::string& l) { return l.find(".chk plain}") != std::string::npos; }),
            10);
  auto fill = [&](const Scenario& s) -> std::unique_ptr<NodePolicy> {
    const std::string dir = ::testing::TempDir();
    auto plans = MakePlans(s, Method::kDelta, TransportKind::kRelayTree, dir + "/base.safetensors",
                           dir + "/target.safetensors", dir, dir, "conformance");
    EXPECT_TRUE(plans.ok()) << plans.status().ToString();
    return plans.ok() ? MakeFillStorePolicy((*plans)[0]) : nullptr;
  };
  EXPECT_EQ(WithoutKeyPrefixes(Replay(fill(scenario_), trace)), expect) << "dcr node";
  Scenario without = scenario_;
  without.transport.relay_tree.edge_relays.clear();
  EXPECT_NE(WithoutKeyPrefixes(Replay(fill(without), trace)), expect);
}

// The comparison sees what the drivers must agree on: a policy with one stream on the long link,
// or with pieces of another size, answers the same trace differently.
TEST_F(Conformance, OtherStreamsOrPiecesAnswerDifferently) {
  const RelayOptions relay = RelayOptionsFor(scenario_, "conformance");
  for (NodeId node : {0, 1}) {
    TraceRecorder rec(topo_, node, relay, stream_);
    const std::vector<TraceStep> trace = rec.Record();
    const std::vector<std::string> expect = Expected(rec.links(), trace);
    RelayOptions one_stream = relay;
    one_stream.root_streams = 1;
    RelayOptions coarse = relay;
    coarse.piece_bytes *= 2;
    EXPECT_NE(Replay(MakeTreePolicy(topo_, node, one_stream), trace), expect) << node;
    EXPECT_NE(Replay(MakeTreePolicy(topo_, node, coarse), trace), expect) << node;
  }
}

}  // namespace
}  // namespace dcr
