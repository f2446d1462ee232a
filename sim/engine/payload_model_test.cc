// The payload model measures sizes with the real codec (no assumed ratio): checks its calibration
// of the change rate, its bounds against dense size, and errors.
#include "payload_model.h"

#include <gtest/gtest.h>

namespace dcr::sim::internal {
namespace {

TEST(PayloadModelTest, HitsTheRateAndShrinksLikeTheCodec) {
  auto cfg = GetPreset("llama3-8b");
  ASSERT_TRUE(cfg.ok());
  ModelConfig small = ScaleModel(*cfg, 8, 4, 1);
  PayloadModelOptions o;
  o.sample_elems = 1 << 18;
  auto p3 = MeasurePayload(small, 0.03, o);
  auto p5 = MeasurePayload(small, 0.05, o);
  ASSERT_TRUE(p3.ok()) << p3.status();
  ASSERT_TRUE(p5.ok()) << p5.status();
  EXPECT_NEAR(p3->measured_rate, 0.03, 0.003);
  EXPECT_NEAR(p5->measured_rate, 0.05, 0.005);
  double r3 = p3->dense_bytes / p3->delta_bytes, r5 = p5->dense_bytes / p5->delta_bytes;
  // The order-0 bound of these deltas is ~57x at 3% and ~37x at 5% (`dcr bench codec` reports it
  // as ratio_vs_bound0); the codec comes within ~10% of it.
  EXPECT_GT(r3, 45);
  EXPECT_LT(r3, 75);
  EXPECT_GT(r5, 30);
  EXPECT_LT(r5, r3);
  EXPECT_EQ(p3->elements, ModelParameterCount(small));
  // Deterministic.
  auto again = MeasurePayload(small, 0.03, o);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->delta_bytes, p3->delta_bytes);
  EXPECT_EQ(again->context_delta_bytes, p3->context_delta_bytes);
}

TEST(PayloadModelTest, ContextFormIsSmallerWhereItIsKept) {
  auto cfg = GetPreset("llama3-8b");
  ASSERT_TRUE(cfg.ok());
  ModelConfig small = ScaleModel(*cfg, 8, 4, 1);
  PayloadModelOptions o;
  o.sample_elems = 1 << 18;
  auto p3 = MeasurePayload(small, 0.03, o);
  ASSERT_TRUE(p3.ok()) << p3.status();
  // Every class keeps the smaller of its two forms, and the exponent-conditioned models code the
  // BF16 weights' changes in fewer bytes than the plain record.
  double bf16_plain = 0, bf16_context = 0;
  for (const ClassPayload& c : p3->classes) {
    EXPECT_LE(c.context_payload_bytes, c.payload_bytes) << c.name;
    EXPECT_GT(c.context_payload_bytes, 0) << c.name;
    if (c.dtype == "BF16") {
      bf16_plain += c.payload_bytes;
      bf16_context += c.context_payload_bytes;
    }
  }
  ASSERT_GT(bf16_plain, 0);
  EXPECT_LT(bf16_context, 0.97 * bf16_plain);
  EXPECT_LT(p3->ContextChunkRatio(), 0.97);
  EXPECT_LT(p3->context_delta_bytes, p3->delta_bytes);
}

TEST(PayloadModelTest, RejectsBadRates) {
  auto cfg = GetPreset("tiny");
  ASSERT_TRUE(cfg.ok());
  auto p = MeasurePayload(*cfg, 0, {});
  EXPECT_TRUE(p.status().IsInvalidArgument());
  EXPECT_NE(p.status().message().find("change_rate"), std::string::npos);
  EXPECT_TRUE(MeasurePayload(*cfg, 1.5, {}).status().IsInvalidArgument());
}

}  // namespace
}  // namespace dcr::sim::internal
