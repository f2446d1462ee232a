// The state-dir spool of a version's blobs: what verifies is restored, a torn or damaged tail
// and a spool of another stream are not.
#include "node/blob_spool.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <numeric>

namespace dcr::internal {
namespace {

class BlobSpoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("blob_spool_test." + std::to_string(getpid()) + "." +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "rank-3.spool").string();
    bytes_.resize(10000);
    std::iota(bytes_.begin(), bytes_.end(), uint8_t{7});
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  StatusOr<std::unique_ptr<BlobSpool>> Open(bool fresh, std::vector<BlobSpool::Restored>* out,
                                            const std::string& key = "run 1 version 2",
                                            uint64_t budget = 1 << 20) {
    return BlobSpool::Open(
        path_, key, budget, fresh, [](BlobKind) { return uint64_t{1} << 20; }, out);
  }
  uint64_t FileSize() const { return std::filesystem::file_size(path_); }

  std::filesystem::path dir_;
  std::string path_;
  std::vector<uint8_t> bytes_;
};

TEST_F(BlobSpoolTest, RestartRestoresWhatArrivedWithItsPrefix) {
  std::vector<BlobSpool::Restored> out;
  {
    auto s = Open(true, &out);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_TRUE(out.empty());
    const BlobInfo whole{5, BlobKind::kChunk, 4000};
    const BlobInfo cut{9, BlobKind::kChunk, 10000};
    (*s)->Append(whole, 0, bytes_.data(), 4000);
    (*s)->Append(cut, 0, bytes_.data(), 4096);
    (*s)->Append(cut, 8192, bytes_.data() + 8192, 1000);  // beyond a gap
    (*s)->Append(BlobInfo{11, BlobKind::kChunk, 10000}, 4096, bytes_.data() + 4096, 10);
    EXPECT_TRUE((*s)->failed().ok());
  }
  auto s = Open(false, &out);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  // Blob 11 holds no prefix: nothing to resume from.
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].info, (BlobInfo{5, BlobKind::kChunk, 4000}));
  EXPECT_EQ(out[0].held.Prefix(), 4000u);
  EXPECT_EQ(std::vector<uint8_t>(out[0].bytes.begin(), out[0].bytes.end()),
            std::vector<uint8_t>(bytes_.begin(), bytes_.begin() + 4000));
  EXPECT_EQ(out[1].info.id, 9u);
  EXPECT_EQ(out[1].bytes.size(), 10000u);
  EXPECT_EQ(out[1].held.Prefix(), 4096u);
  EXPECT_EQ(out[1].held.Held(), 4096u + 1000u);
  EXPECT_TRUE(std::equal(out[1].bytes.begin(), out[1].bytes.begin() + 4096, bytes_.begin()));
  // Appends continue after what was read back; a second restart sees both.
  (*s)->Append(BlobInfo{9, BlobKind::kChunk, 10000}, 4096, bytes_.data() + 4096, 4096);
  s->reset();
  ASSERT_TRUE(Open(false, &out).ok());
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].held.Prefix(), 9192u);
  EXPECT_TRUE(std::equal(out[1].bytes.begin(), out[1].bytes.begin() + 9192, bytes_.begin()));
}

TEST_F(BlobSpoolTest, TornTailIsCutAndAppendingContinuesThere) {
  std::vector<BlobSpool::Restored> out;
  uint64_t good = 0;
  {
    auto s = Open(true, &out);
    ASSERT_TRUE(s.ok());
    (*s)->Append(BlobInfo{1, BlobKind::kHeader, 100}, 0, bytes_.data(), 100);
    good = (*s)->bytes();
    (*s)->Append(BlobInfo{2, BlobKind::kChunk, 5000}, 0, bytes_.data(), 5000);
  }
  // A kill mid-write: the second record loses its last bytes.
  ASSERT_EQ(::truncate(path_.c_str(), static_cast<off_t>(FileSize() - 10)), 0);
  auto s = Open(false, &out);
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].info.id, 1u);
  EXPECT_EQ(FileSize(), good);
  (*s)->Append(BlobInfo{2, BlobKind::kChunk, 5000}, 0, bytes_.data(), 5000);
  s->reset();
  ASSERT_TRUE(Open(false, &out).ok());
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].held.Prefix(), 5000u);
}

