// The metrics endpoint: the text exposition of a node's metrics, and the server against plain
// HTTP clients, including a silent one and one that sends an oversized request.
#include "node/metrics.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "transport/net.h"

namespace dcr::internal {
namespace {

NodeMetrics Sample() {
  NodeMetrics m;
  m.rank = 3;
  m.role = "receiver";
  m.up = true;
  m.version_target = 7;
  m.holds_version = true;
  m.version_held = 6;
  m.bytes_received = 12345;
  m.chunks_applied = 9;
  m.started_at = 100;
  m.now = 102.5;
  return m;
}

TEST(RenderMetrics, OneSampleLineEachWithTypeAndLabels) {
  const std::string t = RenderMetrics(Sample());
  EXPECT_NE(t.find("# TYPE dcr_bytes_received_total counter\n"
                   "dcr_bytes_received_total{rank=\"3\",role=\"receiver\"} 12345\n"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("dcr_node_up{rank=\"3\",role=\"receiver\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("dcr_chunks_applied_total{rank=\"3\",role=\"receiver\"} 9\n"),
            std::string::npos);
  EXPECT_NE(t.find("dcr_version_held{rank=\"3\",role=\"receiver\",hash=\""), std::string::npos);
  EXPECT_NE(t.find("dcr_lag_seconds{rank=\"3\",role=\"receiver\"} 2.5\n"), std::string::npos) << t;
  EXPECT_EQ(t.find("dcr_last_error_info"), std::string::npos);
}

TEST(RenderMetrics, RecoveryCountersAreExported) {
  NodeMetrics m = Sample();
  m.starts = 2;
  m.recoveries = 3;
  m.repairs = 4;
  m.fallbacks = 1;
  m.reloads = 5;
  m.chunks_skipped = 6;
  m.mirror_puts = 7;
  const std::string t = RenderMetrics(m);
  EXPECT_NE(t.find("# TYPE dcr_repairs_total counter\n"
                   "dcr_repairs_total{rank=\"3\",role=\"receiver\"} 4\n"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("dcr_node_starts{rank=\"3\",role=\"receiver\"} 2\n"), std::string::npos);
  EXPECT_NE(t.find("dcr_recoveries_total{rank=\"3\",role=\"receiver\"} 3\n"), std::string::npos);
  EXPECT_NE(t.find("dcr_fallbacks_total{rank=\"3\",role=\"receiver\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("dcr_reloads_total{rank=\"3\",role=\"receiver\"} 5\n"), std::string::npos);
  EXPECT_NE(t.find("dcr_chunks_skipped_total{rank=\"3\",role=\"receiver\"} 6\n"),
            std::string::npos);
  EXPECT_NE(t.find("dcr_mirror_puts_total{rank=\"3\",role=\"receiver\"} 7\n"), std::string::npos);
}

TEST(RenderMetrics, CollectionCountersOnceOneRan) {
  NodeMetrics m = Sample();
  EXPECT_EQ(RenderMetrics(m).find("dcr_gc_runs_total"), std::string::npos);
  m.gc_runs = 2;
  m.gc_removed_objects = 30;
  m.gc_removed_bytes = 4096;
  m.gc_budget_errors = 1;
  m.store_bytes = 777;
  const std::string t = RenderMetrics(m);
  EXPECT_NE(t.find("dcr_gc_runs_total{rank=\"3\",role=\"receiver\"} 2\n"), std::string::npos) << t;
  EXPECT_NE(t.find("dcr_gc_removed_objects_total{rank=\"3\",role=\"receiver\"} 30\n"),
            std::string::npos);
  EXPECT_NE(t.find("dcr_gc_removed_bytes_total{rank=\"3\",role=\"receiver\"} 4096\n"),
            std::string::npos);
  EXPECT_NE(t.find("dcr_gc_budget_errors_total{rank=\"3\",role=\"receiver\"} 1\n"),
            std::string::npos);
  EXPECT_NE(
      t.find("# TYPE dcr_store_bytes gauge\ndcr_store_bytes{rank=\"3\",role=\"receiver\"} 777\n"),
      std::string::npos);
}

TEST(MetricsBoard, CollectionsAccumulateAcrossNodes) {
  MetricsBoard board;
  board.AddCollection(3, 300, false, 1000);
  board.AddCollection(2, 200, true, 900);
  const NodeMetrics m = board.Snapshot();
  EXPECT_EQ(m.gc_runs, 2u);
  EXPECT_EQ(m.gc_removed_objects, 5u);
  EXPECT_EQ(m.gc_removed_bytes, 500u);
  EXPECT_EQ(m.gc_budget_errors, 1u);
  EXPECT_EQ(m.store_bytes, 900u);
}

TEST(RenderMetrics, ErrorIsALabelWithQuotesAndNewlinesEscaped) {
  NodeMetrics m = Sample();
  m.up = false;
  m.last_error = "UNAVAILABLE: peer \"1\" \\ gone\nnext";
  m.committed = true;
  const std::string t = RenderMetrics(m);
  EXPECT_NE(t.find("dcr_last_error_info{rank=\"3\",role=\"receiver\",message=\"UNAVAILABLE: peer "
                   "\\\"1\\\" \\\\ gone\\nnext\"} 1\n"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("dcr_lag_seconds{rank=\"3\",role=\"receiver\"} 0\n"), std::string::npos);
  EXPECT_NE(t.find("dcr_node_up{rank=\"3\",role=\"receiver\"} 0\n"), std::string::npos);
}

// One HTTP exchange with the server at `port`: sends `request`, returns all it answered.
std::string Exchange(int port, const std::string& request) {
  auto fd = Connect("127.0.0.1:" + std::to_string(port), SteadyNow() + 5);
  EXPECT_TRUE(fd.ok()) << fd.status();
  if (!fd.ok()) return "";
  if (!request.empty()) {
    EXPECT_TRUE(WriteFull(*fd, request.data(), request.size()).ok());
  }
  std::string out;
  char buf[4096];
  ssize_t r;
  while ((r = recv(*fd, buf, sizeof(buf), 0)) > 0) out.append(buf, static_cast<size_t>(r));
  close(*fd);
  return out;
}

TEST(MetricsServer, ServesMetricsAndHealthAndSurvivesBadClients) {
  auto port = FreePort();
  ASSERT_TRUE(port.ok());
  NodeMetrics m = Sample();
  MetricsServer server;
  ASSERT_TRUE(server.Start("127.0.0.1:" + std::to_string(*port), [&] { return m; }).ok());
  // A client that connects and says nothing is dropped after its 2 s; the next one is served.
  auto silent = Connect("127.0.0.1:" + std::to_string(*port), SteadyNow() + 5);
  ASSERT_TRUE(silent.ok());
  std::string got = Exchange(*port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(got.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << got;
  EXPECT_NE(got.find("Content-Type: text/plain; version=0.0.4"), std::string::npos);
  EXPECT_NE(got.find("dcr_bytes_received_total{rank=\"3\",role=\"receiver\"} 12345"),
            std::string::npos);
  close(*silent);
  got = Exchange(*port, std::string(20000, 'A'));  // no end of headers within 8 KiB
  EXPECT_EQ(got.rfind("HTTP/1.1 431", 0), 0u) << got;
  got = Exchange(*port, "GET /healthz HTTP/1.0\r\n\r\n");
  EXPECT_NE(got.find("\r\n\r\nok\n"), std::string::npos) << got;
  m.last_error = "DATA_LOSS: bad chunk";
  got = Exchange(*port, "GET /healthz HTTP/1.0\r\n\r\n");
  EXPECT_EQ(got.rfind("HTTP/1.1 503", 0), 0u) << got;
  EXPECT_NE(got.find("DATA_LOSS: bad chunk"), std::string::npos);
  EXPECT_EQ(Exchange(*port, "garbage\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u);
  EXPECT_EQ(Exchange(*port, "GET /x HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 404", 0), 0u);
  EXPECT_EQ(Exchange(*port, "PUT /metrics HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 405", 0), 0u);
  server.Stop();
  // The port is free again once stopped.
  MetricsServer again;
  EXPECT_TRUE(again.Start("127.0.0.1:" + std::to_string(*port), [&] { return m; }).ok());
}

TEST(MetricsServer, APortInUseIsNamed) {
  auto port = FreePort();
  ASSERT_TRUE(port.ok());
  MetricsServer a, b;
  const std::string addr = "127.0.0.1:" + std::to_string(*port);
  ASSERT_TRUE(a.Start(addr, [] { return NodeMetrics{}; }).ok());
  Status s = b.Start(addr, [] { return NodeMetrics{}; });
  EXPECT_TRUE(s.IsUnavailable()) << s;
  EXPECT_NE(s.message().find("metrics endpoint: listen on " + addr), std::string::npos) << s;
}

}  // namespace
}  // namespace dcr::internal
