#include "dcr/scenario.h"

#include <dirent.h>
#include <gtest/gtest.h>

#include <string>

namespace dcr {
namespace {

TEST(Units, Sizes) {
  EXPECT_EQ(*ParseSize("1MiB", "x"), 1048576u);
  EXPECT_EQ(*ParseSize("8 MiB", "x"), 8u << 20);
  EXPECT_EQ(*ParseSize("1.5KB", "x"), 1500u);
  EXPECT_EQ(*ParseSize("4096", "x"), 4096u);
  EXPECT_FALSE(ParseSize("8 MiBs", "x").ok());
  EXPECT_FALSE(ParseSize("MiB", "x").ok());
  EXPECT_FALSE(ParseSize("-1MiB", "x").ok());
}

TEST(Units, Bandwidth) {
  EXPECT_DOUBLE_EQ(*ParseBandwidth("100Mbit/s", "x"), 12.5e6);
  EXPECT_DOUBLE_EQ(*ParseBandwidth("1 Gbps", "x"), 1.25e8);
  EXPECT_DOUBLE_EQ(*ParseBandwidth("10MiB/s", "x"), 10485760.0);
  EXPECT_DOUBLE_EQ(*ParseBandwidth("2e3B/s", "x"), 2000.0);
  auto bad = ParseBandwidth("100Mbits", "network.long_link.bandwidth");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("network.long_link.bandwidth"), std::string::npos);
}

TEST(Units, DurationAndRate) {
  EXPECT_DOUBLE_EQ(*ParseDuration("35ms", "x"), 0.035);
  EXPECT_DOUBLE_EQ(*ParseDuration("2min", "x"), 120.0);
  EXPECT_DOUBLE_EQ(*ParseDuration("1.5", "x"), 1.5);
  EXPECT_DOUBLE_EQ(*ParseDuration("500us", "x"), 0.0005);
  EXPECT_FALSE(ParseDuration("35 msec", "x").ok());
  EXPECT_DOUBLE_EQ(*ParseRate("3%", "x"), 0.03);
  EXPECT_DOUBLE_EQ(*ParseRate("0.05", "x"), 0.05);
  EXPECT_FALSE(ParseRate("150%", "x").ok());
  EXPECT_FALSE(ParseRate("3 percent", "x").ok());
}

TEST(Scenario, FullDocument) {
  const char* text = R"(
name: t
mode: real
model: {preset: tiny, seed: 7, width_div: 2}
change_rates: [1%, 0.03]
steps: 2
methods: [delta, full]
delta: {chunk_elems: 1048576, zstd_level: 1}
training: {tp: 2, pp: 1}
serving: {tp: 4, fp8: true}
transport:
  kinds: [relay_tree, object_store]
  object_store: {kind: s3, endpoint: "http://127.0.0.1:8080", allow_http: true, bucket: b, region: us-east-1}
  relay_tree: {fan_out: 3, streams: 4, window: 16MiB, chunk: 512KiB}
receivers: {count: 6, apply_threads: 1}
network:
  regions: [{name: a, bandwidth: 10Gbit/s, latency: 0.1ms}, {name: b}]
  long_link: {bandwidth: 50Mbit/s, latency: 35ms}
  emulation: transport
sim: {network_model: CM02, extra: {store: {first_byte: 20ms}}}
timeout: 5min
)";
  auto s = ParseScenario(text);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->name, "t");
  EXPECT_EQ(s->model.preset, "tiny");
  EXPECT_EQ(s->model.seed, 7u);
  EXPECT_EQ(s->model.width_div, 2);
  ASSERT_EQ(s->change_rates.size(), 2u);
  EXPECT_DOUBLE_EQ(s->change_rates[0], 0.01);
  EXPECT_EQ(s->steps, 2);
  EXPECT_EQ(s->delta.chunk_elems, 1048576u);
  EXPECT_TRUE(s->training.enabled);
  EXPECT_EQ(s->training.tp, 2);
  EXPECT_TRUE(s->serving.fp8);
  EXPECT_EQ(s->transport.kinds.size(), 2u);
  EXPECT_EQ(s->transport.object_store.kind, StoreKind::kS3);
  EXPECT_EQ(s->transport.relay_tree.fan_out, 3);
  EXPECT_EQ(s->transport.relay_tree.streams, 4);
  EXPECT_EQ(s->transport.relay_tree.window, 16u << 20);
  EXPECT_EQ(s->transport.relay_tree.chunk, 512u << 10);
  EXPECT_EQ(s->receivers.count, 6);
  EXPECT_DOUBLE_EQ(s->network.long_link.bandwidth_Bps, 50e6 / 8);
  EXPECT_DOUBLE_EQ(s->network.long_link.latency_s, 0.035);
  ASSERT_EQ(s->network.regions.size(), 2u);
  EXPECT_DOUBLE_EQ(s->network.regions[0].intra.latency_s, 0.0001);
  EXPECT_EQ(s->sim.extra.at("store.first_byte"), "20ms");
  EXPECT_DOUBLE_EQ(s->timeout_s, 300);
}

