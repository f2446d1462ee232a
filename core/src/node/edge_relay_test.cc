// The edge relay's transcoding: the chunk records it hands its policy are, blob for blob, those
// the sender would have built without context coding, whatever order the pieces arrive in; a
// wrong base is refused; duplicates and a stream left behind hand nothing on.
#include "node/edge_relay.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <set>

#include "dcr/checkpoint.h"
#include "dcr/context.h"
#include "dcr/delta.h"
#include "dcr/edge_split.h"
#include "dcr/format.h"
#include "dcr/testing/fixtures.h"
#include "internal/context_codec.h"

namespace dcr::internal {
namespace {

// Blobs of a delta as the node's builder cuts them: header, records, trailer.
class BlobSink : public DeltaSink {
 public:
  Status OnHeader(const std::vector<uint8_t>& b) override { return Add(BlobKind::kHeader, b); }
  Status OnChunk(const ChunkHeader&, const std::vector<uint8_t>& b) override {
    return Add(BlobKind::kChunk, b);
  }
  Status OnManifest(const std::vector<uint8_t>& b) override { return Add(BlobKind::kChunk, b); }
  Status OnTrailer(const std::vector<uint8_t>& b) override { return Add(BlobKind::kTrailer, b); }
  std::vector<std::pair<BlobKind, std::vector<uint8_t>>> blobs;

