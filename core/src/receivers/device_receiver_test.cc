// The device receiver and the device appliers on the host backend: bit-exact against a dense load
// of the target and against BufferReceiver over random layouts of every width (BF16, F16, F32,
// F8, I32, BOOL, F64 with NaN payloads and -0), change rates 0% to 100%, records applied
// concurrently; loads of files and shard directories; out of device memory; Verify's message;
// the placement applier against a serving replica's host storage.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "dcr/checkpoint.h"
#include "dcr/delta.h"
#include "dcr/device.h"
#include "dcr/receiver.h"
#include "dcr/status_macros.h"

namespace dcr {
namespace {

namespace fs = std::filesystem;

struct T {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
  int width() const { return DTypeWidth(DTypeFromName(dtype)); }
};
using Model = std::vector<T>;

// Bit patterns worth a change: NaN payloads, -0, +0, infinities (of the dtype's width).
uint64_t Special(const std::string& dtype, std::mt19937_64* rng) {
  static const std::vector<uint64_t> bf16 = {0x7FC1, 0xFF81, 0x8000, 0x0000, 0x7F80};
  static const std::vector<uint64_t> f16 = {0x7E01, 0x8000, 0x0000, 0xFC00};
  static const std::vector<uint64_t> f32 = {0x7FC00001, 0x80000000, 0, 0xFF800000};
  static const std::vector<uint64_t> f64 = {0x7FF8000000000001ULL, 0x8000000000000000ULL, 0,
                                            0xFFF0000000000000ULL};
  static const std::vector<uint64_t> f8 = {0x7F, 0x80, 0x00, 0xFF};
  static const std::vector<uint64_t> none = {};
  const std::vector<uint64_t>& v = dtype == "BF16"      ? bf16
                                   : dtype == "F16"     ? f16
                                   : dtype == "F32"     ? f32
                                   : dtype == "F64"     ? f64
                                   : dtype == "F8_E4M3" ? f8
                                                        : none;
  if (v.empty()) return (*rng)();
  return v[(*rng)() % v.size()];
}

uint64_t RandomBits(const T& t, std::mt19937_64* rng) {
  if (t.dtype == "BOOL") return (*rng)() & 1;
  const int w = t.width();
  const uint64_t m = w == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * w)) - 1;
  return ((*rng)() % 8 == 0 ? Special(t.dtype, rng) : (*rng)()) & m;
}

Model RandomModel(uint64_t seed) {
  std::mt19937_64 rng(seed);
  const char* dtypes[] = {"BF16", "F16", "F32", "F8_E4M3", "I32", "BOOL", "F64"};
  Model m;
  for (int i = 0; i < 7; ++i) {
    T t;
    t.name = "layer" + std::to_string(i) + ".w";
    t.dtype = dtypes[(i + seed) % 7];
    t.shape = {static_cast<int64_t>(1 + rng() % 64), static_cast<int64_t>(1 + rng() % 200)};
    t.bytes.resize(static_cast<size_t>(t.shape[0] * t.shape[1]) * t.width());
    for (size_t e = 0; e < t.bytes.size() / t.width(); ++e) {
      const uint64_t v = RandomBits(t, &rng);
      std::memcpy(t.bytes.data() + e * t.width(), &v, t.width());
    }
    m.push_back(std::move(t));
  }
  return m;
}

Model Next(const Model& prev, double rate, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  Model m = prev;
  for (T& t : m) {
    for (size_t e = 0; e < t.bytes.size() / t.width(); ++e) {
      if (rate < 1 && u(rng) >= rate) continue;
      const uint64_t v = RandomBits(t, &rng);
      std::memcpy(t.bytes.data() + e * t.width(), &v, t.width());
    }
  }
  return m;
}

std::vector<TensorView> Views(const Model& m) {
  std::vector<TensorView> v;
  for (const T& t : m) v.push_back({t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size()});
  return v;
}

