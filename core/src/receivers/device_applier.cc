// DeviceApplier (dcr/device.h): chunks applied to device memory through any Device backend.
//
// The host side of a chunk (segment checks, the canonical element and device addresses of every
// change) runs on the calling thread; the device gathers the old bits, the host checks the
// chunk's packed-bits hashes, and only then the device scatters the new bits. The same code runs
// on the host backend in CI and on CUDA.
#include "receivers/device_applier.h"

#include <mutex>
#include <set>

#include "dcr/delta.h"
#include "dcr/device.h"
#include "dcr/hash.h"
#include "dcr/status_macros.h"
#include "receivers/chunk_apply.h"

namespace dcr {
namespace {

// Where the bits of a canonical element live on the device.
class Locator {
 public:
  virtual ~Locator() = default;
  // OK if segment `sg` of a chunk of `width`-byte elements fits the storage.
  virtual Status Check(const Segment& sg, int width) const = 0;
  // Appends every device address of element `e` of tensor `t`; false if it has none.
  virtual bool Addresses(uint32_t t, uint64_t e, std::vector<uint64_t>* out) const = 0;
  virtual uint64_t Salt(uint32_t t) const = 0;
  // When every element has exactly one address: that of element 0 of tensor `t` (elements are
  // then contiguous, `width` bytes apart); 0 when elements may have several or none.
  virtual uint64_t Base(uint32_t t) const { return 0; }
};

class TensorLocator : public Locator {
 public:
  explicit TensorLocator(std::vector<DeviceTensor> t) : t_(std::move(t)) {}
  Status Check(const Segment& sg, int width) const override {
    if (sg.tensor_index >= t_.size()) return DataLossError("tensor index out of range");
    if (t_[sg.tensor_index].width != width) return DataLossError("element width mismatch");
    return internal::CheckSegmentBounds(sg, t_[sg.tensor_index].num_elements);
  }
  bool Addresses(uint32_t t, uint64_t e, std::vector<uint64_t>* out) const override {
    out->push_back(reinterpret_cast<uint64_t>(t_[t].data) + e * static_cast<uint64_t>(t_[t].width));
    return true;
  }
  uint64_t Salt(uint32_t t) const override { return t_[t].salt; }
  uint64_t Base(uint32_t t) const override { return reinterpret_cast<uint64_t>(t_[t].data); }

 private:
  std::vector<DeviceTensor> t_;
};

class PlacementLocator : public Locator {
 public:
  PlacementLocator(const PlacementMap& map, std::vector<void*> bufs)
      : map_(map), bufs_(std::move(bufs)) {
    by_tensor_.resize(map_.tensors.size());
    for (const Placement& p : map_.placements) {
      if (p.tensor < by_tensor_.size()) by_tensor_[p.tensor].push_back(&p);
    }
    converted_ = map_.converted_tensors();
    for (const auto& n : map_.tensors) salts_.push_back(TensorSalt(n));
  }
  Status Check(const Segment& sg, int width) const override {
    if (sg.tensor_index >= map_.tensors.size()) return DataLossError("tensor index out of range");
    if (DTypeWidth(map_.tensor_dtypes[sg.tensor_index]) != width) {
      return DataLossError("element width mismatch");
    }
    if (converted_.count(sg.tensor_index)) {
      return FailedPreconditionError("tensor " + map_.tensors[sg.tensor_index] +
                                     " has converted placements; re-load it through the "
                                     "runtime's loader or use serving-space deltas");
    }
    return internal::CheckSegmentBounds(sg, map_.tensor_elements[sg.tensor_index]);
  }
  bool Addresses(uint32_t t, uint64_t e, std::vector<uint64_t>* out) const override {
    bool any = false;
    for (const Placement* p : by_tensor_[t]) {
      const int64_t off = p->Locate(e);
      if (off >= 0) {
        out->push_back(reinterpret_cast<uint64_t>(bufs_[p->buffer]) + static_cast<uint64_t>(off));
        any = true;
      }
    }
    return any;
  }
  uint64_t Salt(uint32_t t) const override { return salts_[t]; }

 private:
  PlacementMap map_;
  std::vector<void*> bufs_;
  std::vector<std::vector<const Placement*>> by_tensor_;
  std::set<uint32_t> converted_;
  std::vector<uint64_t> salts_;
};

class GenericDeviceApplier : public DeviceApplier {
 public:
  // `version_deltas`: hash_delta() sums the applied chunks' version_delta (BufferApplier's
  // accounting) instead of the terms of the actual bits.
  GenericDeviceApplier(std::shared_ptr<Device> device, std::unique_ptr<Locator> loc,
                       bool version_deltas)
      : device_(std::move(device)), loc_(std::move(loc)), version_deltas_(version_deltas) {}

