#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "dcr/testing/synth.h"

namespace dcr {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Independent reference: double-precision round-to-nearest-even through the value grid.
uint16_t RefBF16(float f) {
  uint32_t u = Bits(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);
  uint16_t lo = static_cast<uint16_t>(u >> 16);  // truncation (toward zero in magnitude)
  uint32_t rest = u & 0xffff;
  if (rest < 0x8000) return lo;
  if (rest > 0x8000) return static_cast<uint16_t>(lo + 1);
  return (lo & 1) ? static_cast<uint16_t>(lo + 1) : lo;
}

TEST(BF16Test, RoundsToNearestEven) {
  EXPECT_EQ(FloatToBF16(1.0f), 0x3f80);
  // Ties: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7 -> even (1.0).
  EXPECT_EQ(FloatToBF16(FromBits(0x3f808000)), 0x3f80);
  // 1 + 3*2^-8 lies halfway between 0x3f81 and 0x3f82 -> even 0x3f82.
  EXPECT_EQ(FloatToBF16(FromBits(0x3f818000)), 0x3f82);
  EXPECT_EQ(FloatToBF16(FromBits(0x3f808001)), 0x3f81);
  EXPECT_EQ(FloatToBF16(FromBits(0x3f807fff)), 0x3f80);
  // Negative ties.
  EXPECT_EQ(FloatToBF16(FromBits(0xbf818000)), 0xbf82);
}

TEST(BF16Test, SpecialValues) {
  EXPECT_EQ(FloatToBF16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToBF16(0.0f), 0x0000);
  EXPECT_EQ(FloatToBF16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(FloatToBF16(-std::numeric_limits<float>::infinity()), 0xff80);
  // Largest finite float rounds up to infinity (as RNE requires).
  EXPECT_EQ(FloatToBF16(std::numeric_limits<float>::max()), 0x7f80);
  // NaN stays NaN, quiet, with sign; a signalling NaN whose payload is only in the low bits must
  // not turn into infinity.
  uint16_t n = FloatToBF16(FromBits(0x7f800001));
  EXPECT_EQ(n & 0x7f80, 0x7f80);
  EXPECT_NE(n & 0x007f, 0);
  EXPECT_EQ(FloatToBF16(FromBits(0xffc00000)), 0xffc0);
  // Subnormals: smallest subnormal rounds to 0; a subnormal with bit 15 set and odd rounds up.
  EXPECT_EQ(FloatToBF16(FromBits(0x00000001)), 0x0000);
  EXPECT_EQ(FloatToBF16(FromBits(0x00018000)), 0x0002);
  EXPECT_EQ(FloatToBF16(FromBits(0x00008000)), 0x0000);
  EXPECT_EQ(FloatToBF16(FromBits(0x807fffff)), 0x8080);  // to the smallest normal
  EXPECT_EQ(BF16ToFloat(0x3f80), 1.0f);
  EXPECT_TRUE(std::isnan(BF16ToFloat(0x7fc0)));
}

TEST(BF16Test, MatchesReferenceAndBulkFormOnManyPatterns) {
  std::mt19937 rng(7);
  std::vector<float> in;
  for (uint32_t hi = 0; hi < 0x10000; hi += 7)
    for (uint32_t lo : {0u, 1u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu})
      in.push_back(FromBits((hi << 16) | lo));
  for (int i = 0; i < 100000; ++i) in.push_back(FromBits(rng()));
  std::vector<uint16_t> bulk(in.size());
  FloatsToBF16(in.data(), bulk.data(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(FloatToBF16(in[i]), RefBF16(in[i])) << std::hex << Bits(in[i]);
    ASSERT_EQ(bulk[i], RefBF16(in[i])) << std::hex << Bits(in[i]);
  }
}

TEST(AdamWTest, MatchesScalarReference) {
  const uint64_t n = 5000;  // not a multiple of the block or vector width
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> p(n), m(n, 0), v(n, 0), pr, mr, vr, g(n);
  for (auto& x : p) x = 0.02f * nd(rng);
  pr = p;
  mr = m;
  vr = v;
  AdamWHyper h;
  h.lr = 3e-4;
  for (int64_t step = 1; step <= 5; ++step) {
    for (auto& x : g) x = 1e-3f * nd(rng);
    AdamWStep(p.data(), m.data(), v.data(), g.data(), n, h, step);
    // Scalar FP32 reference with PyTorch AdamW semantics (constants rounded to float once).
    double bc1 = 1 - std::pow(h.beta1, step), bc2 = 1 - std::pow(h.beta2, step);
    const float b1 = float(h.beta1), c1 = float(1 - h.beta1), b2 = float(h.beta2),
                c2 = float(1 - h.beta2), decay = float(1 - h.lr * h.weight_decay),
                ss = float(h.lr / bc1), isb = float(1 / std::sqrt(bc2)), eps = float(h.eps);
    for (uint64_t i = 0; i < n; ++i) {
      float mi = b1 * mr[i] + c1 * g[i];
      float vi = b2 * vr[i] + c2 * (g[i] * g[i]);
      float pi = pr[i] * decay;
      pi = pi - ss * mi / (std::sqrt(vi) * isb + eps);
      mr[i] = mi;
      vr[i] = vi;
      pr[i] = pi;
    }
    for (uint64_t i = 0; i < n; ++i) {
      // Same FP32 operations: equal up to contraction differences (an ulp or two).
      ASSERT_NEAR(p[i], pr[i], 2.5e-7f * (std::fabs(pr[i]) + float(h.lr)))
          << "step " << step << " i " << i;
      ASSERT_NEAR(m[i], mr[i], 2.5e-7f * std::fabs(mr[i]));
      ASSERT_NEAR(v[i], vr[i], 2.5e-7f * std::fabs(vr[i]));
      // Resync so errors do not accumulate.
      pr[i] = p[i];
      mr[i] = m[i];
      vr[i] = v[i];
    }
  }
}

TEST(AdamWTest, FirstStepIsLrTimesSign) {
  float p = 0.5f, m = 0, v = 0, g = -2e-3f;
  AdamWHyper h;
  h.lr = 1e-3;
  h.weight_decay = 0;
  AdamWStep(&p, &m, &v, &g, 1, h, 1);
  EXPECT_NEAR(p, 0.501f, 1e-6f);
}

}  // namespace
}  // namespace dcr