std::unique_ptr<Checkpoint> ToCheckpoint(const Model& m) {
  auto c = Checkpoint::FromBytes(SafetensorsImage(Views(m)));
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(c).value();
}

std::unique_ptr<DeltaReader> MakeDelta(const Checkpoint& base, const Checkpoint& target,
                                       uint64_t bv, uint64_t tv, ValuePolicy policy) {
  DeltaOptions o;
  o.chunk_elems = 1 << 10;
  o.small_tensor_elems = 1 << 8;
  o.threads = 1;
  o.base_version = bv;
  o.target_version = tv;
  o.value_policy = policy;
  DeltaMemorySink sink;
  auto st = BuildDelta(&base, target, o, &sink);
  EXPECT_TRUE(st.ok()) << st.status();
  auto r = DeltaReader::FromBytes(sink.Release());
  EXPECT_TRUE(r.ok()) << r.status();
  return std::move(r).value();
}

// Every byte of a device receiver's storage, downloaded in tensor order.
std::vector<uint8_t> Download(const DeviceReceiver& rx) {
  std::vector<uint8_t> out;
  for (const DeviceReceiverTensor& t : rx.tensors()) {
    std::vector<uint8_t> h(t.info.nbytes);
    EXPECT_TRUE(rx.device()->Download(h.data(), t.data, h.size()).ok());
    out.insert(out.end(), h.begin(), h.end());
  }
  return out;
}

// The same order over a buffer receiver.
std::vector<uint8_t> Bytes(const BufferReceiver& rx) {
  std::vector<uint8_t> out;
  for (const ReceiverTensor& t : rx.tensors())
    out.insert(out.end(), t.data, t.data + t.info.nbytes);
  return out;
}

std::vector<uint8_t> Bytes(const Checkpoint& c) {
  std::vector<uint8_t> out;
  for (const TensorInfo& t : c.tensors()) out.insert(out.end(), c.data(t), c.data(t) + t.nbytes);
  return out;
}

// Records applied by four threads at once (distinct chunks).
Status ApplyConcurrently(const DeltaReader& d, Receiver* rx) {
  DCR_RETURN_IF_ERROR(BeginDelta(d, rx));
  std::atomic<size_t> next{0};
  std::vector<Status> errors(4);
  std::vector<std::thread> ts;
  for (int k = 0; k < 4; ++k) {
    ts.emplace_back([&, k] {
      for (size_t i; (i = next++) < d.num_chunks();) {
        Status s = rx->ApplyRecord(d.chunk_data(i), d.chunk_size(i));
        if (!s.ok()) errors[k] = s;
      }
    });
  }
  for (auto& t : ts) t.join();
  for (const Status& s : errors) DCR_RETURN_IF_ERROR(s);
  return CommitDelta(d, rx);
}

TEST(DeviceReceiverTest, MatchesADenseLoadAndTheBufferReceiverBitForBit) {
  const double rates[] = {0.0, 0.03, 0.5, 1.0};
  const ValuePolicy policies[] = {ValuePolicy::kAuto, ValuePolicy::kXor, ValuePolicy::kAbsolute,
                                  ValuePolicy::kAuto};
  for (uint64_t seed : {1, 2, 3}) {
    Model m = RandomModel(seed);
    auto prev = ToCheckpoint(m);
    auto dev = MakeDeviceReceiver(std::shared_ptr<Device>(MakeHostDevice()), *prev, 0);
    ASSERT_TRUE(dev.ok()) << dev.status();
    EXPECT_EQ((*dev)->held().hash, prev->ContentHash());
    auto buf = BufferReceiver::Copy(*prev, 0);
    for (int step = 1; step <= 4; ++step) {
      const std::string what = "seed " + std::to_string(seed) + " step " + std::to_string(step);
      m = Next(m, rates[step - 1], seed * 10 + step);
      auto next = ToCheckpoint(m);
      auto d = MakeDelta(*prev, *next, step - 1, step, policies[step - 1]);
      Status s = ApplyConcurrently(*d, dev->get());
      ASSERT_TRUE(s.ok()) << what << ": " << s;
      ASSERT_TRUE(ApplyDelta(*d, buf.get()).ok()) << what;
      EXPECT_EQ((*dev)->held(), buf->held()) << what;
      EXPECT_EQ(Download(**dev), Bytes(*next)) << what;
      EXPECT_EQ(Download(**dev), Bytes(*buf)) << what;
      EXPECT_TRUE((*dev)->Verify(*next).ok()) << what;
      prev = std::move(next);
    }
  }
}

