// RunNode's entry checks (dcr/node.h): the rank from the launcher's environment, and the refusal of
// a plan with fault points in a process that has none installed (this test binary, like the
// deployed dcr-node, links no faults library).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "dcr/node.h"
#include "node/fault_points.h"

namespace dcr {
namespace {

constexpr const char* kRankVariables[] = {"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK",
                                          "PMI_RANK"};

class RankFromEnvironmentTest : public ::testing::Test {
 protected:
  void SetUp() override { Clear(); }
  void TearDown() override { Clear(); }
  static void Clear() {
    for (const char* v : kRankVariables) unsetenv(v);
  }
};

TEST_F(RankFromEnvironmentTest, NoneSetIsMinusOne) { EXPECT_EQ(RankFromEnvironment(), -1); }

TEST_F(RankFromEnvironmentTest, RankComesBeforeTheLaunchersVariables) {
  setenv("PMI_RANK", "4", 1);
  EXPECT_EQ(RankFromEnvironment(), 4);
  setenv("OMPI_COMM_WORLD_RANK", "3", 1);
  EXPECT_EQ(RankFromEnvironment(), 3);
  setenv("SLURM_PROCID", "2", 1);
  EXPECT_EQ(RankFromEnvironment(), 2);
  // torchrun under srun: RANK names this process, SLURM_PROCID the launcher's task.
  setenv("RANK", "7", 1);
  EXPECT_EQ(RankFromEnvironment(), 7);
  setenv("RANK", "0", 1);
  EXPECT_EQ(RankFromEnvironment(), 0);
}

TEST_F(RankFromEnvironmentTest, ValuesThatAreNotRanksArePassedOver) {
  setenv("SLURM_PROCID", "5", 1);
  for (const char* bad : {"", "x1", "1x", "-1", "99999999999999999999"}) {
    setenv("RANK", bad, 1);
    EXPECT_EQ(RankFromEnvironment(), 5) << "RANK=" << bad;
  }
}

TEST(RunNodeFaultPoints, PlanAsksForFaultsReadsTheKillFields) {
  NodePlan p;
  EXPECT_FALSE(PlanAsksForFaults(p));
  p.fault_kill_inside = true;  // only says where the chunk point is
  EXPECT_FALSE(PlanAsksForFaults(p));
  p.fault_kill_chunk = 0;
  EXPECT_TRUE(PlanAsksForFaults(p));
  p = NodePlan();
  p.fault_kill_blob = 2;
  EXPECT_TRUE(PlanAsksForFaults(p));
}

TEST(RunNodeFaultPoints, AProcessWithoutFaultPointsRefusesThePlan) {
  ASSERT_EQ(internal::InstalledFaultPoints(), nullptr);
  NodePlan p;
  p.rank = 2;
  p.fault_kill_blob = 1;
  NodeResult r;
  Status s = RunNode(p, &r);
  EXPECT_TRUE(s.IsFailedPrecondition()) << s.ToString();
  EXPECT_NE(s.message().find("dcr-node-faults"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("node 2"), std::string::npos) << s.ToString();
  EXPECT_EQ(r.rank, 2);
  EXPECT_EQ(r.error, s.ToString());
}

}  // namespace
}  // namespace dcr
