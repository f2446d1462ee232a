// The full-checkpoint reference stream signed (FullStreamSigner) and received through
// WithPlanFullTrust: the signed stream commits byte for byte, also with slices before their
// manifest; an unsigned stream, another signer, another version or run, and an altered slice are
// refused before they reach the file image.
#include "node/node_trust.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/node.h"
#include "dcr/transport.h"

namespace dcr::internal {
namespace {

struct Stream {
  std::vector<uint8_t> header, trailer;
  std::vector<std::vector<uint8_t>> records;
};

class FullStreamTrust : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dcr-full-trust-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    data_.resize(3 * 70000);
    for (size_t i = 0; i < data_.size(); ++i) data_[i] = static_cast<uint8_t>(i * 7 + (i >> 9));
    path_ = dir_ + "/t.safetensors";
    ASSERT_TRUE(
        WriteSafetensors(path_, {{"w", "BF16", {3, 35000}, data_.data(), data_.size()}}).ok());
    for (const char* who : {"trainer", "other"}) {
      auto k = SigningKey::Generate();
      ASSERT_TRUE(k.ok());
      const std::string key = dir_ + "/" + who + ".key", pub = dir_ + "/" + who + ".pub";
      ASSERT_TRUE((*k)->Write(key, pub).ok());
      keys_.push_back(std::move(*k));
    }
  }
  void TearDown() override {
    for (const char* f :
         {"/t.safetensors", "/trainer.key", "/trainer.pub", "/other.key", "/other.pub"}) {
      unlink((dir_ + f).c_str());
    }
    rmdir(dir_.c_str());
  }

  // The stream of the file in 16 KiB slices, signed by key `k` (-1: unsigned) for run 7.
  Stream Make(int k, uint64_t version = 3) {
    Stream st;
    auto collect = [&st](BlobKind kind, std::vector<uint8_t> b) {
      if (kind == BlobKind::kHeader)
        st.header = std::move(b);
      else if (kind == BlobKind::kTrailer)
        st.trailer = std::move(b);
      else
        st.records.push_back(std::move(b));
      return Status();
    };
    Status s;
    if (k < 0) {
      s = FullStreamBlobs(path_, 16 << 10, collect);
    } else {
      FullStreamSigner signer(keys_[k].get(), 7, version, collect, 4);
      s = FullStreamBlobs(path_, 16 << 10, [&](BlobKind kind, std::vector<uint8_t> b) {
        return signer(kind, std::move(b));
      });
    }
    EXPECT_TRUE(s.ok()) << s;
    return st;
  }

  std::unique_ptr<Receiver> Receive(uint64_t version = 3, uint64_t run = 7) {
    NodePlan p;
    p.trust_key = dir_ + "/trainer.pub";
    p.run_id = run;
    p.version = version;
    auto r = WithPlanFullTrust(p, MakeFullReceiver());
    EXPECT_TRUE(r.ok()) << r.status();
    return std::move(*r);
  }

  static Status Deliver(Receiver* r, const Stream& st) {
    Status s = r->Begin(st.header.data(), st.header.size());
    for (size_t i = 0; s.ok() && i < st.records.size(); ++i) {
      s = r->ApplyRecord(st.records[i].data(), st.records[i].size());
    }
    return s.ok() ? r->Commit(st.trailer.data(), st.trailer.size()) : s;
  }

  std::string dir_, path_;
  std::vector<uint8_t> data_;
  std::vector<std::unique_ptr<SigningKey>> keys_;
};

TEST_F(FullStreamTrust, SignedStreamCommitsAlsoOutOfOrder) {
  Stream st = Make(0);
  const size_t slices = 1 + (data_.size() - 1) / (16 << 10);
  const size_t manifests = std::count_if(st.records.begin(), st.records.end(), [](const auto& r) {
    uint64_t v;
    std::memcpy(&v, r.data(), 8);
    return v == kFullManifestMark;
  });
  EXPECT_GE(st.records.size(), slices + manifests);
  EXPECT_EQ(manifests, (slices + 3) / 4 + (slices % 4 == 0 ? 1 : 0));
  auto t = Checkpoint::Open(path_);
  ASSERT_TRUE(t.ok());
  auto r = Receive();
  Status s = Deliver(r.get(), st);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(r->Verify(**t).ok());
  std::reverse(st.records.begin(), st.records.end());  // every slice before its manifest
  auto r2 = Receive();
  s = Deliver(r2.get(), st);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(r2->Verify(**t).ok());
  // A receiver without a key skips the manifests.
  NodePlan plain;
  auto r3 = WithPlanFullTrust(plain, MakeFullReceiver());
  ASSERT_TRUE(r3.ok());
  EXPECT_TRUE(Deliver(r3->get(), Make(0)).ok());
}

TEST_F(FullStreamTrust, UnsignedForgedAlteredAndReplayedStreamsAreRefused) {
  {  // unsigned
    auto r = Receive();
    Status s = Deliver(r.get(), Make(-1));
    EXPECT_TRUE(s.IsFailedPrecondition()) << s;
    EXPECT_NE(s.message().find("not signed"), std::string::npos) << s;
  }
  {  // another key
    auto r = Receive();
    Status s = Deliver(r.get(), Make(1));
    EXPECT_TRUE(s.IsFailedPrecondition()) << s;
    EXPECT_NE(s.message().find("not by the trusted key"), std::string::npos) << s;
  }
  {  // a slice altered
    Stream st = Make(0);
    st.records[2].back() ^= 0x01;  // records[0] is a manifest, [1..4] its slices
    auto r = Receive();
    Status s = Deliver(r.get(), st);
    EXPECT_TRUE(s.IsFailedPrecondition()) << s;
    EXPECT_NE(s.message().find("not the one its signed manifest lists"), std::string::npos) << s;
  }
  {  // a correctly signed stream of version 2 replayed where version 3 is expected; another run
    auto r = Receive(3);
    Status s = Deliver(r.get(), Make(0, 2));
    EXPECT_TRUE(s.IsFailedPrecondition()) << s;
    auto o = Receive(3, 8);
    s = Deliver(o.get(), Make(0));
    EXPECT_TRUE(s.IsFailedPrecondition()) << s;
    EXPECT_NE(s.message().find("run 7"), std::string::npos) << s;
  }
  {  // a slice dropped: the final manifest's count is not met
    Stream st = Make(0);
    st.records.erase(st.records.begin() + 1);
    auto r = Receive();
    Status s = Deliver(r.get(), st);
    EXPECT_FALSE(s.ok());
  }
}

}  // namespace
}  // namespace dcr::internal
