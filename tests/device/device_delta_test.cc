// Deltas built on a Device, one suite for every backend (compiled into dcr_device_host_tests and,
// with CUDA, dcr_device_cuda_tests, as device_backend_test.cc): BuildDeltaOnDevice,
// BuildDeltaFiles and BuildDeltaFromDevice write the same bytes as BuildDelta for random layouts,
// dtypes, special values (NaN, -0, inf), change rates from none to all, options and sharded
// targets; TrainDeltaBuilder's units built on the device the same bytes as its host units; device
// errors are Status values with no output.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>

#include "dcr/delta.h"
#include "dcr/device.h"
#include "dcr/dtype.h"
#include "dcr/testing/device_fixtures.h"
#include "dcr/testing/fixtures.h"
#include "dcr/testing/reference_trainer.h"
#include "dcr/train.h"

namespace dcr {
namespace {

namespace fs = std::filesystem;

constexpr DeviceKind kKind = testing::kTestDeviceKind;
#define OPEN_DEVICE_OR_SKIP(var) DCR_OPEN_TEST_DEVICE_OR_SKIP(var)

using dcr::testing::OwnedTensor;
using dcr::testing::TempDir;
using dcr::testing::Views;

void StoreBits(uint8_t* p, int w, uint64_t i, uint64_t bits) {
  std::memcpy(p + i * static_cast<uint64_t>(w), &bits, static_cast<size_t>(w));  // little-endian
}

// Bit patterns that compare equal or unordered as floats but differ as bits: NaNs, signed zeros,
// infinities, per element width.
std::vector<uint64_t> SpecialBits(int w) {
  switch (w) {
    case 2:
      return {0x7FC0, 0x7FC1, 0xFFC0, 0x8000, 0x0000, 0x7F80, 0xFF80, 0x7E00, 0xFC00};
    case 4:
      return {0x7FC00000, 0x7FC00001, 0xFFC00000, 0x80000000, 0, 0x7F800000, 0xFF800000};
    case 8:
      return {0x7FF8000000000000, 0x7FF8000000000001, 0x8000000000000000, 0,
              0x7FF0000000000000, 0xFFF0000000000000};
    default:
      return {0x00, 0x80, 0x7F, 0xFF};
  }
}

// Random tensors of every width (small ones batched into shared cells, large ones split into
// several), special values in the base, and a target in which a `rate` share of the elements
// change (to random bits or to another special pattern).
void MakePair(std::mt19937_64& rng, double rate, std::vector<OwnedTensor>* base,
              std::vector<OwnedTensor>* target) {
  const char* dtypes[] = {"BF16", "F16", "F32", "F64", "F8_E4M3", "I32", "U8", "BOOL", "I64"};
  const int nt = 1 + static_cast<int>(rng() % 12);
  for (int i = 0; i < nt; ++i) {
    OwnedTensor t;
    t.name = "layers." + std::to_string(rng() % 100) + "." + std::to_string(i) + ".w";
    t.dtype = dtypes[rng() % 9];
    const int w = DTypeWidth(DTypeFromName(t.dtype));
    const int64_t rows = 1 + static_cast<int64_t>(rng() % 64);
    const int64_t cols = static_cast<int64_t>(rng() % 4 == 0 ? 1 + rng() % 3000 : rng() % 50);
    t.shape = {rows, cols};
    const uint64_t n = static_cast<uint64_t>(rows * cols);
    t.bytes.resize(n * static_cast<uint64_t>(w));
    for (auto& b : t.bytes) b = static_cast<uint8_t>(rng());
    const std::vector<uint64_t> special = SpecialBits(w);
    for (uint64_t e = 0; e < n; ++e) {
      if (rng() % 8 == 0) StoreBits(t.bytes.data(), w, e, special[rng() % special.size()]);
    }
    OwnedTensor u = t;
    for (uint64_t e = 0; e < n; ++e) {
      if (std::uniform_real_distribution<double>(0, 1)(rng) >= rate) continue;
      uint64_t old_bits = 0;
      std::memcpy(&old_bits, u.bytes.data() + e * static_cast<uint64_t>(w), static_cast<size_t>(w));
      uint64_t bits = rng() % 2 == 0 ? special[rng() % special.size()] : rng();
      const uint64_t mask = w == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * w)) - 1;
      if (((bits ^ old_bits) & mask) == 0) bits = old_bits ^ 1;  // a change is a change of bits
      StoreBits(u.bytes.data(), w, e, bits);
    }
    base->push_back(std::move(t));
    target->push_back(std::move(u));
  }
}

