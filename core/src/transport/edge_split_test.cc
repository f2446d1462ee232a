#include "dcr/edge_split.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace dcr {
namespace {

TEST(EdgeSplit, RangesAreContiguousAndBalancedByDenseBytes) {
  // Ten chunks of 100 bytes and a tail chunk of 10 (a tensor's last cell).
  std::vector<uint64_t> dense(10, 100);
  dense.push_back(10);
  auto r = SplitChunkRanges(dense, 3);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 3u);
  EXPECT_EQ((*r)[0], (EdgeRange{0, 4, 400}));  // 400 >= 1010 / 3
  EXPECT_EQ((*r)[1], (EdgeRange{4, 7, 300}));  // 700 >= 2020 / 3
  EXPECT_EQ((*r)[2], (EdgeRange{7, 11, 310}));
  EXPECT_EQ(EdgeRangeOf(*r, 0), 0);
  EXPECT_EQ(EdgeRangeOf(*r, 6), 1);
  EXPECT_EQ(EdgeRangeOf(*r, 10), 2);
  EXPECT_EQ(EdgeRangeOf(*r, 11), -1);
}

TEST(EdgeSplit, EveryRangeGetsAChunkWhenOneChunkHoldsMostBytes) {
  auto r = SplitChunkRanges({1000, 1, 1, 1}, 4);
  ASSERT_TRUE(r.ok());
  for (size_t k = 0; k < 4; ++k) EXPECT_EQ((*r)[k].end - (*r)[k].first, 1u) << k;
  auto one = SplitChunkRanges({5, 6, 7}, 1);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ((*one)[0], (EdgeRange{0, 3, 18}));
}

TEST(EdgeSplit, RefusesMoreRangesThanChunksOrNone) {
  auto r = SplitChunkRanges({1, 2}, 3);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("3 ranges asked of a delta of 2 chunks"), std::string::npos)
      << r.status().message();
  EXPECT_EQ(SplitChunkRanges({1, 2}, 0).status().code(), StatusCode::kInvalidArgument);
}

TEST(EdgeSplit, InterleavedOrderAdvancesTheRangesTogether) {
  const std::vector<EdgeRange> ranges = {{0, 2, 200}, {2, 6, 400}};
  const std::vector<uint64_t> order = InterleavedChunkOrder(ranges);
  // Range 1 has twice the chunks: two of its chunks go for each of range 0's.
  EXPECT_EQ(order, (std::vector<uint64_t>{0, 2, 3, 1, 4, 5}));
  std::vector<uint64_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<uint64_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(InterleavedChunkOrder({{0, 3, 30}}), (std::vector<uint64_t>{0, 1, 2}));
}

TEST(EdgeSplit, SmallestSetThatKeepsUp) {
  // 100 MB/s link, context 88x smaller than the 88 GB dense: 8.8 GB/s of dense bytes to transcode
  // at 0.2 GB/s per core: 44 cores in all.
  EdgeSplitChoice c = ChooseEdgeSplit(100e6, 88e9, 1e9, 0.2e9, 8, 64, 0);
  EXPECT_TRUE(c.context);
  EXPECT_EQ(c.count, 1);
  EXPECT_EQ(c.cores, 44);
  // At most 16 cores each: three edge relays of 15 cores (2.93 GB/s each against 3.0: 14 lag).
  c = ChooseEdgeSplit(100e6, 88e9, 1e9, 0.2e9, 8, 16, 0);
  EXPECT_TRUE(c.context);
  EXPECT_EQ(c.count, 3);
  EXPECT_EQ(c.cores, 15);
  EXPECT_DOUBLE_EQ(c.base_bytes, 88e9 / 3);
  EXPECT_GE(c.edge_dense_Bps, c.link_dense_Bps);
  // A memory bound of 25 GB each asks for four.
  c = ChooseEdgeSplit(100e6, 88e9, 1e9, 0.2e9, 8, 16, 25e9);
  EXPECT_EQ(c.count, 4);
  EXPECT_EQ(c.cores, 11);
  // Two edge relays of at most 8 cores cannot keep up: the plain form.
  c = ChooseEdgeSplit(100e6, 88e9, 1e9, 0.2e9, 2, 8, 0);
  EXPECT_FALSE(c.context);
  EXPECT_EQ(c.count, 0);
  EXPECT_LT(c.edge_dense_Bps, c.link_dense_Bps);
}

}  // namespace
}  // namespace dcr