TEST(Scenario, Defaults) {
  auto s = ParseScenario("model: tiny\n", "stem");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->name, "stem");
  EXPECT_EQ(s->mode, RunMode::kReal);
  EXPECT_EQ(s->receivers.count, 4);
  EXPECT_EQ(s->methods.size(), 2u);
  EXPECT_DOUBLE_EQ(s->change_rates.at(0), 0.03);
  EXPECT_EQ(s->network.regions.size(), 2u);
}

// A deployment names only the base: its versions are open-ended. One model form at a time.
TEST(Scenario, ModelBaseIsADeploymentWithoutAVersionCount) {
  auto s = ParseScenario("model: {base: /srv/base.safetensors}\n");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->model.base, "/srv/base.safetensors");
  EXPECT_TRUE(s->model.checkpoints.empty());
  auto both = ParseScenario("model: {base: /b, checkpoints: [/b, /t]}\n");
  ASSERT_FALSE(both.ok());
  EXPECT_NE(both.status().message().find("model: give one of a preset, checkpoints or a base"),
            std::string::npos)
      << both.status().message();
}

TEST(Scenario, FaultProxyKeys) {
  auto s = ParseScenario(
      "model: tiny\nfaults: {proxy_runs: 3, proxy_faults: 2, proxy_kinds: [corrupt, partition, "
      "store_write_fail], partition: 1500ms, delay: 50ms, store_fail: 2s}\n");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->faults.proxy_runs, 3);
  EXPECT_EQ(s->faults.proxy_faults, 2);
  ASSERT_EQ(s->faults.proxy_kinds.size(), 3u);
  EXPECT_EQ(s->faults.proxy_kinds[2], "store_write_fail");
  EXPECT_DOUBLE_EQ(s->faults.partition_s, 1.5);
  EXPECT_DOUBLE_EQ(s->faults.delay_s, 0.05);
  EXPECT_DOUBLE_EQ(s->faults.store_fail_s, 2.0);
  auto bad = ParseScenario("model: tiny\nfaults: {proxy_runs: 1, proxy_kinds: [flip]}\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("faults.proxy_kinds[0]: unknown kind 'flip'"),
            std::string::npos)
      << bad.status().message();
}

TEST(Scenario, S3FaultKeys) {
  auto s = ParseScenario(
      "model: tiny\ntransport: {object_store: {kind: s3, endpoint: 'https://127.0.0.1:8443', "
      "bucket: b, read_deadline: 2s}}\nfaults: {s3_runs: 4, s3_faults: 3, s3_kinds: [5xx, "
      "bad_etag]}\n");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->faults.s3_runs, 4);
  EXPECT_EQ(s->faults.s3_faults, 3);
  ASSERT_EQ(s->faults.s3_kinds.size(), 2u);
  EXPECT_EQ(s->faults.s3_kinds[1], "bad_etag");
  EXPECT_DOUBLE_EQ(s->transport.object_store.read_deadline_s, 2.0);
  auto bad = ParseScenario("model: tiny\nfaults: {s3_runs: 1, s3_kinds: [teleport]}\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("faults.s3_kinds[0]: unknown kind 'teleport'"),
            std::string::npos)
      << bad.status().message();
  auto zero = ParseScenario("model: tiny\ntransport: {object_store: {read_deadline: 0s}}\n");
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("read_deadline"), std::string::npos);
}

