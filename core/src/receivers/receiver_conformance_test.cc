// The receiver conformance suite: every Receiver implementation (BufferReceiver, the device
// receiver on the host backend, ServingReplica, JournaledReceiver over each of them,
// StorageReceiver, and the C API's receiver) runs the same cases of the receiver.h contract. Random
// layouts and dtypes (BF16, F16, F32, F8, integers) with special values (NaN payloads, infinities,
// -0, denormals); change rates 0%, 1%, 50% and 100%; records applied in random order; each commit
// is checked byte for byte against a dense load of the target, both through the receiver's Verify
// and independently by the rig.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "dcr/dcr_c.h"
#include "dcr/delta.h"
#include "dcr/device.h"
#include "dcr/journal.h"
#include "dcr/receiver.h"
#include "dcr/runtime.h"
#include "dcr/status_macros.h"

namespace dcr {
namespace {

// ---- random checkpoints ----

struct Tensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
  int width() const { return DTypeWidth(DTypeFromName(dtype)); }
  uint64_t n() const { return bytes.size() / static_cast<uint64_t>(width()); }
};
using Model = std::vector<Tensor>;

uint64_t GetBits(const Tensor& t, uint64_t i) {
  uint64_t v = 0;
  std::memcpy(&v, t.bytes.data() + i * t.width(), t.width());
  return v;
}
void PutBits(Tensor* t, uint64_t i, uint64_t v) {
  std::memcpy(t->bytes.data() + i * t->width(), &v, t->width());
}

// Special bit patterns of a float dtype: NaN payloads, +-inf, -0, denormals (and +0).
std::vector<uint64_t> Specials(const std::string& dtype) {
  if (dtype == "BF16") return {0x7FC1, 0xFF81, 0x7F80, 0xFF80, 0x8000, 0x0001, 0x807F, 0x0000};
  if (dtype == "F16") return {0x7E01, 0xFC03, 0x7C00, 0xFC00, 0x8000, 0x0001, 0x83FF, 0x0000};
  if (dtype == "F32") {
    return {0x7FC00001, 0xFF800003, 0x7F800000, 0xFF800000, 0x80000000, 0x00000001, 0x807FFFFF, 0};
  }
  if (dtype == "F8_E4M3") return {0x7F, 0xFF, 0x80, 0x01, 0x87, 0x00};
  if (dtype == "F8_E5M2") return {0x7D, 0xFE, 0x7C, 0xFC, 0x80, 0x01, 0x83, 0x00};
  return {};
}

uint64_t Mask(int w) { return w == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * w)) - 1; }

// New bits for one element: a special value, a small ulp step, or random bits; never the old.
uint64_t NewBits(const Tensor& t, uint64_t old, std::mt19937_64* rng) {
  const std::vector<uint64_t> sp = Specials(t.dtype);
  const uint64_t m = Mask(t.width());
  for (;;) {
    uint64_t v;
    const uint64_t pick = (*rng)() % 8;
    if (!sp.empty() && pick == 0) {
      v = sp[(*rng)() % sp.size()];
    } else if (pick < 5) {
      v = (old + 1 + (*rng)() % 3) & m;
    } else {
      v = (*rng)() & m;
    }
    if (v != old) return v;
  }
}

// A random layout: 3 to 6 tensors of random dtypes and shapes (matrices with an even row count
// shard across two serving ranks; "norm" tensors are BF16 vectors the test loader converts).
Model RandomModel(uint64_t seed) {
  std::mt19937_64 rng(seed);
  const char* dtypes[] = {"BF16", "F16", "F32", "F8_E4M3", "F8_E5M2", "I8", "I32", "U8", "I64"};
  Model m;
  const int count = 3 + static_cast<int>(rng() % 4);
  for (int i = 0; i < count; ++i) {
    Tensor t;
    t.name = std::string(1, static_cast<char>('a' + i)) + ".w" + std::to_string(i);
    t.dtype = dtypes[rng() % 9];
    if (rng() % 3 == 0) {
      t.shape = {static_cast<int64_t>(1 + rng() % 3000)};
    } else {
      t.shape = {static_cast<int64_t>(2 * (1 + rng() % 48)), static_cast<int64_t>(1 + rng() % 300)};
    }
    m.push_back(std::move(t));
  }
  Tensor norm;
  norm.name = "z.norm";
  norm.dtype = "BF16";
  norm.shape = {static_cast<int64_t>(64 + rng() % 200)};
  m.push_back(std::move(norm));
  for (Tensor& t : m) {
    uint64_t n = 1;
    for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
    t.bytes.resize(n * t.width());
    const std::vector<uint64_t> sp = Specials(t.dtype);
    for (uint64_t e = 0; e < n; ++e) {
      uint64_t v = rng() & Mask(t.width());
      if (!sp.empty() && rng() % 16 == 0) v = sp[rng() % sp.size()];
      PutBits(&t, e, v);
    }
  }
  return m;
}

