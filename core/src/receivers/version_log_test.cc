// VersionLog: a chain of real deltas logged and replayed, compared byte for byte with the dense
// safetensors image of each version; torn tails, corrupt entries and images; the image policy.
#include "receivers/version_log.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "dcr/device.h"
#include "dcr/status_macros.h"
#include "dcr/testing/fault_test_util.h"

namespace dcr::internal {
namespace {

using testing::DeltaBytes;
using testing::MakeCheckpoint;
using testing::Model;
using testing::NextVersion;
using testing::RandomModel;
using testing::SafetensorsBytes;
using testing::SmallGrid;

// Versions 0..n of a model (3% of the elements change per step) and the deltas between them.
struct Chain {
  std::vector<std::vector<uint8_t>> images;  // dense safetensors bytes of each version
  std::vector<std::unique_ptr<Checkpoint>> ckpts;
  std::vector<std::unique_ptr<DeltaReader>> deltas;  // deltas[k]: version k -> k + 1
  VersionId id(size_t k) const { return VersionId{k, ckpts[k]->ContentHash(1)}; }

  static Chain Make(size_t n) {
    Chain c;
    Model m = RandomModel(11);
    for (size_t k = 0; k <= n; ++k) {
      if (k > 0) m = NextVersion(m, 100 + k, 0.03);
      c.images.push_back(SafetensorsBytes(m));
      c.ckpts.push_back(MakeCheckpoint(m));
      if (k > 0) {
        auto d = DeltaReader::FromBytes(
            DeltaBytes(c.ckpts[k - 1].get(), *c.ckpts[k], SmallGrid(k - 1, k)));
        EXPECT_TRUE(d.ok()) << d.status().ToString();
        c.deltas.push_back(std::move(*d));
      }
    }
    return c;
  }
};

class VersionLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (std::filesystem::temp_directory_path() /
            ("dcr_version_log_test." + std::to_string(::getpid()) + "." +
             ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A receiver over an in-memory copy of version 0's image, logging into a fresh store.
  void Start(const Chain& c, VersionLogOptions o = {}) {
    storage_ = c.images[0];
    rx_ = std::make_unique<BufferReceiver>(ImageTensors(*c.ckpts[0], storage_.data()), c.id(0));
    auto log = VersionLog::Create(dir_, storage_.data(), storage_.size(), c.id(0), o);
    ASSERT_TRUE(log.ok()) << log.status().ToString();
    log_ = std::move(*log);
    logging_ = std::make_unique<VersionLoggingReceiver>(
        rx_.get(), log_.get(), [this](VersionLog* log, const VersionId& v) {
          return log->WriteImage(storage_.data(), storage_.size(), v);
        });
  }
  void Stop() {
    logging_.reset();
    log_.reset();
    rx_.reset();
  }
  StatusOr<RecoveredVersion> Recover(const Chain& c) {
    RecoveredVersion r;
    auto log = VersionLog::Open(dir_, *c.ckpts[0], &r);
    if (!log.ok()) return log.status();
    return r;
  }
  size_t Images() const {
    size_t n = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir_)) {
      if (e.path().filename().string().rfind("image-", 0) == 0) ++n;
    }
    return n;
  }
  uint64_t LogFileSize() const { return std::filesystem::file_size(dir_ + "/log"); }

  std::string dir_;
  std::vector<uint8_t> storage_;
  std::unique_ptr<BufferReceiver> rx_;
  std::unique_ptr<VersionLog> log_;
  std::unique_ptr<VersionLoggingReceiver> logging_;
};

TEST_F(VersionLogTest, ReplayEqualsDenseLoadByteForByte) {
  Chain c = Chain::Make(4);
  Start(c);
  for (size_t k = 0; k < 4; ++k) ASSERT_TRUE(ApplyDelta(*c.deltas[k], logging_.get()).ok());
  EXPECT_EQ(storage_, c.images[4]);
  const VersionLogStats st = log_->stats();
  EXPECT_EQ(st.versions, 4u);
  EXPECT_EQ(st.images, 1u);  // Create's; the log stays far below the image's size
  uint64_t payload = 0;
  for (const auto& d : c.deltas) payload += d->size();
  // Per version: the delta's bytes plus 13 bytes of framing per entry and a 37-byte marker.
  EXPECT_GE(st.log_bytes, payload);
  EXPECT_LT(st.log_bytes, payload + 4 * 4096);
  Stop();
  auto r = Recover(c);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->version, c.id(4));
  EXPECT_EQ(r->image_version, c.id(0));
  EXPECT_EQ(r->versions_replayed, 4u);
  EXPECT_EQ(r->torn_bytes, 0u);
  EXPECT_TRUE(r->bytes == c.images[4]) << "replayed bytes differ from the dense image of v4";
}

