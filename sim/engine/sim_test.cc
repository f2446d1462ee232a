// Scenario-level checks of dcr::sim::Simulate: golden results of small scenarios (deterministic),
// coarsening invariance, and errors naming the scenario key. Each simulation runs in a child.
#include "dcr/sim/sim.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <sstream>

#include "dcr/delta.h"
#include "dcr/scenario.h"

namespace dcr::sim {
namespace {

const char* kSmall = R"(
name: sim-small
mode: sim
model: {preset: llama3-8b, depth_div: 8, width_div: 4, seed: 1}
change_rates: [3%, 5%]
methods: [delta, full]
transport:
  kinds: [relay_tree, object_store]
  relay_tree: {fan_out: 2, root_fan_out: 1, streams: 4, window: 8MiB, chunk: 1MiB}
  object_store: {parallel: 4, sim_bandwidth: 10Gbit/s, sim_latency: 20ms}
receivers: {count: 6, per_node: 2, apply_threads: 2}
network:
  regions: [{name: train}, {name: rollout, bandwidth: 10Gbit/s, latency: 0.1ms}]
  long_link: {bandwidth: 100Mbit/s, latency: 35ms}
sim: {gpus_per_node: 4}
)";

std::string GoldenPath() { return std::string(DCR_TEST_SRC) + "/testdata/golden_small.json"; }

Scenario Parse(const std::string& yaml) {
  auto s = ParseScenario(yaml, "test");
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

TEST(SimTest, SmallScenarioMatchesGolden) {
  Scenario s = Parse(kSmall);
  auto r = Simulate(s);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->runs.size(), 8u);
  nlohmann::json now = nlohmann::json::array();
  for (const RunResult& run : r->runs) {
    EXPECT_EQ(run.error, "");
    EXPECT_EQ(run.receivers_verified, 6);
    now.push_back({{"method", MethodName(run.method)},
                   {"transport", TransportKindName(run.transport)},
                   {"change_rate", run.change_rate},
                   {"refit_seconds", run.refit_seconds},
                   {"wire_bytes", run.wire_bytes},
                   {"payload_bytes", run.payload_bytes}});
  }
  if (std::getenv("DCR_UPDATE_GOLDEN") != nullptr) {
    std::ofstream(GoldenPath()) << now.dump(2) << "\n";
    GTEST_SKIP() << "golden file rewritten";
  }
  std::ifstream in(GoldenPath());
  ASSERT_TRUE(in) << GoldenPath();
  nlohmann::json golden = nlohmann::json::parse(in);
  ASSERT_EQ(golden.size(), now.size());
  for (size_t i = 0; i < now.size(); ++i) {
    SCOPED_TRACE(now[i].dump());
    EXPECT_EQ(golden[i]["method"], now[i]["method"]);
    EXPECT_EQ(golden[i]["transport"], now[i]["transport"]);
    double g = golden[i]["refit_seconds"], n = now[i]["refit_seconds"];
    EXPECT_NEAR(n, g, g * 1e-6);  // floats: a relative tolerance across compilers
    uint64_t gp = golden[i]["payload_bytes"], np = now[i]["payload_bytes"];
    EXPECT_NEAR(static_cast<double>(np), static_cast<double>(gp), gp * 1e-6);
  }
  // Delta beats full on the same link by more than the payload ratio's share of the link time.
  for (size_t i = 0; i + 1 < r->runs.size(); i += 2) {
    EXPECT_LT(r->runs[i].refit_seconds * 10, r->runs[i + 1].refit_seconds);
  }
}

TEST(SimTest, TlsIsChargedWhenOnAndSaysSo) {
  // The default calibration carries dcr_bench_tls's costs; network.tls is on by default.
  Scenario s = Parse(kSmall);
  s.change_rates = {0.03};
  s.transport.kinds = {TransportKind::kRelayTree};
  s.methods = {Method::kFull};
  auto on = Simulate(s);
  s.network.tls.enabled = false;
  auto off = Simulate(s);
  ASSERT_TRUE(on.ok() && off.ok());
  EXPECT_EQ(on->setup.at("tls").rfind("on (network.tls): every relay-tree endpoint is charged", 0),
            0u)
      << on->setup.at("tls");
  EXPECT_EQ(off->setup.at("tls").rfind("off", 0), 0u) << off->setup.at("tls");
  const std::string key = "run.full.relay_tree.0.03";
  EXPECT_NE(on->setup.at(key).find("; sockets (TCP + TLS) "), std::string::npos)
      << on->setup.at(key);
  EXPECT_EQ(off->setup.at(key).find("TLS"), std::string::npos) << off->setup.at(key);
  EXPECT_NE(off->setup.at(key).find("; sockets (TCP) "), std::string::npos) << off->setup.at(key);
  EXPECT_EQ(on->runs[0].receivers_verified, 6);
  EXPECT_EQ(on->runs[0].wire_bytes, off->runs[0].wire_bytes);
  // At the calibrated costs the endpoints' cores keep up with the 100 Mbit/s link: TLS costs CPU,
  // not refit time.
  EXPECT_NEAR(on->runs[0].refit_seconds, off->runs[0].refit_seconds,
              off->runs[0].refit_seconds * 0.01);
}

// The default calibration with the durable commit at `s_per_byte` wall seconds per byte of a
// receiver's storage at every rate.
std::string CommitCalibration(double s_per_byte) {
  std::ifstream in(std::string(DCR_TEST_SRC) + "/../calibration/default.json");
  nlohmann::json j = nlohmann::json::parse(in);
  j.erase("durability");
  for (auto& r : j["rates"]) r["commit_s_per_storage_byte"] = s_per_byte;
  for (const char* k : {"tls", "signing"}) {
    j[k] = std::string(DCR_TEST_SRC) + "/../calibration/" + k + ".json";
  }
  char path[] = "/tmp/dcr_sim_commit_cal_XXXXXX";
  int fd = ::mkstemp(path);
  EXPECT_GE(fd, 0);
  ::close(fd);
  std::ofstream(path) << j.dump();
  return path;
}

TEST(SimTest, DurableCommitAddsAfterTheLastApplyAndSaysSo) {
  // 10 ns per byte of storage: the whole 1/1 checkpoint per receiver, so the commit shows.
  Scenario s = Parse(kSmall);
  s.change_rates = {0.03};
  s.methods = {Method::kDelta};
  s.transport.kinds = {TransportKind::kRelayTree, TransportKind::kObjectStore};
  s.sim.calibration = CommitCalibration(1e-8);
  auto on = Simulate(s);
  s.sim.extra["durable"] = "false";
  auto off = Simulate(s);
  std::remove(s.sim.calibration.c_str());
  ASSERT_TRUE(on.ok() && off.ok()) << on.status() << off.status();
  EXPECT_EQ(on->setup.at("durability").rfind("durable receivers (state directory", 0), 0u)
      << on->setup.at("durability");
  EXPECT_EQ(off->setup.at("durability").rfind("off (sim.extra.durable: false)", 0), 0u);
  EXPECT_NE(on->setup.at("hardware").find("receivers: 6 on 3 hosts"), std::string::npos)
      << on->setup.at("hardware");
  ASSERT_EQ(on->runs.size(), 2u);
  const double storage = static_cast<double>(on->model_bytes);
  for (size_t i = 0; i < on->runs.size(); ++i) {
    const std::string key =
        std::string("costs.delta.") + TransportKindName(on->runs[i].transport) + ".0.03";
    EXPECT_NE(on->setup.at(key).find("; durable commit "), std::string::npos) << on->setup.at(key);
    EXPECT_NE(off->setup.at(key).find("durable commit not charged"), std::string::npos);
    EXPECT_EQ(on->runs[i].receivers_verified, 6);
    // The commit cannot overlap the transfer: it adds its whole time (storage >= dense bytes).
    const double added = on->runs[i].refit_seconds - off->runs[i].refit_seconds;
    EXPECT_GE(added, storage * 1e-8 * 0.99) << key;
    EXPECT_LE(added, storage * 1e-8 * 1.05 + 0.05) << key;
  }
}

TEST(SimTest, VersionLogImageIsChargedInTheCommitThatWritesIt) {
  // The commit's log part at 1e-12 s per byte of storage, the image written at 1 GB/s: at 3% an
  // image falls due every ~70 versions (the log reaching 1.25 images).
  std::string cal = CommitCalibration(1e-12);
  {
    std::ifstream in(cal);
    nlohmann::json j = nlohmann::json::parse(in);
    for (auto& r : j["rates"]) r["plain_write_bytes_per_s"] = 1e9;
    std::ofstream(cal) << j.dump();
  }
  Scenario s = Parse(kSmall);
  s.change_rates = {0.03};
  s.methods = {Method::kDelta};
  s.transport.kinds = {TransportKind::kRelayTree};
  s.sim.calibration = cal;
  s.steps = 200;
  auto many = Simulate(s);
  s.steps = 3;
  auto few = Simulate(s);
  std::remove(cal.c_str());
  ASSERT_TRUE(many.ok() && few.ok()) << many.status() << few.status();
  // Within 200 steps: the run of every other step (step 1) and the step whose commit writes it.
  ASSERT_EQ(many->runs.size(), 2u);
  const RunResult& plain = many->runs[0];
  const RunResult& imaged = many->runs[1];
  EXPECT_EQ(plain.step, 1);
  EXPECT_GT(imaged.step, 10);
  EXPECT_LE(imaged.step, 200);
  const double storage = static_cast<double>(many->model_bytes);
  const double added = imaged.refit_seconds - plain.refit_seconds;
  EXPECT_GE(added, storage / 1e9 * 0.99);
  EXPECT_LE(added, storage / 1e9 * 1.05 + 0.01);
  const std::string key = "costs.delta.relay_tree.0.03";
  const std::string step_key = key + ".step" + std::to_string(imaged.step);
  EXPECT_NE(many->setup.at(step_key).find("whose commit writes the version log's image (every " +
                                          std::to_string(imaged.step) + " versions)"),
            std::string::npos)
      << many->setup.at(step_key);
  EXPECT_NE(many->setup.at(key).find("not in this version's commit"), std::string::npos)
      << many->setup.at(key);
  // Within 3 steps none writes an image: one run, and its commit is the log's alone.
  ASSERT_EQ(few->runs.size(), 1u);
  EXPECT_NEAR(few->runs[0].refit_seconds, plain.refit_seconds, 1e-9);
  EXPECT_NE(few->setup.at(key).find("beyond the scenario's 3 steps"), std::string::npos)
      << few->setup.at(key);
}

// The default calibration with the context-coded delta encoded at half the plain encoder's speed,
// decoded + applied at 4 GB/s per core and transcoded at `transcode` B/s per core (transcode 0:
// without context keys), measured at `classes` classes per chunk (0: the file does not say).
std::string ContextCalibration(double transcode, int classes = 0) {
  std::ifstream in(std::string(DCR_TEST_SRC) + "/../calibration/default.json");
  nlohmann::json j = nlohmann::json::parse(in);
  for (auto& r : j["rates"]) {
    for (auto it = r.begin(); it != r.end();) {
      it = it.key().rfind("context_", 0) == 0 ? r.erase(it) : std::next(it);
    }
    if (transcode <= 0) continue;
    r["context_encode_bytes_per_s"] = r["encode_bytes_per_s"].get<double>() / 2;
    r["context_decode_apply_bytes_per_s"] = 4e9;
    r["context_transcode_bytes_per_s"] = transcode;
  }
  if (classes > 0) j["context_classes"] = classes;
  j["tls"] = std::string(DCR_TEST_SRC) + "/../calibration/tls.json";
  j["signing"] = std::string(DCR_TEST_SRC) + "/../calibration/signing.json";
  j["durability"] = std::string(DCR_TEST_SRC) + "/../calibration/durability.json";
  char path[] = "/tmp/dcr_sim_ctx_cal_XXXXXX";
  int fd = ::mkstemp(path);
  EXPECT_GE(fd, 0);
  ::close(fd);
  std::ofstream(path) << j.dump();
  return path;
}

// The payload model's context chunks as a fraction of the plain ones at 3% (its setup line).
std::optional<double> ContextChunkRatio(const ScenarioResult& r) {
  std::smatch m;
  const std::string model = r.setup.at("payload_model.0.03");
  if (!std::regex_search(model, m, std::regex("chunks ([0-9.e+-]+) of the plain ones"))) {
    return std::nullopt;
  }
  return std::stod(m[1]);
}

TEST(SimTest, WanContextSendsTheContextFormToAnEdgeRelay) {
  Scenario s = Parse(kSmall);
  s.sim.extra["durable"] = "false";  // the long link's form alone (the commit adds to both)
  s.change_rates = {0.03};
  s.transport.kinds = {TransportKind::kRelayTree};
  s.methods = {Method::kDelta};
  auto plain = Simulate(s);
  ASSERT_TRUE(plain.ok()) << plain.status();
  SimOptions o;
  o.calibration_path = ContextCalibration(2e9);
  s.delta.wan_context = true;
  s.sim.extra["edge_relay_cores"] = "8";
  auto ctx = Simulate(s, o);
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  const RunResult& p = plain->runs[0];
  const RunResult& c = ctx->runs[0];
  EXPECT_EQ(c.error, "");
  EXPECT_EQ(c.receivers_verified, 6);
  EXPECT_EQ(c.payload_bytes, p.payload_bytes);  // the receivers get the plain delta
  // The long link carries the chunks at the size the payload model measured for their context
  // form (header and trailer as they are), and that form is the smaller one.
  const std::optional<double> measured = ContextChunkRatio(*ctx);
  ASSERT_TRUE(measured.has_value()) << ctx->setup.at("payload_model.0.03");
  const double ratio = *measured;
  EXPECT_GT(ratio, 0.5);
  EXPECT_LT(ratio, 0.97);
  EXPECT_NEAR(static_cast<double>(c.wire_bytes) / p.wire_bytes, ratio, 0.02);
  // Bound by the 100 Mbit/s link; the edge relay's transcoding and the extra hop add a little.
  EXPECT_LT(c.refit_seconds, p.refit_seconds * (ratio + 0.15)) << "size ratio " << ratio;
  const std::string line = ctx->setup.at("run.delta.relay_tree.0.03");
  EXPECT_NE(line.find("it keeps up, the long link carries the context form"), std::string::npos)
      << line;
  EXPECT_NE(line.find("8 cores"), std::string::npos) << line;

  // An edge relay that cannot keep up (one core at 1 MB/s): the long link carries the plain form.
  SimOptions slow;
  slow.calibration_path = ContextCalibration(1e6);
  s.sim.extra["edge_relay_cores"] = "1";
  auto lag = Simulate(s, slow);
  ASSERT_TRUE(lag.ok()) << lag.status();
  EXPECT_NE(lag->setup.at("run.delta.relay_tree.0.03").find("it would lag"), std::string::npos);
  EXPECT_EQ(lag->runs[0].wire_bytes, p.wire_bytes);
  EXPECT_EQ(lag->runs[0].refit_seconds, p.refit_seconds);
  std::remove(o.calibration_path.c_str());
  std::remove(slow.calibration_path.c_str());

  // Edge relays split by chunk range: `auto` finds the smallest set that keeps up. At 100 MB/s
  // per core one edge relay of 2 cores lags; a few of them keep up, each holding its share.
  SimOptions mid;
  mid.calibration_path = ContextCalibration(1e8);
  s.sim.extra["edge_relay_cores"] = "2";
  auto one = Simulate(s, mid);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_NE(one->setup.at("run.delta.relay_tree.0.03").find("it would lag"), std::string::npos);
  s.sim.extra["edge_relays"] = "auto";
  auto split = Simulate(s, mid);
  ASSERT_TRUE(split.ok()) << split.status();
  const std::string sl = split->setup.at("run.delta.relay_tree.0.03");
  EXPECT_NE(sl.find("smallest set that keeps up"), std::string::npos) << sl;
  EXPECT_NE(sl.find("it keeps up, the long link carries the context form"), std::string::npos)
      << sl;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(sl, m,
                                std::regex("keeps up \\(sim.extra.edge_relays: auto, at "
                                           "most 2 cores each\\): ([0-9]+) edge relays")))
      << sl;
  const int k = std::stoi(m[1]);
  EXPECT_GT(k, 1);
  EXPECT_NE(
      split->setup.at("hardware")
          .find("edge relays of run.delta.relay_tree.0.03: " + std::to_string(k) + " hosts of"),
      std::string::npos)
      << split->setup.at("hardware");
  EXPECT_EQ(split->runs[0].error, "");
  EXPECT_EQ(split->runs[0].receivers_verified, 6);
  EXPECT_EQ(split->runs[0].wire_bytes, c.wire_bytes);  // the context stream, once
  // Each range keeps up only just (the choice is the steady state's): its last chunks' transcoding
  // adds a tail, which on this 45-chunk stream is about the context form's saving.
  EXPECT_LT(split->runs[0].refit_seconds, p.refit_seconds * 1.2) << sl;
  // A bound on each edge relay's share of the base asks for more of them (fewer cores each).
  s.sim.extra["edge_relay_memory"] = "30MB";
  auto bounded = Simulate(s, mid);
  ASSERT_TRUE(bounded.ok()) << bounded.status();
  const std::string bl = bounded->setup.at("run.delta.relay_tree.0.03");
  ASSERT_TRUE(std::regex_search(bl, m,
                                std::regex("and 0.03 GB of base each\\): ([0-9]+) edge "
                                           "relays in region rollout, ([0-9]+) cores")))
      << bl;
  EXPECT_GT(std::stoi(m[1]), k);
  EXPECT_LE(std::stoi(m[2]), 2);
  EXPECT_EQ(bounded->runs[0].receivers_verified, 6);
  s.sim.extra["edge_relay_memory"] = "0";
  EXPECT_TRUE(Simulate(s, mid).status().IsInvalidArgument());
  s.sim.extra.erase("edge_relay_memory");
  // One fewer edge relay than the smallest set lags.
  s.sim.extra["edge_relays"] = std::to_string(k - 1);
  auto fewer = Simulate(s, mid);
  ASSERT_TRUE(fewer.ok()) << fewer.status();
  EXPECT_NE(fewer->setup.at("run.delta.relay_tree.0.03").find("it would lag"), std::string::npos);
  for (const char* bad : {"0", "65", "some"}) {
    s.sim.extra["edge_relays"] = bad;
    auto refused = Simulate(s, mid);
    EXPECT_TRUE(refused.status().IsInvalidArgument()) << bad;
    EXPECT_NE(refused.status().message().find("sim.extra.edge_relays: must be 'auto' or a count"),
              std::string::npos)
        << refused.status().message();
  }
  s.sim.extra.erase("edge_relays");
  std::remove(mid.calibration_path.c_str());

