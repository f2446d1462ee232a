// Analytic checks of the platform and the driver (each simulation in its own child process).
#include "driver.h"

#include <gtest/gtest.h>
#include <xbt/log.h>

#include <cmath>
#include <cstdio>
#include <simgrid/s4u.hpp>

#include "platform.h"
#include "sim_test_util.h"

namespace sg4 = simgrid::s4u;

namespace dcr::sim::internal {
namespace {

PlatformSpec TwoRegions(double wan_bw, double wan_lat) {
  PlatformSpec p;
  p.regions = {{"train", 1, 4, 12.5e9, 1e-4}, {"rollout", 2, 4, 12.5e9, 1e-4}};
  p.wan_bandwidth = wan_bw;
  p.wan_latency = wan_lat;
  p.object_store = true;
  p.store_region = 1;
  p.store_bandwidth = 1.25e9;
  p.store_latency = 0.02;
  return p;
}

// One message of `bytes` from train-0 to rollout-0 (rate cap `rate`, 0 = none); returns its time.
std::vector<double> OneMessage(const PlatformSpec& spec, double bytes, double rate) {
  int argc = 1;
  char arg0[] = "t";
  char* argv[] = {arg0, nullptr};
  xbt_log_control_set("root.thresh:critical");
  sg4::Engine e(&argc, argv);
  sg4::Engine::set_config("network/model:CM02");
  sg4::Engine::set_config("network/TCP-gamma", 1e30);
  sg4::Engine::set_config("network/crosstraffic", false);
  Platform p = BuildPlatform(spec);
  double done = -1;
  static int payload = 0;
  sg4::Mailbox* mb = sg4::Mailbox::by_name("rcv");
  sg4::Actor::create("rcv", p.hosts[1][0], [mb]() { mb->get<int>(); });
  sg4::Actor::create("snd", p.hosts[0][0], [&, mb]() {
    sg4::CommPtr c = mb->put_init(&payload, static_cast<uint64_t>(bytes));
    if (rate > 0) c->set_rate(rate);
    c->start();
    c->wait();
    done = sg4::Engine::get_clock();
  });
  e.run();
  return {done};
}

TEST(DriverTest, OneCommIsLatencyPlusSizeOverBottleneck) {
  PlatformSpec spec = TwoRegions(381e6, 0.035);
  std::vector<double> t = InChild([&] { return OneMessage(spec, 1e9, 0); });
  ASSERT_EQ(t.size(), 1u);
  double expect = (1e-4 + 0.035 + 1e-4) + 1e9 / 381e6;  // CM02: no latency/bandwidth factors
  EXPECT_NEAR(t[0], expect, expect * 1e-6);
}

TEST(DriverTest, StreamRateCapIsWindowOverRtt) {
  PlatformSpec spec = TwoRegions(381e6, 0.035);
  double rtt = 2 * (0.035 + 2e-4);
  double cap = StreamRateCap(4194304, 8 << 20, rtt, 1);
  EXPECT_NEAR(cap, 4194304 / rtt, 1e-6);  // gamma < window: gamma wins
  EXPECT_NEAR(StreamRateCap(4194304, 1 << 20, rtt, 1), (1 << 20) / rtt, 1e-6);  // window wins
  EXPECT_NEAR(StreamRateCap(4194304, 8 << 20, rtt, 8), cap / 8, 1e-9);          // shared by pieces
  EXPECT_EQ(StreamRateCap(0, 0, rtt, 1), 0.0);
  std::vector<double> t = InChild([&] { return OneMessage(spec, 1e9, cap); });
  ASSERT_EQ(t.size(), 1u);
  double expect = (0.035 + 2e-4) + 1e9 / cap;  // 59.6 MB/s < 381 MB/s
  EXPECT_NEAR(t[0], expect, expect * 1e-6);
}

TEST(DriverTest, ValidationNamesTheField) {
  PlatformSpec spec = TwoRegions(381e6, 0.035);
  EXPECT_EQ(ValidatePlatformSpec(spec), "");
  spec.regions[1].nic_bandwidth = 0;
  EXPECT_NE(ValidatePlatformSpec(spec).find("network.regions[1].nic_bandwidth"), std::string::npos);
  spec = TwoRegions(-1, 0.035);
  EXPECT_NE(ValidatePlatformSpec(spec).find("network.wan.bandwidth"), std::string::npos);
}

// A full checkpoint of `total` bytes in `chunks` blobs over the relay tree to `receivers`.
RunSpec FullTransfer(double total, int chunks, int receivers, int streams, double wan_bw) {
  RunSpec r;
  r.platform = TwoRegions(wan_bw, 0.035);
  r.platform.object_store = false;
  r.platform.regions[1].nodes = receivers;
  r.receivers = receivers;
  r.receivers_per_host = 1;
  r.topology = *Topology::FanOut(receivers + 1, 2, 1);
  uint64_t chunk = static_cast<uint64_t>(total / chunks);
  r.relay.piece_bytes = chunk / 8;
  r.relay.window_bytes = chunk;
  r.relay.root_streams = streams;
  r.pieces_in_flight = 8;
  r.tcp_gamma = 4194304;
  r.real_window = 8 << 20;
  r.blobs.push_back({BlobInfo{0, BlobKind::kHeader, 4096}, 0, 0});
  for (int i = 0; i < chunks; ++i) {
    r.blobs.push_back({BlobInfo{static_cast<BlobId>(i + 1), BlobKind::kChunk, chunk}, 0, 1});
  }
  r.blobs.push_back({BlobInfo{static_cast<BlobId>(chunks + 1), BlobKind::kTrailer, 4096}, 0, 0});
  return r;
}

TEST(DriverTest, SixteenStreamsFillTheLongLink) {
  // 16 streams x 59.6 MB/s exceed the link: 2 TB at 381 MB/s take 5249.3 s = 87.49 min; +-1%.
  RunSpec r = FullTransfer(2e12, 1000, 1, 16, 381e6);
  auto out = RunForked(r);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->error, "");
  ASSERT_EQ(out->receivers.size(), 1u);
  EXPECT_TRUE(out->receivers[0].committed);
  EXPECT_TRUE(out->receivers[0].complete);
  const double expect = 2e12 / 381e6;
  EXPECT_NEAR(out->refit_seconds, expect, expect * 0.01);
  EXPECT_NEAR(out->wire_bytes, 2e12 + 8192, 1.0);
}

TEST(DriverTest, FewStreamsAreCappedByTcpWindow) {
  // One stream: min(8 MiB, 4 MiB) / RTT = 59.6 MB/s, far below the 381 MB/s link.
  RunSpec r = FullTransfer(2e10, 100, 1, 1, 381e6);
  auto out = RunForked(r);
  ASSERT_TRUE(out.ok()) << out.status();
  double rtt = 2 * (0.035 + 2e-4);
  // The stream delivers its pieces in order, back to back at the window rate: the bytes at
  // min(8 MiB, 4 MiB) / RTT plus one path latency (not one latency per window of pieces).
  double cap = 4194304 / rtt;
  double expect = 2e10 / cap + 0.035 + 2e-4;
  EXPECT_NEAR(out->refit_seconds, expect, expect * 0.002);
  EXPECT_GT(out->refit_seconds, 2e10 / cap);  // never faster than one TCP stream
}

TEST(DriverTest, RelayTreeDeliversToEveryReceiverAndObjectStoreToo) {
  RunSpec r = FullTransfer(4e9, 40, 7, 8, 381e6);  // 8 streams x 59.6 MB/s > link
  auto out = RunForked(r);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->error, "");
  for (const NodeOutcome& n : out->receivers) {
    EXPECT_TRUE(n.committed && n.complete);
    EXPECT_EQ(n.bytes_received, 4e9 / 40 * 40 + 8192);
  }
  // Only the sender's edge crosses the long link: bytes cross once.
  EXPECT_NEAR(out->wire_bytes, 4e9 + 8192, 1.0);
  double wan_time = 4e9 / 381e6;
  EXPECT_GT(out->refit_seconds, wan_time);
  EXPECT_LT(out->refit_seconds, wan_time * 1.1);

