// The full-checkpoint reference receiver (MakeFullReceiver), in host memory and onto a device
// (the host backend): the file image rebuilt from shuffled slices, verified byte for byte; onto a
// device, a file the device cannot hold is refused at Begin, before any slice, and a corrupt
// stream is refused at Commit with nothing loaded.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
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

}  // namespace
}  // namespace dcr