std::unique_ptr<Checkpoint> InMemory(const std::vector<OwnedTensor>& ts) {
  auto c = Checkpoint::FromBytes(SafetensorsImage(Views(ts)));
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return std::move(*c);
}

// Tensors copied into allocations of `device`, freed with it.
class Resident {
 public:
  Resident(Device* device, const Checkpoint& ckpt, const Inventory& inv) : device_(device) {
    for (const TensorInfo& t : inv.tensors) {
      const TensorInfo* c = ckpt.Find(t.name);
      StatusOr<void*> p = device->Allocate(c->nbytes);
      EXPECT_TRUE(p.ok()) << p.status().ToString();
      EXPECT_TRUE(device->Upload(*p, ckpt.data(*c), c->nbytes).ok());
      ptrs_.push_back(*p);
    }
  }
  ~Resident() {
    for (void* p : ptrs_) device_->Free(p);
  }
  std::vector<const void*> addresses() const { return {ptrs_.begin(), ptrs_.end()}; }

 private:
  Device* device_;
  std::vector<void*> ptrs_;
};

DeltaOptions RandomOptions(std::mt19937_64& rng) {
  DeltaOptions o;
  o.chunk_elems = 1 + rng() % 5000;
  o.small_tensor_elems = rng() % 3000;
  o.zstd_level = 1 + static_cast<int>(rng() % 3);
  o.threads = 1 + static_cast<int>(rng() % 4);
  const ValuePolicy policies[] = {ValuePolicy::kAuto, ValuePolicy::kXor, ValuePolicy::kUlpDelta,
                                  ValuePolicy::kAbsolute};
  o.value_policy = policies[rng() % 4];
  o.emit_unchanged = rng() % 4 == 0;
  o.collect_entropy = rng() % 2 == 0;
  o.full = rng() % 8 == 0;
  o.base_version = rng() % 10;
  o.target_version = o.base_version + 1;
  return o;
}

void ExpectSameStats(const DeltaStats& a, const DeltaStats& b) {
  EXPECT_EQ(a.changed, b.changed);
  EXPECT_EQ(a.chunks, b.chunks);
  EXPECT_EQ(a.payload_bytes, b.payload_bytes);
  EXPECT_EQ(a.base_hash, b.base_hash);
  EXPECT_EQ(a.target_hash, b.target_hash);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    EXPECT_EQ(a.tensors[i].changed, b.tensors[i].changed) << a.tensors[i].name;
    EXPECT_EQ(a.tensors[i].payload_bytes, b.tensors[i].payload_bytes) << a.tensors[i].name;
  }
}