void ExpectError(const std::string& text, const std::string& needle) {
  auto s = ParseScenario(text);
  ASSERT_FALSE(s.ok()) << "accepted: " << text;
  EXPECT_TRUE(s.status().IsInvalidArgument());
  EXPECT_NE(s.status().message().find(needle), std::string::npos)
      << s.status().message() << " lacks " << needle;
}

TEST(Scenario, ErrorsNameTheKey) {
  ExpectError("model: tiny\nrecievers: 3\n", "unknown key 'recievers'");
  ExpectError("model: tiny\nnetwork: {long_link: {bandwith: 1Gbit/s}}\n",
              "network.long_link: unknown key 'bandwith'");
  ExpectError("model: tiny\nnetwork: {long_link: {bandwidth: 1Gbits}}\n",
              "network.long_link.bandwidth: bad bandwidth '1Gbits'");
  ExpectError("model: tiny\nnetwork: {long_link: {latency: 35 msec}}\n",
              "network.long_link.latency");
  ExpectError("model: tiny\ntransport: {relay_tree: {window: 8 MiBs}}\n",
              "transport.relay_tree.window: bad size '8 MiBs'");
  ExpectError("model: tiny\ntransport: {relay_tree: {fan_out: two}}\n",
              "transport.relay_tree.fan_out: expected an integer");
  ExpectError("model: tiny\nmode: fast\n", "mode: unknown mode 'fast'");
  ExpectError("model: tiny\nchange_rate: 3 percent\n", "change_rate[0]");
  ExpectError("model: tiny\ntransport: {kinds: [carrier_pigeon]}\n", "transport.kinds");
  ExpectError("model: tiny\ntransport: {kinds: [object_store], object_store: {kind: s3}}\n",
              "transport.object_store.endpoint");
  ExpectError("model: tiny\nreceivers: 2\ntransport: {relay_tree: {topology: [-1, 0]}}\n",
              "transport.relay_tree.topology");
  ExpectError("network: {}\n", "model");
  ExpectError("model: tiny\nsteps: [1\n", "YAML error");
  ExpectError("model: {preset: tiny, width_div: 0}\n", "model.width_div");
  ExpectError("model: tiny\nnetwork: {regions: [{bandwidth: 1Gbit/s}]}\n",
              "network.regions[0].name");
}

TEST(Scenario, HeartbeatAndReadDeadline) {
  auto d = ParseScenario("model: tiny\n");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_DOUBLE_EQ(d->network.heartbeat_interval_s, 1.0);
  EXPECT_DOUBLE_EQ(ReadDeadlineFor(*d), 10.0);  // 100 Mbit/s: one segment round is far below
  auto slow = ParseScenario(
      "model: tiny\nnetwork: {long_link: {bandwidth: 1Mbit/s, latency: 100ms}}\n"
      "transport: {relay_tree: {root_fan_out: 2, streams: 4}}\n");
  ASSERT_TRUE(slow.ok()) << slow.status();
  // 8 streams x 64 KiB at 125 kB/s = 4.19 s, + 0.1 s latency, x 4.
  EXPECT_NEAR(ReadDeadlineFor(*slow), 4 * (8 * 65536 / 125e3 + 0.1), 1e-9);
  auto s = ParseScenario("model: tiny\nnetwork: {heartbeat: 250ms, read_deadline: 2s}\n");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_DOUBLE_EQ(s->network.heartbeat_interval_s, 0.25);
  EXPECT_DOUBLE_EQ(ReadDeadlineFor(*s), 2.0);
  ExpectError("model: tiny\nnetwork: {heartbeat: 0s}\n", "network.heartbeat: must be > 0");
  ExpectError("model: tiny\nnetwork: {heartbeat: 1s, read_deadline: 1500ms}\n",
              "network.read_deadline: must be at least twice network.heartbeat");
}