  r.object_store = true;
  r.platform.object_store = true;
  r.relay.max_parallel_puts = 16;
  r.relay.max_parallel_fetches = 16;
  r.relay.poll_timeout_s = 1e9;
  auto st = RunForked(r);
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->error, "");
  for (const NodeOutcome& n : st->receivers) EXPECT_TRUE(n.committed && n.complete);
  EXPECT_NEAR(st->wire_bytes, 4e9 + 8192, 1.0);  // store in the rollout region: put crosses once
  EXPECT_NEAR(st->store_get_bytes, 7 * (4e9 + 8192), 10.0);
}

TEST(DriverTest, TlsCostsEachEndItsCores) {
  // 16 streams could fill the 381 MB/s link; with TLS at 50 MB/s per core the 4 cores of the
  // sending (then the receiving) host encrypt (decrypt) 200 MB/s: the edge runs at that rate.
  const double total = 2e10, per_byte = 1 / 50e6, cores = 4;
  RunSpec plain = FullTransfer(total, 100, 1, 16, 381e6);
  auto p = RunForked(plain);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->tls_cpu_seconds, 0);
  EXPECT_NEAR(p->refit_seconds, total / 381e6, total / 381e6 * 0.02);
  for (int end = 0; end < 2; ++end) {
    SCOPED_TRACE(end == 0 ? "sending end" : "receiving end");
    RunSpec r = plain;
    (end == 0 ? r.tls_send_s_per_byte : r.tls_recv_s_per_byte) = per_byte;
    auto out = RunForked(r);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->error, "");
    ASSERT_EQ(out->receivers.size(), 1u);
    EXPECT_TRUE(out->receivers[0].committed && out->receivers[0].complete);
    EXPECT_NEAR(out->tls_cpu_seconds, (total + 8192) * per_byte, 1e-6 * total * per_byte);
    const double cpu_bound = total * per_byte / cores;
    EXPECT_NEAR(out->refit_seconds, cpu_bound, cpu_bound * 0.03);
  }
  // Cheap TLS hides behind the link: 1 GB/s per core on each end.
  RunSpec cheap = plain;
  cheap.tls_send_s_per_byte = cheap.tls_recv_s_per_byte = 1e-9;
  auto c = RunForked(cheap);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NEAR(c->refit_seconds, p->refit_seconds, p->refit_seconds * 0.01);
  EXPECT_GE(c->refit_seconds, p->refit_seconds);
}

