#include "diff_bench.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "dcr/sums.h"
#include "dcr/testing/fault_test_util.h"

namespace dcr::internal {
namespace {

TEST(DiffBenchTest, TimesEveryRegionOnTheFilesItWrites) {
  dcr::testing::TempDir dir;
  DiffBenchConfig cfg;
  cfg.elements = uint64_t{1} << 16;
  cfg.reps = 1;
  cfg.dir = dir.path.string();
  auto rep = RunDiffBench(cfg, [](const std::string&) {});
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_EQ(rep->elements, cfg.elements);
  EXPECT_GT(rep->target_bytes, cfg.elements * 2);  // tensor bytes plus the safetensors header
  EXPECT_GT(rep->changed, 0u);
  EXPECT_LT(rep->changed, cfg.elements / 10);
  // The last region wrote the delta the encoder built; `dcr diff` writes the same bytes.
  EXPECT_EQ(std::filesystem::file_size(dir / "delta.dcr"), rep->delta_bytes);
  ASSERT_EQ(rep->rows.size(), 13u);
  EXPECT_EQ(rep->rows[0].name, "dd read");
  EXPECT_EQ(rep->rows[1].name, "diff");
  EXPECT_EQ(rep->rows[3].name, "diff --wan-context");
  EXPECT_EQ(rep->rows[4].name, "diff --base-sums --target-sums");
  // The chained diff wrote the target's sums, which check against the target.
  auto target = Checkpoint::Open(dir / "target.safetensors");
  auto sums = ReadSums(dir / "target.sums");
  ASSERT_TRUE(target.ok() && sums.ok());
  EXPECT_TRUE(CheckSums(**target, *sums, 1).ok());
  EXPECT_EQ(sums->content_hash, (*target)->ContentHash(1));
  EXPECT_GT(rep->context_delta_bytes, 0u);
  EXPECT_LT(rep->context_delta_bytes, rep->delta_bytes);  // BF16 changes code smaller by exponent
  EXPECT_DOUBLE_EQ(rep->rows[0].vs_dd, 1.0);
  const std::string table = DiffBenchTable(*rep);
  EXPECT_NE(table.find("| diff -q |"), std::string::npos);
  EXPECT_NE(table.find("content hash of base"), std::string::npos);
}

TEST(DiffBenchTest, RefusesAMissingDirectory) {
  DiffBenchConfig cfg;
  cfg.elements = uint64_t{1} << 16;
  cfg.reps = 1;
  EXPECT_TRUE(RunDiffBench(cfg, [](const std::string&) {}).status().IsInvalidArgument());
  cfg.dir = "/nonexistent/dcr-bench-diff";
  EXPECT_FALSE(RunDiffBench(cfg, [](const std::string&) {}).ok());
}

}  // namespace
}  // namespace dcr::internal