TEST(Scenario, DeviceKeys) {
  auto d = ParseScenario("model: tiny\n");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->receivers.device, "cpu");
  EXPECT_EQ(d->sender.device, "cpu");
  EXPECT_TRUE(d->receivers.devices.empty());
  auto s = ParseScenario(
      "model: tiny\nmethods: [delta]\n"
      "receivers: {count: 4, per_node: 2, device: cuda, devices: [3, 1]}\n"
      "sender: {device: host}\n");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->receivers.device, "cuda");
  EXPECT_EQ(s->sender.device, "host");
  EXPECT_EQ(s->receivers.devices, (std::vector<int>{3, 1}));
  auto one =
      ParseScenario("model: tiny\nmethods: [delta]\nreceivers: {device: host, devices: 0}\n");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->receivers.devices, (std::vector<int>{0}));

  ExpectError("model: tiny\nreceivers: {device: gpu}\n",
              "receivers.device: unknown device 'gpu' (cpu, host, cuda)");
  ExpectError("model: tiny\nreceivers: {device: [cuda]}\n", "receivers.device: unknown device");
  ExpectError("model: tiny\nsender: {device: CUDA}\n", "sender.device: unknown device 'CUDA'");
  ExpectError("model: tiny\nsender: {devices: [0]}\n", "sender: unknown key 'devices'");
  ExpectError("model: tiny\nsender: cuda\n", "sender: expected a mapping");
  ExpectError("model: tiny\nreceivers: {devices: [0, x]}\n",
              "receivers.devices[1]: expected a device index");
  ExpectError("model: tiny\nreceivers: {devices: [-1]}\n", "receivers.devices[0]");
  ExpectError("model: tiny\nreceivers: {devices: []}\n", "receivers.devices: empty list");
  ExpectError("model: tiny\nreceivers: {devices: [[0]]}\n", "receivers.devices[0]");

  // Both methods with a device; the simulator takes the keys too.
  EXPECT_TRUE(ParseScenario("model: tiny\nreceivers: {device: host}\n").ok());
  EXPECT_TRUE(ParseScenario("model: tiny\nmode: sim\nreceivers: {device: cuda}\n").ok());

  Scenario bad = *d;
  bad.receivers.device = "tpu";
  EXPECT_NE(ValidateScenario(bad).message().find("receivers.device"), std::string::npos);
  bad = *d;
  bad.sender.device = "";
  EXPECT_NE(ValidateScenario(bad).message().find("sender.device"), std::string::npos);
}

TEST(Scenario, DeviceIndexByLocalIndex) {
  auto s = ParseScenario(
      "model: tiny\nmethods: [delta]\nreceivers: {count: 6, per_node: 3, device: cuda}\n");
  ASSERT_TRUE(s.ok()) << s.status();
  // Nodes 1..3 on host 0, 4..6 on host 1.
  EXPECT_EQ(ReceiverHost(*s, 1), 0);
  EXPECT_EQ(ReceiverHost(*s, 3), 0);
  EXPECT_EQ(ReceiverHost(*s, 4), 1);
  EXPECT_EQ(ReceiverLocalIndex(*s, 1), 0);
  EXPECT_EQ(ReceiverLocalIndex(*s, 3), 2);
  EXPECT_EQ(ReceiverLocalIndex(*s, 5), 1);
  EXPECT_EQ(DeviceIndexFor(*s, 2), 2);  // no list: the local index
  s->receivers.devices = {0};
  EXPECT_EQ(DeviceIndexFor(*s, 0), 0);
  EXPECT_EQ(DeviceIndexFor(*s, 2), 0);  // every receiver of the host shares device 0
  s->receivers.devices = {4, 5};
  EXPECT_EQ(DeviceIndexFor(*s, 0), 4);
  EXPECT_EQ(DeviceIndexFor(*s, 1), 5);
  EXPECT_EQ(DeviceIndexFor(*s, 2), 4);
}