TEST_F(VersionLogTest, TornTailIsDiscardedAndLoggingGoesOn) {
  Chain c = Chain::Make(3);
  Start(c);
  ASSERT_TRUE(ApplyDelta(*c.deltas[0], logging_.get()).ok());
  ASSERT_TRUE(ApplyDelta(*c.deltas[1], logging_.get()).ok());
  // Version 3's entries without their marker (the process dies before the commit), then half
  // of one more entry (a write cut short).
  const DeltaReader& d = *c.deltas[2];
  ASSERT_TRUE(BeginDelta(d, logging_.get()).ok());
  for (size_t i = 0; i < d.num_chunks() / 2; ++i) {
    ASSERT_TRUE(logging_->ApplyRecord(d.chunk_data(i), d.chunk_size(i)).ok());
  }
  Stop();
  {
    std::ofstream f(dir_ + "/log", std::ios::binary | std::ios::app);
    const char half[7] = {0x40, 0, 0, 0, 2, 1, 2};
    f.write(half, sizeof(half));
  }
  auto r = Recover(c);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->version, c.id(2));
  EXPECT_GT(r->torn_bytes, 7u);
  EXPECT_TRUE(r->bytes == c.images[2]);

  // The store goes on from the recovered version: version 3 logged whole, replayed.
  storage_ = std::move(r->bytes);
  rx_ = std::make_unique<BufferReceiver>(ImageTensors(*c.ckpts[0], storage_.data()), c.id(2));
  RecoveredVersion again;
  auto log = VersionLog::Open(dir_, *c.ckpts[0], &again);
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  EXPECT_EQ(again.torn_bytes, 0u);  // truncated by the first Open
  log_ = std::move(*log);
  logging_ = std::make_unique<VersionLoggingReceiver>(rx_.get(), log_.get());
  ASSERT_TRUE(ApplyDelta(*c.deltas[2], logging_.get()).ok());
  Stop();
  auto r3 = Recover(c);
  ASSERT_TRUE(r3.ok()) << r3.status().ToString();
  EXPECT_EQ(r3->version, c.id(3));
  EXPECT_TRUE(r3->bytes == c.images[3]);
}

TEST_F(VersionLogTest, RecoverReadsWhileTheLogIsOpenAndChangesNothing) {
  Chain c = Chain::Make(2);
  Start(c);
  ASSERT_TRUE(ApplyDelta(*c.deltas[0], logging_.get()).ok());
  // Version 2 begun and half applied: Recover (read only, the log still open for appending)
  // gives version 1, and leaves the entries of version 2 where they are.
  const DeltaReader& d = *c.deltas[1];
  ASSERT_TRUE(BeginDelta(d, logging_.get()).ok());
  for (size_t i = 0; i < d.num_chunks() / 2; ++i) {
    ASSERT_TRUE(logging_->ApplyRecord(d.chunk_data(i), d.chunk_size(i)).ok());
  }
  const uint64_t size = LogFileSize();
  RecoveredVersion r;
  ASSERT_TRUE(VersionLog::Recover(dir_, *c.ckpts[0], &r).ok());
  EXPECT_EQ(r.version, c.id(1));
  EXPECT_GT(r.torn_bytes, 0u);
  EXPECT_TRUE(r.bytes == c.images[1]);
  EXPECT_EQ(LogFileSize(), size);
  // The version goes on and commits; Recover then gives it.
  for (size_t i = d.num_chunks() / 2; i < d.num_chunks(); ++i) {
    ASSERT_TRUE(logging_->ApplyRecord(d.chunk_data(i), d.chunk_size(i)).ok());
  }
  ASSERT_TRUE(CommitDelta(d, logging_.get()).ok());
  ASSERT_TRUE(VersionLog::Recover(dir_, *c.ckpts[0], &r).ok());
  EXPECT_EQ(r.version, c.id(2));
  EXPECT_TRUE(r.bytes == c.images[2]);
}

TEST_F(VersionLogTest, AbortAbandonsTheVersionsEntries) {
  Chain c = Chain::Make(1);
  Start(c);
  const uint64_t before = log_->log_size();
  const DeltaReader& d = *c.deltas[0];
  ASSERT_TRUE(BeginDelta(d, logging_.get()).ok());
  ASSERT_TRUE(logging_->ApplyRecord(d.chunk_data(0), d.chunk_size(0)).ok());
  logging_->Abort();
  EXPECT_EQ(log_->log_size(), before);
  EXPECT_EQ(LogFileSize(), before);
  EXPECT_TRUE(logging_->MarkApplied(0, Hash128{}).IsFailedPrecondition());
}

