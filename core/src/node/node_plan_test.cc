// NodePlan JSON (what `dcr run` writes and `dcr-node --plan` reads): every field survives the
// round trip; fields a plan may omit take their defaults.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "dcr/node.h"

namespace dcr {
namespace {

TEST(NodePlanJson, RoundTripKeepsTheDevice) {
  NodePlan p;
  p.rank = 3;
  p.transport = "relay_tree";
  p.method = "delta";
  p.parents = {-1, 0, 1, 1};
  p.addresses = {"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4"};
  p.relay.prefix = "refit/step-2";
  p.run_id = 0xfedcba9876543210;
  p.version = 2;
  p.device = "cuda";
  p.device_index = 5;
  p.receiver_base_path = "/b.safetensors";
  p.verify_path = "/t.safetensors";
  p.result_path = "/r.json";
  p.base_sums = "/b.sums";
  p.target_sums = "/t.sums";
  auto back = NodePlanFromJson(NodePlanToJson(p));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->rank, 3);
  EXPECT_EQ(back->base_sums, "/b.sums");
  EXPECT_EQ(back->target_sums, "/t.sums");
  EXPECT_EQ(back->parents, p.parents);
  EXPECT_EQ(back->addresses, p.addresses);
  EXPECT_EQ(back->relay.prefix, "refit/step-2");
  EXPECT_EQ(back->run_id, 0xfedcba9876543210);
  EXPECT_EQ(back->version, 2u);
  EXPECT_EQ(back->device, "cuda");
  EXPECT_EQ(back->device_index, 5);
  EXPECT_EQ(back->receiver_base_path, "/b.safetensors");
  EXPECT_EQ(NodePlanToJson(*back), NodePlanToJson(p));
}

TEST(NodePlanJson, AbsentDeviceIsTheHostPath) {
  NodePlan p;
  p.device = "host";
  p.device_index = 2;
  nlohmann::json j = nlohmann::json::parse(NodePlanToJson(p));
  j.erase("device");
  j.erase("device_index");
  auto back = NodePlanFromJson(j.dump());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->device, "cpu");
  EXPECT_EQ(back->device_index, 0);
  j["device_index"] = "zero";
  EXPECT_TRUE(NodePlanFromJson(j.dump()).status().IsInvalidArgument());
}

// The context coding's class cap travels with the plan; a plan without it has the default, one
// outside 1..16 is refused.
TEST(NodePlanJson, ContextClasses) {
  NodePlan p;
  p.context_coding = true;
  p.context_classes = 9;
  auto back = NodePlanFromJson(NodePlanToJson(p));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->context_coding);
  EXPECT_EQ(back->context_classes, 9);
  nlohmann::json j = nlohmann::json::parse(NodePlanToJson(p));
  j.erase("context_classes");
  back = NodePlanFromJson(j.dump());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->context_classes, kContextClassesMax);
  for (int bad : {0, 17}) {
    j["context_classes"] = bad;
    auto refused = NodePlanFromJson(j.dump());
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_TRUE(refused.status().IsInvalidArgument()) << refused.status();
    EXPECT_NE(refused.status().message().find("context classes"), std::string::npos);
  }
}

}  // namespace
}  // namespace dcr