// The next version: each element changes with probability `rate` (every element at 1).
Model Next(const Model& prev, double rate, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  Model m = prev;
  for (Tensor& t : m) {
    for (uint64_t e = 0; e < t.n(); ++e) {
      if (rate < 1 && u(rng) >= rate) continue;
      PutBits(&t, e, NewBits(t, GetBits(t, e), &rng));
    }
  }
  return m;
}

std::unique_ptr<Checkpoint> ToCheckpoint(const Model& m) {
  std::vector<TensorView> v;
  for (const Tensor& t : m) v.push_back({t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size()});
  auto c = Checkpoint::FromBytes(SafetensorsImage(v));
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(c).value();
}

// ---- a serving loader for these layouts ----

// Rank `rank` of `tp`: matrices with rows divisible by tp are sharded by rows (bit-preserving
// copies), "norm" tensors are upcast to F32 through a staging buffer (converted placements),
// everything else is copied whole (replicated on every rank).
class ShardLoader : public ModelLoader {
 public:
  ShardLoader(std::vector<TensorInfo> tensors, int rank, int tp)
      : tensors_(std::move(tensors)), rank_(rank), tp_(tp) {}
  Status Init(Storage* storage) override {
    for (const TensorInfo& t : tensors_) {
      std::vector<int64_t> shape = t.shape;
      std::string dtype = t.dtype_name;
      if (Sharded(t)) shape[0] /= tp_;
      if (Converted(t)) dtype = "F32";
      auto p = storage->Allocate(t.name, dtype, shape);
      if (!p.ok()) return p.status();
    }
    return Status::OK();
  }
  Status LoadWeight(const WeightRef& w, Storage* storage) override {
    Storage::Buffer* b = storage->Find(w.name);
    if (b == nullptr) return InvalidArgumentError("no buffer for " + w.name);
    const TensorInfo* t = nullptr;
    for (const TensorInfo& x : tensors_) {
      if (x.name == w.name) t = &x;
    }
    if (Converted(*t)) {
      std::vector<uint32_t> staged(w.nbytes / 2);
      for (size_t i = 0; i < staged.size(); ++i) {
        uint16_t h;
        std::memcpy(&h, w.data + 2 * i, 2);
        staged[i] = static_cast<uint32_t>(h) << 16;
      }
      std::memcpy(b->data, staged.data(), b->nbytes);
    } else if (Sharded(*t)) {
      std::memcpy(b->data, w.data + static_cast<uint64_t>(rank_) * b->nbytes, b->nbytes);
    } else {
      std::memcpy(b->data, w.data, b->nbytes);
    }
    return Status::OK();
  }

 private:
  bool Sharded(const TensorInfo& t) const {
    return t.shape.size() == 2 && t.shape[0] % tp_ == 0 && t.name.find("norm") == std::string::npos;
  }
  static bool Converted(const TensorInfo& t) { return t.name.find("norm") != std::string::npos; }
  std::vector<TensorInfo> tensors_;
  int rank_, tp_;
};

LoaderFactory ShardLoaderFactory(const Checkpoint& base, int tp) {
  std::vector<TensorInfo> tensors = base.tensors();
  return [tensors, tp](int rank) -> StatusOr<std::unique_ptr<ModelLoader>> {
    return std::unique_ptr<ModelLoader>(new ShardLoader(tensors, rank, tp));
  };
}

// Compares every buffer of `storage` with a dense load of `target` through `factory(rank)`.
void ExpectDenseLoadEquals(const Storage& storage, const Checkpoint& target,
                           const LoaderFactory& factory, int rank, const std::string& what) {
  Storage dense(0);
  auto loader = factory(rank);
  ASSERT_TRUE(loader.ok());
  ASSERT_TRUE(LoadCheckpoint(target, loader->get(), &dense).ok());
  ASSERT_EQ(storage.buffers().size(), dense.buffers().size());
  for (size_t b = 0; b < dense.buffers().size(); ++b) {
    const auto& x = storage.buffers()[b];
    const auto& y = dense.buffers()[b];
    ASSERT_EQ(x.name, y.name);
    ASSERT_EQ(x.nbytes, y.nbytes);
    EXPECT_EQ(std::memcmp(x.data, y.data, x.nbytes), 0)
        << what << ": rank " << rank << " buffer " << x.name << " differs from the dense load";
  }
}