// The parents of TopologyFor(scenario `yaml`).
std::vector<NodeId> TreeOf(const std::string& yaml) {
  auto s = ParseScenario("model: tiny\n" + yaml);
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return {};
  auto t = TopologyFor(*s);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? t->parent : std::vector<NodeId>{};
}

TEST(TopologyFor, OneReceiverPerHostIsTheFanOutTree) {
  auto fan = Topology::FanOut(8, 2, 1);
  ASSERT_TRUE(fan.ok());
  EXPECT_EQ(TreeOf("receivers: {count: 7}\ntransport: {relay_tree: {fan_out: 2}}\n"), fan->parent);
  EXPECT_EQ(TreeOf("receivers: {count: 7, per_node: 1}\n"), fan->parent);
}

TEST(TopologyFor, PerNodeCrossesBetweenHostsOncePerHost) {
  // 3 hosts of 2: leaders 1, 3, 5; leader tree fan_out 2, root_fan_out 1: 0 -> 1 -> {3, 5}.
  EXPECT_EQ(TreeOf("receivers: {count: 6, per_node: 2}\n"
                   "transport: {relay_tree: {fan_out: 2, root_fan_out: 1}}\n"),
            (std::vector<NodeId>{-1, 0, 1, 1, 3, 1, 5}));
  // A short last host (7 receivers, 3 per host: hosts {1,2,3} {4,5,6} {7}); root_fan_out 2
  // feeds leaders 1 and 4 over the long link, leader 1 feeds 7.
  EXPECT_EQ(TreeOf("receivers: {count: 7, per_node: 3}\n"
                   "transport: {relay_tree: {fan_out: 1, root_fan_out: 2}}\n"),
            (std::vector<NodeId>{-1, 0, 1, 1, 0, 4, 4, 1}));
  // The paper shape: 64 receivers, 8 per host, fan_out 4.
  auto s = ParseScenario(
      "model: tiny\nreceivers: {count: 64, per_node: 8}\n"
      "transport: {relay_tree: {fan_out: 4, root_fan_out: 1}}\n");
  ASSERT_TRUE(s.ok()) << s.status();
  auto t = TopologyFor(*s);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 65);
  int cross_host = 0, from_sender = 0;
  for (int node = 1; node < t->size(); ++node) {
    const NodeId p = t->parent[node];
    if (p == 0) {
      ++from_sender;
    } else if (ReceiverHost(*s, p) != ReceiverHost(*s, node)) {
      ++cross_host;
      EXPECT_EQ(ReceiverLocalIndex(*s, node), 0) << "only leaders receive from another host";
      EXPECT_EQ(ReceiverLocalIndex(*s, p), 0) << "only leaders send to another host";
    } else {
      EXPECT_EQ(p, 1 + ReceiverHost(*s, node) * 8) << "siblings hang off their leader";
    }
  }
  EXPECT_EQ(from_sender, 1);
  EXPECT_EQ(cross_host, 7);  // 8 hosts: one long-link entry, 7 host-to-host edges
}

TEST(TopologyFor, ExplicitTopologyWinsOverPerNode) {
  EXPECT_EQ(TreeOf("receivers: {count: 3, per_node: 3}\n"
                   "transport: {relay_tree: {topology: [-1, 0, 1, 2]}}\n"),
            (std::vector<NodeId>{-1, 0, 1, 2}));
}

TEST(Scenario, ShippedScenariosParse) {
  // Every scenario in scenarios/ (the test runs from the source root) must parse.
  DIR* d = opendir("scenarios");
  if (d == nullptr) GTEST_SKIP() << "scenarios/ not found from the working directory";
  int n = 0;
  while (dirent* e = readdir(d)) {
    std::string f = e->d_name;
    if (f.size() < 5 || f.substr(f.size() - 5) != ".yaml") continue;
    auto s = LoadScenario("scenarios/" + f);
    EXPECT_TRUE(s.ok()) << f << ": " << s.status();
    ++n;
  }
  closedir(d);
  EXPECT_GT(n, 0);
}

