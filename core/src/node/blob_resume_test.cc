// Resume of an interrupted blob: held ranges and the fetch that continues at the byte held.
#include "node/blob_resume.h"

#include <gtest/gtest.h>

#include <numeric>

namespace dcr::internal {
namespace {

TEST(HeldRangesTest, PrefixIsTheContiguousStart) {
  HeldRanges h;
  EXPECT_EQ(h.Prefix(), 0u);
  h.Add(4096, 4096);  // a piece beyond a gap
  EXPECT_EQ(h.Prefix(), 0u);
  EXPECT_EQ(h.Held(), 4096u);
  h.Add(0, 1000);
  EXPECT_EQ(h.Prefix(), 1000u);
  h.Add(1000, 3096);  // closes the gap: the two ranges merge
  EXPECT_EQ(h.Prefix(), 8192u);
  h.Add(0, 8192);  // a duplicate
  EXPECT_EQ(h.Prefix(), 8192u);
  EXPECT_EQ(h.Held(), 8192u);
  h.Add(9000, 10);
  h.Add(8500, 1000);  // overlaps the range after it
  EXPECT_EQ(h.Held(), 8192u + 1000u);
  h.Add(8192, 308);
  EXPECT_EQ(h.Prefix(), 9500u);
}

// A MemoryStore whose GetRange fails every `fail_every`-th call: a store connection that is cut.
class CutStore : public MemoryStore {
 public:
  explicit CutStore(int fail_every) : fail_every_(fail_every) {}
  StatusOr<std::vector<uint8_t>> GetRange(const std::string& key, uint64_t offset,
                                          uint64_t length) override {
    ++calls_;
    offsets_.push_back(offset);
    if (fail_every_ > 0 && calls_ % fail_every_ == 0) return UnavailableError("connection cut");
    return MemoryStore::GetRange(key, offset, length);
  }
  int calls_ = 0;
  std::vector<uint64_t> offsets_;

 private:
  int fail_every_;
};

std::vector<uint8_t> Pattern(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 131 + 7);
  return v;
}

TEST(FetchRemainderTest, ContinuesAtTheByteHeld) {
  const std::vector<uint8_t> blob = Pattern(10000);
  MemoryStore store;
  ASSERT_TRUE(store.Put("p/0000000001.chk", blob.data(), blob.size()).ok());
  std::vector<uint8_t> bytes(blob.size(), 0);
  std::copy(blob.begin(), blob.begin() + 3333, bytes.begin());  // pieces from the parent
  uint64_t have = 3333, fetched = 0;
  bool other = false;
  ASSERT_TRUE(
      FetchRemainder(store, "p/0000000001.chk", blob.size(), 4096, &bytes, &have, &fetched, &other)
          .ok());
  EXPECT_EQ(bytes, blob);
  EXPECT_EQ(have, blob.size());
  EXPECT_EQ(fetched, blob.size() - 3333);  // nothing held was read again
  EXPECT_FALSE(other);
}

TEST(FetchRemainderTest, ACutFetchResumesAtItsLastWholeRange) {
  const std::vector<uint8_t> blob = Pattern(5 * 1000 + 17);
  CutStore store(/*fail_every=*/3);
  ASSERT_TRUE(store.Put("k", blob.data(), blob.size()).ok());
  std::vector<uint8_t> bytes(blob.size(), 0);
  uint64_t have = 0, fetched = 0;
  bool other = false;
  Status s = FetchRemainder(store, "k", blob.size(), 1000, &bytes, &have, &fetched, &other);
  ASSERT_TRUE(s.IsUnavailable()) << s.ToString();
  EXPECT_EQ(have, 2000u);  // two ranges read whole before the cut
  int attempts = 1;
  while (!s.ok() && attempts < 10) {
    s = FetchRemainder(store, "k", blob.size(), 1000, &bytes, &have, &fetched, &other);
    ++attempts;
  }
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(bytes, blob);
  EXPECT_EQ(fetched, blob.size());  // every byte read once, however often the fetch was cut
  // Every request after a cut starts where the last whole range ended.
  for (size_t i = 1; i < store.offsets_.size(); ++i) {
    EXPECT_GE(store.offsets_[i], store.offsets_[i - 1]);
  }
}

TEST(FetchRemainderTest, AnObjectOfAnotherSizeIsNotSpliced) {
  const std::vector<uint8_t> blob = Pattern(3000);
  MemoryStore store;
  ASSERT_TRUE(store.Put("k", blob.data(), blob.size()).ok());
  for (uint64_t listed : {2000u, 4000u}) {
    std::vector<uint8_t> bytes(listed, 0);
    uint64_t have = 0, fetched = 0;
    bool other = false;
    Status s = FetchRemainder(store, "k", listed, 1024, &bytes, &have, &fetched, &other);
    EXPECT_TRUE(s.IsDataLoss()) << listed << ": " << s.ToString();
    EXPECT_TRUE(other) << listed;
  }
  // Held bytes past the object's end.
  std::vector<uint8_t> bytes(5000, 0);
  uint64_t have = 4000, fetched = 0;
  bool other = false;
  Status s = FetchRemainder(store, "k", 5000, 1024, &bytes, &have, &fetched, &other);
  EXPECT_TRUE(s.IsDataLoss()) << s.ToString();
  EXPECT_TRUE(other);
}

TEST(FetchRemainderTest, EmptyAndWholeBlobs) {
  MemoryStore store;
  ASSERT_TRUE(store.Put("e", nullptr, 0).ok());
  std::vector<uint8_t> none;
  uint64_t have = 0, fetched = 0;
  bool other = false;
  EXPECT_TRUE(FetchRemainder(store, "e", 0, 1024, &none, &have, &fetched, &other).ok());
  const std::vector<uint8_t> blob = Pattern(100);
  ASSERT_TRUE(store.Put("w", blob.data(), blob.size()).ok());
  std::vector<uint8_t> bytes = blob;
  have = 100;
  fetched = 0;
  // Held whole: one request checks the object's end (nothing more than the byte past it).
  EXPECT_TRUE(FetchRemainder(store, "w", 100, 1024, &bytes, &have, &fetched, &other).ok());
  EXPECT_EQ(fetched, 0u);
}

}  // namespace
}  // namespace dcr::internal
