// Tests of the shared per-element operations (the same code the CUDA kernels compile).
#include "internal/element_ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "dcr/hash.h"

namespace dcr {
namespace internal {
namespace {

std::vector<uint64_t> SpecialBits(int width) {
  const uint64_t mask = WidthMask(width);
  const uint64_t sign = SignBit(width);
  std::vector<uint64_t> v = {0, sign, 1, sign | 1, mask, mask >> 1, sign - 1, 2, sign + 2};
  if (width == 2) {  // BF16: +Inf, -Inf, quiet NaN, NaN with payload, subnormals, max finite
    v.insert(v.end(), {0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0xFFC1, 0x0001, 0x807F, 0x7F7F, 0x3F80});
  }
  if (width == 4) {
    v.insert(v.end(), {0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFBADBAD, 0x00000001,
                       0x807FFFFF, 0x3F800000});
  }
  if (width == 1) v.insert(v.end(), {0x7E, 0x7F, 0xFE, 0x08, 0x88});  // E4M3 max, NaN, subnormal
  for (auto& b : v) b &= mask;
  return v;
}

class ElementOpsTest : public ::testing::TestWithParam<int> {};

TEST_P(ElementOpsTest, OrdIsABijectionOnSpecialsAndRandom) {
  const int w = GetParam();
  std::mt19937_64 rng(w);
  std::vector<uint64_t> values = SpecialBits(w);
  for (int i = 0; i < 2000; ++i) values.push_back(rng() & WidthMask(w));
  for (uint64_t b : values) {
    EXPECT_EQ(Unord(Ord(b, w), w), b) << std::hex << b;
    EXPECT_EQ(UnZigZag(ZigZag(b, w), w), b) << std::hex << b;
    EXPECT_LE(Ord(b, w), WidthMask(w));
  }
}

TEST_P(ElementOpsTest, EveryModeRoundTripsAllPairs) {
  const int w = GetParam();
  std::mt19937_64 rng(100 + w);
  std::vector<uint64_t> values = SpecialBits(w);
  for (int i = 0; i < 64; ++i) values.push_back(rng() & WidthMask(w));
  for (uint64_t a : values) {
    for (uint64_t b : values) {
      for (uint8_t mode : {kOpXor, kOpUlpDelta, kOpAbsolute}) {
        const uint64_t v = EncodeValue(mode, w, a, b);
        EXPECT_LE(v, WidthMask(w));
        EXPECT_EQ(ApplyOp(mode, w, a, v), b)
            << "mode " << int(mode) << " w " << w << std::hex << " " << a << " -> " << b;
      }
    }
  }
}

// UndoOp takes the bits after a relative change back to the bits before it, for every current
// bits and every value (a failed chunk is restored this way, with values a corrupt record may
// hold): all values at 1 and 2 bytes, specials and random ones wider.
TEST_P(ElementOpsTest, UndoOpInvertsEveryRelativeApply) {
  const int w = GetParam();
  std::mt19937_64 rng(200 + w);
  std::vector<uint64_t> olds = SpecialBits(w);
  for (int i = 0; i < 32; ++i) olds.push_back(rng() & WidthMask(w));
  std::vector<uint64_t> values = SpecialBits(w);
  if (w <= 2) {
    values.clear();
    for (uint64_t v = 0; v <= WidthMask(w); ++v) values.push_back(v);
  } else {
    for (int i = 0; i < 2000; ++i) values.push_back(rng() & WidthMask(w));
  }
  for (uint8_t mode : {kOpXor, kOpUlpDelta}) {
    for (uint64_t o : olds) {
      for (uint64_t v : values) {
        const uint64_t n = ApplyOp(mode, w, o, v);
        ASSERT_EQ(UndoOp(mode, w, n, v), o)
            << "mode " << int(mode) << " w " << w << std::hex << " old " << o << " value " << v;
      }
    }
  }
}

TEST_P(ElementOpsTest, LoadStoreRoundTrip) {
  const int w = GetParam();
  std::vector<uint8_t> buf(8 * w + 1, 0xAA);
  for (uint64_t i = 0; i < 8; ++i) StoreElem(buf.data() + 1, w, i, 0x0102030405060708ULL * (i + 1));
  for (uint64_t i = 0; i < 8; ++i) {
    EXPECT_EQ(LoadElem(buf.data() + 1, w, i), (0x0102030405060708ULL * (i + 1)) & WidthMask(w));
  }
  EXPECT_EQ(buf[0], 0xAA);  // nothing written outside
}

INSTANTIATE_TEST_SUITE_P(Widths, ElementOpsTest, ::testing::Values(1, 2, 4, 8));

// The branch-free Ord / Unord / ZigZag equal their plain definitions: every 8- and 16-bit
// pattern, and random and special 32- and 64-bit ones.
TEST(ElementOps, BranchFreeFormsEqualTheDefinitions) {
  auto ord = [](uint64_t b, int w) {
    return (b & SignBit(w)) ? (~b & WidthMask(w)) : (b | SignBit(w));
  };
  auto unord = [](uint64_t o, int w) {
    return (o & SignBit(w)) ? (o & ~SignBit(w)) : (~o & WidthMask(w));
  };
  auto zigzag = [](uint64_t d, int w) {
    d &= WidthMask(w);
    return ((d << 1) ^ ((d & SignBit(w)) ? WidthMask(w) : 0)) & WidthMask(w);
  };
  std::mt19937_64 rng(17);
  for (int w : {1, 2, 4, 8}) {
    std::vector<uint64_t> xs = SpecialBits(w);
    if (w <= 2) {
      for (uint64_t b = 0; b <= WidthMask(w); ++b) xs.push_back(b);
    } else {
      for (int i = 0; i < 100000; ++i) xs.push_back(rng() & WidthMask(w));
    }
    for (uint64_t b : xs) {
      ASSERT_EQ(Ord(b, w), ord(b, w)) << w << " " << std::hex << b;
      ASSERT_EQ(Unord(b, w), unord(b, w)) << w << " " << std::hex << b;
      ASSERT_EQ(ZigZag(b, w), zigzag(b, w)) << w << " " << std::hex << b;
    }
  }
}

TEST(ElementOps, OrdPreservesFloatOrderAndAdjacentFloatsDifferByOne) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1e6f, 1e6f);
  std::vector<float> xs = {0.0f,
                           -0.0f,
                           1e-45f,
                           -1e-45f,
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           1.0f,
                           -1.0f};
  for (int i = 0; i < 1000; ++i) xs.push_back(dist(rng));
  auto bits = [](float f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    return uint64_t{b};
  };
  for (float x : xs) {
    for (float y : xs) {
      if (x < y) {
        EXPECT_LT(Ord(bits(x), 4), Ord(bits(y), 4)) << x << " " << y;
      }
    }
    const float up = std::nextafter(x, std::numeric_limits<float>::infinity());
    if (std::isfinite(x) && !(x == 0.0f && std::signbit(x))) {
      EXPECT_EQ(UlpValue(bits(x), bits(up), 4), 2u) << x;  // zigzag(+1)
      EXPECT_EQ(UlpValue(bits(up), bits(x), 4), 1u) << x;  // zigzag(-1)
    }
  }
  EXPECT_EQ(UlpValue(bits(-0.0f), bits(0.0f), 4), 2u);  // -0 and +0 are adjacent
}

TEST(ElementOps, ElementTermLanesMatchesHashH) {
  std::mt19937_64 rng(3);
  for (int i = 0; i < 1000; ++i) {
    const uint64_t s = rng(), idx = rng() >> (i % 64), b = rng() >> (i % 64);
    uint64_t lo, hi;
    ElementTermLanes(s, idx, b, &lo, &hi);
    const Hash128 h = ElementTerm(s, idx, b);
    EXPECT_EQ(lo, h.lo);
    EXPECT_EQ(hi, h.hi);
  }
}

}  // namespace
}  // namespace internal
}  // namespace dcr