TEST(DeviceDeltaTest, SameBytesAsTheHostScanOverRandomInputs) {
  OPEN_DEVICE_OR_SKIP(device);
  const double rates[] = {0.0, 0.0005, 0.01, 0.2, 0.7, 1.0};
  int built = 0;
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    std::mt19937_64 rng(seed);
    const double rate = rates[seed % 6];
    std::vector<OwnedTensor> b, t;
    MakePair(rng, rate, &b, &t);
    const DeltaOptions o = RandomOptions(rng);
    SCOPED_TRACE("seed " + std::to_string(seed) + " rate " + std::to_string(rate) + " chunk " +
                 std::to_string(o.chunk_elems) + " small " + std::to_string(o.small_tensor_elems) +
                 (o.full ? " full" : ""));
    auto base = InMemory(b);
    auto target = InMemory(t);

    DeltaMemorySink host_sink;
    StatusOr<DeltaStats> host = BuildDelta(base.get(), *target, o, &host_sink);
    ASSERT_TRUE(host.ok()) << host.status().ToString();

    DeltaMemorySink up_sink;
    StatusOr<DeltaStats> up = BuildDeltaOnDevice(base.get(), *target, o, device.get(), &up_sink);
    ASSERT_TRUE(up.ok()) << up.status().ToString();
    EXPECT_TRUE(up_sink.bytes() == host_sink.bytes());
    ExpectSameStats(*host, *up);

    DeviceDeltaInputs in;
    in.inventory = Inventory::FromCheckpoint(*target);
    Resident rb(device.get(), *base, in.inventory), rt(device.get(), *target, in.inventory);
    if (!o.full || rng() % 2 == 0) in.base = rb.addresses();
    in.target = rt.addresses();
    DeltaMemorySink res_sink;
    StatusOr<DeltaStats> res = BuildDeltaFromDevice(in, o, device.get(), &res_sink);
    ASSERT_TRUE(res.ok()) << res.status().ToString();
    EXPECT_TRUE(res_sink.bytes() == host_sink.bytes());
    ExpectSameStats(*host, *res);
    ++built;
  }
  EXPECT_EQ(built, 60);
}

TEST(DeviceDeltaTest, KnownBaseHashIsUsedAsGiven) {
  OPEN_DEVICE_OR_SKIP(device);
  std::mt19937_64 rng(7);
  std::vector<OwnedTensor> b, t;
  MakePair(rng, 0.1, &b, &t);
  auto base = InMemory(b);
  auto target = InMemory(t);
  DeltaOptions o;
  o.chunk_elems = 700;
  o.known_base_hash = base->ContentHash(1);
  DeltaMemorySink host_sink, dev_sink;
  ASSERT_TRUE(BuildDelta(base.get(), *target, o, &host_sink).ok());
  DeviceDeltaInputs in;
  in.inventory = Inventory::FromCheckpoint(*target);
  Resident rb(device.get(), *base, in.inventory), rt(device.get(), *target, in.inventory);
  in.base = rb.addresses();
  in.target = rt.addresses();
  ASSERT_TRUE(BuildDeltaFromDevice(in, o, device.get(), &dev_sink).ok());
  EXPECT_TRUE(dev_sink.bytes() == host_sink.bytes());
}

TEST(DeviceDeltaTest, ShardedTargetFromFilesSameBytes) {
  OPEN_DEVICE_OR_SKIP(device);
  TempDir dir;
  for (uint64_t seed = 100; seed < 106; ++seed) {
    std::mt19937_64 rng(seed);
    std::vector<OwnedTensor> b, t;
    MakePair(rng, seed % 2 ? 0.05 : 1.0, &b, &t);
    const std::string base_path = dir / ("base" + std::to_string(seed) + ".safetensors");
    const std::string target_dir = dir / ("target" + std::to_string(seed));
    ASSERT_TRUE(WriteSafetensors(base_path, Views(b)).ok());
    ASSERT_TRUE(WriteShardedCheckpoint(target_dir, Views(t), 1 + rng() % 20000).ok());
    DeltaOptions o = RandomOptions(rng);
    o.full = false;
    DeltaMemorySink host_sink, dev_sink;
    auto host = BuildDeltaFiles(base_path, target_dir, o, nullptr, &host_sink);
    ASSERT_TRUE(host.ok()) << host.status().ToString();
    auto dev = BuildDeltaFiles(base_path, target_dir, o, device.get(), &dev_sink);
    ASSERT_TRUE(dev.ok()) << dev.status().ToString();
    EXPECT_TRUE(dev_sink.bytes() == host_sink.bytes()) << "seed " << seed;
    ExpectSameStats(*host, *dev);
    // And the same as BuildDelta over the opened checkpoints.
    auto bc = Checkpoint::Open(base_path);
    auto tc = Checkpoint::Open(target_dir);
    ASSERT_TRUE(bc.ok() && tc.ok());
    ASSERT_TRUE((*tc)->sharded());
    DeltaMemorySink plain;
    ASSERT_TRUE(BuildDelta(bc->get(), **tc, o, &plain).ok());
    EXPECT_TRUE(plain.bytes() == host_sink.bytes());
  }
}