// The relay tree behind an edge relay: the long link carries a stream `shrink` times smaller,
// which the edge relay transcodes (`transcode_s` per chunk on one of its `cores`) into the plain
// stream it forwards.
RunSpec BehindEdgeRelay(RunSpec r, double shrink, int cores, double transcode_s) {
  r.edge_relay = true;
  r.platform.edge_cores = cores;
  r.wan_blobs = r.blobs;
  for (SimBlob& b : r.wan_blobs) {
    if (b.info.kind != BlobKind::kChunk) continue;
    b.info.size = static_cast<uint64_t>(static_cast<double>(b.info.size) / shrink);
    b.apply_flops = transcode_s * kHostFlops;
  }
  return r;
}

TEST(DriverTest, EdgeRelayTranscodesWhatTheLongLinkCarries) {
  const double total = 2e10;
  RunSpec plain = FullTransfer(total, 100, 7, 16, 381e6);
  auto p = RunForked(plain);
  ASSERT_TRUE(p.ok()) << p.status();
  // A stream 4x smaller on the link, transcoded fast (8 cores, 10 ms a chunk): the link's time
  // for a quarter of the bytes; every receiver gets the plain stream.
  auto fast = RunForked(BehindEdgeRelay(plain, 4, 8, 0.01));
  ASSERT_TRUE(fast.ok()) << fast.status();
  EXPECT_EQ(fast->error, "");
  for (const NodeOutcome& n : fast->receivers) {
    EXPECT_TRUE(n.committed && n.complete);
    EXPECT_EQ(n.bytes_received, total / 100 * 100 + 8192);
  }
  EXPECT_NEAR(fast->wire_bytes, total / 4 + 8192, 100.0);
  const double link = total / 4 / 381e6;
  EXPECT_GT(fast->refit_seconds, link);
  EXPECT_LT(fast->refit_seconds, link * 1.1);
  EXPECT_LT(fast->refit_seconds * 3, p->refit_seconds);
  // A lagging edge relay (one core, 1 s a chunk) bounds the refit: 100 chunks in turn.
  auto slow = RunForked(BehindEdgeRelay(plain, 4, 1, 1.0));
  ASSERT_TRUE(slow.ok()) << slow.status();
  EXPECT_EQ(slow->error, "");
  for (const NodeOutcome& n : slow->receivers) EXPECT_TRUE(n.committed && n.complete);
  EXPECT_GT(slow->refit_seconds, 100.0);
  EXPECT_LT(slow->refit_seconds, 100.0 * 1.05);
  EXPECT_EQ(slow->edge_switches, 0);  // no lag bound: it is never switched
}

