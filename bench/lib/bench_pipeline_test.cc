// `dcr bench pipeline` on a small model: the durable receiver's commit is timed through the shipped
// DurableReceiver on real files, and the keys the simulator reads come out with it.
#include "bench_pipeline.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "run_real.h"

namespace dcr::cli {
namespace {

// Names in `dir` that start with `prefix`.
int CountEntries(const std::string& dir, const std::string& prefix) {
  int n = 0;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) n += std::string(e->d_name).rfind(prefix, 0) == 0;
    ::closedir(d);
  }
  return n;
}

TEST(PipelineBenchTest, TimesTheDurableCommitThroughTheShippedReceiver) {
  char tmpl[] = "/tmp/dcr_bench_pipeline_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const std::string scenario = dir + "/s.yaml";
  std::ofstream(scenario) << "name: bench-pipeline-test\nmode: real\n"
                             "model: {preset: llama3-8b, depth_div: 32, width_div: 16, seed: 3, "
                             "work_dir: "
                          << dir
                          << "}\n"
                             "change_rates: [1%, 5%]\nmethods: [delta]\n"
                             "transport: {kinds: [relay_tree]}\n"
                             "receivers: {count: 2}\n";
  PipelineBenchConfig cfg;
  cfg.scenario_path = scenario;
  cfg.reps = 1;
  cfg.prepare_checkpoints = PrepareCheckpoints;
  auto js = RunPipelineBench(cfg, nullptr);
  ASSERT_TRUE(js.ok()) << js.status();
  nlohmann::json j = nlohmann::json::parse(*js);
  ASSERT_EQ(j["rates"].size(), 2u);
  for (const auto& r : j["rates"]) {
    SCOPED_TRACE(r.dump());
    // The storage is a byte copy of the base's file: at least its tensors' bytes.
    EXPECT_GE(r["commit_storage_bytes"].get<double>(), r["dense_bytes"].get<double>());
    EXPECT_GT(r["commit_s_per_storage_byte"].get<double>(), 0);
    EXPECT_GT(r["commit_s_per_delta_byte"].get<double>(), 0);
    EXPECT_GE(r["durable_apply_cpu_s_per_storage_byte"].get<double>(), 0);
    EXPECT_GT(r["commit_apply_wall_s"].get<double>(), 0);
    EXPECT_GT(r["commit_plain_apply_wall_s"].get<double>(), 0);
    EXPECT_GT(r["plain_write_bytes_per_s"].get<double>(), 0);
  }
  // The commitment (CommitmentOf, one thread) and dcr run's verify, per byte of the target.
  EXPECT_GT(j["commitment_bytes_per_s"].get<double>(), 1e7);
  EXPECT_GT(j["commitment_wall_bytes_per_s"].get<double>(), 0);
  EXPECT_GT(j["verify_bytes_per_s"].get<double>(), 1e7);
  // The durable receiver's state directory and the reference write's file are gone.
  EXPECT_EQ(CountEntries(dir, "bench-commit-"), 0);
  std::string cmd = "rm -rf '" + dir + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
}

}  // namespace
}  // namespace dcr::cli