  // Without context keys in the calibration the key is refused, named.
  SimOptions none;
  none.calibration_path = ContextCalibration(0);
  auto bad = Simulate(s, none);
  std::remove(none.calibration_path.c_str());
  EXPECT_TRUE(bad.status().IsInvalidArgument());
  EXPECT_NE(bad.status().message().find("delta.wan_context"), std::string::npos) << bad.status();
}

// delta.context_classes sizes the sampled context records at that cap (fewer classes: larger
// records), and needs a calibration whose context speeds were measured at the same cap.
TEST(SimTest, ContextClassesSizeThePayloadAndMatchTheCalibration) {
  Scenario s = Parse(kSmall);
  s.change_rates = {0.03};
  s.transport.kinds = {TransportKind::kRelayTree};
  s.methods = {Method::kDelta};
  s.delta.wan_context = true;
  s.sim.extra["edge_relay_cores"] = "8";
  SimOptions o16;
  o16.calibration_path = ContextCalibration(2e9);
  auto full = Simulate(s, o16);
  ASSERT_TRUE(full.ok()) << full.status();
  s.delta.context_classes = 2;
  auto refused = Simulate(s, o16);
  std::remove(o16.calibration_path.c_str());
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(refused.status().IsInvalidArgument());
  EXPECT_NE(refused.status().message().find("delta.context_classes"), std::string::npos)
      << refused.status();
  SimOptions o2;
  o2.calibration_path = ContextCalibration(2e9, 2);
  auto two = Simulate(s, o2);
  std::remove(o2.calibration_path.c_str());
  ASSERT_TRUE(two.ok()) << two.status();
  const std::optional<double> ratio_two = ContextChunkRatio(*two);
  const std::optional<double> ratio_full = ContextChunkRatio(*full);
  ASSERT_TRUE(ratio_two.has_value() && ratio_full.has_value());
  EXPECT_GT(*ratio_two, *ratio_full);
  EXPECT_GT(two->runs[0].wire_bytes, full->runs[0].wire_bytes);
  EXPECT_EQ(two->runs[0].payload_bytes, full->runs[0].payload_bytes);  // the plain delta
}

