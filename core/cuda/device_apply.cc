// dcr::cuda entry points of cuda_apply.h: the generic device appliers and Device operations of
// dcr/device.h over the CUDA backend (cuda_device.cc) on the current device and a caller's stream.
#include <cuda_runtime.h>

#include "common.cuh"
#include "dcr/cuda_apply.h"
#include "dcr/device.h"
#include "dcr/status_macros.h"

namespace dcr {
namespace cuda {
namespace {

// The CUDA backend on the calling thread's current device, running on `stream` (null: the
// legacy default stream, ordered with the caller's default-stream work).
StatusOr<std::shared_ptr<Device>> CurrentDevice(void* stream) {
  int index = 0;
  const cudaError_t e = cudaGetDevice(&index);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return UnavailableError(std::string("CUDA: no usable device: ") + cudaGetErrorString(e));
  }
  DCR_ASSIGN_OR_RETURN(
      std::unique_ptr<Device> d,
      OpenCudaDevice(index, stream != nullptr ? stream : static_cast<void*>(cudaStreamLegacy)));
  return std::shared_ptr<Device>(std::move(d));
}

}  // namespace

bool DeviceAvailable() { return ProbeCudaDevice(0).ok(); }

std::string DeviceDescription() {
  auto d = OpenCudaDevice(0);
  if (!d.ok()) return d.status().message();
  return (*d)->name();
}

StatusOr<std::unique_ptr<DeviceApplier>> MakeDeviceApplier(std::vector<DeviceTensor> tensors,
                                                           void* stream) {
  DCR_ASSIGN_OR_RETURN(std::shared_ptr<Device> d, CurrentDevice(stream));
  return ::dcr::MakeDeviceApplier(std::move(d), std::move(tensors));
}

StatusOr<std::unique_ptr<DeviceApplier>> MakePlacementApplier(const PlacementMap& map,
                                                              std::vector<void*> device_buffers,
                                                              void* stream) {
  DCR_ASSIGN_OR_RETURN(std::shared_ptr<Device> d, CurrentDevice(stream));
  return MakeDevicePlacementApplier(std::move(d), map, std::move(device_buffers));
}

StatusOr<DeviceDiffResult> DeviceDiff(const void* old_data, const void* new_data, uint64_t n,
                                      int width, ValueMode mode, void* stream) {
  DCR_ASSIGN_OR_RETURN(std::shared_ptr<Device> d, CurrentDevice(stream));
  return d->Diff(old_data, new_data, n, width, mode);
}

StatusOr<Hash128> DeviceRangeHash(uint64_t salt, const void* data, int width, uint64_t begin,
                                  uint64_t count, void* stream) {
  DCR_ASSIGN_OR_RETURN(std::shared_ptr<Device> d, CurrentDevice(stream));
  return d->RangeHash(salt, data, width, begin, count);
}

}  // namespace cuda
}  // namespace dcr
