// dcr::cuda host side: appliers, diff and range hash over device memory (cuda_apply.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "common.cuh"
#include "dcr/cuda_apply.h"
#include "dcr/delta.h"
#include "dcr/hash.h"
#include "dcr/status_macros.h"
#include "internal/element_ops.h"
#include "kernels.cuh"
#include "receivers/chunk_apply.h"

namespace dcr {
namespace cuda {
namespace {

cudaStream_t AsStream(void* s) { return static_cast<cudaStream_t>(s); }

// A grow-only device array.
class DeviceArray {
 public:
  ~DeviceArray() {
    if (p_ != nullptr) cudaFree(p_);
  }
  Status Reserve(size_t bytes) {
    if (bytes <= cap_) return Status::OK();
    if (p_ != nullptr) cudaFree(p_);
    p_ = nullptr;
    cap_ = 0;
    DCR_CUDA_RETURN_IF_ERROR(cudaMalloc(&p_, bytes));
    cap_ = bytes;
    return Status::OK();
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
  size_t cap_ = 0;
};

template <typename T>
Status Upload(DeviceArray* d, const std::vector<T>& h, cudaStream_t s) {
  DCR_RETURN_IF_ERROR(d->Reserve(std::max<size_t>(1, h.size()) * sizeof(T)));
  if (h.empty()) return Status::OK();
  DCR_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(d->as<void>(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice, s));
  return Status::OK();
}

// Where the bits of a canonical element live on the device.
class Locator {
 public:
  virtual ~Locator() = default;
  virtual Status Check(const Segment& sg, int width) const = 0;
  // Appends every destination address of (t, e); returns false if none.
  virtual bool Addresses(uint32_t t, uint64_t e, std::vector<uint64_t>* out) const = 0;
  virtual uint64_t Salt(uint32_t t) const = 0;
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
    out->push_back(reinterpret_cast<uint64_t>(t_[t].data) + e * t_[t].width);
    return true;
  }
  uint64_t Salt(uint32_t t) const override { return t_[t].salt; }

 private:
  std::vector<DeviceTensor> t_;
};

class PlacementLocator : public Locator {
 public:
  PlacementLocator(const PlacementMap& map, std::vector<void*> bufs) : map_(map), bufs_(std::move(bufs)) {
    by_tensor_.resize(map_.tensors.size());
    for (const Placement& p : map_.placements) by_tensor_[p.tensor].push_back(&p);
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
                                     " has converted placements; re-load it on the host or use "
                                     "serving-space deltas");
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

class Impl : public DeviceApplier {
 public:
  Impl(std::unique_ptr<Locator> loc, void* stream) : loc_(std::move(loc)), s_(AsStream(stream)) {}