TEST(SimTest, EdgeRelayTranscodesMergedChunksAsTheRealGrid) {
  // 1835 grid cells, merged 18 to a chunk (comm_budget 2400) or 183 (240); the edge relay's 64
  // cores transcode at 600 MB/s each. A merged chunk is transcoded on min(cells, cores) cores at
  // once, as the real edge relay spreads its grid cells, so the merging moves the refit only by
  // the burstier arrival of bigger chunks (one core per merged chunk would add ~20%: the last
  // chunk's whole transcoding after it arrives).
  Scenario s = Parse(kSmall);
  s.sim.extra["durable"] = "false";  // the transcoding's tail alone
  // Nor the commitment's leaves, hashed after each chunk's apply: a merged chunk's come after
  // its whole apply, a tail that grows with the merging (the real receiver's is one grid cell's).
  s.network.signing.enabled = false;
  s.change_rates = {0.03};
  s.transport.kinds = {TransportKind::kRelayTree};
  s.methods = {Method::kDelta};
  s.delta.chunk_elems = 1 << 16;
  s.delta.wan_context = true;
  s.sim.extra["edge_relay_cores"] = "64";
  SimOptions o;
  o.calibration_path = ContextCalibration(6e8);
  s.sim.extra["comm_budget"] = "2400";
  auto fine = Simulate(s, o);
  s.sim.extra["comm_budget"] = "240";
  auto merged = Simulate(s, o);
  std::remove(o.calibration_path.c_str());
  ASSERT_TRUE(fine.ok()) << fine.status();
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_NE(fine->setup.at("run.delta.relay_tree.0.03").find("(3 x 18 cores per merged chunk)"),
            std::string::npos)
      << fine->setup.at("run.delta.relay_tree.0.03");
  EXPECT_NE(merged->setup.at("run.delta.relay_tree.0.03").find("(1 x 64 cores per merged chunk)"),
            std::string::npos)
      << merged->setup.at("run.delta.relay_tree.0.03");
  const double a = fine->runs[0].refit_seconds, b = merged->runs[0].refit_seconds;
  EXPECT_NEAR(b, a, a * 0.08) << "fine " << a << " merged " << b;
}

