// The CUDA backend of dcr/device.h: a Device over one GPU, running the kernels of kernels.cu.
//
// Every call sets the calling thread's current device, checks a lane (a stream and its staging
// arrays) out of a pool, runs on that stream and synchronizes it before returning; concurrent
// calls therefore run on distinct streams with distinct staging. CUDA errors become Status values
// (CudaStatus clears the sticky error); allocation failures are kResourceExhausted naming the
// device.
#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "common.cuh"
#include "dcr/cuda_apply.h"
#include "dcr/device.h"
#include "dcr/status_macros.h"
#include "kernels.cuh"

namespace dcr {
namespace cuda {
namespace {

bool ValidWidth(int w) { return w == 1 || w == 2 || w == 4 || w == 8; }

// kInvalidArgument "<op>: element width must be 1, 2, 4 or 8" unless `width` is one of those.
Status CheckWidth(const char* op, int width) {
  if (ValidWidth(width)) return Status::OK();
  return InvalidArgumentError(std::string(op) + ": element width must be 1, 2, 4 or 8");
}

// "cuda:0 (NVIDIA H200, cc 9.0, 139 GiB)" of a present device.
std::string Describe(int index, const cudaDeviceProp& p) {
  return "cuda:" + std::to_string(index) + " (" + p.name + ", cc " + std::to_string(p.major) + "." +
         std::to_string(p.minor) + ", " + std::to_string(p.totalGlobalMem >> 30) + " GiB)";
}

// The checks of OpenDevice: a device `index` is present; fills its properties.
Status CheckDevice(int index, cudaDeviceProp* props) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return UnavailableError(std::string("CUDA: no usable device: ") + cudaGetErrorString(e));
  }
  if (n == 0) return UnavailableError("CUDA: no usable device: no CUDA device is present");
  if (index < 0 || index >= n) {
    return UnavailableError("CUDA: no usable device: cuda:" + std::to_string(index) +
                            " requested, " + std::to_string(n) + " device(s) present");
  }
  const cudaError_t pe = cudaGetDeviceProperties(props, index);
  if (pe != cudaSuccess) {
    cudaGetLastError();
    return UnavailableError("CUDA: no usable device: cuda:" + std::to_string(index) + ": " +
                            cudaGetErrorString(pe));
  }
  return Status::OK();
}

// A grow-only device array of one lane.
class StagingArray {
 public:
  StagingArray() = default;
  StagingArray(const StagingArray&) = delete;
  StagingArray& operator=(const StagingArray&) = delete;
  ~StagingArray() {
    if (p_ != nullptr) cudaFree(p_);
  }
  // REQUIRES: the lane's device is current.
  Status Reserve(uint64_t bytes, const std::string& device_name) {
    bytes = std::max<uint64_t>(bytes, 8);
    if (bytes <= cap_) return Status::OK();
    if (p_ != nullptr) cudaFree(p_);
    p_ = nullptr;
    cap_ = 0;
    const cudaError_t e = cudaMalloc(&p_, bytes);
    if (e != cudaSuccess) {
      cudaGetLastError();
      p_ = nullptr;
      if (e == cudaErrorMemoryAllocation) {
        return ResourceExhaustedError("out of device memory on " + device_name + ": " +
                                      std::to_string(bytes) + " bytes of staging");
      }
      return CudaStatus(e, "cudaMalloc (staging)");
    }
    cap_ = bytes;
    return Status::OK();
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
  uint64_t cap_ = 0;
};

// A stream and the staging arrays of one call in flight.
struct Lane {
  cudaStream_t stream = nullptr;
  bool owns_stream = true;
  StagingArray a[6];
};

class CudaDevice : public Device {
 public:
  CudaDevice(int index, std::string name, cudaStream_t stream)
      : index_(index), name_(std::move(name)), stream_(stream) {}
  ~CudaDevice() override {
    cudaSetDevice(index_);
    for (auto& lane : free_) {
      if (lane->owns_stream && lane->stream != nullptr) cudaStreamDestroy(lane->stream);
    }
    free_.clear();
    cudaGetLastError();
  }