// A chunk whose current bits are not the delta's base writes nothing on the device: the device
// storage is moved off the base under the receiver (one element), then every record is offered.
TEST(DeviceReceiverTest, WrongBaseBitsLeaveTheDeviceStorageUnchanged) {
  Model m0 = RandomModel(5);
  Model m1 = Next(m0, 1.0, 6);
  auto c0 = ToCheckpoint(m0), c1 = ToCheckpoint(m1);
  auto rx = MakeDeviceReceiver(std::shared_ptr<Device>(MakeHostDevice()), *c0, 0);
  ASSERT_TRUE(rx.ok());
  auto d = MakeDelta(*c0, *c1, 0, 1, ValuePolicy::kXor);
  ASSERT_TRUE(BeginDelta(*d, rx->get()).ok());
  // Every element of every tensor flipped on the device, behind the receiver's back.
  for (const DeviceReceiverTensor& t : (*rx)->tensors()) {
    std::vector<uint8_t> h(t.info.nbytes);
    ASSERT_TRUE((*rx)->device()->Download(h.data(), t.data, h.size()).ok());
    for (auto& b : h) b ^= 0x01;
    ASSERT_TRUE((*rx)->device()->Upload(t.data, h.data(), h.size()).ok());
  }
  const std::vector<uint8_t> before = Download(**rx);
  for (size_t i = 0; i < d->num_chunks(); ++i) {
    Status s = (*rx)->ApplyRecord(d->chunk_data(i), d->chunk_size(i));
    EXPECT_TRUE(s.IsFailedPrecondition()) << i << ": " << s;
  }
  EXPECT_EQ(Download(**rx), before);
  EXPECT_TRUE(CommitDelta(*d, rx->get()).IsFailedPrecondition());
}

// A full frame (no base) repairs any storage with the same inventory: committed and verified
// over a receiver holding another version, and again over the frame's own target.
TEST(DeviceReceiverTest, AFullFrameRepairsAnyVersion) {
  Model m0 = RandomModel(15);
  Model m1 = Next(m0, 0.4, 16);
  auto c0 = ToCheckpoint(m0), c1 = ToCheckpoint(m1);
  DeltaOptions o;
  o.full = true;
  o.chunk_elems = 1 << 10;
  o.threads = 1;
  o.target_version = 7;
  DeltaMemorySink sink;
  ASSERT_TRUE(BuildDelta(nullptr, *c1, o, &sink).ok());
  auto d = DeltaReader::FromBytes(sink.Release());
  ASSERT_TRUE(d.ok());
  auto rx = MakeDeviceReceiver(std::shared_ptr<Device>(MakeHostDevice()), *c0, 0);
  ASSERT_TRUE(rx.ok());
  auto buf = BufferReceiver::Copy(*c0, 0);
  for (int pass = 0; pass < 2; ++pass) {
    Status s = ApplyConcurrently(**d, rx->get());
    ASSERT_TRUE(s.ok()) << "pass " << pass << ": " << s;
    ASSERT_TRUE(ApplyDelta(**d, buf.get()).ok());
    EXPECT_EQ((*rx)->held(), buf->held());
    EXPECT_EQ((*rx)->held().number, 7u);
    EXPECT_TRUE((*rx)->Verify(*c1).ok());
    EXPECT_EQ(Download(**rx), Bytes(*c1));
  }
}