std::vector<uint8_t> Concat(const Storage& s) {
  std::vector<uint8_t> out;
  for (const auto& b : s.buffers()) out.insert(out.end(), b.data, b.data + b.nbytes);
  return out;
}

// ---- rigs: one per receiver implementation ----

class Rig {
 public:
  virtual ~Rig() = default;
  virtual Receiver* rx() = 0;
  // The delta this receiver is sent to move from `base` to `target`.
  virtual std::vector<uint8_t> MakeDelta(const Checkpoint& base, const Checkpoint& target,
                                         const DeltaOptions& o) {
    DeltaMemorySink sink;
    auto st = BuildDelta(&base, target, o, &sink);
    EXPECT_TRUE(st.ok()) << st.status();
    return sink.Release();
  }
  // Independent of Receiver::Verify: the storage equals a dense load of `target`.
  virtual void ExpectHolds(const Checkpoint& target, const std::string& what) = 0;
  // Every byte of the storage (to check that refused pieces wrote nothing).
  virtual std::vector<uint8_t> Snapshot() = 0;
  // Whether every duplicate record is skipped with OK (a journal knows it is applied).
  virtual bool skips_duplicates() const { return false; }
  // Whether MissingChunks is available.
  virtual bool lists_missing() const { return true; }
};

class BufferRig : public Rig {
 public:
  explicit BufferRig(const Checkpoint& base) : rx_(BufferReceiver::Copy(base, 0)) {}
  Receiver* rx() override { return rx_.get(); }
  void ExpectHolds(const Checkpoint& target, const std::string& what) override {
    for (const ReceiverTensor& t : rx_->tensors()) {
      const TensorInfo* tt = target.Find(t.info.name);
      ASSERT_NE(tt, nullptr);
      ASSERT_EQ(tt->nbytes, t.info.nbytes);
      EXPECT_EQ(std::memcmp(target.data(*tt), t.data, tt->nbytes), 0)
          << what << ": " << t.info.name;
    }
  }
  std::vector<uint8_t> Snapshot() override {
    std::vector<uint8_t> out;
    for (const ReceiverTensor& t : rx_->tensors())
      out.insert(out.end(), t.data, t.data + t.info.nbytes);
    return out;
  }

 protected:
  std::unique_ptr<BufferReceiver> rx_;
};

// The device receiver on the host backend (the code the CUDA backend runs, without a GPU).
class DeviceRig : public Rig {
 public:
  explicit DeviceRig(const Checkpoint& base) {
    auto r = MakeDeviceReceiver(std::shared_ptr<Device>(MakeHostDevice()), base, 0);
    EXPECT_TRUE(r.ok()) << r.status();
    rx_ = std::move(r).value();
  }
  Receiver* rx() override { return rx_.get(); }
  void ExpectHolds(const Checkpoint& target, const std::string& what) override {
    for (const DeviceReceiverTensor& t : rx_->tensors()) {
      const TensorInfo* tt = target.Find(t.info.name);
      ASSERT_NE(tt, nullptr);
      ASSERT_EQ(tt->nbytes, t.info.nbytes);
      std::vector<uint8_t> h(t.info.nbytes);
      ASSERT_TRUE(rx_->device()->Download(h.data(), t.data, h.size()).ok());
      EXPECT_EQ(std::memcmp(target.data(*tt), h.data(), tt->nbytes), 0)
          << what << ": " << t.info.name;
    }
  }
  std::vector<uint8_t> Snapshot() override {
    std::vector<uint8_t> out;
    for (const DeviceReceiverTensor& t : rx_->tensors()) {
      std::vector<uint8_t> h(t.info.nbytes);
      EXPECT_TRUE(rx_->device()->Download(h.data(), t.data, h.size()).ok());
      out.insert(out.end(), h.begin(), h.end());
    }
    return out;
  }

 private:
  std::unique_ptr<DeviceReceiver> rx_;
};

// JournaledReceiver over another rig's receiver (the decorator works over any receiver).
class JournaledRig : public Rig {
 public:
  explicit JournaledRig(std::unique_ptr<Rig> inner)
      : inner_(std::move(inner)),
        path_(std::filesystem::temp_directory_path() /
              ("dcr_conformance_" + std::to_string(::getpid()) + "_" +
               std::to_string(std::random_device{}()) + ".journal")) {
    auto j = ReceiverJournal::Open(path_);
    EXPECT_TRUE(j.ok()) << j.status();
    journal_ = std::move(j).value();
    EXPECT_TRUE(journal_->RecordCommitted(inner_->rx()->held()).ok());
    jrx_ = std::make_unique<JournaledReceiver>(inner_->rx(), journal_.get());
  }
  ~JournaledRig() override {
    jrx_.reset();
    journal_.reset();
    std::filesystem::remove(path_);
  }
  Receiver* rx() override { return jrx_.get(); }
  std::vector<uint8_t> MakeDelta(const Checkpoint& base, const Checkpoint& target,
                                 const DeltaOptions& o) override {
    return inner_->MakeDelta(base, target, o);
  }
  void ExpectHolds(const Checkpoint& target, const std::string& what) override {
    inner_->ExpectHolds(target, what);
  }
  std::vector<uint8_t> Snapshot() override { return inner_->Snapshot(); }
  bool skips_duplicates() const override { return true; }