TEST(SimTest, SignedDeltasChargeHashingAndManifestsAndSaySo) {
  Scenario s = Parse(kSmall);
  s.change_rates = {0.03};
  s.methods = {Method::kDelta};
  s.network.signing.enabled = false;
  auto plain = Simulate(s);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->setup.at("signing").rfind("off", 0), 0u) << plain->setup.at("signing");
  s.network.signing.enabled = true;  // the default

  std::ifstream in(std::string(DCR_TEST_SRC) + "/../calibration/default.json");
  nlohmann::json j = nlohmann::json::parse(in);
  j["tls"] = std::string(DCR_TEST_SRC) + "/../calibration/tls.json";
  j["durability"] = std::string(DCR_TEST_SRC) + "/../calibration/durability.json";
  j.erase("signing");
  // Signing alone: the commitment's per-chunk hashing (its own test) shifts the object-store
  // downloaders' polls.
  j.erase("commitment_bytes_per_s");
  j.erase("commitment_wall_bytes_per_s");
  {
    char path[] = "/tmp/dcr_sim_nosign_cal_XXXXXX";
    int fd = ::mkstemp(path);
    ASSERT_GE(fd, 0);
    ::close(fd);
    std::ofstream(path) << j.dump();
    SimOptions o;
    o.calibration_path = path;
    auto uncharged = Simulate(s, o);
    std::remove(path);
    ASSERT_TRUE(uncharged.ok()) << uncharged.status();
    EXPECT_NE(uncharged->setup.at("signing").find("not charged"), std::string::npos);
  }
  // Slow primitives, so the charge shows: 100 MB/s SHA-256, 1 ms per signature / verification.
  j["signing"] = {{"sha256_bytes_per_s", 1e8},
                  {"ed25519_signs_per_s", 1e3},
                  {"ed25519_verifies_per_s", 1e3},
                  {"chunks", 64},
                  {"manifests", 2},
                  {"delta_bytes", 1000},
                  {"signed_delta_bytes", 1010}};
  char path[] = "/tmp/dcr_sim_sign_cal_XXXXXX";
  int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ::close(fd);
  std::ofstream(path) << j.dump();
  SimOptions o;
  o.calibration_path = path;
  auto sig = Simulate(s, o);
  std::remove(path);
  ASSERT_TRUE(sig.ok()) << sig.status();
  EXPECT_EQ(sig->setup.at("signing").rfind("on (network.signing): delta runs are signed", 0), 0u)
      << sig->setup.at("signing");
  ASSERT_EQ(sig->runs.size(), plain->runs.size());
  for (size_t i = 0; i < sig->runs.size(); ++i) {
    const RunResult& a = plain->runs[i];
    const RunResult& b = sig->runs[i];
    SCOPED_TRACE(TransportKindName(b.transport));
    EXPECT_EQ(b.receivers_verified, 6);
    // The relay tree pays the hashing in its pipeline; here the object-store downloaders are
    // bound by the store and their polls, which may hide it.
    if (b.transport == TransportKind::kRelayTree) {
      EXPECT_GT(b.refit_seconds, a.refit_seconds);
    } else {
      EXPECT_GE(b.refit_seconds, a.refit_seconds);
    }
    EXPECT_GT(static_cast<double>(b.wire_bytes), a.wire_bytes * 1.005);  // manifest records
    const std::string line =
        sig->setup.at(std::string("run.delta.") + TransportKindName(b.transport) + ".0.03");
    EXPECT_NE(line.find("; signing "), std::string::npos) << line;
  }
}

