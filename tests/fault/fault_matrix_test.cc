// The CI fault matrix: seeded runs over several tree shapes, each injecting a mix of every fault
// kind at seeded points; every run must end with every receiver committed at the target and
// byte-equal to it, the joint commit whole. Totals: >= 100 faults injected and all survived.
// DCR_FAULT_MATRIX_RUNS overrides the number of runs; DCR_FAULT_MATRIX_JSON=path writes a summary.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>

#include "dcr/testing/fault_injection.h"
#include "dcr/testing/fault_test_util.h"

namespace dcr {
namespace {

using testing::MakeCheckpoint;
using testing::Model;
using testing::NextVersion;
using testing::RandomModel;
using testing::SmallGrid;
using testing::TempDir;

TEST(FaultMatrixTest, EveryRunEndsBitExactAndCommitted) {
  int runs = 12;
  if (const char* e = std::getenv("DCR_FAULT_MATRIX_RUNS")) runs = std::max(1, std::atoi(e));
  Model m0 = RandomModel(41, 2);
  auto base = MakeCheckpoint(m0);
  auto target = MakeCheckpoint(NextVersion(m0, 42, 0.03));
  int injected = 0, survived = 0, receivers = 0, verified = 0;
  uint64_t repairs = 0, fallbacks = 0, restarts = 0, refused = 0, corrupt = 0, dups = 0;
  std::map<std::string, int> by_kind;
  auto t0 = std::chrono::steady_clock::now();
  for (int run = 0; run < runs; ++run) {
    TempDir dir;
    FaultRunOptions o;
    o.seed = 1000 + run;
    o.receivers = 4 + run % 5;     // 4..8 receivers
    o.fan_out = 1 + run % 3;       // chains, binary and ternary trees
    o.root_fan_out = 1 + run % 2;  // one or two long-link relays
    o.work_dir = dir / "run";
    auto r = RunFaultScenario(*base, *target, SmallGrid(0, 1), SeededFaults(o.seed, 13), o);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->error, "") << "run " << run;
    if (!r->error.empty()) {
      for (const auto& l : r->log) std::fprintf(stderr, "  %s\n", l.c_str());
    }
    EXPECT_EQ(r->receivers_verified, o.receivers) << "run " << run;
    EXPECT_EQ(r->receivers_committed, o.receivers) << "run " << run;
    EXPECT_TRUE(r->joint_commit_whole) << "run " << run;
    injected += r->faults_injected;
    survived += r->faults_survived;
    receivers += r->receivers;
    verified += r->receivers_verified;
    repairs += r->overwrite_repairs;
    fallbacks += r->fallbacks_to_store;
    restarts += r->restarts;
    refused += r->payloads_refused;
    corrupt += r->corrupt_detected;
    dups += r->duplicates_skipped;
    for (const auto& [k, v] : r->injected_by_kind) by_kind[k] += v;
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "fault matrix: %d runs, %d faults injected, %d survived, %d/%d receivers verified, "
      "%.1f s\n",
      runs, injected, survived, verified, receivers, secs);
  std::printf(
      "  overwrite repairs %llu, store fallbacks %llu, restarts %llu, payloads refused "
      "%llu, corrupt blobs caught %llu, duplicates skipped %llu\n",
      (unsigned long long)repairs, (unsigned long long)fallbacks, (unsigned long long)restarts,
      (unsigned long long)refused, (unsigned long long)corrupt, (unsigned long long)dups);
  for (const auto& [k, v] : by_kind) std::printf("  %-28s %d\n", k.c_str(), v);
  if (runs >= 10) {
    EXPECT_GE(injected, 100);
    for (int k = 0; k < kNumFaultKinds; ++k) {
      EXPECT_GE(by_kind[FaultKindName(static_cast<FaultKind>(k))], 3)
          << FaultKindName(static_cast<FaultKind>(k));
    }
  }
  EXPECT_EQ(survived, injected);
  EXPECT_EQ(verified, receivers);
  if (const char* path = std::getenv("DCR_FAULT_MATRIX_JSON")) {
    std::ofstream f(path);
    f << "{\"runs\": " << runs << ", \"faults_injected\": " << injected
      << ", \"faults_survived\": " << survived << ", \"receivers\": " << receivers
      << ", \"receivers_verified\": " << verified << ", \"overwrite_repairs\": " << repairs
      << ", \"fallbacks_to_store\": " << fallbacks << ", \"restarts\": " << restarts
      << ", \"payloads_refused\": " << refused << ", \"corrupt_detected\": " << corrupt
      << ", \"seconds\": " << secs << ", \"by_kind\": {";
    bool first = true;
    for (const auto& [k, v] : by_kind) {
      f << (first ? "" : ", ") << "\"" << k << "\": " << v;
      first = false;
    }
    f << "}}\n";
  }
}

}  // namespace
}  // namespace dcr
