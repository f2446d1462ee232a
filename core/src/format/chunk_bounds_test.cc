// Bounds before decode: a chunk record's segments are checked against the tensors it names
// before anything of it is decoded or allocated, with overflow-free arithmetic; the hostile
// records (a zstd stream that expands 32768-fold, segments that wrap, overlap or reach past their
// tensor) are refused with kDataLoss and without the allocation their header asks for; an
// exception becomes a Status.
#include "internal/chunk_bounds.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstring>
#include <stdexcept>

#include "dcr/apply.h"
#include "dcr/delta.h"
#include "internal/context_codec.h"

namespace dcr::internal {
namespace {

ChunkHeader Header(int width, std::vector<Segment> segments) {
  ChunkHeader h;
  h.chunk_id = 7;
  h.elem_width = static_cast<uint8_t>(width);
  h.num_elements = 0;
  for (const Segment& s : segments) h.num_elements += s.num_elements();
  h.segments = std::move(segments);
  return h;
}

Segment Box(uint32_t tensor, uint64_t offset, std::vector<std::pair<uint64_t, int64_t>> dims) {
  Segment s;
  s.tensor_index = tensor;
  s.offset = offset;
  s.ndim = static_cast<uint32_t>(dims.size());
  for (size_t d = 0; d < dims.size(); ++d) {
    s.count[d] = dims[d].first;
    s.stride[d] = dims[d].second;
  }
  return s;
}

const std::vector<TensorBound> kTensors = {{1000, 2}, {33, 1}, {64 * 96, 2}};

TEST(ChunkBoundsTest, SegmentsInsideTheirTensorsPass) {
  EXPECT_TRUE(CheckChunkBounds(Header(2, {Segment::Range(0, 0, 1000)}), kTensors).ok());
  // Rows 3..5 of a 64 x 96 tensor, columns 10..19; the same box walked backwards.
  EXPECT_TRUE(
      CheckChunkBounds(Header(2, {Box(2, 3 * 96 + 10, {{3, 96}, {10, 1}})}), kTensors).ok());
  EXPECT_TRUE(
      CheckChunkBounds(Header(2, {Box(2, 5 * 96 + 19, {{3, -96}, {10, -1}})}), kTensors).ok());
  // Two tensors and two disjoint ranges of one.
  EXPECT_TRUE(CheckChunkBounds(Header(2, {Segment::Range(0, 0, 10), Segment::Range(2, 0, 10),
                                          Segment::Range(0, 500, 500)}),
                               kTensors)
                  .ok());
}

void ExpectRefused(const ChunkHeader& h, const std::string& what) {
  Status s = CheckChunkBounds(h, kTensors);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_NE(s.message().find(what), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("chunk 7"), std::string::npos) << s.ToString();
}

TEST(ChunkBoundsTest, WhatDoesNotFitIsRefused) {
  ExpectRefused(Header(2, {Segment::Range(3, 0, 1)}), "out of range");
  ExpectRefused(Header(1, {Segment::Range(0, 0, 1)}), "element width");
  ExpectRefused(Header(2, {Segment::Range(0, 1, 1000)}), "outside its tensor");
  ExpectRefused(Header(2, {Segment::Range(0, 0, uint64_t{1} << 33)}), "outside its tensor");
  ExpectRefused(Header(2, {Box(0, 5, {{10, -1}})}), "outside its tensor");
  // (count - 1) * stride overflows 64 bits: 2^34 elements of stride 2^62 wrap to a small span.
  ExpectRefused(Header(2, {Box(0, 0, {{uint64_t{1} << 34, int64_t{1} << 62}})}),
                "outside its tensor");
  // Stride 0 repeats one element: inside, but it covers the tensor more than once over.
  ExpectRefused(Header(1, {Box(1, 0, {{1 << 20, 0}})}), "more elements than its tensor has");
  ExpectRefused(Header(2, {Segment::Range(0, 0, 600), Segment::Range(0, 200, 600)}), "overlap");
  ChunkHeader h = Header(2, {Segment::Range(0, 0, 10)});
  h.num_elements = uint64_t{1} << 34;
  ExpectRefused(h, "do not cover num_elements");
  ExpectRefused(Header(2, {Box(0, 0, {{0, 1}})}), "empty dimension");
}

// A zstd frame of `n` zero bytes in RLE blocks (4 bytes per 128 KiB), its content size set.
std::vector<uint8_t> RleFrame(uint64_t n) {
  std::vector<uint8_t> f = {0x28, 0xB5, 0x2F, 0xFD, 0xC0, 0x38};
  for (int i = 0; i < 8; ++i) f.push_back(static_cast<uint8_t>(n >> (8 * i)));
  for (uint64_t left = n; left > 0;) {
    const uint64_t b = std::min<uint64_t>(left, 1 << 17);
    left -= b;
    const uint32_t hdr = (left == 0 ? 1u : 0u) | (1u << 1) | static_cast<uint32_t>(b << 3);
    f.push_back(static_cast<uint8_t>(hdr));
    f.push_back(static_cast<uint8_t>(hdr >> 8));
    f.push_back(static_cast<uint8_t>(hdr >> 16));
    f.push_back(0);
  }
  return f;
}

// A dense, absolute, 1-byte record over `n` elements of tensor `tensor` whose one stream is an
// RLE zstd frame of n bytes: 32 KiB of record per GiB it expands to.
std::vector<uint8_t> ZstdBomb(uint32_t tensor, uint64_t n) {
  ChunkHeader h;
  h.chunk_id = 7;
  h.position_mode = PositionMode::kDense;
  h.value_mode = ValueMode::kAbsolute;
  h.elem_width = 1;
  h.num_elements = h.num_changes = n;
  h.segments = {Segment::Range(tensor, 0, n)};
  const std::vector<uint8_t> frame = RleFrame(n);
  h.streams = {StreamInfo{StreamCodec::kZstd, n, frame.size()}};
  return SealRecord(h, frame);
}

long MaxRssKiB() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

TEST(ChunkBoundsTest, AZstdBombIsRefusedBeforeItExpands) {
  const std::vector<uint8_t> bomb = ZstdBomb(1, uint64_t{1} << 30);  // 1 GiB from ~32 KiB
  ASSERT_LT(bomb.size(), 40u << 10);
  std::vector<uint8_t> t0(2000), t1(33), t2(64 * 96 * 2);
  BufferApplier applier({TensorBuffer{t0.data(), 1000, 2, 1}, TensorBuffer{t1.data(), 33, 1, 2},
                         TensorBuffer{t2.data(), 64 * 96, 2, 3}});
  const long before = MaxRssKiB();
  Status s = applier.ApplyRecord(bomb.data(), bomb.size());
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_NE(s.message().find("outside its tensor"), std::string::npos) << s.ToString();
  EXPECT_LT(MaxRssKiB() - before, 64 << 10) << "the refused record was expanded first";
  EXPECT_EQ(t1, std::vector<uint8_t>(33)) << "nothing written";
}

TEST(ChunkBoundsTest, SegmentCountsThatWrapAreRefusedByTheParser) {
  ChunkHeader h;
  h.chunk_id = 7;
  h.position_mode = PositionMode::kDense;
  h.value_mode = ValueMode::kAbsolute;
  h.elem_width = 1;
  h.num_elements = h.num_changes = 16;
  // 2^32 x 2^32 elements: 0 in 64-bit arithmetic; the second segment makes up num_elements.
  h.segments = {Box(1, 0, {{uint64_t{1} << 32, 0}, {uint64_t{1} << 32, 0}}),
                Segment::Range(1, 0, 16)};
  const std::vector<uint8_t> values(16, 1);
  h.streams = {StreamInfo{StreamCodec::kRaw, 16, 16}};
  const std::vector<uint8_t> rec = SealRecord(h, values);
  auto parsed = ParseChunkHeader(rec.data(), rec.size(), nullptr, nullptr);
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(parsed.status().message().find("segment too large"), std::string::npos)
      << parsed.status().ToString();
}

TEST(ChunkBoundsTest, ExceptionsBecomeStatuses) {
  Status s = NoThrow("decoding", []() -> Status { throw std::bad_alloc(); });
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_NE(s.message().find("decoding"), std::string::npos);
  s = NoThrow("decoding", []() -> Status { throw std::runtime_error("boom"); });
  EXPECT_EQ(s.code(), StatusCode::kInternal) << s.ToString();
  EXPECT_NE(s.message().find("boom"), std::string::npos);
  EXPECT_TRUE(NoThrow("decoding", [] { return Status(); }).ok());
}

}  // namespace
}  // namespace dcr::internal