TEST(SimTest, CoarseningDoesNotMoveTheResult) {
  Scenario s = Parse(kSmall);
  s.change_rates = {0.03};
  s.transport.kinds = {TransportKind::kRelayTree};
  s.methods = {Method::kFull};
  auto fine = Simulate(s);
  // 4 MiB pieces, 32 MiB windows: same depth of pieces in flight. The residue is the tail: the
  // last round of pieces on the capped long link takes one (bigger) piece time.
  s.sim.coarsen = 4;
  auto coarse = Simulate(s);
  ASSERT_TRUE(fine.ok() && coarse.ok());
  double a = fine->runs[0].refit_seconds, b = coarse->runs[0].refit_seconds;
  EXPECT_NEAR(b, a, a * 0.02) << "fine " << a << " coarse " << b;
}

TEST(SimTest, OneMachineSharesItsCoresAmongAllNodes) {
  // shared_cpu: the sender's build and every receiver's applies compete for one CPU (a real run on
  // one machine), so the build-bound delta refit gets slower; the link-bound full one does not.
  Scenario s = Parse(kSmall);
  s.change_rates = {0.03};
  s.transport.kinds = {TransportKind::kRelayTree};
  auto own = Simulate(s);
  s.sim.extra["shared_cpu"] = "1";
  auto shared = Simulate(s);
  ASSERT_TRUE(own.ok() && shared.ok());
  EXPECT_GT(shared->runs[0].refit_seconds, own->runs[0].refit_seconds * 1.05);
  EXPECT_NEAR(shared->runs[1].refit_seconds, own->runs[1].refit_seconds,
              own->runs[1].refit_seconds * 0.01);
  EXPECT_NE(shared->setup.at("platform").find("shared 1-core CPU"), std::string::npos);
  EXPECT_NE(shared->setup.at("wall_seconds").find("payload model"), std::string::npos);
}