  Status ApplyChunk(const DecodedChunk& chunk) override {
    const ChunkHeader& h = chunk.header;
    const int w = h.elem_width;
    const std::string id = "chunk " + std::to_string(h.chunk_id);
    if (w != 1 && w != 2 && w != 4 && w != 8) return DataLossError(id + ": bad element width");
    uint64_t covered = 0;
    for (const Segment& sg : h.segments) {
      DCR_RETURN_IF_ERROR(loc_->Check(sg, w).WithContext(id));
      covered += sg.num_elements();
    }
    if (covered != h.num_elements) return DataLossError(id + ": segments do not cover num_elements");
    const bool dense = h.position_mode == PositionMode::kDense;
    const uint64_t k = h.num_changes;
    if ((!dense && chunk.positions.size() != k) || chunk.values.size() != k) {
      return InvalidArgumentError(id + ": decoded chunk is inconsistent with its header");
    }
    // Host: canonical elements and device addresses of every change.
    read_.clear();
    write_.clear();
    begin_.assign(1, 0);
    tensor_.resize(k);
    elem_.resize(k);
    SegmentCursor cursor(h.segments);
    std::vector<uint64_t> addrs;
    for (uint64_t i = 0; i < k; ++i) {
      const uint64_t pos = dense ? i : chunk.positions[i];
      if (pos >= h.num_elements) return DataLossError(id + ": position out of range");
      uint32_t sgi;
      cursor.Locate(pos, &sgi, &elem_[i]);
      tensor_[i] = h.segments[sgi].tensor_index;
      addrs.clear();
      if (!loc_->Addresses(tensor_[i], elem_[i], &addrs)) {
        return FailedPreconditionError(id + ": element " + std::to_string(elem_[i]) +
                                       " of a changed tensor is not placed on this device");
      }
      read_.push_back(addrs[0]);
      write_.insert(write_.end(), addrs.begin(), addrs.end());
      begin_.push_back(write_.size());
    }
    if (k == 0) {
      if (PackedBitsHash(nullptr, 0, w) != h.target_change_hash) {
        return DataLossError(id + ": target change hash mismatch");
      }
      return Status::OK();
    }
    DCR_RETURN_IF_ERROR(Upload(&d_read_, read_, s_));
    DCR_RETURN_IF_ERROR(Upload(&d_values_, chunk.values, s_));
    DCR_RETURN_IF_ERROR(d_old_.Reserve(k * 8));
    DCR_RETURN_IF_ERROR(d_new_.Reserve(k * 8));
    DCR_RETURN_IF_ERROR(LaunchGather(d_read_.as<uint64_t>(), d_values_.as<uint64_t>(),
                                     d_old_.as<uint64_t>(), d_new_.as<uint64_t>(), k, w,
                                     static_cast<uint8_t>(h.value_mode), s_));
    old_.resize(k);
    new_.resize(k);
    DCR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(old_.data(), d_old_.as<void>(), k * 8, cudaMemcpyDeviceToHost, s_));
    DCR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(new_.data(), d_new_.as<void>(), k * 8, cudaMemcpyDeviceToHost, s_));
    DCR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s_));
    if (IsRelative(h.value_mode) && PackedBitsHash(old_.data(), k, w) != h.base_change_hash) {
      return FailedPreconditionError(id + ": current bits differ from the delta's base; nothing written");
    }
    if (PackedBitsHash(new_.data(), k, w) != h.target_change_hash) {
      return DataLossError(id + ": decoded values do not produce the target bits; nothing written");
    }
    DCR_RETURN_IF_ERROR(Upload(&d_write_, write_, s_));
    DCR_RETURN_IF_ERROR(Upload(&d_begin_, begin_, s_));
    DCR_RETURN_IF_ERROR(LaunchScatter(d_write_.as<uint64_t>(), d_begin_.as<uint64_t>(),
                                      d_new_.as<uint64_t>(), k, w, s_));
    DCR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s_));
    for (uint64_t i = 0; i < k; ++i) {
      const uint64_t salt = loc_->Salt(tensor_[i]);
      HashSub(&delta_, ElementTerm(salt, elem_[i], old_[i]));
      HashAdd(&delta_, ElementTerm(salt, elem_[i], new_[i]));
    }
    return Status::OK();
  }

  Hash128 hash_delta() const override { return delta_; }

 private:
  std::unique_ptr<Locator> loc_;
  cudaStream_t s_;
  std::vector<uint64_t> read_, write_, begin_, elem_, old_, new_;
  std::vector<uint32_t> tensor_;
  DeviceArray d_read_, d_values_, d_old_, d_new_, d_write_, d_begin_;
  Hash128 delta_;
};

}  // namespace

bool DeviceAvailable() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

std::string DeviceDescription() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string("no CUDA device: ") + cudaGetErrorString(e);
  }
  if (n == 0) return "no CUDA device";
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) {
    cudaGetLastError();
    return "CUDA device 0 (properties unavailable)";
  }
  return std::string(p.name) + ", cc " + std::to_string(p.major) + "." + std::to_string(p.minor) +
         ", " + std::to_string(p.totalGlobalMem >> 30) + " GiB";
}

StatusOr<std::unique_ptr<DeviceApplier>> MakeDeviceApplier(std::vector<DeviceTensor> tensors,
                                                           void* stream) {
  if (!DeviceAvailable()) return UnavailableError("dcr::cuda: " + DeviceDescription());
  return std::unique_ptr<DeviceApplier>(
      new Impl(std::make_unique<TensorLocator>(std::move(tensors)), stream));
}