TEST(Result, JsonRoundTripAndSpeedup) {
  ScenarioResult r;
  r.scenario = "q";
  r.model = "tiny";
  RunResult d;
  d.method = Method::kDelta;
  d.change_rate = 0.03;
  d.refit_seconds = 0.5;
  d.wire_bytes = 100;
  d.receivers = 4;
  d.receivers_verified = 4;
  RunResult f = d;
  f.method = Method::kFull;
  f.refit_seconds = 20;
  f.wire_bytes = 4000;
  r.runs = {d, f};
  EXPECT_DOUBLE_EQ(SpeedupVsFull(r, r.runs[0]), 40.0);
  std::string js = ResultToJson(r);
  for (const char* key : {"\"scenario\"", "\"mode\"", "\"model\"", "\"runs\"", "\"method\"",
                          "\"transport\"", "\"change_rate\"", "\"refit_seconds\"", "\"wire_bytes\"",
                          "\"receivers\"", "\"receivers_verified\""}) {
    EXPECT_NE(js.find(key), std::string::npos) << key;
  }
  auto back = ResultFromJson(js);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->runs.size(), 2u);
  EXPECT_EQ(back->runs[1].method, Method::kFull);
  EXPECT_DOUBLE_EQ(back->runs[1].refit_seconds, 20);
  EXPECT_EQ(back->runs[0].wire_bytes, 100u);
  std::string md = ResultToMarkdown(r);
  EXPECT_NE(md.find("40.0x"), std::string::npos) << md;
  EXPECT_FALSE(ResultFromJson("{not json").ok());
}

}  // namespace
TEST(Scenario, PlainHttpStoreNeedsAllowHttpAndTlsKeysParse) {
  const std::string head = R"(
name: t
mode: real
model: {preset: tiny}
transport:
  kinds: [object_store]
  object_store: {kind: s3, endpoint: "http://127.0.0.1:8080", bucket: b)";
  auto refused = ParseScenario(head + "}\n");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("allow_http"), std::string::npos) << refused.status();
  auto allowed = ParseScenario(head + ", allow_http: true}\n");
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  EXPECT_TRUE(allowed->transport.object_store.allow_http);
  EXPECT_TRUE(allowed->network.tls.enabled);  // TLS on by default

  auto off = ParseScenario("name: t\nmodel: {preset: tiny}\nnetwork: {tls: false}\n");
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE(off->network.tls.enabled);
  auto files = ParseScenario(
      "name: t\nmodel: {preset: tiny}\nnetwork:\n  tls: {ca: k/ca.crt, cert: 'k/node-{rank}.crt', "
      "key: 'k/node-{rank}.key'}\n");
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(files->network.tls.cert, "k/node-{rank}.crt");
  auto partial = ParseScenario("name: t\nmodel: {preset: tiny}\nnetwork: {tls: {ca: k/ca.crt}}\n");
  EXPECT_FALSE(partial.ok());
}

TEST(Scenario, EdgeRelaysAndNodeDevices) {
  const std::string base =
      "mode: real\nmodel: tiny\ndelta: {wan_context: true}\nreceivers: {count: 4, node_devices: "
      "{4: host}}\nnetwork: {signing: false}\ntransport: {relay_tree: {fan_out: 3%s}}\n";
  auto with = [&](const std::string& key) {
    std::string t = base;
    t.replace(t.find("%s"), 2, key);
    return ParseScenario(t);
  };
  auto s = with(", edge_relays: [1]");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->transport.relay_tree.edge_relays, std::vector<int>{1});
  EXPECT_EQ(ReceiverDevice(*s, 4), "host");
  EXPECT_EQ(ReceiverDevice(*s, 2), "cpu");
  // A host receiver without an edge relay above it could not decode the context-coded chunks.
  auto none = with("");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("edge_relays"), std::string::npos)
      << none.status().ToString();
  auto deep = with(", edge_relays: [1, 2]");
  ASSERT_FALSE(deep.ok());
  EXPECT_NE(deep.status().message().find("node 2 is not a child of the sender"), std::string::npos)
      << deep.status().ToString();
  auto bad = with(", edge_relays: [x]");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("edge_relays[0]"), std::string::npos);
  std::string plain = base;
  plain.replace(plain.find("delta: {wan_context: true}"), 26, "delta: {wan_context: false}");
  plain.replace(plain.find("%s"), 2, ", edge_relays: [1]");
  auto no_context = ParseScenario(plain);
  ASSERT_FALSE(no_context.ok());
  EXPECT_NE(no_context.status().message().find("delta.wan_context"), std::string::npos);
}

}  // namespace dcr