// The simulated sender builds in BuildDelta's production order: the builder window it reports is
// ProductionOrder::ForMergedCells over its merged chunks, for the scenario's delta.threads.
TEST(SimTest, BuilderWindowIsBuildDeltasProductionOrder) {
  for (int threads : {1, 4, 64}) {
    SCOPED_TRACE("threads=" + std::to_string(threads));
    Scenario s = Parse(kSmall);
    s.change_rates = {0.03};
    s.transport.kinds = {TransportKind::kRelayTree};
    s.methods = {Method::kDelta};
    s.delta.threads = threads;
    auto r = Simulate(s);
    ASSERT_TRUE(r.ok()) << r.status();
    const std::string line = r->setup.at("run.delta.relay_tree.0.03");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(
        line, m, std::regex(R"((\d+) chunks \(grid (\d+)\).*builder window (\d+) chunks)")))
        << line;
    const uint64_t chunks = std::stoull(m[1]), grid = std::stoull(m[2]), window = std::stoull(m[3]);
    const ProductionOrder order = ProductionOrder::ForMergedCells(
        chunks, static_cast<double>(grid) / static_cast<double>(chunks), threads);
    EXPECT_EQ(window, order.window()) << line;
  }
}

// The long link's calibration: the kimi-k2-1t preset's own full-checkpoint refit, as the paper
// sweep simulates it (paper-1t-3.yaml: 64 receivers, relay tree), takes the paper's 87.5 min.
// The test recomputes the rate that gives exactly 87.5 min from two simulations (the refit is
// a + b / rate: a fixed tail plus the link's share) and requires the scenarios' stated rate to be
// that rate within 0.1%, so a change of the simulator that moves the figure cannot leave the
// calibration silently stale.
double FullRelayRefitSeconds(const Scenario& base, double long_link_Bps) {
  Scenario s = base;
  s.methods = {Method::kFull};
  s.transport.kinds = {TransportKind::kRelayTree};
  s.network.long_link.bandwidth_Bps = long_link_Bps;
  auto r = Simulate(s);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok() || r->runs.size() != 1) return 0;
  const RunResult& run = r->runs[0];
  EXPECT_EQ(run.error, "");
  EXPECT_EQ(run.receivers_verified, base.receivers.count);
  EXPECT_GT(static_cast<double>(run.wire_bytes), 2.05e12);  // the preset's bytes, not 2 TB
  return run.refit_seconds;
}

