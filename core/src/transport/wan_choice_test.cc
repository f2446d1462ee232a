#include "dcr/wan_choice.h"

#include <gtest/gtest.h>

namespace dcr {
namespace {

TEST(WanChoice, ContextWhenTheEdgeRelayKeepsUp) {
  // 100 MB/s link, 88x smaller context form: the link delivers 8.8 GB/s of dense bytes.
  const WanChoice c = ChooseWanEncoding(100e6, 88e9, 1e9, 16, 1e9);
  EXPECT_TRUE(c.context);
  EXPECT_DOUBLE_EQ(c.edge_dense_Bps, 16e9);
  EXPECT_DOUBLE_EQ(c.link_dense_Bps, 8.8e9);
}

TEST(WanChoice, PlainWhenTheEdgeRelayWouldLag) {
  const WanChoice c = ChooseWanEncoding(100e6, 88e9, 1e9, 8, 1e9);
  EXPECT_FALSE(c.context);
  EXPECT_DOUBLE_EQ(c.edge_dense_Bps, 8e9);
  // Exactly keeping up is enough.
  EXPECT_TRUE(ChooseWanEncoding(100e6, 88e9, 1e9, 88, 1e8).context);
}

TEST(WanChoice, NoContextPayloadOrNoCoresIsPlain) {
  EXPECT_FALSE(ChooseWanEncoding(100e6, 88e9, 0, 16, 1e9).context);
  EXPECT_FALSE(ChooseWanEncoding(100e6, 88e9, 1e9, 0, 1e9).context);
  const WanChoice c = ChooseWanEncoding(100e6, 88e9, 1e9, -3, 1e9);
  EXPECT_FALSE(c.context);
  EXPECT_DOUBLE_EQ(c.edge_dense_Bps, 0);
}

}  // namespace
}  // namespace dcr