// The host backend with a memory limit stands for a full GPU.
TEST(DeviceDeltaTest, OutOfDeviceMemoryIsAStatusAndLeavesNoFile) {
  if (kKind != DeviceKind::kHost) GTEST_SKIP() << "a memory limit is a host backend option";
  HostDeviceOptions small;
  small.memory_bytes = 1024;  // less than two cells of 2^12 BF16 elements
  std::unique_ptr<Device> device = MakeHostDevice(small);
  std::mt19937_64 rng(3);
  std::vector<OwnedTensor> b = {{"w", "BF16", {64, 100}, std::vector<uint8_t>(12800)}};
  for (auto& x : b[0].bytes) x = static_cast<uint8_t>(rng());
  std::vector<OwnedTensor> t = b;
  t[0].bytes[10] ^= 1;
  auto base = InMemory(b);
  auto target = InMemory(t);
  TempDir dir;
  const std::string out = dir / "out.dcr";
  DeltaOptions o;
  o.chunk_elems = 4096;
  {
    DeltaFileSink sink(out);
    StatusOr<DeltaStats> st = BuildDeltaOnDevice(base.get(), *target, o, device.get(), &sink);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.status().code(), StatusCode::kResourceExhausted) << st.status().ToString();
    EXPECT_NE(st.status().message().find("out of device memory"), std::string::npos)
        << st.status().ToString();
    EXPECT_NE(st.status().message().find("on device host"), std::string::npos)
        << st.status().ToString();
  }
  EXPECT_FALSE(fs::exists(out));
  for (const auto& e : fs::directory_iterator(dir.path)) ADD_FAILURE() << "left " << e.path();
}

TEST(DeviceDeltaTest, ResidentAddressesMustMatchTheInventory) {
  OPEN_DEVICE_OR_SKIP(device);
  std::vector<OwnedTensor> b = {{"a", "F32", {4}, std::vector<uint8_t>(16)},
                                {"b", "F32", {4}, std::vector<uint8_t>(16)}};
  auto target = InMemory(b);
  DeviceDeltaInputs in;
  in.inventory = Inventory::FromCheckpoint(*target);
  Resident r(device.get(), *target, in.inventory);
  in.base = r.addresses();
  in.target = r.addresses();
  in.target.pop_back();
  DeltaMemorySink sink;
  StatusOr<DeltaStats> st = BuildDeltaFromDevice(in, DeltaOptions{}, device.get(), &sink);
  EXPECT_TRUE(st.status().IsInvalidArgument()) << st.status().ToString();
  EXPECT_TRUE(sink.bytes().empty());
  in.target = r.addresses();
  in.base[1] = nullptr;
  st = BuildDeltaFromDevice(in, DeltaOptions{}, device.get(), &sink);
  EXPECT_TRUE(st.status().IsInvalidArgument()) << st.status().ToString();
  EXPECT_NE(st.status().message().find("'b'"), std::string::npos) << st.status().ToString();
  in.base = r.addresses();
  st = BuildDeltaFromDevice(in, DeltaOptions{}, nullptr, &sink);
  EXPECT_TRUE(st.status().IsInvalidArgument()) << st.status().ToString();
  EXPECT_TRUE(sink.bytes().empty());
  // Host addresses are not device addresses: the host backend refuses them as a GPU would.
  if (kKind != DeviceKind::kHost) return;
  in.base = {b[0].bytes.data(), b[1].bytes.data()};
  st = BuildDeltaFromDevice(in, DeltaOptions{}, device.get(), &sink);
  EXPECT_FALSE(st.ok());
}

// ---- per-rank train deltas ----

