#include "codec_bench.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "context_pass.h"
#include "internal/context_walk.h"
#include "internal/simd.h"

namespace dcr::internal {
namespace {

CodecBenchReport FakeReport() {
  CodecBenchReport rep;
  rep.memcpy_bytes_per_s = 10e9;
  for (double rate : {0.01, 0.03, 0.05}) {
    CodecRateResult r;
    r.change_rate = rate;
    r.ratio_vs_dense = 0.6 / rate;  // 60x at 1%, 20x at 3%
    r.ratio_vs_bound0 = 1.05;
    r.encode_vs_memcpy = 0.3;
    r.decode_apply_vs_memcpy = 0.9;
    rep.rates.push_back(r);
  }
  return rep;
}

TEST(CodecThresholdsTest, PassesFailsAndAppliesSpeedMarginOnly) {
  const std::string ok = R"({"codec": {"speed_margin": 0.5, "rates": [
      {"change_rate": 0.03, "min_ratio_vs_dense": 19, "max_ratio_vs_bound0": 1.1,
       "min_encode_vs_memcpy": 0.5, "min_decode_apply_vs_memcpy": 1.5}]}})";
  std::vector<std::string> lines;
  EXPECT_TRUE(CheckCodecThresholds(FakeReport(), ok, &lines).ok());
  EXPECT_EQ(lines.size(), 4u);
  // Size ratios get no margin: 20x < 21x fails even though 21 * 0.5 would pass.
  const std::string size_fail = R"({"codec": {"speed_margin": 0.5, "rates": [
      {"change_rate": 0.03, "min_ratio_vs_dense": 21}]}})";
  Status s = CheckCodecThresholds(FakeReport(), size_fail, nullptr);
  EXPECT_TRUE(s.IsFailedPrecondition()) << s;
  EXPECT_NE(s.message().find("min_ratio_vs_dense"), std::string::npos);
  const std::string speed_fail = R"({"codec": {"speed_margin": 0.5, "rates": [
      {"change_rate": 0.01, "min_encode_vs_memcpy": 0.7}]}})";
  EXPECT_TRUE(CheckCodecThresholds(FakeReport(), speed_fail, nullptr).IsFailedPrecondition());
  const std::string bound_fail = R"({"codec": {"rates": [
      {"change_rate": 0.05, "max_ratio_vs_bound0": 1.0}]}})";
  EXPECT_TRUE(CheckCodecThresholds(FakeReport(), bound_fail, nullptr).IsFailedPrecondition());
  const std::string missing_rate = R"({"codec": {"rates": [{"change_rate": 0.10}]}})";
  EXPECT_TRUE(CheckCodecThresholds(FakeReport(), missing_rate, nullptr).IsFailedPrecondition());
}

TEST(CodecThresholdsTest, MalformedFilesAreInvalidArgument) {
  for (const char* bad :
       {"", "[]", R"({"codec": 3})", R"({"codec": {"rates": []}})",
        R"({"codec": {"speed_margin": 2, "rates": [{"change_rate": 0.03}]}})",
        R"({"codec": {"rates": [{"min_ratio_vs_dense": 3}]}})",
        R"({"codec": {"rates": [{"change_rate": 0.03, "min_ratio_vs_dense": "x"}]}})"}) {
    EXPECT_TRUE(CheckCodecThresholds(FakeReport(), bad, nullptr).IsInvalidArgument()) << bad;
  }
}

TEST(CodecThresholdsTest, RepositoryThresholdsFileParses) {
  auto bytes = ReadFile("bench/thresholds.json");
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  std::string text(bytes.value().begin(), bytes.value().end());
  auto j = nlohmann::json::parse(text, nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["codec"]["rates"].size(), 3u);
  // The issue's numbers.
  EXPECT_EQ(j["codec"]["rates"][1]["min_ratio_vs_dense"].get<double>(), 52);
  Status s = CheckCodecThresholds(FakeReport(), text, nullptr);
  EXPECT_TRUE(s.IsFailedPrecondition()) << s;  // the fake report is far below them
}

// 2^18 elements at 3%, one repetition: big enough to compress, quick to run.
CodecBenchConfig SmallConfig() {
  CodecBenchConfig cfg;
  cfg.elements = 1 << 18;
  cfg.reps = 1;
  cfg.rates = {0.03};
  cfg.data_threads = 2;
  return cfg;
}