TEST_F(BlobSpoolTest, DamagedDataIsNotReused) {
  std::vector<BlobSpool::Restored> out;
  {
    auto s = Open(true, &out);
    ASSERT_TRUE(s.ok());
    (*s)->Append(BlobInfo{1, BlobKind::kChunk, 3000}, 0, bytes_.data(), 3000);
    (*s)->Append(BlobInfo{2, BlobKind::kChunk, 3000}, 0, bytes_.data(), 3000);
  }
  // One byte of the first record's data flipped (a machine crash lost the page): neither it nor
  // anything after it is trusted.
  const int fd = ::open(path_.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  uint8_t b = 0;
  const off_t at = static_cast<off_t>(FileSize() - 2 * (56 + 3000) + 56 + 1234);
  ASSERT_EQ(::pread(fd, &b, 1, at), 1);
  b ^= 0x10;
  ASSERT_EQ(::pwrite(fd, &b, 1, at), 1);
  ::close(fd);
  ASSERT_TRUE(Open(false, &out).ok());
  EXPECT_TRUE(out.empty());
}

TEST_F(BlobSpoolTest, AnotherStreamOrAFreshStartBeginsAgain) {
  std::vector<BlobSpool::Restored> out;
  {
    auto s = Open(true, &out);
    ASSERT_TRUE(s.ok());
    (*s)->Append(BlobInfo{1, BlobKind::kChunk, 3000}, 0, bytes_.data(), 3000);
  }
  ASSERT_TRUE(Open(false, &out, "run 1 version 3").ok());
  EXPECT_TRUE(out.empty());
  {
    auto s = Open(true, &out);
    ASSERT_TRUE(s.ok());
    (*s)->Append(BlobInfo{1, BlobKind::kChunk, 3000}, 0, bytes_.data(), 3000);
  }
  ASSERT_TRUE(Open(true, &out).ok());
  EXPECT_TRUE(out.empty());
  ASSERT_TRUE(Open(false, &out).ok());
  EXPECT_TRUE(out.empty());
}

TEST_F(BlobSpoolTest, BudgetAndBlobLimitsBound) {
  std::vector<BlobSpool::Restored> out;
  {
    auto s = Open(true, &out, "k", 4096);
    ASSERT_TRUE(s.ok());
    (*s)->Append(BlobInfo{1, BlobKind::kChunk, 3000}, 0, bytes_.data(), 3000);
    (*s)->Append(BlobInfo{2, BlobKind::kChunk, 3000}, 0, bytes_.data(), 3000);  // past the budget
    EXPECT_LE((*s)->bytes(), 4096u);
    EXPECT_TRUE((*s)->failed().ok());
  }
  ASSERT_TRUE(Open(false, &out, "k", 4096).ok());
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].info.id, 1u);
  // A record claiming a blob larger than its kind allows is not restored.
  {
    auto s = Open(true, &out);
    ASSERT_TRUE(s.ok());
    (*s)->Append(BlobInfo{1, BlobKind::kChunk, uint64_t{1} << 40}, 0, bytes_.data(), 100);
  }
  ASSERT_TRUE(Open(false, &out).ok());
  EXPECT_TRUE(out.empty());
  EXPECT_TRUE(Open(true, &out, "k", 0).status().IsInvalidArgument());
}

TEST_F(BlobSpoolTest, DiscardRemovesTheFileAndStopsAppends) {
  std::vector<BlobSpool::Restored> out;
  auto s = Open(true, &out);
  ASSERT_TRUE(s.ok());
  (*s)->Discard();
  EXPECT_FALSE(std::filesystem::exists(path_));
  (*s)->Append(BlobInfo{1, BlobKind::kChunk, 3000}, 0, bytes_.data(), 3000);
  EXPECT_FALSE(std::filesystem::exists(path_));
}

}  // namespace
}  // namespace dcr::internal