  std::string name() const override { return name_; }
  DeviceKind kind() const override { return DeviceKind::kCuda; }

  StatusOr<void*> Allocate(uint64_t bytes) override {
    DCR_RETURN_IF_ERROR(Current());
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, std::max<uint64_t>(bytes, 1));
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      std::string have;
      if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
        have = ", " + std::to_string(free_b) + " of " + std::to_string(total_b) + " bytes free";
      }
      cudaGetLastError();
      return ResourceExhaustedError("out of device memory on " + name_ + ": " +
                                    std::to_string(bytes) + " bytes requested" + have);
    }
    DCR_RETURN_IF_ERROR(CudaStatus(e, "cudaMalloc").WithContext(name_));
    return p;
  }

  void Free(void* p) override {
    if (p == nullptr) return;
    cudaSetDevice(index_);
    cudaFree(p);
    cudaGetLastError();
  }

  Status Upload(void* dst, const void* src, uint64_t bytes) override {
    return Memcpy(dst, src, bytes, cudaMemcpyHostToDevice);
  }
  Status Download(void* dst, const void* src, uint64_t bytes) override {
    return Memcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
  }
  Status Copy(void* dst, const void* src, uint64_t bytes) override {
    return Memcpy(dst, src, bytes, cudaMemcpyDeviceToDevice);
  }

  Status Gather(const uint64_t* read_addr, const uint64_t* values, uint64_t n, int width,
                ValueMode mode, uint64_t* old_bits, uint64_t* new_bits) override {
    DCR_RETURN_IF_ERROR(CheckWidth("Gather", width));
    if (n == 0) return Status::OK();
    return OnLane([&](Lane& l) -> Status {
      for (int i = 0; i < 4; ++i) DCR_RETURN_IF_ERROR(l.a[i].Reserve(n * 8, name_));
      DCR_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(l.a[0].as<void>(), read_addr, n * 8, cudaMemcpyHostToDevice, l.stream));
      DCR_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(l.a[1].as<void>(), values, n * 8, cudaMemcpyHostToDevice, l.stream));
      DCR_RETURN_IF_ERROR(LaunchGather(l.a[0].as<uint64_t>(), l.a[1].as<uint64_t>(),
                                       l.a[2].as<uint64_t>(), l.a[3].as<uint64_t>(), n, width,
                                       static_cast<uint8_t>(mode), l.stream));
      DCR_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(old_bits, l.a[2].as<void>(), n * 8, cudaMemcpyDeviceToHost, l.stream));
      DCR_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(new_bits, l.a[3].as<void>(), n * 8, cudaMemcpyDeviceToHost, l.stream));
      return Status::OK();
    });
  }

  Status Scatter(const uint64_t* write_addr, const uint64_t* write_begin, const uint64_t* new_bits,
                 uint64_t n, int width) override {
    DCR_RETURN_IF_ERROR(CheckWidth("Scatter", width));
    if (n == 0) return Status::OK();
    return OnLane([&](Lane& l) -> Status {
      const uint64_t m = write_begin[n];
      DCR_RETURN_IF_ERROR(l.a[0].Reserve(m * 8, name_));
      DCR_RETURN_IF_ERROR(l.a[1].Reserve((n + 1) * 8, name_));
      DCR_RETURN_IF_ERROR(l.a[2].Reserve(n * 8, name_));
      if (m > 0) {
        DCR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(l.a[0].as<void>(), write_addr, m * 8,
                                                 cudaMemcpyHostToDevice, l.stream));
      }
      DCR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(l.a[1].as<void>(), write_begin, (n + 1) * 8,
                                               cudaMemcpyHostToDevice, l.stream));
      DCR_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(l.a[2].as<void>(), new_bits, n * 8, cudaMemcpyHostToDevice, l.stream));
      return LaunchScatter(l.a[0].as<uint64_t>(), l.a[1].as<uint64_t>(), l.a[2].as<uint64_t>(), n,
                           width, l.stream);
    });
  }

  StatusOr<DeviceDiffResult> Diff(const void* old_data, const void* new_data, uint64_t n, int width,
                                  ValueMode mode) override {
    DCR_RETURN_IF_ERROR(CheckWidth("Diff", width));
    DeviceDiffResult r;
    if (n == 0) return r;
    DCR_RETURN_IF_ERROR(OnLane([&](Lane& l) -> Status {
      StagingArray& flags = l.a[0];
      StagingArray& index = l.a[1];
      DCR_RETURN_IF_ERROR(flags.Reserve(n * 4, name_));
      DCR_RETURN_IF_ERROR(index.Reserve(n * 8, name_));
      DCR_RETURN_IF_ERROR(
          LaunchCompare(old_data, new_data, n, width, flags.as<uint32_t>(), l.stream));
      Status scan = ExclusiveScan(flags.as<uint32_t>(), index.as<uint64_t>(), n, l.stream);
      if (scan.code() == StatusCode::kResourceExhausted) {
        return ResourceExhaustedError("out of device memory on " + name_ + ": " + scan.message());
      }
      DCR_RETURN_IF_ERROR(scan);
      uint64_t last_index = 0;
      uint32_t last_flag = 0;
      DCR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&last_index, index.as<uint64_t>() + (n - 1), 8,
                                               cudaMemcpyDeviceToHost, l.stream));
      DCR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&last_flag, flags.as<uint32_t>() + (n - 1), 4,
                                               cudaMemcpyDeviceToHost, l.stream));
      DCR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(l.stream));
      const uint64_t k = last_index + last_flag;
      for (int i = 2; i < 6; ++i) DCR_RETURN_IF_ERROR(l.a[i].Reserve(k * 8, name_));
      DCR_RETURN_IF_ERROR(LaunchCompact(old_data, new_data, n, width, static_cast<uint8_t>(mode),
                                        flags.as<uint32_t>(), index.as<uint64_t>(),
                                        l.a[2].as<uint64_t>(), l.a[3].as<uint64_t>(),
                                        l.a[4].as<uint64_t>(), l.a[5].as<uint64_t>(), l.stream));
      r.positions.resize(k);
      r.values.resize(k);
      r.old_bits.resize(k);
      r.new_bits.resize(k);
      if (k > 0) {
        uint64_t* out[4] = {r.positions.data(), r.values.data(), r.old_bits.data(),
                            r.new_bits.data()};
        for (int i = 0; i < 4; ++i) {
          DCR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out[i], l.a[2 + i].as<void>(), k * 8,
                                                   cudaMemcpyDeviceToHost, l.stream));
        }
      }
      return Status::OK();
    }));
    return r;
  }

  StatusOr<Hash128> RangeHash(uint64_t salt, const void* data, int width, uint64_t begin,
                              uint64_t count) override {
    DCR_RETURN_IF_ERROR(CheckWidth("RangeHash", width));
    if (count == 0) return Hash128{};
    unsigned long long h[2] = {0, 0};
    DCR_RETURN_IF_ERROR(OnLane([&](Lane& l) -> Status {
      DCR_RETURN_IF_ERROR(l.a[0].Reserve(16, name_));
      DCR_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(l.a[0].as<void>(), 0, 16, l.stream));
      DCR_RETURN_IF_ERROR(LaunchRangeHash(salt, data, width, begin, count,
                                          l.a[0].as<unsigned long long>(), l.stream));
      DCR_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(h, l.a[0].as<void>(), 16, cudaMemcpyDeviceToHost, l.stream));
      return Status::OK();
    }));
    return Hash128{h[0], h[1]};
  }

  StatusOr<uint64_t> FirstDifference(const void* a, const void* b, uint64_t bytes) override {
    if (bytes == 0) return uint64_t{0};
    unsigned long long first = bytes;
    DCR_RETURN_IF_ERROR(OnLane([&](Lane& l) -> Status {
      DCR_RETURN_IF_ERROR(l.a[0].Reserve(8, name_));
      DCR_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(l.a[0].as<void>(), &first, 8, cudaMemcpyHostToDevice, l.stream));
      DCR_RETURN_IF_ERROR(
          LaunchFirstDifference(a, b, bytes, l.a[0].as<unsigned long long>(), l.stream));
      DCR_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(&first, l.a[0].as<void>(), 8, cudaMemcpyDeviceToHost, l.stream));
      return Status::OK();
    }));
    return static_cast<uint64_t>(first);
  }

 private:
  // A lane checked out of the pool for one call, returned when the call ends.
  class LaneLease {
   public:
    explicit LaneLease(CudaDevice* d) : d_(d) { status_ = d_->Checkout(&lane_); }
    // Waits for the lane's stream first: a call that failed midway may have left copies in
    // flight, and nothing of a call may outlive it.
    ~LaneLease() {
      if (!lane_) return;
      cudaStreamSynchronize(lane_->stream);
      cudaGetLastError();
      d_->Return(std::move(lane_));
    }
    Status status() const { return status_; }
    Lane& operator*() { return *lane_; }

   private:
    CudaDevice* d_;
    std::unique_ptr<Lane> lane_;
    Status status_;
  };

  Status Current() const { return CudaStatus(cudaSetDevice(index_), "cudaSetDevice"); }

  // Runs one call's work `body(lane)` (returning a Status) on a lane of this device, made current,
  // then waits for the lane's stream. The first error of these is returned; the lane goes back to
  // the pool only once its stream is idle.
  template <typename Body>
  Status OnLane(Body&& body) {
    DCR_RETURN_IF_ERROR(Current());
    LaneLease lane(this);
    DCR_RETURN_IF_ERROR(lane.status());
    Lane& l = *lane;
    DCR_RETURN_IF_ERROR(body(l));
    DCR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(l.stream));
    return Status::OK();
  }

  Status Checkout(std::unique_ptr<Lane>* out) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        *out = std::move(free_.back());
        free_.pop_back();
        return Status::OK();
      }
    }
    auto lane = std::make_unique<Lane>();
    if (stream_ != nullptr) {
      lane->stream = stream_;
      lane->owns_stream = false;
    } else {
      DCR_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&lane->stream, cudaStreamNonBlocking));
    }
    *out = std::move(lane);
    return Status::OK();
  }
  void Return(std::unique_ptr<Lane> lane) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(std::move(lane));
  }

  Status Memcpy(void* dst, const void* src, uint64_t bytes, cudaMemcpyKind kind) {
    if (bytes == 0) return Status::OK();
    DCR_RETURN_IF_ERROR(Current());
    LaneLease lane(this);
    DCR_RETURN_IF_ERROR(lane.status());
    DCR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, kind, (*lane).stream));
    DCR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize((*lane).stream));
    return Status::OK();
  }

  const int index_;
  const std::string name_;
  const cudaStream_t stream_;  // every lane's stream when set; else each lane owns one
  std::mutex mu_;
  // Lanes not in use (every lane once no call is in flight); guarded by mu_.
  std::vector<std::unique_ptr<Lane>> free_;
};

}  // namespace

StatusOr<std::unique_ptr<Device>> OpenCudaDevice(int index, void* stream) {
  cudaDeviceProp props{};
  DCR_RETURN_IF_ERROR(CheckDevice(index, &props));
  return std::unique_ptr<Device>(
      new CudaDevice(index, Describe(index, props), static_cast<cudaStream_t>(stream)));
}

Status ProbeCudaDevice(int index) {
  cudaDeviceProp props{};
  return CheckDevice(index, &props);
}

}  // namespace cuda
}  // namespace dcr
