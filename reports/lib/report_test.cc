#include "dcr/reports/report.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace dcr::reports {
namespace {

const char* kResult = R"({
  "scenario": "paper-kimi-k2-1t-3", "mode": "sim", "model": "kimi-k2-1t",
  "setup": {"host": "test", "commit": "abc"},
  "runs": [
    {"method": "full", "transport": "relay_tree", "change_rate": 0.03, "refit_seconds": 5400,
     "wire_bytes": 2.0e12, "receivers": 64, "receivers_verified": 64},
    {"method": "delta", "transport": "relay_tree", "change_rate": 0.03, "refit_seconds": 108,
     "wire_bytes": 4.0e10, "receivers": 64, "receivers_verified": 64},
    {"method": "full", "transport": "object_store", "change_rate": 0.03, "refit_seconds": 6000,
     "wire_bytes": 2.0e12, "receivers": 64, "receivers_verified": 64},
    {"method": "delta", "transport": "object_store", "change_rate": 0.03, "refit_seconds": 120,
     "wire_bytes": 4.0e10, "receivers": 64, "receivers_verified": 63}
  ]})";

TEST(ReportTest, ComputesSpeedupPerTransportAndHeadline) {
  Report r;
  ASSERT_TRUE(AddResult(kResult, "a.json", &r).ok());
  ComputeDerived(&r);
  ASSERT_EQ(r.rows.size(), 4u);
  EXPECT_DOUBLE_EQ(r.rows[1].speedup, 50.0);
  EXPECT_DOUBLE_EQ(r.rows[1].delta_ratio, 50.0);
  EXPECT_DOUBLE_EQ(r.rows[3].speedup, 50.0);
  EXPECT_EQ(r.rows[0].speedup, 0.0);
  std::string md = RenderMarkdown(r);
  EXPECT_NE(md.find("| kimi-k2-1t | 3% | - | relay_tree | delta | 108.0 | 40.00 | 64/64 | 50.0x"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("the paper (NeMo-DCR) reports 150 s"), std::string::npos);
  EXPECT_NE(md.find("**not met**"), std::string::npos);
  // The headline and the summary (one line per model and rate) come before the table of all runs.
  size_t summary = md.find("| kimi-k2-1t | 3% | 108.0 | 5400.0 | 50.0x | 120.0 | 6000.0 | 50.0x |");
  EXPECT_NE(summary, std::string::npos) << md;
  EXPECT_LT(md.find("**1T, 3% change"), summary);
  EXPECT_LT(summary, md.find("All runs:"));
  EXPECT_NE(md.find("63/64"), std::string::npos);
  EXPECT_NE(md.find("commit: abc"), std::string::npos);
  std::string csv = RenderCsv(r);
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 5);
}

// Node results (a dcr-node --result file, a long-lived node's per-version result) become rows of
// the nodes table, beside or without run results; a node result without its rank is refused.
TEST(ReportTest, NodeResultsMakeTheNodesTable) {
  const char* sender = R"({"rank": 0, "role": "sender", "ok": true, "verified": false,
    "t_start": 100.0, "t_commit": 102.5, "bytes_sent": 2500000, "receivers_committed": 4,
    "declared_dead": ["6: no commit report within 3 s"], "error": ""})";
  const char* stopped = R"({"rank": 3, "role": "relay", "ok": false,
    "error": "ABORTED: stopped by SIGTERM after version 2 of 6"})";
  Report r;
  ASSERT_TRUE(AddResult(sender, "node-0-v1.json", &r).ok());
  ASSERT_TRUE(AddResult(stopped, "h3/result.json", &r).ok());
  ASSERT_EQ(r.nodes.size(), 2u);
  EXPECT_TRUE(r.rows.empty());
  const std::string md = RenderMarkdown(r);
  EXPECT_NE(md.find("| node-0-v1.json | 0 | sender | yes | no | 2.50 | 0.00 | 2.50 | 4 | "
                    "6: no commit report within 3 s | - |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| h3/result.json | 3 | relay | no | no | 0.00 |"), std::string::npos) << md;
  const std::string csv = RenderNodesCsv(r);
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 3);
  EXPECT_NE(RenderJson(r).find("\"receivers_committed\": 4"), std::string::npos);
  // With run results: the runs' tables, then the nodes.
  ASSERT_TRUE(AddResult(kResult, "a.json", &r).ok());
  const std::string both = RenderMarkdown(r);
  EXPECT_LT(both.find("All runs:"), both.find("Nodes:"));
  Status bad = AddResult(R"({"rank": "x", "role": "sender", "ok": true})", "b.json", &r);
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("b.json: a node result needs integer 'rank'"), std::string::npos);
}