TEST_F(VersionLogTest, CorruptEntryIsDataLoss) {
  Chain c = Chain::Make(2);
  Start(c);
  ASSERT_TRUE(ApplyDelta(*c.deltas[0], logging_.get()).ok());
  ASSERT_TRUE(ApplyDelta(*c.deltas[1], logging_.get()).ok());
  Stop();
  // One byte inside the first record of version 1 (after the 64-byte header and the header
  // entry).
  std::vector<uint8_t> bytes = *ReadFile(dir_ + "/log");
  const uint32_t header_entry = bytes[64] | bytes[65] << 8 | bytes[66] << 16 | bytes[67] << 24;
  const size_t at = 64 + 13 + header_entry + 5 + 10;
  ASSERT_LT(at, bytes.size());
  bytes[at] ^= 0x10;
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/log", bytes.data(), bytes.size()).ok());
  auto r = Recover(c);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsDataLoss()) << r.status().ToString();
  EXPECT_NE(r.status().message().find("corrupt record entry"), std::string::npos)
      << r.status().ToString();
}

TEST_F(VersionLogTest, CorruptImageIsDataLoss) {
  Chain c = Chain::Make(1);
  Start(c);
  ASSERT_TRUE(ApplyDelta(*c.deltas[0], logging_.get()).ok());
  Stop();
  const std::string image = dir_ + "/image-0";
  std::vector<uint8_t> bytes = *ReadFile(image);
  bytes[bytes.size() / 2] ^= 1;
  ASSERT_TRUE(WriteFileAtomic(image, bytes.data(), bytes.size()).ok());
  auto r = Recover(c);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsDataLoss()) << r.status().ToString();
  EXPECT_NE(r.status().message().find("digest"), std::string::npos) << r.status().ToString();
}

TEST_F(VersionLogTest, NamedVersionsReadsTheLogWithoutItsImage) {
  Chain c = Chain::Make(2);
  Start(c);
  ASSERT_TRUE(ApplyDelta(*c.deltas[0], logging_.get()).ok());
  ASSERT_TRUE(ApplyDelta(*c.deltas[1], logging_.get()).ok());
  Stop();
  // The image cannot be recovered; the log still says which content each version was.
  std::filesystem::remove(dir_ + "/image-0");
  ASSERT_FALSE(Recover(c).ok());
  auto named = VersionLog::NamedVersions(dir_);
  ASSERT_TRUE(named.ok()) << named.status().ToString();
  EXPECT_EQ(*named, (std::vector<VersionId>{c.id(0), c.id(1), c.id(2)}));
  // A corrupt entry is data loss; no log is not found.
  std::vector<uint8_t> bytes = *ReadFile(dir_ + "/log");
  bytes[bytes.size() - 12] ^= 1;
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/log", bytes.data(), bytes.size()).ok());
  EXPECT_TRUE(VersionLog::NamedVersions(dir_).status().IsDataLoss());
  std::filesystem::remove(dir_ + "/log");
  EXPECT_TRUE(VersionLog::NamedVersions(dir_).status().IsNotFound());
}

TEST_F(VersionLogTest, ImageEveryNVersions) {
  Chain c = Chain::Make(5);
  VersionLogOptions o;
  o.image_every_versions = 2;
  Start(c, o);
  for (size_t k = 0; k < 5; ++k) {
    ASSERT_TRUE(ApplyDelta(*c.deltas[k], logging_.get()).ok());
    EXPECT_EQ(Images(), 1u);  // the old image removed once the log names the new one
    EXPECT_EQ(log_->versions_since_image(), (k + 1) % 2);
  }
  EXPECT_EQ(log_->stats().images, 3u);  // Create's, v2's, v4's
  Stop();
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/image-4"));
  auto r = Recover(c);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->image_version, c.id(4));
  EXPECT_EQ(r->versions_replayed, 1u);
  EXPECT_EQ(r->version, c.id(5));
  EXPECT_TRUE(r->bytes == c.images[5]);
}

TEST_F(VersionLogTest, ImageWhenTheLogPassesItsBudget) {
  Chain c = Chain::Make(2);
  VersionLogOptions o;
  o.log_budget_bytes = 1;  // any committed version passes it
  Start(c, o);
  ASSERT_TRUE(ApplyDelta(*c.deltas[0], logging_.get()).ok());
  EXPECT_EQ(log_->versions_since_image(), 0u);
  EXPECT_EQ(log_->stats().images, 2u);
  Stop();
  auto r = Recover(c);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->image_version, c.id(1));
  EXPECT_EQ(r->versions_replayed, 0u);
  EXPECT_TRUE(r->bytes == c.images[1]);
}

TEST_F(VersionLogTest, OneVersionStaysUnderTheDefaultBudget) {
  Chain c = Chain::Make(1);
  Start(c);
  ASSERT_TRUE(ApplyDelta(*c.deltas[0], logging_.get()).ok());
  EXPECT_FALSE(log_->ImageDue());
  EXPECT_LT(log_->log_size(), storage_.size());
}