 private:
  std::unique_ptr<Rig> inner_;
  std::string path_;
  std::unique_ptr<ReceiverJournal> journal_;
  std::unique_ptr<JournaledReceiver> jrx_;
};

class ReplicaRig : public Rig {
 public:
  explicit ReplicaRig(const Checkpoint& base) : factory_(ShardLoaderFactory(base, 2)) {
    auto r = ServingReplica::Create(2, factory_, base, 0);
    EXPECT_TRUE(r.ok()) << r.status();
    rx_ = std::move(r).value();
    EXPECT_GT(rx_->placement(0).converted_bytes(), 0u);
  }
  Receiver* rx() override { return rx_.get(); }
  void ExpectHolds(const Checkpoint& target, const std::string& what) override {
    for (int r = 0; r < rx_->tp(); ++r)
      ExpectDenseLoadEquals(rx_->storage(r), target, factory_, r, what);
  }
  std::vector<uint8_t> Snapshot() override {
    std::vector<uint8_t> out;
    for (int r = 0; r < rx_->tp(); ++r) {
      std::vector<uint8_t> s = Concat(rx_->storage(r));
      out.insert(out.end(), s.begin(), s.end());
    }
    return out;
  }

 private:
  LoaderFactory factory_;
  std::unique_ptr<ServingReplica> rx_;
};

// Serving space: rank 1 of two; the deltas are between the loader's storage images.
class StorageRig : public Rig {
 public:
  explicit StorageRig(const Checkpoint& base) : factory_(ShardLoaderFactory(base, 2)) {
    auto loader = factory_(kRank);
    EXPECT_TRUE(loader.ok());
    EXPECT_TRUE(LoadCheckpoint(base, loader->get(), &storage_).ok());
    rx_ = StorageReceiver::Create(&storage_, 0, factory_, kRank);
  }
  Receiver* rx() override { return rx_.get(); }
  std::vector<uint8_t> MakeDelta(const Checkpoint& base, const Checkpoint& target,
                                 const DeltaOptions& o) override {
    DeltaMemorySink sink;
    auto st = BuildServingDelta(base, target, factory_, kRank, o, &sink);
    EXPECT_TRUE(st.ok()) << st.status();
    return sink.Release();
  }
  void ExpectHolds(const Checkpoint& target, const std::string& what) override {
    ExpectDenseLoadEquals(storage_, target, factory_, kRank, what);
  }
  std::vector<uint8_t> Snapshot() override { return Concat(storage_); }

 private:
  static constexpr int kRank = 1;
  LoaderFactory factory_;
  Storage storage_{0};
  std::unique_ptr<StorageReceiver> rx_;
};

Status FromC(int rc) {
  if (rc == DCR_OK) return Status::OK();
  return Status(static_cast<StatusCode>(rc), dcr_last_error());
}