TEST(SimTest, CalibratedLongLinkMovesTheOneTerabytePresetIn87AndAHalfMinutes) {
  const std::string dir = std::string(DCR_TEST_SRC) + "/../../scenarios/paper/";
  auto s = LoadScenario(dir + "paper-1t-3.yaml");
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->receivers.count, 64);
  const double stated = s->network.long_link.bandwidth_Bps;
  const double target = 87.5 * 60;
  const double t0 = FullRelayRefitSeconds(*s, stated);
  EXPECT_NEAR(t0 / 60, 87.5, 87.5 * 0.01) << t0 << " s at " << stated << " B/s";
  const double r1 = stated * 1.02;
  const double t1 = FullRelayRefitSeconds(*s, r1);
  ASSERT_GT(t0, t1);
  // t = a + b / rate through both points, solved for t = target.
  const double b = (t0 - t1) / (1 / stated - 1 / r1);
  const double a = t0 - b / stated;
  ASSERT_GT(target, a);
  const double calibrated = b / (target - a);
  EXPECT_NEAR(calibrated / stated, 1.0, 1e-3)
      << "the long link that moves the preset's full refit in 87.5 min is " << calibrated
      << " B/s; the paper scenarios state " << stated << " B/s";
  // Every paper scenario runs on the same calibrated link.
  for (const char* m : {"30b", "70b", "235b", "671b", "1t"}) {
    for (const char* rate : {"3", "5"}) {
      std::string path = dir + "paper-" + m + "-" + rate + ".yaml";
      auto p = LoadScenario(path);
      ASSERT_TRUE(p.ok()) << p.status();
      EXPECT_EQ(p->network.long_link.bandwidth_Bps, stated) << path;
      EXPECT_EQ(p->network.long_link.latency_s, s->network.long_link.latency_s) << path;
    }
  }
}

// The default calibration with the commitment at `bytes_per_s` per core (0: without the key).
std::string CommitmentCalibration(double bytes_per_s) {
  std::ifstream in(std::string(DCR_TEST_SRC) + "/../calibration/default.json");
  nlohmann::json j = nlohmann::json::parse(in);
  j.erase("commitment_wall_bytes_per_s");
  if (bytes_per_s > 0)
    j["commitment_bytes_per_s"] = bytes_per_s;
  else
    j.erase("commitment_bytes_per_s");
  for (const char* k : {"tls", "signing", "durability"}) {
    j[k] = std::string(DCR_TEST_SRC) + "/../calibration/" + k + ".json";
  }
  char path[] = "/tmp/dcr_sim_commitment_cal_XXXXXX";
  int fd = ::mkstemp(path);
  EXPECT_GE(fd, 0);
  ::close(fd);
  std::ofstream(path) << j.dump();
  return path;
}

TEST(SimTest, CommitmentIsHashedPerChunkAsItAppliesAndSaysSo) {
  // Each receiver hashes the leaves each chunk completes once it is applied, on the cores of its
  // host (4, shared by the host's 2 receivers), while the transfer goes on; after the trailer no
  // leaf is left (every grid cell is a chunk). At 1 GB/s per core the hashing hides in the
  // transfer; at 100 MB/s the hosts' cores are the bottleneck, and it costs at most what both
  // receivers' passes take on the host's 4 cores after the last chunk.
  Scenario s = Parse(kSmall);
  s.change_rates = {0.03};
  s.transport.kinds = {TransportKind::kRelayTree, TransportKind::kObjectStore};
  SimOptions without;
  without.calibration_path = CommitmentCalibration(0);
  auto off = Simulate(s, without);
  std::remove(without.calibration_path.c_str());
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->setup.at("commitment").rfind("not charged", 0), 0u);
  for (double rate : {1e8, 1e9}) {
    SCOPED_TRACE(rate);
    s.network.signing.enabled = true;
    SimOptions with;
    with.calibration_path = CommitmentCalibration(rate);
    auto on = Simulate(s, with);
    s.network.signing.enabled = false;
    auto unsigned_run = Simulate(s, with);
    std::remove(with.calibration_path.c_str());
    ASSERT_TRUE(on.ok() && unsigned_run.ok()) << on.status() << unsigned_run.status();
    EXPECT_EQ(on->setup.at("commitment").rfind("signed delta runs: SHA-256 Merkle leaves at", 0),
              0u)
        << on->setup.at("commitment");
    EXPECT_NE(on->setup.at("commitment").find("each chunk completes once the chunk is applied"),
              std::string::npos)
        << on->setup.at("commitment");
    EXPECT_EQ(unsigned_run->setup.at("commitment").rfind("none", 0), 0u);
    ASSERT_EQ(on->runs.size(), 4u);
    const double pass = static_cast<double>(on->model_bytes) / rate;  // CPU-s per receiver
    const double host_pass = pass * 2 / 4;  // both receivers of a host on its 4 cores
    for (size_t i = 0; i < on->runs.size(); ++i) {
      const RunResult& a = off->runs[i];
      const RunResult& b = on->runs[i];
      const std::string key = std::string("costs.") + MethodName(b.method) + "." +
                              TransportKindName(b.transport) + ".0.03";
      SCOPED_TRACE(key);
      EXPECT_EQ(b.receivers_verified, 6);
      if (b.method == Method::kFull) {
        EXPECT_EQ(b.refit_seconds, a.refit_seconds);
        EXPECT_NE(on->setup.at(key).find("commitment: none (a full checkpoint"), std::string::npos);
        continue;
      }
      const std::string& costs = on->setup.at(key);
      EXPECT_NE(costs.find("; commitment "), std::string::npos) << costs;
      EXPECT_NE(costs.find("sender commitment"), std::string::npos);
      EXPECT_NE(costs.find("each chunk's leaves hashed once it is applied on up to 4 cores"),
                std::string::npos)
          << costs;
      EXPECT_NE(costs.find(", 0 CPU-s after the trailer"), std::string::npos) << costs;
      EXPECT_NE(off->setup.at(key).find("commitment not charged"), std::string::npos);
      const double added = b.refit_seconds - a.refit_seconds;
      EXPECT_GE(added, 0);
      if (rate == 1e8) {
        EXPECT_GT(added, 0);
        EXPECT_LE(added, host_pass * 1.05);
        // Unsigned deltas carry no commitment.
        EXPECT_LT(unsigned_run->runs[i].refit_seconds, b.refit_seconds);
      } else {
        EXPECT_LE(added, host_pass * 0.25);
      }
    }
  }
}