// The same lagging edge relay with a lag bound (RelayOptions::edge_lag_bytes, run by the
// sender's policy) of 4 x the bytes in flight on its 16 streams (one 25 MB piece each): past it
// the sender transcodes the chunks the edge relay has not started itself (one at a time, at the
// edge relay's speed) and sends them plain, which the edge relay forwards; both transcode, the
// long link carries some plain chunks, and the refit is shorter. An edge relay that keeps up is
// never switched.
TEST(DriverTest, LaggingEdgeRelayIsSwitchedToThePlainForm) {
  const double total = 2e10;
  RunSpec plain = FullTransfer(total, 100, 7, 16, 381e6);
  plain.pieces_in_flight = 1;
  const uint64_t bound = 4 * 16 * plain.relay.piece_bytes;
  RunSpec slow = BehindEdgeRelay(plain, 4, 1, 1.0);
  auto unbounded = RunForked(slow);
  ASSERT_TRUE(unbounded.ok()) << unbounded.status();
  EXPECT_EQ(unbounded->edge_switches, 0);
  slow.edge_lag_bytes = bound;
  auto bounded = RunForked(slow);
  ASSERT_TRUE(bounded.ok()) << bounded.status();
  EXPECT_EQ(bounded->error, "");
  for (const NodeOutcome& n : bounded->receivers) {
    EXPECT_TRUE(n.committed && n.complete);
    EXPECT_EQ(n.bytes_received, total / 100 * 100 + 8192);
  }
  std::printf("unbounded %.3f s; bounded %.3f s, %d switches, %llu plain chunks, %.0f wire B\n",
              unbounded->refit_seconds, bounded->refit_seconds, bounded->edge_switches,
              static_cast<unsigned long long>(bounded->edge_plain_chunks), bounded->wire_bytes);
  EXPECT_GE(bounded->edge_switches, 1);
  EXPECT_GT(bounded->edge_plain_chunks, 5u);
  EXPECT_LT(bounded->edge_plain_chunks, 95u);
  const double chunk = total / 100;
  EXPECT_NEAR(bounded->wire_bytes,
              total / 4 + 8192 + static_cast<double>(bounded->edge_plain_chunks) * chunk * 0.75,
              100.0 * 100);
  EXPECT_LT(bounded->refit_seconds, unbounded->refit_seconds * 0.9);
  RunSpec fast = BehindEdgeRelay(plain, 4, 8, 0.01);
  fast.edge_lag_bytes = bound;
  auto f = RunForked(fast);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->error, "");
  EXPECT_EQ(f->edge_switches, 0);
  EXPECT_EQ(f->edge_plain_chunks, 0u);
}