// The C API, driven as a foreign runtime drives it: it runs its own loader (rank 0 of two) under
// the recorder and re-runs it from the reload callback. The rig presents dcr_receiver_* as a
// Receiver so that the suite can run it.
class CApiRig : public Rig, public Receiver {
 public:
  explicit CApiRig(const Checkpoint& base)
      : factory_(ShardLoaderFactory(base, 2)),
        dir_(std::filesystem::temp_directory_path() /
             ("dcr_conformance_c_" + std::to_string(::getpid()) + "_" +
              std::to_string(std::random_device{}()))) {
    std::filesystem::create_directories(dir_);
    const std::string path = dir_ + "/base.safetensors";
    EXPECT_TRUE(WriteFileAtomic(path, base.file_data(), base.file_size()).ok());
    auto l = factory_(0);
    EXPECT_TRUE(l.ok());
    loader_ = std::move(l).value();
    dcr_recorder* rec = nullptr;
    EXPECT_EQ(dcr_recorder_begin(path.c_str(), &rec), DCR_OK) << dcr_last_error();
    EXPECT_TRUE(loader_->Init(&storage_).ok());
    for (const auto& b : storage_.buffers()) {
      EXPECT_EQ(dcr_recorder_add_buffer(rec, b.name.c_str(), b.data, b.nbytes), DCR_OK);
    }
    for (const TensorInfo& t : base.tensors()) {
      uint64_t n = 0;
      const void* p = dcr_recorder_tensor_data(rec, t.name.c_str(), &n);
      EXPECT_EQ(dcr_recorder_set_tensor(rec, t.name.c_str()), DCR_OK);
      WeightRef w{t.name, t.dtype_name, t.dtype, t.shape, static_cast<const uint8_t*>(p), n};
      EXPECT_TRUE(loader_->LoadWeight(w, &storage_).ok());
    }
    EXPECT_EQ(dcr_recorder_set_tensor(rec, nullptr), DCR_OK);
    tensors_ = base.tensors();
    EXPECT_EQ(dcr_recorder_end(rec, &CApiRig::Reload, this, &c_), DCR_OK) << dcr_last_error();
  }
  ~CApiRig() override {
    dcr_receiver_free(c_);
    std::filesystem::remove_all(dir_);
  }
  Receiver* rx() override { return this; }
  void ExpectHolds(const Checkpoint& target, const std::string& what) override {
    ExpectDenseLoadEquals(storage_, target, factory_, 0, what);
  }
  std::vector<uint8_t> Snapshot() override { return Concat(storage_); }
  bool lists_missing() const override { return false; }

  // Receiver over dcr_c.h.
  Status Begin(const uint8_t* h, size_t n) override { return FromC(dcr_receiver_begin(c_, h, n)); }
  Status ApplyRecord(const uint8_t* r, size_t n) override {
    return FromC(dcr_receiver_apply_chunk(c_, r, n));
  }
  Status Commit(const uint8_t* t, size_t n) override {
    return FromC(dcr_receiver_finish(c_, t, n));
  }
  void Abort() override {}
  Status MarkApplied(uint64_t, const Hash128&) override {
    return UnimplementedError("not in the C API");
  }
  Status Verify(const Checkpoint& target) const override {
    const std::string path = dir_ + "/target.safetensors";
    DCR_RETURN_IF_ERROR(WriteFileAtomic(path, target.file_data(), target.file_size()));
    return FromC(dcr_receiver_verify(c_, path.c_str()));
  }
  VersionId held() const override {
    VersionId v;
    uint64_t h[2] = {0, 0};
    EXPECT_EQ(dcr_receiver_version(c_, &v.number, h, nullptr), DCR_OK);
    v.hash.lo = h[0];
    v.hash.hi = h[1];
    return v;
  }
  bool in_delta() const override {
    int d = 0;
    EXPECT_EQ(dcr_receiver_version(c_, nullptr, nullptr, &d), DCR_OK);
    return d != 0;
  }
  std::vector<uint64_t> MissingChunks(const Trailer&) const override { return {}; }

 private:
  static int Reload(void* ctx, const char* tensor, const void* data, uint64_t nbytes) {
    auto* self = static_cast<CApiRig*>(ctx);
    for (const TensorInfo& t : self->tensors_) {
      if (t.name != tensor) continue;
      WeightRef w{t.name, t.dtype_name, t.dtype, t.shape, static_cast<const uint8_t*>(data),
                  nbytes};
      return static_cast<int>(self->loader_->LoadWeight(w, &self->storage_).code());
    }
    return static_cast<int>(StatusCode::kNotFound);
  }
  LoaderFactory factory_;
  std::string dir_;
  std::unique_ptr<ModelLoader> loader_;
  Storage storage_{0};
  std::vector<TensorInfo> tensors_;
  dcr_receiver* c_ = nullptr;
};

// ---- the suite ----

struct Kind {
  const char* name;
  std::function<std::unique_ptr<Rig>(const Checkpoint& base)> make;
};

class ReceiverConformance : public ::testing::TestWithParam<Kind> {};

DeltaOptions Options(uint64_t bv, uint64_t tv, ValuePolicy policy) {
  DeltaOptions o;
  o.chunk_elems = 1 << 11;  // many chunks
  o.small_tensor_elems = 1 << 9;
  o.threads = 1;
  o.base_version = bv;
  o.target_version = tv;
  o.value_policy = policy;
  return o;
}

std::vector<size_t> Shuffled(size_t n, uint64_t seed) {
  std::vector<size_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = i;
  std::shuffle(v.begin(), v.end(), std::mt19937_64(seed));
  return v;
}

std::unique_ptr<DeltaReader> Reader(std::vector<uint8_t> bytes) {
  auto r = DeltaReader::FromBytes(std::move(bytes));
  EXPECT_TRUE(r.ok()) << r.status();
  return std::move(r).value();
}