// A node's state directory stands for its per-version results: those of every deployment in it
// (deployment-<id>/node-<rank>-v<k>.json), by rank then version, and nothing else in it; a
// directory without any is refused, naming it.
TEST(ReportTest, StateDirectoryGivesItsNodeResults) {
  char tmpl[] = "/tmp/dcr_report_stateXXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string root = tmpl;
  const std::string a = root + "/deployment-00000000000000aa";
  const std::string b = root + "/deployment-00000000000000bb";
  ASSERT_EQ(mkdir(a.c_str(), 0700), 0);
  ASSERT_EQ(mkdir(b.c_str(), 0700), 0);
  auto put = [](const std::string& path, int rank) {
    std::ofstream(path) << "{\"rank\": " << rank << ", \"role\": \"receiver\", \"ok\": true}";
  };
  put(a + "/node-2-v10.json", 2);
  put(a + "/node-2-v2.json", 2);
  put(b + "/node-2-v1.json", 2);
  put(a + "/rank-2.floor", 2);        // not a node result
  put(a + "/node-2-v1.json.tmp", 2);  // nor this
  auto found = NodeResultsIn(root);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, (std::vector<std::string>{a + "/node-2-v2.json", a + "/node-2-v10.json",
                                              b + "/node-2-v1.json"}));
  auto report = LoadResults({root});
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->nodes.size(), 3u);
  const std::string empty = root + "/empty";
  ASSERT_EQ(mkdir(empty.c_str(), 0700), 0);
  Status none = LoadResults({empty}).status();
  EXPECT_TRUE(none.IsNotFound()) << none;
  EXPECT_NE(none.message().find(empty + "' holds no node results"), std::string::npos) << none;
  std::system(("rm -rf '" + root + "'").c_str());
}

TEST(ReportTest, MeasuredRateBesideTheTrainerRate) {
  // A result of synthetic checkpoints: the measured change, the trainer's input beside it; the
  // headline picks the run by the trainer's rate and the speedup pairs runs of the same rates.
  const char* result = R"({
    "scenario": "s", "mode": "real", "model": "kimi-k2-1t",
    "runs": [
      {"method": "full", "transport": "relay_tree", "change_rate": 0.0649,
       "configured_change_rate": 0.03, "refit_seconds": 500, "wire_bytes": 2.0e12,
       "receivers": 2, "receivers_verified": 2},
      {"method": "delta", "transport": "relay_tree", "change_rate": 0.0649,
       "configured_change_rate": 0.03, "refit_seconds": 50, "wire_bytes": 4.0e10,
       "receivers": 2, "receivers_verified": 2},
      {"method": "full", "transport": "relay_tree", "change_rate": 0.1,
       "configured_change_rate": 0.05, "refit_seconds": 1000, "wire_bytes": 2.0e12,
       "receivers": 2, "receivers_verified": 2}
    ]})";
  Report r;
  ASSERT_TRUE(AddResult(result, "b.json", &r).ok());
  ComputeDerived(&r);
  EXPECT_DOUBLE_EQ(r.rows[1].configured_change_rate, 0.03);
  EXPECT_DOUBLE_EQ(r.rows[1].speedup, 10.0);  // against the 3% full run, not the 5% one
  std::string md = RenderMarkdown(r);
  EXPECT_NE(md.find("| kimi-k2-1t | 6.49% | 3% | relay_tree | delta | 50.0 |"), std::string::npos)
      << md;
  EXPECT_NE(md.find("**1T, 3% change, relay tree (real):** refit 50.0 s"), std::string::npos) << md;
  std::string csv = RenderCsv(r);
  EXPECT_NE(csv.find(",0.0649,0.03,"), std::string::npos) << csv;
}

