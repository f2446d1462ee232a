// The `faults:` block of scenario files and the `faults` object of result JSON.
#include <gtest/gtest.h>

#include "dcr/scenario.h"

namespace dcr {
namespace {

const char* kBase = R"(
name: f
model: tiny
receivers: 6
)";

TEST(FaultsScenarioTest, ParsesTheBlock) {
  auto s = ParseScenario(std::string(kBase) + R"(
faults:
  runs: 3
  per_run: 5
  kinds: [kill_relay, torn_journal]
  seed: 9
  chunk_elems: 8192
  detect_timeout: 100ms
  restart_delay: 0.5s
  only: true
)");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->faults.enabled);
  EXPECT_EQ(s->faults.runs, 3);
  EXPECT_EQ(s->faults.per_run, 5);
  EXPECT_EQ(s->faults.kinds, (std::vector<std::string>{"kill_relay", "torn_journal"}));
  EXPECT_EQ(s->faults.seed, 9u);
  EXPECT_EQ(s->faults.chunk_elems, 8192u);
  EXPECT_DOUBLE_EQ(s->faults.detect_timeout_s, 0.1);
  EXPECT_DOUBLE_EQ(s->faults.restart_delay_s, 0.5);
  EXPECT_TRUE(s->faults.only);
  auto none = ParseScenario(kBase);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->faults.enabled);
}

TEST(FaultsScenarioTest, BadKindsAndKeysNameTheKey) {
  auto bad = ParseScenario(std::string(kBase) + "faults: {kinds: [kill_relay, meteor]}\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("faults.kinds[1]"), std::string::npos) << bad.status();
  EXPECT_NE(bad.status().message().find("meteor"), std::string::npos);
  auto key = ParseScenario(std::string(kBase) + "faults: {runz: 2}\n");
  ASSERT_FALSE(key.ok());
  EXPECT_NE(key.status().message().find("runz"), std::string::npos) << key.status();
}

TEST(FaultsScenarioTest, ResultJsonRoundTrip) {
  ScenarioResult r;
  r.scenario = "f";
  r.faults.enabled = true;
  r.faults.runs = 2;
  r.faults.faults_injected = 26;
  r.faults.faults_survived = 26;
  r.faults.receivers = 12;
  r.faults.receivers_verified = 12;
  r.faults.injected_by_kind = {{"kill_relay", 2}, {"torn_journal", 2}};
  r.faults.overwrite_repairs = 5;
  std::string js = ResultToJson(r);
  EXPECT_NE(js.find("\"faults_injected\": 26"), std::string::npos) << js;
  auto back = ResultFromJson(js);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->faults.enabled);
  EXPECT_EQ(back->faults.faults_survived, 26);
  EXPECT_EQ(back->faults.injected_by_kind.at("kill_relay"), 2);
  EXPECT_EQ(back->faults.overwrite_repairs, 5u);
  EXPECT_NE(ResultToMarkdown(r).find("26 faults injected, 26 survived"), std::string::npos);
  ScenarioResult plain;
  EXPECT_EQ(ResultToJson(plain).find("faults_injected"), std::string::npos);
}

}  // namespace
}  // namespace dcr