// Begin / every record in random order / Commit / Verify, through change rates 0%, 1%, 50% and
// 100% and every value policy, over several random layouts.
TEST_P(ReceiverConformance, AppliesEveryRateInAnyOrderBitExact) {
  const double rates[] = {0.0, 0.01, 0.5, 1.0};
  const ValuePolicy policies[] = {ValuePolicy::kAuto, ValuePolicy::kXor, ValuePolicy::kAbsolute,
                                  ValuePolicy::kAuto};
  for (uint64_t seed : {1, 2}) {
    Model m = RandomModel(seed * 100);
    std::unique_ptr<Checkpoint> prev = ToCheckpoint(m);
    std::unique_ptr<Rig> rig = GetParam().make(*prev);
    ASSERT_FALSE(rig->rx()->in_delta());
    EXPECT_EQ(rig->rx()->held().number, 0u);
    for (int step = 1; step <= 4; ++step) {
      const std::string what = std::string(GetParam().name) + " seed " + std::to_string(seed) +
                               " rate " + std::to_string(rates[step - 1]);
      m = Next(m, rates[step - 1], seed * 100 + step);
      std::unique_ptr<Checkpoint> next = ToCheckpoint(m);
      auto d = Reader(rig->MakeDelta(*prev, *next, Options(step - 1, step, policies[step - 1])));
      ASSERT_TRUE(BeginDelta(*d, rig->rx()).ok()) << what;
      EXPECT_TRUE(rig->rx()->in_delta());
      for (size_t i : Shuffled(d->num_chunks(), seed * 10 + step)) {
        Status s = rig->rx()->ApplyRecord(d->chunk_data(i), d->chunk_size(i));
        ASSERT_TRUE(s.ok()) << what << ": " << s;
      }
      Status c = CommitDelta(*d, rig->rx());
      ASSERT_TRUE(c.ok()) << what << ": " << c;
      EXPECT_FALSE(rig->rx()->in_delta());
      EXPECT_EQ(rig->rx()->held().number, static_cast<uint64_t>(step));
      EXPECT_EQ(rig->rx()->held().hash, d->trailer().target_hash);
      Status v = rig->rx()->Verify(*next);
      EXPECT_TRUE(v.ok()) << what << ": " << v;
      rig->ExpectHolds(*next, what);
      if (rates[step - 1] > 0) {
        // Verify can fail: the previous version differs.
        EXPECT_TRUE(rig->rx()->Verify(*prev).IsDataLoss()) << what;
      }
      prev = std::move(next);
    }
  }
}

// A delta for another base is refused at Begin and nothing is written; records before a Begin
// are refused too.
TEST_P(ReceiverConformance, WrongBaseRefusedWithNothingWritten) {
  Model m0 = RandomModel(7);
  Model m1 = Next(m0, 0.05, 8), m2 = Next(m1, 0.05, 9);
  auto c0 = ToCheckpoint(m0), c1 = ToCheckpoint(m1), c2 = ToCheckpoint(m2);
  std::unique_ptr<Rig> rig = GetParam().make(*c0);
  const std::vector<uint8_t> before = rig->Snapshot();
  auto d12 = Reader(rig->MakeDelta(*c1, *c2, Options(1, 2, ValuePolicy::kXor)));
  Status b = BeginDelta(*d12, rig->rx());
  EXPECT_TRUE(b.IsFailedPrecondition()) << b;
  EXPECT_FALSE(rig->rx()->in_delta());
  for (size_t i = 0; i < d12->num_chunks(); ++i) {
    Status s = rig->rx()->ApplyRecord(d12->chunk_data(i), d12->chunk_size(i));
    EXPECT_TRUE(s.IsFailedPrecondition()) << s;
  }
  EXPECT_TRUE(CommitDelta(*d12, rig->rx()).IsFailedPrecondition());
  EXPECT_EQ(rig->Snapshot(), before);
  EXPECT_EQ(rig->rx()->held().number, 0u);
  EXPECT_TRUE(rig->rx()->Verify(*c0).ok());
}