ModelConfig DenseConfig() {
  ModelConfig c;
  c.name = "t-dense";
  c.vocab = 250;
  c.hidden = 64;
  c.layers = 4;
  c.heads = 16;
  c.kv_heads = 8;
  c.head_dim = 4;
  c.intermediate = 96;
  return c;
}

ModelConfig MoeConfig() {
  ModelConfig c = DenseConfig();
  c.name = "t-moe";
  c.vocab = 200;
  c.experts = 8;
  c.moe_intermediate = 16;
  c.shared_experts = 1;
  c.experts_per_token = 2;
  c.first_dense_layers = 1;
  c.qk_norm = true;
  return c;
}

struct Rig {
  std::shared_ptr<const TrainStructure> s;
  std::shared_ptr<const Exporter> ex;
  std::shared_ptr<const LayoutMap> map;
  std::unique_ptr<TrainState> state;
};

Rig Make(const ModelConfig& cfg, const TrainLayout& l, uint64_t seed) {
  Rig st;
  auto s = TrainStructure::Create(cfg, l);
  EXPECT_TRUE(s.ok()) << s.status() << " layout " << l.ToString();
  if (!s.ok()) return st;
  st.s = *s;
  st.ex = std::make_shared<ReferenceExporter>(st.s);
  auto m = LayoutMap::Discover(*st.ex, 2);
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return st;
  st.map = *m;
  TrainOptions to;
  to.seed = seed;
  to.threads = 2;
  to.warmup_steps = 2;
  auto state = TrainState::Create(st.s, to);
  EXPECT_TRUE(state.ok()) << state.status();
  if (state.ok()) st.state = std::move(*state);
  return st;
}

// Steps that change everything, some parameters or nothing: the units built on `device` give the
// host units' delta bytes and statistics.
void ExpectSameSteps(Rig& st, const TrainDeltaOptions& o, Device* device) {
  auto host = TrainDeltaBuilder::Create(st.s, st.map, st.ex, st.state->shards(), o);
  auto dev = TrainDeltaBuilder::Create(st.s, st.map, st.ex, st.state->shards(), o);
  ASSERT_TRUE(host.ok() && dev.ok());
  const std::function<bool(const LocalParam&)> filters[] = {
      nullptr, [](const LocalParam& p) { return p.name.find("mlp") != std::string::npos; },
      [](const LocalParam&) { return false; }};
  for (const auto& filter : filters) {
    ShardSet prev = st.state->shards();
    st.state->Step(filter);
    DeltaMemorySink hs, ds;
    auto a = (*host)->BuildStep(prev, st.state->shards(), &hs);
    ASSERT_TRUE(a.ok()) << a.status();
    auto b = (*dev)->BuildStepOnDevice(prev, st.state->shards(), device, &ds);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_GT(hs.bytes().size(), 0u);
    EXPECT_TRUE(hs.bytes() == ds.bytes());
    EXPECT_EQ(a->affine_changes, b->affine_changes);
    EXPECT_EQ(a->residual_tensors_exported, b->residual_tensors_exported);
    EXPECT_EQ(a->scanned_bytes, b->scanned_bytes);
    EXPECT_EQ(a->target_hash, b->target_hash);
  }
}

// Random layouts: strided and transposed pieces (changes found out of position order), residual
// tensors, several chunk sizes.
TEST(DeviceTrainDeltaTest, UnitsGiveTheSameBytes) {
  OPEN_DEVICE_OR_SKIP(device);
  std::mt19937_64 rng(20261201);
  auto pick = [&](std::vector<int> v) { return v[rng() % v.size()]; };
  for (int i = 0; i < 10; ++i) {
    const bool moe = i % 2 == 0;
    TrainLayout l;
    l.tp = pick({1, 2, 4});
    l.pp = pick({1, 2});
    l.ep = moe ? pick({1, 2, 4}) : 1;
    l.dp = pick({1, 2, 3});
    l.dist_opt = rng() % 2;
    l.tied = static_cast<int>(rng() % 2);
    l.fold_layers = static_cast<int>(rng() % 2);
    l.vocab_pad = pick({1, 8, 128});
    TrainDeltaOptions o;
    o.chunk_elems = static_cast<uint64_t>(pick({97, 1000, 1 << 22}));
    o.threads = pick({1, 3});
    SCOPED_TRACE(l.ToString() + " chunk=" + std::to_string(o.chunk_elems));
    Rig st = Make(moe ? MoeConfig() : DenseConfig(), l, 100 + i);
    ASSERT_TRUE(st.state);
    ExpectSameSteps(st, o, device.get());
  }
}