namespace dcr {
namespace {

TEST(Scenario, CatchUpBlockAndReceiverDeadline) {
  auto s = ParseScenario(
      "model: tiny\nsteps: 5\nreceivers: {count: 6, deadline: 2s}\n"
      "catch_up: {down_step: 2, down_versions: 2, join_step: 3, max_replay: 4, "
      "full_frame_fraction: 0.25}\n");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_DOUBLE_EQ(s->receivers.deadline_s, 2.0);
  EXPECT_TRUE(s->catch_up.enabled);
  EXPECT_EQ(s->catch_up.down_step, 2);
  EXPECT_EQ(s->catch_up.down_versions, 2);
  EXPECT_EQ(s->catch_up.join_step, 3);
  EXPECT_EQ(s->catch_up.max_replay, 4);
  EXPECT_DOUBLE_EQ(s->catch_up.full_frame_fraction, 0.25);
  auto d = ParseScenario("model: tiny\n");
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->catch_up.enabled);
  EXPECT_DOUBLE_EQ(d->receivers.deadline_s, 30.0);
  // Coming back after the last step, joining at step 1 or after the last: refused.
  EXPECT_TRUE(ParseScenario("model: tiny\nsteps: 3\ncatch_up: {down_step: 2, down_versions: 2}\n")
                  .status()
                  .IsInvalidArgument());
  EXPECT_TRUE(ParseScenario("model: tiny\nsteps: 3\ncatch_up: {join_step: 1}\n")
                  .status()
                  .IsInvalidArgument());
  EXPECT_TRUE(ParseScenario("model: tiny\nsteps: 3\ncatch_up: {join_step: 4}\n")
                  .status()
                  .IsInvalidArgument());
  EXPECT_TRUE(ParseScenario("model: tiny\ncatch_up: {down_stp: 2}\n").status().IsInvalidArgument());
}

TEST(Scenario, ContextClasses) {
  auto parse = [](const std::string& delta) {
    return ParseScenario("name: t\nmodel: {preset: tiny}\ndelta: " + delta + "\n");
  };
  auto dflt = parse("{wan_context: true}");
  ASSERT_TRUE(dflt.ok()) << dflt.status().ToString();
  EXPECT_EQ(dflt->delta.context_classes, kContextClassesMax);
  auto eight = parse("{wan_context: true, context_classes: 8}");
  ASSERT_TRUE(eight.ok()) << eight.status().ToString();
  EXPECT_EQ(eight->delta.context_classes, 8);
  for (const char* bad : {"0", "17", "-3", "many", "[4]"}) {
    auto s = parse(std::string("{wan_context: true, context_classes: ") + bad + "}");
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_TRUE(s.status().IsInvalidArgument()) << s.status().ToString();
    EXPECT_NE(s.status().message().find("context_classes"), std::string::npos)
        << s.status().ToString();
  }
  // Plain chunks have no classes: the key without context coding is a mistake, said so.
  for (const char* without : {"{context_classes: 8}", "{wan_context: false, context_classes: 8}"}) {
    auto s = parse(without);
    ASSERT_FALSE(s.ok()) << without;
    EXPECT_NE(s.status().message().find("delta.wan_context"), std::string::npos)
        << s.status().ToString();
  }
}

}  // namespace
}  // namespace dcr