// Begin while a delta is in progress: another delta is refused with nothing written; the same
// delta again resumes it in a journaled receiver and is refused by the others.
TEST_P(ReceiverConformance, BeginWhileADeltaIsInProgress) {
  Model m0 = RandomModel(21);
  Model m1 = Next(m0, 0.05, 22), mx = Next(m0, 0.05, 23);
  auto c0 = ToCheckpoint(m0), c1 = ToCheckpoint(m1), cx = ToCheckpoint(mx);
  std::unique_ptr<Rig> rig = GetParam().make(*c0);
  auto d = Reader(rig->MakeDelta(*c0, *c1, Options(0, 1, ValuePolicy::kXor)));
  auto dx = Reader(rig->MakeDelta(*c0, *cx, Options(0, 2, ValuePolicy::kXor)));
  ASSERT_TRUE(BeginDelta(*d, rig->rx()).ok());
  ASSERT_TRUE(rig->rx()->ApplyRecord(d->chunk_data(0), d->chunk_size(0)).ok());
  const std::vector<uint8_t> before = rig->Snapshot();
  Status other = BeginDelta(*dx, rig->rx());
  EXPECT_TRUE(other.IsFailedPrecondition()) << other;
  EXPECT_EQ(rig->Snapshot(), before);
  Status same = BeginDelta(*d, rig->rx());
  if (rig->skips_duplicates()) {
    EXPECT_TRUE(same.ok()) << same;
  } else {
    EXPECT_TRUE(same.IsFailedPrecondition()) << same;
  }
  EXPECT_TRUE(rig->rx()->in_delta());
  for (size_t i = 1; i < d->num_chunks(); ++i) {
    ASSERT_TRUE(rig->rx()->ApplyRecord(d->chunk_data(i), d->chunk_size(i)).ok());
  }
  ASSERT_TRUE(CommitDelta(*d, rig->rx()).ok());
  rig->ExpectHolds(*c1, "after a second Begin");
}

// A duplicate record writes nothing: skipped (OK) by a journaled receiver and for absolute
// payloads, refused (kFailedPrecondition) for relative ones otherwise; the delta still commits.
TEST_P(ReceiverConformance, DuplicateRecordWritesNothing) {
  for (ValuePolicy policy : {ValuePolicy::kXor, ValuePolicy::kAbsolute}) {
    Model m0 = RandomModel(11);
    Model m1 = Next(m0, 0.05, 12);
    auto c0 = ToCheckpoint(m0), c1 = ToCheckpoint(m1);
    std::unique_ptr<Rig> rig = GetParam().make(*c0);
    auto d = Reader(rig->MakeDelta(*c0, *c1, Options(0, 1, policy)));
    ASSERT_GT(d->num_chunks(), 2u);
    ASSERT_TRUE(BeginDelta(*d, rig->rx()).ok());
    ASSERT_TRUE(rig->rx()->ApplyRecord(d->chunk_data(1), d->chunk_size(1)).ok());
    const std::vector<uint8_t> before = rig->Snapshot();
    Status dup = rig->rx()->ApplyRecord(d->chunk_data(1), d->chunk_size(1));
    auto h = DecodeChunk(d->chunk_data(1), d->chunk_size(1));
    ASSERT_TRUE(h.ok());
    if (rig->skips_duplicates() || !IsRelative(h->header.value_mode)) {
      EXPECT_TRUE(dup.ok()) << dup;
    } else {
      EXPECT_TRUE(dup.IsFailedPrecondition()) << dup;
    }
    EXPECT_EQ(rig->Snapshot(), before);
    for (size_t i = 0; i < d->num_chunks(); ++i) {
      if (i != 1) {
        ASSERT_TRUE(rig->rx()->ApplyRecord(d->chunk_data(i), d->chunk_size(i)).ok());
      }
    }
    Status c = CommitDelta(*d, rig->rx());
    ASSERT_TRUE(c.ok()) << c;
    EXPECT_TRUE(rig->rx()->Verify(*c1).ok());
    rig->ExpectHolds(*c1, "after a duplicate");
  }
}