TEST(DeviceReceiverTest, LoadsFilesAndShardDirectories) {
  const fs::path dir =
      fs::temp_directory_path() / ("dcr_device_receiver_test_" + std::to_string(::getpid()) + "_" +
                                   std::to_string(std::random_device{}()));
  fs::create_directories(dir);
  Model m = RandomModel(9);
  const std::string file = (dir / "one.safetensors").string();
  const std::string shards = (dir / "shards").string();
  ASSERT_TRUE(WriteSafetensors(file, Views(m)).ok());
  ASSERT_TRUE(WriteShardedCheckpoint(shards, Views(m), 20000).ok());
  auto ck = Checkpoint::Open(shards);
  ASSERT_TRUE(ck.ok());
  ASSERT_TRUE((*ck)->sharded());
  ASSERT_GE((*ck)->files().size(), 2u);
  std::shared_ptr<Device> device = MakeHostDevice();
  for (const std::string& path : {file, shards}) {
    auto rx = MakeDeviceReceiver(device, path, 4);
    ASSERT_TRUE(rx.ok()) << path << ": " << rx.status();
    EXPECT_EQ((*rx)->held().number, 4u);
    EXPECT_EQ((*rx)->held().hash, (*ck)->ContentHash());
    EXPECT_TRUE(VerifyFile(**rx, file).ok());
    EXPECT_TRUE(VerifyFile(**rx, shards).ok());
  }
  EXPECT_TRUE(MakeDeviceReceiver(device, (dir / "absent").string()).status().IsNotFound());
  fs::remove_all(dir);
}

// A checkpoint larger than the device: kResourceExhausted naming the device, every allocation
// freed (the whole budget is then allocatable).
TEST(DeviceReceiverTest, OutOfDeviceMemoryAtLoadFreesEverything) {
  Model m = RandomModel(11);
  auto c = ToCheckpoint(m);
  HostDeviceOptions o;
  o.memory_bytes = c->total_tensor_bytes() - 1;
  std::shared_ptr<Device> device = MakeHostDevice(o);
  auto rx = MakeDeviceReceiver(device, *c, 0);
  ASSERT_FALSE(rx.ok());
  EXPECT_EQ(rx.status().code(), StatusCode::kResourceExhausted) << rx.status();
  EXPECT_NE(rx.status().message().find("out of device memory on host"), std::string::npos)
      << rx.status();
  auto all = device->Allocate(o.memory_bytes);
  EXPECT_TRUE(all.ok()) << all.status();
  device->Free(*all);
  // With room for the checkpoint but not for Verify's scratch, Verify reports it, storage intact.
  o.memory_bytes = c->total_tensor_bytes();
  std::shared_ptr<Device> tight = MakeHostDevice(o);
  auto fits = MakeDeviceReceiver(tight, *c, 0);
  ASSERT_TRUE(fits.ok()) << fits.status();
  Status v = (*fits)->Verify(*c);
  EXPECT_EQ(v.code(), StatusCode::kResourceExhausted) << v;
  EXPECT_EQ(Download(**fits), Bytes(*c));
}

TEST(DeviceReceiverTest, VerifyNamesTheFirstDifferingTensorAndByte) {
  Model m = RandomModel(13);
  auto c = ToCheckpoint(m);
  auto rx = MakeDeviceReceiver(std::shared_ptr<Device>(MakeHostDevice()), *c, 0);
  ASSERT_TRUE(rx.ok());
  Model other = m;
  T& t = other[3];
  const size_t byte = t.bytes.size() / 2;
  t.bytes[byte] ^= 0x10;
  Status s = (*rx)->Verify(*ToCheckpoint(other));
  ASSERT_TRUE(s.IsDataLoss()) << s;
  EXPECT_NE(s.message().find("tensor '" + t.name + "'"), std::string::npos) << s;
  EXPECT_NE(s.message().find("(byte " + std::to_string(byte) + ")"), std::string::npos) << s;
  other = m;
  other.pop_back();
  EXPECT_TRUE((*rx)->Verify(*ToCheckpoint(other)).IsDataLoss());
}

}  // namespace
}  // namespace dcr