TEST(ReportTest, MalformedResultsNameTheKey) {
  Report r;
  Status s = AddResult(R"({"scenario":"x","mode":"sim","model":"m","runs":[{"method":"delta",
      "transport":"relay_tree","change_rate":0.03,"wire_bytes":1,"receivers":1,
      "receivers_verified":1}]})",
                       "b.json", &r);
  EXPECT_TRUE(s.IsInvalidArgument());
  EXPECT_NE(s.message().find("runs[0]"), std::string::npos) << s;
  EXPECT_NE(s.message().find("refit_seconds"), std::string::npos) << s;
  s = AddResult("{", "c.json", &r);
  EXPECT_TRUE(s.IsInvalidArgument());
  s = AddResult(R"({"mode":"sim","model":"m","runs":[]})", "d.json", &r);
  EXPECT_NE(s.message().find("scenario"), std::string::npos) << s;
  EXPECT_TRUE(LoadResults({"/nonexistent/e.json"}).status().IsNotFound());
}

TEST(ReportTest, WritesTablesAndFigures) {
  char tmpl[] = "/tmp/dcr_report_testXXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  std::string dir = std::string(tmpl) + "/out/sub";
  Report r;
  ASSERT_TRUE(AddResult(kResult, "a.json", &r).ok());
  ComputeDerived(&r);
  ReportOptions o;
  o.out_dir = dir;
  Status st = WriteReport(r, o);
  ASSERT_TRUE(st.ok()) << st;
  for (const char* f : {"summary.md", "summary.csv", "summary.json", "refit_time.png",
                        "refit_time.svg", "speedup.png", "speedup.svg"}) {
    std::ifstream in(dir + "/" + f, std::ios::binary);
    ASSERT_TRUE(in) << f;
    std::stringstream ss;
    ss << in.rdbuf();
    EXPECT_GT(ss.str().size(), 100u) << f;
  }
  // A titled figure, the 1T 3% group's own reference marks (the clustered histogram puts the one
  // group at x = 0), and the calibration input marked as such.
  std::ifstream gp_in(dir + "/refit_time.png.gp");
  std::stringstream gp;
  gp << gp_in.rdbuf();
  EXPECT_NE(gp.str().find("set title 'Refit time, delta against the full checkpoint (simulated, "
                          "64 receivers)'"),
            std::string::npos)
      << gp.str();
  EXPECT_NE(gp.str().find("set arrow from -0.5, first 150 to 0.5, first 150"), std::string::npos)
      << gp.str();
  EXPECT_NE(gp.str().find("87.5 min full (calibration input)"), std::string::npos) << gp.str();
  EXPECT_NE(gp.str().find("set xlabel"), std::string::npos);
  std::ifstream png(dir + "/refit_time.png", std::ios::binary);
  char sig[4] = {};
  png.read(sig, 4);
  EXPECT_EQ(std::string(sig + 1, 3), "PNG");
  std::system(("rm -rf " + std::string(tmpl)).c_str());
}

TEST(ReportTest, FailingGnuplotKeepsTablesAndSaysSo) {
  char tmpl[] = "/tmp/dcr_report_testXXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  Report r;
  ASSERT_TRUE(AddResult(kResult, "a.json", &r).ok());
  ReportOptions o;
  o.out_dir = tmpl;
  o.gnuplot = "false";
  Status st = WriteReport(r, o);
  EXPECT_TRUE(st.IsUnavailable()) << st;
  std::ifstream md(std::string(tmpl) + "/summary.md");
  EXPECT_TRUE(md);
  std::ifstream png(std::string(tmpl) + "/refit_time.png");
  EXPECT_FALSE(png);
  std::system(("rm -rf " + std::string(tmpl)).c_str());
}

}  // namespace
}  // namespace dcr::reports