// One chunk whose runs lie far apart in its buffer: with the distributed optimizer the folded
// down_proj of the last layer (256 x 512 elements) is residual and sits between mapped pieces of
// the flat buffer, so the chunk covering the whole buffer is diffed as several spans.
TEST(DeviceTrainDeltaTest, ChunkWithFarApartRunsGivesTheSameBytes) {
  OPEN_DEVICE_OR_SKIP(device);
  ModelConfig cfg = DenseConfig();
  cfg.hidden = 256;
  cfg.intermediate = 512;
  cfg.layers = 2;
  cfg.head_dim = 16;
  TrainLayout l;
  l.dist_opt = true;
  l.fold_layers = 1;
  TrainDeltaOptions o;
  o.chunk_elems = uint64_t{1} << 22;
  o.threads = 2;
  Rig st = Make(cfg, l, 9);
  ASSERT_TRUE(st.state);
  ExpectSameSteps(st, o, device.get());
}

// The host backend with a memory limit stands for a full GPU.
TEST(DeviceTrainDeltaTest, ErrorsAreStatusesBeforeAnyOutput) {
  if (kKind != DeviceKind::kHost) GTEST_SKIP() << "a memory limit is a host backend option";
  auto l = TrainLayout::Parse("tp=2,dp=2,dist_opt=1");
  ASSERT_TRUE(l.ok());
  Rig st = Make(DenseConfig(), *l, 5);
  ASSERT_TRUE(st.state);
  TrainDeltaOptions o;
  o.chunk_elems = 1000;
  auto b = TrainDeltaBuilder::Create(st.s, st.map, st.ex, st.state->shards(), o);
  ASSERT_TRUE(b.ok());
  ShardSet prev = st.state->shards();
  st.state->Step();
  HostDeviceOptions small;
  small.memory_bytes = 4096;  // less than one rank's buffers
  std::unique_ptr<Device> device = MakeHostDevice(small);
  DeltaMemorySink sink;
  auto r = (*b)->BuildStepOnDevice(prev, st.state->shards(), device.get(), &sink);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status();
  EXPECT_NE(r.status().message().find("rank 0 on device host"), std::string::npos) << r.status();
  EXPECT_TRUE(sink.bytes().empty());
  EXPECT_EQ((*b)->version(), 0u);  // nothing merged
  // Host arrays are not device addresses; a null device or address is refused.
  std::unique_ptr<Device> big = MakeHostDevice();
  const RankSpec& rk = st.s->ranks()[0];
  std::vector<const void*> host_ptrs;
  for (const auto& v : prev.buffers[0]) host_ptrs.push_back(v.data());
  EXPECT_FALSE((*b)->BuildUnitOnDevice(0, big.get(), host_ptrs, host_ptrs).ok());
  EXPECT_TRUE(
      (*b)->BuildUnitOnDevice(0, nullptr, host_ptrs, host_ptrs).status().IsInvalidArgument());
  std::vector<const void*> nulls(rk.buffers.size(), nullptr);
  EXPECT_TRUE((*b)->BuildUnitOnDevice(0, big.get(), nulls, nulls).status().IsInvalidArgument());
  EXPECT_TRUE((*b)->BuildStepOnDevice(prev, st.state->shards(), nullptr, &sink)
                  .status()
                  .IsInvalidArgument());
}

}  // namespace
}  // namespace dcr
