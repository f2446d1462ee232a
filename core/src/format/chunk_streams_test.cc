// PositionReader against a plain varint decoder: gap streams mixing one-byte and longer gaps at
// every offset of its sixteen-byte windows, read in batches of every size, and bad streams.
#include "internal/chunk_streams.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace dcr::internal {
namespace {

void PutVarint(uint64_t v, std::vector<uint8_t>* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<uint8_t>(v) | 0x80);
    v >>= 7;
  }
  out->push_back(static_cast<uint8_t>(v));
}

ChunkStreams GapStreams(const std::vector<uint8_t>& bytes, uint64_t k, uint64_t num_elements) {
  ChunkStreams cs;
  cs.header.position_mode = PositionMode::kGaps;
  cs.header.num_changes = k;
  cs.header.num_elements = num_elements;
  cs.positions = bytes.data();
  cs.positions_size = bytes.size();
  return cs;
}

// Reads all k positions in batches of `batch`; returns the first error, if any.
std::string ReadAll(const ChunkStreams& cs, uint64_t batch, std::vector<uint64_t>* got) {
  PositionReader reader(cs);
  const uint64_t k = cs.header.num_changes;
  got->assign(k, ~uint64_t{0});
  for (uint64_t i = 0; i < k; i += batch) {
    const uint64_t n = std::min(batch, k - i);
    if (const char* bad = reader.Next(n, got->data() + i)) return bad;
  }
  return "";
}

TEST(PositionReader, GapsMatchAPlainDecoderAtEveryBatchSize) {
  std::mt19937_64 rng(7);
  for (double long_share : {0.0, 0.02, 0.3, 1.0}) {
    for (int trial = 0; trial < 20; ++trial) {
      const uint64_t k = 1 + rng() % 300;
      std::vector<uint64_t> want;
      std::vector<uint8_t> bytes;
      uint64_t next = 0;
      for (uint64_t i = 0; i < k; ++i) {
        const bool longer = std::uniform_real_distribution<double>(0, 1)(rng) < long_share;
        const uint64_t gap = longer ? 128 + rng() % 100000 : rng() % 128;
        PutVarint(gap, &bytes);
        next += gap;
        want.push_back(next);
        ++next;
      }
      const ChunkStreams cs = GapStreams(bytes, k, next + rng() % 3);
      for (uint64_t batch : {uint64_t{1}, uint64_t{7}, uint64_t{16}, uint64_t{17}, uint64_t{512}}) {
        std::vector<uint64_t> got;
        ASSERT_EQ(ReadAll(cs, batch, &got), "") << "batch " << batch;
        EXPECT_EQ(got, want) << "long share " << long_share << ", batch " << batch;
      }
    }
  }
}

TEST(PositionReader, PositionPastTheEndIsRefusedWhereverItFalls) {
  // 40 one-byte gaps of 3: positions 3, 7, ..., 159. With num_elements = 159 only the last is out
  // of range; every shorter range puts the first bad position at another offset of a window.
  const uint64_t k = 40;
  std::vector<uint8_t> bytes(k, 3);
  for (uint64_t num_elements = 1; num_elements <= 160; ++num_elements) {
    const ChunkStreams cs = GapStreams(bytes, k, num_elements);
    for (uint64_t batch : {uint64_t{1}, uint64_t{16}, uint64_t{40}}) {
      std::vector<uint64_t> got;
      EXPECT_EQ(ReadAll(cs, batch, &got), num_elements >= 160 ? "" : "position out of range")
          << "num_elements " << num_elements << ", batch " << batch;
    }
  }
}

TEST(PositionReader, OverlongVarintIsRefused) {
  std::vector<uint8_t> bytes(20, 1);
  for (int i = 0; i < 11; ++i) bytes[4 + i] = 0x80;  // 11 continuation bytes: over 64 bits
  bytes[15] = 0x01;
  const ChunkStreams cs = GapStreams(bytes, 10, uint64_t{1} << 40);
  std::vector<uint64_t> got;
  EXPECT_EQ(ReadAll(cs, 16, &got), "overlong position varint");
}

}  // namespace
}  // namespace dcr::internal