TEST_F(VersionLogTest, ConcurrentAppliesReplayBitExact) {
  // Chunks applied from four threads at once, in no fixed order, as a node's apply pool does.
  Chain c = Chain::Make(2);
  Start(c);
  for (size_t k = 0; k < 2; ++k) {
    const DeltaReader& d = *c.deltas[k];
    ASSERT_TRUE(BeginDelta(d, logging_.get()).ok());
    std::atomic<size_t> next{0};
    std::atomic<bool> ok{true};
    std::vector<std::thread> pool;
    for (int t = 0; t < 4; ++t) {
      pool.emplace_back([&] {
        for (size_t i; (i = next.fetch_add(1)) < d.num_chunks();) {
          if (!logging_->ApplyRecord(d.chunk_data(i), d.chunk_size(i)).ok()) ok = false;
        }
      });
    }
    for (auto& th : pool) th.join();
    ASSERT_TRUE(ok.load());
    ASSERT_TRUE(CommitDelta(d, logging_.get()).ok());
  }
  Stop();
  auto r = Recover(c);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->version, c.id(2));
  EXPECT_TRUE(r->bytes == c.images[2]);
}

TEST_F(VersionLogTest, DeviceReceiverImagesAndReplayBitExact) {
  // A receiver on the host device backend: images are its tensors downloaded into the layout.
  Chain c = Chain::Make(3);
  auto dev = MakeDeviceReceiver(std::shared_ptr<Device>(MakeHostDevice()), *c.ckpts[0], 0);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  DeviceReceiver* drx = dev->get();
  VersionLogOptions o;
  o.image_every_versions = 2;
  auto log = VersionLog::Create(dir_, c.images[0].data(), c.images[0].size(), c.id(0), o);
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  std::vector<uint8_t> image(c.images[0].size());
  std::memcpy(image.data(), c.images[0].data(), image.size());  // the files' headers
  VersionLoggingReceiver logging(drx, log->get(), [&](VersionLog* l, const VersionId& v) {
    std::vector<ReceiverTensor> at = ImageTensors(*c.ckpts[0], image.data());
    for (size_t k = 0; k < drx->tensors().size(); ++k) {
      const DeviceReceiverTensor& t = drx->tensors()[k];
      DCR_RETURN_IF_ERROR(drx->device()->Download(at[k].data, t.data, t.info.nbytes));
    }
    return l->WriteImage(image.data(), image.size(), v);
  });
  for (size_t k = 0; k < 3; ++k) ASSERT_TRUE(ApplyDelta(*c.deltas[k], &logging).ok());
  EXPECT_EQ((*log)->stats().images, 2u);  // Create's and v2's
  log->reset();
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/image-2"));
  auto r = Recover(c);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->image_version, c.id(2));
  EXPECT_EQ(r->version, c.id(3));
  EXPECT_TRUE(r->bytes == c.images[3]);
}

TEST_F(VersionLogTest, AFailedAppendKeepsTheVersionFromCommitting) {
  // In a child process, the log file may not grow past its size after the header entry
  // (RLIMIT_FSIZE, SIGXFSZ ignored: write fails with EFBIG): the record's append fails, the
  // commit is refused, Abandon discards the version, and the store recovers the version before.
  Chain c = Chain::Make(1);
  Start(c);
  const DeltaReader& d = *c.deltas[0];
  ASSERT_TRUE(BeginDelta(d, logging_.get()).ok());
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = {log_->log_size() + 16, log_->log_size() + 16};
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) ::_exit(2);
    Status s = logging_->ApplyRecord(d.chunk_data(0), d.chunk_size(0));
    if (s.ok()) ::_exit(3);  // the append must fail
    for (size_t i = 1; i < d.num_chunks(); ++i) {
      (void)logging_->ApplyRecord(d.chunk_data(i), d.chunk_size(i));
    }
    Status commit = CommitDelta(d, logging_.get());
    if (!commit.IsFailedPrecondition()) ::_exit(4);
    if (commit.message().find("abandon") == std::string::npos) ::_exit(5);
    if (!log_->Abandon().ok()) ::_exit(6);
    ::_exit(0);
  }
  int wstatus = 0;
  ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus)) << wstatus;
  EXPECT_EQ(WEXITSTATUS(wstatus), 0);
  Stop();
  auto r = Recover(c);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->version, c.id(0));
  EXPECT_TRUE(r->bytes == c.images[0]);
}

TEST_F(VersionLogTest, OpenWithoutAStoreIsNotFound) {
  Chain c = Chain::Make(0);
  auto r = Recover(c);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsNotFound()) << r.status().ToString();
}

}  // namespace
}  // namespace dcr::internal
