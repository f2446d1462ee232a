// End-to-end loopback runs of the real drivers: every rank's RunNode in its own thread, real TCP
// sockets on 127.0.0.1 and a real directory store; every receiver verified byte for byte.
#include <gtest/gtest.h>
#include <unistd.h>

#include <random>
#include <set>
#include <thread>

#include "dcr/checkpoint.h"
#include "dcr/node.h"
#include "dcr/testing/fixtures.h"
#include "transport/net.h"

namespace dcr {
namespace {

// A base and a target (3% of the elements changed, incl. tensors of several widths) plus an
// unrelated checkpoint of the same shape (a receiver holding the wrong base): random bytes, a
// change an XOR of the element's first byte.
const testing::ChangedCheckpoints& Checkpoints() {
  static const testing::ChangedCheckpoints* f =
      new testing::ChangedCheckpoints(testing::WriteChangedCheckpoints(
                                          "dcr_loopback_",
                                          {{"a.weight", "BF16", {256, 384}},
                                           {"b.weight", "BF16", {512, 128}},
                                           {"c.bias", "F32", {1000}},
                                           {"d.norm", "BF16", {384}},
                                           {"e.table", "I64", {300}}},
                                          42, 3,
                                          [](std::mt19937_64& rng, uint8_t* e, int width) {
                                            for (int k = 0; k < width; ++k)
                                              e[k] = static_cast<uint8_t>(rng());
                                          },
                                          [](std::mt19937_64& rng, uint8_t* e, int) {
                                            e[0] ^= static_cast<uint8_t>(1 + rng() % 255);
                                          })
                                          .value());
  return *f;
}

struct Config {
  int receivers = 4;
  std::vector<int> parents;  // empty: fan-out tree
  int fan_out = 2;
  int streams = 1;
  std::string method = "delta";
  std::string transport = "relay_tree";
  uint64_t shuffle = 0;
  double bandwidth = 0, latency = 0;
  std::string wrong_base_rank_path;  // receiver 1 holds this base instead
  std::string device = "cpu";        // every node's plan.device
};

std::vector<NodePlan> Plans(const Config& c, const std::string& tag) {
  const testing::ChangedCheckpoints& f = Checkpoints();
  int n = c.receivers + 1;
  std::vector<int> parents = c.parents;
  if (parents.empty()) parents = Topology::FanOut(n, c.fan_out, 1).value().parent;
  std::vector<std::string> addresses;
  for (int r = 0; r < n; ++r) {
    addresses.push_back("127.0.0.1:" + std::to_string(internal::FreePort().value()));
  }
  std::vector<NodePlan> plans;
  for (int r = 0; r < n; ++r) {
    NodePlan p;
    p.rank = r;
    p.transport = c.transport;
    p.method = c.method;
    p.parents = parents;
    p.addresses = addresses;
    p.relay.piece_bytes = 8 << 10;
    p.relay.window_bytes = 32 << 10;
    p.relay.root_streams = c.streams;
    p.relay.prefix = "t/" + tag;
    p.relay.poll_interval_s = 0.01;
    p.emulate_wan = c.bandwidth > 0 || c.latency > 0;
    p.long_bandwidth_Bps = c.bandwidth;
    p.long_latency_s = c.latency;
    p.store = "dir:" + f.dir + "/store";
    p.base_path = f.base;
    p.target_path = f.target;
    p.chunk_elems = 8192;  // many chunks
    p.full_slice_bytes = 20000;
    p.shuffle_seed = c.shuffle;
    p.receiver_base_path =
        (r == 1 && !c.wrong_base_rank_path.empty()) ? c.wrong_base_rank_path : f.base;
    p.verify_path = f.target;
    p.timeout_s = 30;
    p.device = c.device;
    p.run_id = 0x5eed;
    p.version = 7;
    plans.push_back(p);
  }
  return plans;
}

std::vector<std::pair<Status, NodeResult>> RunAll(const std::vector<NodePlan>& plans) {
  std::vector<std::pair<Status, NodeResult>> out(plans.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < plans.size(); ++i) {
    threads.emplace_back([&, i] { out[i].first = RunNode(plans[i], &out[i].second); });
  }
  for (auto& t : threads) t.join();
  return out;
}

void ExpectAllVerified(const Config& c, const std::string& tag) {
  auto results = RunAll(Plans(c, tag));
  for (size_t i = 0; i < results.size(); ++i) {
    EXPECT_TRUE(results[i].first.ok()) << tag << " node " << i << ": " << results[i].first;
    if (i > 0) {
      EXPECT_TRUE(results[i].second.verified)
          << tag << " node " << i << ": " << results[i].second.verify_message;
      EXPECT_GT(results[i].second.t_commit, 0);
    }
  }
  if (c.transport == "relay_tree") {
    const NodeResult& sender = results[0].second;
    EXPECT_EQ(sender.receivers_committed, c.receivers) << tag;
    // One committed report per receiver, each for this run and version with the hash the
    // receiver's storage holds (the published target's for a delta).
    ASSERT_EQ(sender.reports.size(), static_cast<size_t>(c.receivers)) << tag;
    std::set<int> ranks;
    for (const CommitReport& r : sender.reports) {
      EXPECT_TRUE(r.ok) << tag << " rank " << r.rank << ": " << r.error;
      EXPECT_TRUE(ranks.insert(r.rank).second) << tag << " rank " << r.rank << " twice";
      EXPECT_GE(r.rank, 1);
      EXPECT_LE(r.rank, c.receivers);
      EXPECT_EQ(r.version, 7u);
      EXPECT_EQ(r.run, 0x5eedu);
      if (c.method == "delta") {
        EXPECT_EQ(r.target_hash, sender.target_hash) << tag << " rank " << r.rank;
      }
    }
    if (c.method == "delta") {
      EXPECT_NE(sender.target_hash, Hash128{}) << tag;
    }
  }
  EXPECT_GT(results[0].second.payload_bytes, 0u);
}

TEST(RelayLoopback, TreesOfOneToSixteenReceivers) {
  int k = 0;
  for (int receivers : {1, 3, 6, 16}) {
    for (int fan_out : {1, 2, 4}) {
      if (receivers == 16 && fan_out == 1) continue;  // a 16-deep chain: covered by depth 6
      Config c;
      c.receivers = receivers;
      c.fan_out = fan_out;
      c.streams = 1 + k % 3;
      ExpectAllVerified(c, "tree" + std::to_string(k++));
    }
  }
}

TEST(RelayLoopback, ChunkOrdersAndFanOutThree) {
  for (uint64_t seed : {1, 2, 3}) {
    Config c;
    c.receivers = 7;
    c.fan_out = 3;
    c.shuffle = seed;
    ExpectAllVerified(c, "shuffle" + std::to_string(seed));
  }
  Config explicit_tree;
  explicit_tree.receivers = 5;
  explicit_tree.parents = {-1, 0, 0, 1, 3, 3};  // two long-link relays, a chain below one
  explicit_tree.streams = 2;
  ExpectAllVerified(explicit_tree, "explicit");
}

TEST(RelayLoopback, FullCheckpointReference) {
  Config c;
  c.receivers = 4;
  c.method = "full";
  c.streams = 2;
  ExpectAllVerified(c, "full-tree");
  c.transport = "object_store";
  ExpectAllVerified(c, "full-store");
}

TEST(RelayLoopback, ObjectStoreDelta) {
  Config c;
  c.receivers = 5;
  c.transport = "object_store";
  ExpectAllVerified(c, "store");
  c.shuffle = 9;
  ExpectAllVerified(c, "store-shuffled");
}

TEST(RelayLoopback, DevicePathOnTheHostBackend) {
  // Receivers holding their base in device memory (MakeDeviceReceiver), the sender diffing on the
  // device: verified on the device, and the same stream as the host path.
  Config c;
  c.receivers = 5;
  c.fan_out = 2;
  c.streams = 2;
  c.device = "host";
  ExpectAllVerified(c, "device-tree");
  c.shuffle = 4;
  ExpectAllVerified(c, "device-shuffled");
  c.shuffle = 0;
  c.transport = "object_store";
  ExpectAllVerified(c, "device-store");
  c.method = "full";  // the file image loaded onto the device at commit, verified there
  ExpectAllVerified(c, "device-full-store");
  c.transport = "relay_tree";
  ExpectAllVerified(c, "device-full-tree");
  c.method = "delta";
  c.receivers = 1;
  auto host = RunAll(Plans(c, "device-bytes"));
  c.device = "cpu";
  auto cpu = RunAll(Plans(c, "cpu-bytes"));
  ASSERT_TRUE(host[0].first.ok() && cpu[0].first.ok()) << host[0].first << " " << cpu[0].first;
  EXPECT_EQ(host[0].second.payload_bytes, cpu[0].second.payload_bytes);
  EXPECT_EQ(host[0].second.blobs, cpu[0].second.blobs);
}

TEST(RelayLoopback, DeviceReceiverRefusals) {
  Config c;
  c.receivers = 1;
  auto plans = Plans(c, "device-refusals");
  NodePlan rx = plans[1];
  rx.device = "gpu";
  NodeResult r;
  Status s = RunNode(rx, &r);  // refused at setup: nothing connects or loads
  EXPECT_TRUE(s.IsInvalidArgument()) << s;
  EXPECT_NE(s.message().find("plan.device"), std::string::npos) << s;
  rx = plans[1];
  rx.device = "host";
  rx.device_index = 3;  // the host backend has device 0 only
  s = RunNode(rx, &r);
  EXPECT_TRUE(s.IsInvalidArgument()) << s;
  EXPECT_NE(s.message().find("receiver 1 on device host:3"), std::string::npos) << s;
  rx = plans[1];
  rx.device = "host";
  rx.receiver_base_path = Checkpoints().dir + "/missing.safetensors";
  s = RunNode(rx, &r);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("loading the base"), std::string::npos) << s;
}

TEST(RelayLoopback, EmulatedLongLinkPacesTheSender) {
  Config c;
  c.receivers = 2;
  c.method = "full";
  c.streams = 3;
  c.bandwidth = 4e6;  // 32 Mbit/s
  c.latency = 0.02;
  auto results = RunAll(Plans(c, "wan"));
  ASSERT_TRUE(results[0].first.ok()) << results[0].first;
  const NodeResult& s = results[0].second;
  double last = 0;
  for (size_t i = 1; i < results.size(); ++i) {
    ASSERT_TRUE(results[i].second.verified) << results[i].second.verify_message;
    last = std::max(last, results[i].second.t_commit);
  }
  // The long link carries the stream once at <= 4 MB/s (after a 64 KiB burst) plus the latency.
  double expected = static_cast<double>(s.bytes_sent_long - (64 << 10)) / 4e6 + 0.02;
  EXPECT_GT(last - s.t_first_blob, 0.95 * expected) << "rate limit not applied";
  EXPECT_GE(s.bytes_sent_long, s.payload_bytes);
  EXPECT_LT(s.bytes_sent_long, s.payload_bytes * 11 / 10);
}

TEST(RelayLoopback, WrongBaseIsRefusedNamingTheHashes) {
  Config c;
  c.receivers = 1;
  c.wrong_base_rank_path = Checkpoints().other;
  auto plans = Plans(c, "wrongbase");
  for (auto& p : plans) p.timeout_s = 10;
  auto results = RunAll(plans);
  ASSERT_FALSE(results[1].first.ok());
  EXPECT_TRUE(results[1].first.IsFailedPrecondition()) << results[1].first;
  EXPECT_NE(results[1].first.message().find("holds"), std::string::npos) << results[1].first;
  EXPECT_FALSE(results[1].second.verified);
  EXPECT_FALSE(results[0].first.ok());  // the sender sees its child go away
  // The receiver's failure reached the sender as its report, with its code and message.
  ASSERT_EQ(results[0].second.reports.size(), 1u);
  const CommitReport& r = results[0].second.reports[0];
  EXPECT_EQ(r.rank, 1);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.code, StatusCode::kFailedPrecondition);
  EXPECT_NE(r.error.find("holds"), std::string::npos) << r.error;
}

TEST(RelayLoopback, UnreachableChildIsNamed) {
  Config c;
  c.receivers = 1;
  auto plans = Plans(c, "unreachable");
  plans[0].timeout_s = 1;
  NodeResult r;
  Status s = RunNode(plans[0], &r);  // nobody listens at the child's address
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(s.IsUnavailable()) << s;
  EXPECT_NE(s.message().find(plans[0].addresses[1]), std::string::npos) << s;
  EXPECT_FALSE(r.ok);
}

}  // namespace
}  // namespace dcr