// A corrupt record is refused with kDataLoss and writes nothing; the intact record then applies.
TEST_P(ReceiverConformance, CorruptRecordRefusedWithNothingWritten) {
  Model m0 = RandomModel(13);
  Model m1 = Next(m0, 0.2, 14);
  auto c0 = ToCheckpoint(m0), c1 = ToCheckpoint(m1);
  std::unique_ptr<Rig> rig = GetParam().make(*c0);
  auto d = Reader(rig->MakeDelta(*c0, *c1, Options(0, 1, ValuePolicy::kAuto)));
  ASSERT_TRUE(BeginDelta(*d, rig->rx()).ok());
  const std::vector<uint8_t> before = rig->Snapshot();
  std::mt19937_64 rng(15);
  for (size_t i = 0; i < d->num_chunks(); ++i) {
    std::vector<uint8_t> bad(d->chunk_data(i), d->chunk_data(i) + d->chunk_size(i));
    bad[rng() % bad.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
    Status s = rig->rx()->ApplyRecord(bad.data(), bad.size());
    EXPECT_TRUE(s.IsDataLoss()) << "record " << i << ": " << s;
    bad.resize(bad.size() / 2);  // truncated
    s = rig->rx()->ApplyRecord(bad.data(), bad.size());
    EXPECT_TRUE(s.IsDataLoss()) << "record " << i << " truncated: " << s;
  }
  EXPECT_EQ(rig->Snapshot(), before);
  for (size_t i = 0; i < d->num_chunks(); ++i) {
    ASSERT_TRUE(rig->rx()->ApplyRecord(d->chunk_data(i), d->chunk_size(i)).ok());
  }
  ASSERT_TRUE(CommitDelta(*d, rig->rx()).ok());
  EXPECT_TRUE(rig->rx()->Verify(*c1).ok());
  rig->ExpectHolds(*c1, "after corrupt records");
}

// Commit with a chunk missing is refused and the delta stays in progress; the missing chunk then
// completes it. A corrupt trailer is refused with kDataLoss.
TEST_P(ReceiverConformance, CommitWithAMissingChunkRefused) {
  Model m0 = RandomModel(17);
  Model m1 = Next(m0, 0.05, 18);
  auto c0 = ToCheckpoint(m0), c1 = ToCheckpoint(m1);
  std::unique_ptr<Rig> rig = GetParam().make(*c0);
  auto d = Reader(rig->MakeDelta(*c0, *c1, Options(0, 1, ValuePolicy::kAuto)));
  ASSERT_GT(d->num_chunks(), 1u);
  ASSERT_TRUE(BeginDelta(*d, rig->rx()).ok());
  const size_t skip = d->num_chunks() / 2;
  for (size_t i = 0; i < d->num_chunks(); ++i) {
    if (i != skip) {
      ASSERT_TRUE(rig->rx()->ApplyRecord(d->chunk_data(i), d->chunk_size(i)).ok());
    }
  }
  Status c = CommitDelta(*d, rig->rx());
  EXPECT_TRUE(c.IsFailedPrecondition()) << c;
  EXPECT_TRUE(rig->rx()->in_delta());
  EXPECT_EQ(rig->rx()->held().number, 0u);
  if (rig->lists_missing()) {
    EXPECT_EQ(rig->rx()->MissingChunks(d->trailer()),
              std::vector<uint64_t>{d->trailer().chunks[skip].chunk_id});
  }
  // The trailer of another delta (other target hash) is refused too.
  Model mx = Next(m0, 0.05, 19);
  auto cx = ToCheckpoint(mx);
  auto dx = Reader(rig->MakeDelta(*c0, *cx, Options(0, 1, ValuePolicy::kAuto)));
  ASSERT_TRUE(rig->rx()->ApplyRecord(d->chunk_data(skip), d->chunk_size(skip)).ok());
  if (dx->trailer().target_hash != d->trailer().target_hash) {
    Status other = CommitDelta(*dx, rig->rx());
    EXPECT_FALSE(other.ok());
    EXPECT_TRUE(rig->rx()->in_delta());
  }
  ASSERT_TRUE(CommitDelta(*d, rig->rx()).ok());
  EXPECT_FALSE(rig->rx()->in_delta());
  EXPECT_TRUE(rig->rx()->Verify(*c1).ok());
  rig->ExpectHolds(*c1, "after the missing chunk");
}

INSTANTIATE_TEST_SUITE_P(
    Receivers, ReceiverConformance,
    ::testing::Values(
        Kind{"Buffer", [](const Checkpoint& b) { return std::unique_ptr<Rig>(new BufferRig(b)); }},
        Kind{"Journaled",
             [](const Checkpoint& b) {
               return std::unique_ptr<Rig>(new JournaledRig(std::make_unique<BufferRig>(b)));
             }},
        Kind{"Device", [](const Checkpoint& b) { return std::unique_ptr<Rig>(new DeviceRig(b)); }},
        Kind{"JournaledDevice",
             [](const Checkpoint& b) {
               return std::unique_ptr<Rig>(new JournaledRig(std::make_unique<DeviceRig>(b)));
             }},
        Kind{"ServingReplica",
             [](const Checkpoint& b) { return std::unique_ptr<Rig>(new ReplicaRig(b)); }},
        Kind{"JournaledServingReplica",
             [](const Checkpoint& b) {
               return std::unique_ptr<Rig>(new JournaledRig(std::make_unique<ReplicaRig>(b)));
             }},
        Kind{"Storage",
             [](const Checkpoint& b) { return std::unique_ptr<Rig>(new StorageRig(b)); }},
        Kind{"CApi", [](const Checkpoint& b) { return std::unique_ptr<Rig>(new CApiRig(b)); }}),
    [](const ::testing::TestParamInfo<Kind>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace dcr