// Every simulated result lists the hardware it assumes and, per run, what each cost amounts to:
// relay tree and object store, delta and full, durable or not, with and without an edge relay.
TEST(SimTest, EveryResultListsItsHardwareAndEveryCost) {
  struct Case {
    const char* name;
    bool durable;
    bool edge;
  };
  for (const Case& c : {Case{"durable", true, false}, Case{"not durable", false, false},
                        Case{"edge relay", true, true}}) {
    SCOPED_TRACE(c.name);
    Scenario s = Parse(kSmall);
    s.change_rates = {0.03};
    if (!c.durable) s.sim.extra["durable"] = "false";
    SimOptions o;
    if (c.edge) {
      s.delta.wan_context = true;
      o.calibration_path = ContextCalibration(1e10);
    }
    auto r = Simulate(s, o);
    if (c.edge) std::remove(o.calibration_path.c_str());
    ASSERT_TRUE(r.ok()) << r.status();
    const std::string hw = r->setup.at("hardware");
    for (const char* part :
         {"sender: 1 host, 4 build cores", "receivers: 6 on 3 hosts", "4 cores per host",
          c.edge ? "edge relays (relay-tree delta runs): 1 "
                   "host, 64 cores each, memory"
                 : "edge relays: none"}) {
      EXPECT_NE(hw.find(part), std::string::npos) << part << " in " << hw;
    }
    for (const char* key : {"tls", "signing", "commitment", "durability", "platform"}) {
      EXPECT_TRUE(r->setup.count(key)) << key;
    }
    ASSERT_EQ(r->runs.size(), 4u);
    for (const RunResult& run : r->runs) {
      const bool delta = run.method == Method::kDelta;
      const bool tree = run.transport == TransportKind::kRelayTree;
      const std::string key = std::string("costs.") + MethodName(run.method) + "." +
                              TransportKindName(run.transport) + ".0.03";
      SCOPED_TRACE(key);
      ASSERT_TRUE(r->setup.count(key));
      const std::string costs = r->setup.at(key);
      std::vector<std::string> parts = {
          "refit ",    "; long link alone ", "; apply ", "; durable commit ",
          "ommitment", "; build ",           "; verify "};
      parts.push_back("(signing in build and apply)");
      if (delta) parts.push_back("; commitment ");
      if (delta) parts.push_back("; sender commitment ");
      if (tree) parts.push_back("; sockets (TCP + TLS) ");
      if (delta && c.durable) parts.push_back("of it for the durable storage");
      if (delta && tree && c.edge) parts.push_back("; edge transcoding ");
      for (const std::string& part : parts) {
        EXPECT_NE(costs.find(part), std::string::npos) << "'" << part << "' in " << costs;
      }
      if (!delta || !c.durable) {
        EXPECT_NE(costs.find("durable commit not charged"), std::string::npos) << costs;
      }
    }
  }
}

TEST(SimTest, BadScenariosNameTheKey) {
  Scenario s = Parse(kSmall);
  s.sim.extra["bogus"] = "1";
  auto r = Simulate(s);
  EXPECT_TRUE(r.status().IsInvalidArgument());
  EXPECT_NE(r.status().message().find("sim.extra.bogus"), std::string::npos) << r.status();

  s = Parse(kSmall);
  s.sim.extra["shared_cpu"] = "many";
  r = Simulate(s);
  EXPECT_NE(r.status().message().find("sim.extra.shared_cpu"), std::string::npos) << r.status();

  s = Parse(kSmall);
  s.sim.network_model = "IB";
  r = Simulate(s);
  EXPECT_NE(r.status().message().find("sim.network_model"), std::string::npos) << r.status();

  s = Parse(kSmall);
  s.model.preset = "no-such-model";
  r = Simulate(s);
  EXPECT_NE(r.status().message().find("model.preset"), std::string::npos) << r.status();

  s = Parse(kSmall);
  s.sim.calibration = "/nonexistent/cal.json";
  r = Simulate(s);
  EXPECT_TRUE(r.status().IsNotFound()) << r.status();
  EXPECT_NE(r.status().message().find("sim.calibration"), std::string::npos) << r.status();

  s = Parse(kSmall);
  s.network.regions.pop_back();
  r = Simulate(s);
  EXPECT_NE(r.status().message().find("network.regions"), std::string::npos) << r.status();

  // Schema errors come from the parser and name the key path too.
  auto p = ParseScenario(std::string(kSmall) + "bogus_key: 1\n", "t");
  EXPECT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("bogus_key"), std::string::npos) << p.status();
}

}  // namespace
}  // namespace dcr::sim