TEST(DriverTest, EdgeRelaysSplitByRangeShareTheTranscoding) {
  const double total = 2e10;
  RunSpec plain = FullTransfer(total, 100, 7, 16, 381e6);
  // Four edge relays of one core, 1 s a chunk, the chunks of their ranges interleaved: each
  // transcodes 25 chunks in turn, a quarter of the one lagging edge relay's 100 s.
  RunSpec split = BehindEdgeRelay(plain, 4, 1, 1.0);
  split.platform.edge_count = 4;
  split.edge_range_of.assign(split.wan_blobs.size(), 0);
  for (size_t id = 1; id + 1 < split.wan_blobs.size(); ++id) {
    split.edge_range_of[id] = static_cast<int>((id - 1) % 4);
  }
  auto r = RunForked(split);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->error, "");
  for (const NodeOutcome& n : r->receivers) {
    EXPECT_TRUE(n.committed && n.complete);
    EXPECT_EQ(n.bytes_received, total / 100 * 100 + 8192);
  }
  // The long link still carries the context stream once.
  EXPECT_NEAR(r->wire_bytes, total / 4 + 8192, 100.0);
  EXPECT_GT(r->refit_seconds, 25.0);
  EXPECT_LT(r->refit_seconds, 25.0 * 1.2);
  // All ranges on one host: that host's one core transcodes the 100 chunks in turn.
  split.edge_range_of.assign(split.wan_blobs.size(), 2);
  auto one = RunForked(split);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_GT(one->refit_seconds, 100.0);
}

TEST(DriverTest, CommitmentAddsAfterTheLastChunkOnTheHostsCores) {
  RunSpec plain = FullTransfer(2e9, 20, 1, 16, 381e6);
  auto p = RunForked(plain);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->sender_ready, 0);
  // The receiver's commitment: 8 CPU-s on the 4 cores of its host after the last chunk adds 2 s;
  // asking for more threads than the host has cores changes nothing.
  for (int threads : {4, 16}) {
    SCOPED_TRACE(threads);
    RunSpec r = plain;
    r.commitment_cpu_s = 8;
    r.commitment_threads = threads;
    auto out = RunForked(r);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->error, "");
    EXPECT_TRUE(out->receivers[0].committed && out->receivers[0].complete);
    EXPECT_NEAR(out->refit_seconds - p->refit_seconds, 2.0, 0.01);
  }
  // The sender's: 4 CPU-s on its 4 cores before the first blob. The refit clock starts at the
  // first blob, so the refit is unchanged; the simulation ends 1 s later.
  RunSpec s = plain;
  s.sender_commitment_cpu_s = 4;
  s.sender_commitment_threads = 4;
  auto out = RunForked(s);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->error, "");
  EXPECT_NEAR(out->sender_ready, 1.0, 1e-6);
  EXPECT_NEAR(out->first_built, p->first_built + 1.0, 1e-6);
  EXPECT_NEAR(out->refit_seconds, p->refit_seconds, 1e-6);
  // The harness's verify after the commit: CPU that competes, never delays the commit itself.
  RunSpec v = plain;
  v.verify_cpu_s = 50;
  auto verified = RunForked(v);
  ASSERT_TRUE(verified.ok()) << verified.status();
  EXPECT_EQ(verified->error, "");
  EXPECT_NEAR(verified->refit_seconds, p->refit_seconds, 1e-6);
  EXPECT_NEAR(verified->sim_clock, verified->end + 50, 0.5);
}

TEST(DriverTest, DeterministicAcrossRuns) {
  RunSpec r = FullTransfer(1e9, 20, 5, 2, 381e6);
  auto a = RunForked(r);
  auto b = RunForked(r);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->refit_seconds, b->refit_seconds);
  EXPECT_EQ(a->comms, b->comms);
}

}  // namespace
}  // namespace dcr::sim::internal