StatusOr<std::unique_ptr<DeviceApplier>> MakePlacementApplier(const PlacementMap& map,
                                                              std::vector<void*> device_buffers,
                                                              void* stream) {
  if (!DeviceAvailable()) return UnavailableError("dcr::cuda: " + DeviceDescription());
  if (device_buffers.size() != map.buffers.size()) {
    return InvalidArgumentError("dcr::cuda: " + std::to_string(device_buffers.size()) +
                                " device buffers for " + std::to_string(map.buffers.size()) +
                                " buffers of the placement map");
  }
  return std::unique_ptr<DeviceApplier>(
      new Impl(std::make_unique<PlacementLocator>(map, std::move(device_buffers)), stream));
}

StatusOr<DeviceDiffResult> DeviceDiff(const void* old_data, const void* new_data, uint64_t n,
                                      int width, ValueMode mode, void* stream) {
  if (!DeviceAvailable()) return UnavailableError("dcr::cuda: " + DeviceDescription());
  if (width != 1 && width != 2 && width != 4 && width != 8) {
    return InvalidArgumentError("dcr::cuda: element width must be 1, 2, 4 or 8");
  }
  cudaStream_t s = AsStream(stream);
  DeviceDiffResult r;
  if (n == 0) return r;
  DeviceArray flags, index;
  DCR_RETURN_IF_ERROR(flags.Reserve(n * 4));
  DCR_RETURN_IF_ERROR(index.Reserve(n * 8));
  DCR_RETURN_IF_ERROR(LaunchCompare(old_data, new_data, n, width, flags.as<uint32_t>(), s));
  DCR_RETURN_IF_ERROR(ExclusiveScan(flags.as<uint32_t>(), index.as<uint64_t>(), n, s));
  uint64_t last_index = 0;
  uint32_t last_flag = 0;
  DCR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&last_index, index.as<uint64_t>() + (n - 1), 8, cudaMemcpyDeviceToHost, s));
  DCR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&last_flag, flags.as<uint32_t>() + (n - 1), 4, cudaMemcpyDeviceToHost, s));
  DCR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
  const uint64_t k = last_index + last_flag;
  DeviceArray pos, val, ob, nb;
  DCR_RETURN_IF_ERROR(pos.Reserve(std::max<uint64_t>(k, 1) * 8));
  DCR_RETURN_IF_ERROR(val.Reserve(std::max<uint64_t>(k, 1) * 8));
  DCR_RETURN_IF_ERROR(ob.Reserve(std::max<uint64_t>(k, 1) * 8));
  DCR_RETURN_IF_ERROR(nb.Reserve(std::max<uint64_t>(k, 1) * 8));
  DCR_RETURN_IF_ERROR(LaunchCompact(old_data, new_data, n, width, static_cast<uint8_t>(mode),
                                    flags.as<uint32_t>(), index.as<uint64_t>(), pos.as<uint64_t>(),
                                    val.as<uint64_t>(), ob.as<uint64_t>(), nb.as<uint64_t>(), s));
  r.positions.resize(k);
  r.values.resize(k);
  r.old_bits.resize(k);
  r.new_bits.resize(k);
  if (k > 0) {
    DCR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(r.positions.data(), pos.as<void>(), k * 8, cudaMemcpyDeviceToHost, s));
    DCR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(r.values.data(), val.as<void>(), k * 8, cudaMemcpyDeviceToHost, s));
    DCR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(r.old_bits.data(), ob.as<void>(), k * 8, cudaMemcpyDeviceToHost, s));
    DCR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(r.new_bits.data(), nb.as<void>(), k * 8, cudaMemcpyDeviceToHost, s));
  }
  DCR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
  return r;
}

StatusOr<Hash128> DeviceRangeHash(uint64_t salt, const void* data, int width, uint64_t begin,
                                  uint64_t count, void* stream) {
  if (!DeviceAvailable()) return UnavailableError("dcr::cuda: " + DeviceDescription());
  cudaStream_t s = AsStream(stream);
  DeviceArray acc;
  DCR_RETURN_IF_ERROR(acc.Reserve(16));
  DCR_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(acc.as<void>(), 0, 16, s));
  DCR_RETURN_IF_ERROR(LaunchRangeHash(salt, data, width, begin, count, acc.as<unsigned long long>(), s));
  unsigned long long h[2] = {0, 0};
  DCR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h, acc.as<void>(), 16, cudaMemcpyDeviceToHost, s));
  DCR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
  return Hash128{h[0], h[1]};
}

}  // namespace cuda
}  // namespace dcr