 private:
  Status Add(BlobKind k, const std::vector<uint8_t>& b) {
    blobs.emplace_back(k, b);
    return Status();
  }
};

// A base, a target with ~3% of its elements changed and an unrelated checkpoint of the shape:
// BF16 around 1 with varied exponents, a change a step of 1-3 in the low byte.
const testing::ChangedCheckpoints& Checkpoints() {
  static const testing::ChangedCheckpoints* f =
      new testing::ChangedCheckpoints(testing::WriteChangedCheckpoints(
                                          "dcr_edge_",
                                          {{"a.weight", "BF16", {512, 256}},
                                           {"b.weight", "BF16", {300, 100}},
                                           {"c.norm", "BF16", {640}}},
                                          7, 3,
                                          [](std::mt19937_64& rng, uint8_t* e, int) {
                                            const uint16_t v =
                                                static_cast<uint16_t>(0x3C00 + rng() % 0x0800);
                                            e[0] = static_cast<uint8_t>(v);
                                            e[1] = static_cast<uint8_t>(v >> 8);
                                          },
                                          [](std::mt19937_64& rng, uint8_t* e, int) {
                                            e[0] = static_cast<uint8_t>(e[0] + 1 + rng() % 3);
                                          })
                                          .value());
  return *f;
}

std::vector<std::pair<BlobKind, std::vector<uint8_t>>> Build(bool context) {
  auto base = Checkpoint::Open(Checkpoints().base);
  auto target = Checkpoint::Open(Checkpoints().target);
  EXPECT_TRUE(base.ok() && target.ok());
  DeltaOptions o;
  o.chunk_elems = 16384;
  o.context_coding = context;
  BlobSink sink;
  auto st = BuildDelta(base->get(), **target, o, &sink);
  EXPECT_TRUE(st.ok()) << st.status().ToString();
  if (context) {
    EXPECT_GT(st->context_chunks, 0u);
  }
  return sink.blobs;
}

TEST(PieceTrackerTest, WholeOnceAfterEveryPieceDuplicatesIgnored) {
  PieceTracker t(4);
  const BlobInfo b{3, BlobKind::kChunk, 10};  // pieces at 0, 4, 8
  EXPECT_FALSE(t.Add(b, 8));
  EXPECT_FALSE(t.Add(b, 8));
  EXPECT_FALSE(t.Add(b, 0));
  EXPECT_FALSE(t.Whole(3));
  EXPECT_TRUE(t.Add(b, 4));
  EXPECT_TRUE(t.Whole(3));
  EXPECT_FALSE(t.Add(b, 4));
  const BlobInfo empty{4, BlobKind::kTrailer, 0};  // one empty piece
  EXPECT_TRUE(t.Add(empty, 0));
  t.Clear();
  EXPECT_FALSE(t.Whole(3));
}

TEST(EdgeTranscoderTest, ContextRecordsBecomeThePlainEncodersRecords) {
  const auto ctx = Build(true), plain = Build(false);
  ASSERT_EQ(ctx.size(), plain.size());
  auto t = EdgeTranscoder::Open(Checkpoints().base, 1);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_TRUE((*t)->SetHeader(ctx[0].second.data(), ctx[0].second.size()).ok());
  int transcoded = 0;
  for (size_t i = 1; i + 1 < ctx.size(); ++i) {
    auto p = (*t)->ToPlain(ctx[i].second.data(), ctx[i].second.size());
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    if (p->has_value()) {
      ++transcoded;
      EXPECT_EQ(**p, plain[i].second) << "chunk blob " << i;
    } else {
      EXPECT_EQ(ctx[i].second, plain[i].second) << "chunk blob " << i << " travels as it is";
    }
  }
  EXPECT_GT(transcoded, 0);
}

TEST(EdgeTranscoderTest, AnotherBaseIsRefused) {
  const auto ctx = Build(true);
  auto t = EdgeTranscoder::Open(Checkpoints().other, 1);
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE((*t)->SetHeader(ctx[0].second.data(), ctx[0].second.size()).ok());
  bool refused = false;
  for (size_t i = 1; i + 1 < ctx.size() && !refused; ++i) {
    auto p = (*t)->ToPlain(ctx[i].second.data(), ctx[i].second.size());
    if (!p.ok()) {
      EXPECT_EQ(p.status().code(), StatusCode::kFailedPrecondition) << p.status().ToString();
      refused = true;
    }
  }
  EXPECT_TRUE(refused);
  // A chunk before the header is refused too, not decoded against nothing.
  auto fresh = EdgeTranscoder::Open(Checkpoints().base, 1);
  ASSERT_TRUE(fresh.ok());
  bool before_header = false;
  for (size_t i = 1; i + 1 < ctx.size(); ++i) {
    auto p = (*fresh)->ToPlain(ctx[i].second.data(), ctx[i].second.size());
    if (!p.ok()) before_header = true;
  }
  EXPECT_TRUE(before_header);
}

// A context-coded record whose one segment claims 2^33 elements of a 131072-element tensor (its
// checksums right, 100-odd bytes): refused from its header, before the base bits it would be
// decoded against are gathered (16 GiB), and never an exception out of the worker thread.
TEST(EdgeTranscoderTest, ARecordWiderThanItsTensorIsRefusedBeforeAllocating) {
  const auto ctx = Build(true);
  auto t = EdgeTranscoder::Open(Checkpoints().base, 1);
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE((*t)->SetHeader(ctx[0].second.data(), ctx[0].second.size()).ok());
  for (size_t i = 1; i + 1 < ctx.size(); ++i) {
    size_t hs = 0, rs = 0;
    auto h = ParseChunkHeader(ctx[i].second.data(), ctx[i].second.size(), &hs, &rs);
    if (!h.ok() || !IsContextCoded(*h)) continue;
    ChunkHeader wide = *h;
    wide.segments = {Segment::Range(0, 0, uint64_t{1} << 33)};
    wide.num_elements = uint64_t{1} << 33;
    const std::vector<uint8_t> body(ctx[i].second.begin() + static_cast<std::ptrdiff_t>(hs),
                                    ctx[i].second.begin() + static_cast<std::ptrdiff_t>(rs));
    const std::vector<uint8_t> rec = SealContextRecord(wide, body);
    ASSERT_TRUE(ParseChunkHeader(rec.data(), rec.size(), nullptr, nullptr).ok());
    auto p = (*t)->ToPlain(rec.data(), rec.size());
    ASSERT_FALSE(p.ok());
    EXPECT_EQ(p.status().code(), StatusCode::kDataLoss) << p.status().ToString();
    EXPECT_NE(p.status().message().find("outside its tensor"), std::string::npos)
        << p.status().ToString();
    return;
  }
  FAIL() << "no context-coded record in the delta";
}

// The ingress over pieces in a shuffled order (header last): what it hands on is the plain stream.
// The base of one edge relay of a split: the tensors of `base` that the context-coded chunks of
// `range` cover, and none other, written as a checkpoint of its own under the fixtures' folder.
std::string PartialBase(const std::vector<std::pair<BlobKind, std::vector<uint8_t>>>& ctx,
                        const EdgeRange& range, int k) {
  size_t consumed = 0;
  auto fh = ParseFileHeader(ctx[0].second.data(), ctx[0].second.size(), &consumed);
  EXPECT_TRUE(fh.ok());
  auto inv = Inventory::FromHeader(*fh);
  EXPECT_TRUE(inv.ok());
  std::set<std::string> names;
  for (size_t i = 1; i + 1 < ctx.size(); ++i) {
    size_t hs = 0, rs = 0;
    auto h = ParseChunkHeader(ctx[i].second.data(), ctx[i].second.size(), &hs, &rs);
    if (!h.ok() || !range.Contains(h->chunk_id)) continue;
    for (const Segment& sg : h->segments) names.insert(inv->tensors[sg.tensor_index].name);
  }
  auto base = Checkpoint::Open(Checkpoints().base);
  EXPECT_TRUE(base.ok());
  std::vector<TensorView> views;
  for (const TensorInfo& t : (*base)->tensors()) {
    if (names.count(t.name) == 0) continue;
    views.push_back(TensorView{t.name, t.dtype_name, t.shape, (*base)->data(t), t.nbytes});
  }
  const std::string path = Checkpoints().dir + "/range-" + std::to_string(k) + ".safetensors";
  EXPECT_TRUE(WriteSafetensors(path, views).ok());
  return path;
}

// Chunk ids and the dense bytes of the cells the records of a delta cover.
std::vector<uint64_t> ChunkDense(const std::vector<std::pair<BlobKind, std::vector<uint8_t>>>& b) {
  std::vector<uint64_t> dense;
  for (size_t i = 1; i + 1 < b.size(); ++i) {
    size_t hs = 0, rs = 0;
    auto h = ParseChunkHeader(b[i].second.data(), b[i].second.size(), &hs, &rs);
    if (!h.ok()) continue;  // a manifest record
    if (dense.size() <= h->chunk_id) dense.resize(h->chunk_id + 1, 0);
    dense[h->chunk_id] = h->num_elements * h->elem_width;
  }
  return dense;
}

TEST(EdgeTranscoderTest, AChainOfRangeTranscodersGivesThePlainStream) {
  const auto ctx = Build(true), plain = Build(false);
  ASSERT_EQ(ctx.size(), plain.size());
  auto ranges = SplitChunkRanges(ChunkDense(ctx), 3);
  ASSERT_TRUE(ranges.ok()) << ranges.status().ToString();
  // Each edge relay of the chain replaces the context records of its range; the rest pass.
  std::vector<std::vector<uint8_t>> stream;
  for (const auto& b : ctx) stream.push_back(b.second);
  std::vector<int> per_range(3, 0);
  for (int k = 0; k < 3; ++k) {
    const std::string base = PartialBase(ctx, (*ranges)[k], k);
    auto held = Checkpoint::Open(base);
    ASSERT_TRUE(held.ok());
    // a.weight is 81% of the dense bytes: the first two ranges lie in it and hold it alone.
    if (k < 2) {
      EXPECT_EQ((*held)->tensors().size(), 1u) << "range " << k;
    }
    auto t = EdgeTranscoder::Open(base, 1, (*ranges)[k]);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    ASSERT_TRUE((*t)->SetHeader(stream[0].data(), stream[0].size()).ok());
    for (size_t i = 1; i + 1 < stream.size(); ++i) {
      auto p = (*t)->ToPlain(stream[i].data(), stream[i].size());
      ASSERT_TRUE(p.ok()) << "range " << k << ", blob " << i << ": " << p.status().ToString();
      if (!p->has_value()) continue;
      ++per_range[k];
      stream[i] = std::move(**p);
    }
  }
  for (int k = 0; k < 3; ++k) EXPECT_GT(per_range[k], 0) << "range " << k << " transcoded none";
  // Header and trailer are the context delta's (the sender's, forwarded as they are).
  for (size_t i = 1; i + 1 < stream.size(); ++i) {
    EXPECT_EQ(stream[i], plain[i].second) << "blob " << i << " is not the plain encoder's";
  }
}

TEST(EdgeTranscoderTest, ARangeWhoseBaseLacksItsTensorIsRefused) {
  const auto ctx = Build(true);
  auto ranges = SplitChunkRanges(ChunkDense(ctx), 3);
  ASSERT_TRUE(ranges.ok());
  // The base of range 0 given to the edge relay of the last range.
  const std::string base = PartialBase(ctx, (*ranges)[0], 10);
  auto t = EdgeTranscoder::Open(base, 1, (*ranges)[2]);
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE((*t)->SetHeader(ctx[0].second.data(), ctx[0].second.size()).ok());
  bool refused = false;
  for (size_t i = 1; i + 1 < ctx.size() && !refused; ++i) {
    auto p = (*t)->ToPlain(ctx[i].second.data(), ctx[i].second.size());
    if (p.ok()) continue;
    refused = true;
    EXPECT_EQ(p.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(p.status().message().find("which its base lacks"), std::string::npos)
        << p.status().message();
  }
  EXPECT_TRUE(refused);
  // Without a range, a base that lacks a tensor of the delta is refused at the header.
  auto whole = EdgeTranscoder::Open(base, 1);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ((*whole)->SetHeader(ctx[0].second.data(), ctx[0].second.size()).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(EdgeTranscoder::Open(base, 1, EdgeRange{4, 4, 0}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(EdgeIngressTest, ShuffledPiecesGiveThePlainStream) {
  const auto ctx = Build(true), plain = Build(false);
  const uint64_t piece = 1000;
  std::mutex mu;
  std::condition_variable cv;
  std::map<BlobId, std::vector<uint8_t>> replaced;
  std::map<BlobId, uint64_t> received;  // bytes handed on per blob
  std::map<BlobId, uint64_t> sizes;
  Status fatal;
  EdgeIngress::Callbacks cb;
  cb.replace = [&](const BlobInfo& info, std::vector<uint8_t> bytes) {
    std::lock_guard<std::mutex> l(mu);
    EXPECT_EQ(info.size, bytes.size());
    replaced[info.id] = std::move(bytes);
  };
  cb.post = [&](const Event& e) {
    std::lock_guard<std::mutex> l(mu);
    const auto* d = std::get_if<event::DataReceived>(&e);
    ASSERT_NE(d, nullptr);
    EXPECT_EQ(d->offset % piece, 0u);
    received[d->blob.id] += d->length;
    sizes[d->blob.id] = d->blob.size;
    cv.notify_all();
  };
  cb.fatal = [&](Status s) {
    std::lock_guard<std::mutex> l(mu);
    fatal = s;
    cv.notify_all();
  };
  auto t = EdgeTranscoder::Open(Checkpoints().base, 1);
  ASSERT_TRUE(t.ok());
  EdgeIngress ingress(std::move(*t), piece, 3, cb);
  std::vector<std::shared_ptr<const std::vector<uint8_t>>> bufs;
  struct P {
    BlobInfo info;
    uint64_t offset;
    size_t buf;
  };
  std::vector<P> pieces;
  for (size_t i = 0; i < ctx.size(); ++i) {
    bufs.push_back(std::make_shared<const std::vector<uint8_t>>(ctx[i].second));
    const BlobInfo info{i, ctx[i].first, ctx[i].second.size()};
    for (uint64_t k = 0; k < NumPieces(info.size, piece); ++k)
      pieces.push_back({info, k * piece, i});
  }
  std::mt19937_64 rng(3);
  std::shuffle(pieces.begin(), pieces.end(), rng);
  // The header's pieces last, so that chunks wait for it; one duplicate of every piece.
  std::stable_partition(pieces.begin(), pieces.end(),
                        [](const P& p) { return p.info.kind != BlobKind::kHeader; });
  for (const P& p : pieces) ingress.Piece(p.info, p.offset, bufs[p.buf]);
  for (const P& p : pieces) {
    if (!ingress.Whole(p.info.id)) ingress.Piece(p.info, p.offset, bufs[p.buf]);
  }
  std::unique_lock<std::mutex> l(mu);
  ASSERT_TRUE(cv.wait_for(l, std::chrono::seconds(60), [&] {
    if (!fatal.ok()) return true;
    for (size_t i = 0; i < plain.size(); ++i) {
      if (sizes.count(i) == 0 || received[i] != sizes[i]) return false;
    }
    return true;
  }));
  ASSERT_TRUE(fatal.ok()) << fatal.ToString();
  // Chunk records are the plain encoder's; header and trailer are the sender's, as they came
  // (the header's CONTEXT flag, the trailer's chunk ids and target hash are what receivers check).
  for (size_t i = 0; i < plain.size(); ++i) {
    const bool chunk = ctx[i].first == BlobKind::kChunk;
    const std::vector<uint8_t>& want = chunk ? plain[i].second : ctx[i].second;
    EXPECT_EQ(sizes[i], want.size()) << "blob " << i;
    EXPECT_EQ(received[i], want.size()) << "blob " << i << ": each piece once";
    const std::vector<uint8_t>& got = replaced.count(i) ? replaced[i] : ctx[i].second;
    EXPECT_EQ(got, want) << "blob " << i;
  }
  EXPECT_FALSE(replaced.empty());
  const EdgeStats st = ingress.stats();
  EXPECT_EQ(st.chunks, replaced.size());
  EXPECT_LT(st.context_bytes, st.plain_bytes);
}

// After Reset (the stream left for the store) a whole blob is handed on again only by a new
// stream; jobs in flight hand nothing on.
TEST(EdgeIngressTest, ResetForgetsTheStream) {
  const auto ctx = Build(true);
  std::mutex mu;
  int posted = 0;
  EdgeIngress::Callbacks cb;
  cb.replace = [](const BlobInfo&, std::vector<uint8_t>) {};
  cb.post = [&](const Event&) {
    std::lock_guard<std::mutex> l(mu);
    ++posted;
  };
  cb.fatal = [](Status s) { ADD_FAILURE() << s.ToString(); };
  auto t = EdgeTranscoder::Open(Checkpoints().base, 1);
  ASSERT_TRUE(t.ok());
  EdgeIngress ingress(std::move(*t), uint64_t{1} << 20, 1, cb);
  auto header = std::make_shared<const std::vector<uint8_t>>(ctx[0].second);
  ingress.Piece(BlobInfo{0, BlobKind::kHeader, header->size()}, 0, header);
  EXPECT_TRUE(ingress.Whole(0));
  ingress.Reset();
  EXPECT_FALSE(ingress.Whole(0));
  std::lock_guard<std::mutex> l(mu);
  EXPECT_EQ(posted, 1);
}

}  // namespace
}  // namespace dcr::internal