  Status ApplyChunk(const DecodedChunk& chunk) override {
    const ChunkHeader& h = chunk.header;
    const int w = h.elem_width;
    const std::string id = "chunk " + std::to_string(h.chunk_id);
    DCR_RETURN_IF_ERROR(internal::CheckDecodedChunk(
        chunk, id, [this, w](const Segment& sg) { return loc_->Check(sg, w); }));
    const bool dense = h.position_mode == PositionMode::kDense;
    const uint64_t k = h.num_changes;
    if (k == 0) {
      if (PackedBitsHash(nullptr, 0, w) != h.target_change_hash) {
        return DataLossError(id + ": decoded values do not produce the target bits");
      }
      if (version_deltas_) AddDelta(h.version_delta);
      return Status::OK();
    }
    // Per-thread scratch reused across chunks: concurrent chunks each have their own.
    thread_local std::vector<uint64_t> read, write, begin, elem, old_bits, new_bits, addrs, iota;
    thread_local std::vector<uint32_t> tensor;
    // The canonical element of every change is kept only when the hash needs its terms.
    const bool terms = !version_deltas_ && !IsRelative(h.value_mode);
    read.resize(k);
    if (terms) {
      tensor.resize(k);
      elem.resize(k);
    }
    const bool single = h.segments.empty() ? false : loc_->Base(h.segments[0].tensor_index) != 0;
    if (single) {
      // One address per element: the writes go where the reads came from.
      if (iota.size() < k + 1) {
        const size_t from = iota.size();
        iota.resize(k + 1);
        for (size_t i = from; i <= k; ++i) iota[i] = i;
      }
    } else {
      write.clear();
      begin.assign(1, 0);
    }
    SegmentCursor cursor(h.segments);
    uint32_t current = ~0u;
    uint64_t base = 0;
    for (uint64_t i = 0; i < k; ++i) {
      const uint64_t pos = dense ? i : chunk.positions[i];
      if (pos >= h.num_elements) return DataLossError(id + ": position out of range");
      uint32_t sgi;
      uint64_t e;
      cursor.Locate(pos, &sgi, &e);
      const uint32_t t = h.segments[sgi].tensor_index;
      if (terms) {
        tensor[i] = t;
        elem[i] = e;
      }
      if (single) {
        if (sgi != current) {
          current = sgi;
          base = loc_->Base(t);
        }
        read[i] = base + e * static_cast<uint64_t>(w);
        continue;
      }
      addrs.clear();
      if (!loc_->Addresses(t, e, &addrs)) {
        return FailedPreconditionError(id + ": element " + std::to_string(e) +
                                       " of a changed tensor is not placed on this device");
      }
      read[i] = addrs[0];
      write.insert(write.end(), addrs.begin(), addrs.end());
      begin.push_back(write.size());
    }
    old_bits.resize(k);
    new_bits.resize(k);
    DCR_RETURN_IF_ERROR(device_
                            ->Gather(read.data(), chunk.values.data(), k, w, h.value_mode,
                                     old_bits.data(), new_bits.data())
                            .WithContext(id));
    if (IsRelative(h.value_mode) && PackedBitsHash(old_bits.data(), k, w) != h.base_change_hash) {
      return FailedPreconditionError(id +
                                     ": current bits differ from the delta's base (wrong base, "
                                     "or the chunk was already applied); nothing written");
    }
    if (PackedBitsHash(new_bits.data(), k, w) != h.target_change_hash) {
      return DataLossError(id + ": decoded values do not produce the target bits; nothing written");
    }
    DCR_RETURN_IF_ERROR(device_
                            ->Scatter(single ? read.data() : write.data(),
                                      single ? iota.data() : begin.data(), new_bits.data(), k, w)
                            .WithContext(id));
    if (!terms) {
      // A relative chunk's old bits are the base's (checked above), so its version_delta is
      // exactly the terms of the actual bits.
      AddDelta(h.version_delta);
      return Status::OK();
    }
    Hash128 d;
    for (uint64_t i = 0; i < k; ++i) {
      const uint64_t salt = loc_->Salt(tensor[i]);
      HashSub(&d, ElementTerm(salt, elem[i], old_bits[i]));
      HashAdd(&d, ElementTerm(salt, elem[i], new_bits[i]));
    }
    AddDelta(d);
    return Status::OK();
  }

  Hash128 hash_delta() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return delta_;
  }

 private:
  void AddDelta(const Hash128& d) {
    std::lock_guard<std::mutex> lock(mu_);
    HashAdd(&delta_, d);
  }

  const std::shared_ptr<Device> device_;
  const std::unique_ptr<Locator> loc_;
  const bool version_deltas_;
  mutable std::mutex mu_;
  Hash128 delta_;  // guarded by mu_
};

}  // namespace

std::unique_ptr<DeviceApplier> MakeDeviceApplier(std::shared_ptr<Device> device,
                                                 std::vector<DeviceTensor> tensors) {
  return std::make_unique<GenericDeviceApplier>(
      std::move(device), std::make_unique<TensorLocator>(std::move(tensors)), false);
}

namespace internal {

std::unique_ptr<DeviceApplier> MakeVersionDeltaDeviceApplier(std::shared_ptr<Device> device,
                                                             std::vector<DeviceTensor> tensors) {
  return std::make_unique<GenericDeviceApplier>(
      std::move(device), std::make_unique<TensorLocator>(std::move(tensors)), true);
}

}  // namespace internal

StatusOr<std::unique_ptr<DeviceApplier>> MakeDevicePlacementApplier(std::shared_ptr<Device> device,
                                                                    const PlacementMap& map,
                                                                    std::vector<void*> buffers) {
  if (buffers.size() != map.buffers.size()) {
    return InvalidArgumentError(std::to_string(buffers.size()) + " device buffers for " +
                                std::to_string(map.buffers.size()) +
                                " buffers of the placement map");
  }
  return std::unique_ptr<DeviceApplier>(std::make_unique<GenericDeviceApplier>(
      std::move(device), std::make_unique<PlacementLocator>(map, std::move(buffers)), false));
}

}  // namespace dcr
