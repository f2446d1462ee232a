// The full-checkpoint reference receiver (MakeFullReceiver), in host memory and onto a device
// (the host backend): the file image rebuilt from shuffled slices, verified byte for byte; onto a
// device, a file the device cannot hold is refused at Begin, before any slice, and a corrupt
// stream is refused at Commit with nothing loaded. Sizes a header claims are bounded before any
// memory is committed: a header whose file size its safetensors header does not give is refused,
// a consistent 16 TiB claim costs no resident memory, and a stream missing a slice is refused.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "dcr/checkpoint.h"
#include "dcr/device.h"
#include "dcr/receiver.h"
#include "dcr/transport.h"

namespace dcr {
namespace {

struct Files {
  std::string dir, a, b;  // b: a with one byte of the second tensor flipped
  uint64_t bytes = 0;     // size of a
};

const Files& TwoCheckpoints() {
  static Files* f = [] {
    auto* out = new Files;
    char tmpl[] = "/tmp/dcr_full_rx_XXXXXX";
    out->dir = mkdtemp(tmpl);
    std::mt19937_64 rng(7);
    std::vector<uint8_t> x(2 * 300 * 256), y(4 * 1000);
    for (auto& v : x) v = static_cast<uint8_t>(rng());
    for (auto& v : y) v = static_cast<uint8_t>(rng());
    auto write = [&](const std::string& path) {
      Status s = WriteSafetensors(path, {{"x.weight", "BF16", {300, 256}, x.data(), x.size()},
                                         {"y.bias", "F32", {1000}, y.data(), y.size()}});
      EXPECT_TRUE(s.ok()) << s;
    };
    out->a = out->dir + "/a.safetensors";
    out->b = out->dir + "/b.safetensors";
    write(out->a);
    y[123] ^= 0x10;
    write(out->b);
    auto c = Checkpoint::Open(out->a);
    EXPECT_TRUE(c.ok());
    out->bytes = c.ok() ? (*c)->files()[0].size : 0;
    return out;
  }();
  return *f;
}

struct Stream {
  std::vector<uint8_t> header, trailer;
  std::vector<std::vector<uint8_t>> slices;
};

Stream StreamOf(const std::string& path) {
  Stream s;
  Status st = FullStreamBlobs(path, 4096, [&](BlobKind k, std::vector<uint8_t> b) {
    if (k == BlobKind::kHeader) s.header = std::move(b);
    if (k == BlobKind::kChunk) s.slices.push_back(std::move(b));
    if (k == BlobKind::kTrailer) s.trailer = std::move(b);
    return Status();
  });
  EXPECT_TRUE(st.ok()) << st;
  std::shuffle(s.slices.begin(), s.slices.end(), std::mt19937_64(3));
  return s;
}

Status Receive(const Stream& s, Receiver* rx) {
  Status st = rx->Begin(s.header.data(), s.header.size());
  for (const auto& b : s.slices) {
    if (st.ok()) st = rx->ApplyRecord(b.data(), b.size());
  }
  if (st.ok()) st = rx->Commit(s.trailer.data(), s.trailer.size());
  return st;
}

TEST(FullReceiver, HostAndDeviceVerifyTheImage) {
  const Files& f = TwoCheckpoints();
  const Stream s = StreamOf(f.a);
  ASSERT_GT(s.slices.size(), 10u);
  std::shared_ptr<Device> device = MakeHostDevice();
  std::vector<std::unique_ptr<Receiver>> receivers;
  receivers.push_back(MakeFullReceiver());
  receivers.push_back(MakeFullReceiver(device));
  for (const auto& rx : receivers) {
    Status st = Receive(s, rx.get());
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_FALSE(rx->in_delta());
    EXPECT_TRUE(VerifyFile(*rx, f.a).ok());
    Status other = VerifyFile(*rx, f.b);
    EXPECT_FALSE(other.ok());
    EXPECT_NE(other.ToString().find("y.bias"), std::string::npos) << other;
  }
}

TEST(FullReceiver, DeviceTooSmallIsRefusedAtBegin) {
  const Files& f = TwoCheckpoints();
  const Stream s = StreamOf(f.a);
  HostDeviceOptions o;
  o.memory_bytes = f.bytes - 1;
  auto rx = MakeFullReceiver(MakeHostDevice(o));
  Status st = rx->Begin(s.header.data(), s.header.size());
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st;
  EXPECT_NE(st.ToString().find("full stream onto host"), std::string::npos) << st;
  EXPECT_FALSE(rx->in_delta());
  EXPECT_FALSE(VerifyFile(*rx, f.a).ok());  // nothing was loaded
  // Room for the file's tensors (each rounded up to 256 B) and Verify's scratch (the largest).
  o.memory_bytes = 2 * f.bytes;
  auto fits = MakeFullReceiver(MakeHostDevice(o));
  Status fit = Receive(s, fits.get());
  EXPECT_TRUE(fit.ok()) << fit << " (file " << f.bytes << " B)";
  Status v = VerifyFile(*fits, f.a);
  EXPECT_TRUE(v.ok()) << v;
}

TEST(FullReceiver, CorruptSliceIsRefusedAtCommitOnTheDevice) {
  const Files& f = TwoCheckpoints();
  Stream s = StreamOf(f.a);
  s.slices[2].back() ^= 1;
  auto rx = MakeFullReceiver(MakeHostDevice());
  Status st = Receive(s, rx.get());
  EXPECT_TRUE(st.IsDataLoss()) << st;
  EXPECT_FALSE(VerifyFile(*rx, f.a).ok());
}

long MaxRssKiB() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

// A full-stream header blob: file size, then the safetensors header (length and JSON).
std::vector<uint8_t> Header(uint64_t file_size, const std::string& json) {
  std::vector<uint8_t> h(16 + json.size());
  const uint64_t n = json.size();
  std::memcpy(h.data(), &file_size, 8);
  std::memcpy(h.data() + 8, &n, 8);
  std::memcpy(h.data() + 16, json.data(), n);
  return h;
}

TEST(FullReceiver, ClaimedSizesAreBoundedBeforeMemoryIsCommitted) {
  const long before = MaxRssKiB();
  // 24 bytes claiming a 4.2 GB file: its (empty) safetensors header describes 16 bytes.
  const std::vector<uint8_t> small = Header(4200000000u, "{}      ");
  ASSERT_EQ(small.size(), 24u);
  auto rx = MakeFullReceiver();
  Status st = rx->Begin(small.data(), small.size());
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st;
  EXPECT_NE(st.ToString().find("claims a file of 4200000000 bytes"), std::string::npos) << st;
  EXPECT_FALSE(rx->in_delta());
  // A header shorter than its length field says, and a 16 TiB claim with nothing behind it.
  std::vector<uint8_t> cut = Header(1u << 20, "{}");
  cut.pop_back();
  EXPECT_EQ(rx->Begin(cut.data(), cut.size()).code(), StatusCode::kDataLoss);
  const std::vector<uint8_t> huge = Header(uint64_t{1} << 44, "{}");
  EXPECT_EQ(rx->Begin(huge.data(), huge.size()).code(), StatusCode::kDataLoss);
  // A consistent claim of 16 TiB minus its header (one U8 tensor): refused for want of address
  // space or reserved without resident memory; either way no slice means no commit.
  const uint64_t json_pad = 128;
  const uint64_t data = (uint64_t{1} << 44) - 8 - json_pad;
  std::string json = "{\"x\": {\"dtype\": \"U8\", \"shape\": [" + std::to_string(data) +
                     "], \"data_offsets\": [0, " + std::to_string(data) + "]}}";
  json.resize(json_pad, ' ');
  const std::vector<uint8_t> big = Header(uint64_t{1} << 44, json);
  Status b = rx->Begin(big.data(), big.size());
  EXPECT_TRUE(b.ok() || b.code() == StatusCode::kResourceExhausted) << b;
  if (b.ok()) {
    const uint64_t off = 8 + json_pad;
    std::vector<uint8_t> slice(8 + 4096, 7);
    std::memcpy(slice.data(), &off, 8);
    EXPECT_TRUE(rx->ApplyRecord(slice.data(), slice.size()).ok());
    std::vector<uint8_t> trailer(24, 0);
    const uint64_t size = uint64_t{1} << 44;
    std::memcpy(trailer.data(), &size, 8);
    Status c = rx->Commit(trailer.data(), trailer.size());
    EXPECT_EQ(c.code(), StatusCode::kDataLoss) << c;
    EXPECT_NE(c.ToString().find("no slice brought bytes"), std::string::npos) << c;
    rx->Abort();
  }
  EXPECT_LT(MaxRssKiB() - before, 64 << 10) << "a claimed size was committed to memory";
}

TEST(FullReceiver, AMissingSliceIsRefusedAtCommit) {
  const Files& f = TwoCheckpoints();
  Stream s = StreamOf(f.a);
  s.slices.erase(s.slices.begin() + 3);
  auto rx = MakeFullReceiver();
  Status st = Receive(s, rx.get());
  EXPECT_TRUE(st.IsDataLoss()) << st;
}

}  // namespace
}  // namespace dcr