TEST(CodecBenchTest, SmallRunIsBitExactAndCompresses) {
  CodecBenchConfig cfg = SmallConfig();
  auto rep = RunCodecBench(cfg, nullptr);
  ASSERT_TRUE(rep.ok()) << rep.status();
  ASSERT_EQ(rep.value().rates.size(), 1u);
  const CodecRateResult& r = rep.value().rates[0];
  EXPECT_NEAR(r.measured_change_rate, 0.03, 0.004);
  EXPECT_GT(r.ratio_vs_dense, 30.0);
  EXPECT_GT(r.bound0_vs_dense, 40.0);
  EXPECT_GT(r.encode_bytes_per_s, 0.0);
  EXPECT_GT(rep.value().memcpy_bytes_per_s, 0.0);
  auto j = nlohmann::json::parse(CodecBenchJson(rep.value(), "abc"));
  EXPECT_GT(j["memcpy_bytes_per_s"].get<double>(), 0);
  EXPECT_EQ(j["rates"][0]["change_rate"].get<double>(), 0.03);
  for (const char* k : {"ratio_vs_dense", "ratio_vs_bound0", "encode_bytes_per_s",
                        "decode_apply_bytes_per_s", "encode_vs_memcpy", "decode_apply_vs_memcpy"})
    EXPECT_TRUE(j["rates"][0].contains(k)) << k;
  EXPECT_EQ(j["commit"], "abc");
  EXPECT_TRUE(j["machine"].contains("cpu"));
  // The class pass alone is measured wherever the decoder has a vector walk.
  EXPECT_TRUE(j["rates"][0].contains("context_class_pass_vs_memcpy"));
  EXPECT_EQ(r.context_class_pass_bytes_per_s > 0, CpuSimd() != Simd::kPortable);
  EXPECT_NE(CodecBenchTable(rep.value()).find("class pass / memcpy"), std::string::npos);
}

// The class pass that the bench times counts every class's members as the decoder's classes say
// (ClassMap), at each vector level this CPU runs, over windows and a last block left partial.
TEST(ContextClassPassTest, CountsTheMembersOfEveryClass) {
  if (CpuSimd() == Simd::kPortable) GTEST_SKIP() << "this CPU runs the portable walk only";
  std::mt19937_64 rng(7);
  const uint64_t n = 3 * 4096 + 77;
  std::vector<uint16_t> base(n);
  for (uint16_t& x : base) x = static_cast<uint16_t>(rng());
  for (uint64_t i = 0; i < n; i += 5) base[i] = 0x3C00;  // a crowded context beside uniform ones
  const uint8_t bounds[5] = {0, 1, 100, 120, 200};
  const ClassMap map(bounds, 5);
  uint64_t want[5] = {};
  for (uint16_t x : base) ++want[map.ClassOf(static_cast<uint8_t>(x >> 7))];
  uint64_t got[kContextClassesMax];
  ContextClassPassAvx2(base.data(), n, bounds, 5, got);
  for (int c = 0; c < 5; ++c) EXPECT_EQ(got[c], want[c]) << "AVX2, class " << c;
  if (CpuSimd() == Simd::kAvx512) {
    ContextClassPassAvx512(base.data(), n, bounds, 5, got);
    for (int c = 0; c < 5; ++c) EXPECT_EQ(got[c], want[c]) << "AVX-512, class " << c;
  }
}

// The class cap reaches the context-coded runs: with 3 classes the payload is larger than with 16
// (the data has many exponents) and still decodes bit-exact (RunCodecBench checks every apply);
// the JSON says which cap it measured; a cap outside 1..16 is refused.
TEST(CodecBenchTest, ContextClassesReachTheContextRuns) {
  CodecBenchConfig cfg = SmallConfig();
  auto full = RunCodecBench(cfg, nullptr);
  ASSERT_TRUE(full.ok()) << full.status();
  cfg.context_classes = 3;
  auto three = RunCodecBench(cfg, nullptr);
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_GT(three->rates[0].context_payload_bytes, full->rates[0].context_payload_bytes);
  EXPECT_EQ(three->rates[0].payload_bytes, full->rates[0].payload_bytes);
  EXPECT_EQ(nlohmann::json::parse(CodecBenchJson(*three, "abc"))["context_classes"].get<int>(), 3);
  EXPECT_NE(CodecBenchTable(*three).find("at most 3 classes"), std::string::npos);
  cfg.context_classes = 0;
  EXPECT_TRUE(RunCodecBench(cfg, nullptr).status().IsInvalidArgument());
}

}  // namespace
}  // namespace dcr::internal
