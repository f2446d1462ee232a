// OpenDevice / ProbeDevice: the backends of dcr/device.h by kind. The CUDA backend is linked in
// when dcr is built with CUDA (DCR_HAVE_CUDA); without it kCuda is refused with the reason.
#include "dcr/device.h"

#if DCR_HAVE_CUDA
#include "dcr/cuda_apply.h"
#endif

namespace dcr {

StatusOr<std::unique_ptr<Device>> OpenDevice(DeviceKind kind, int index) {
  switch (kind) {
    case DeviceKind::kCpu:
      return InvalidArgumentError("device 'cpu' is plain host storage, not a device to open");
    case DeviceKind::kHost:
      if (index != 0) {
        return InvalidArgumentError("the host device has only index 0, not " +
                                    std::to_string(index));
      }
      return MakeHostDevice();
    case DeviceKind::kCuda:
#if DCR_HAVE_CUDA
      return cuda::OpenCudaDevice(index);
#else
      return UnavailableError("CUDA: dcr was built without CUDA");
#endif
  }
  return InvalidArgumentError("unknown device kind");
}

Status ProbeDevice(DeviceKind kind, int index) {
#if DCR_HAVE_CUDA
  if (kind == DeviceKind::kCuda) return cuda::ProbeCudaDevice(index);
#endif
  return OpenDevice(kind, index).status();
}

}  // namespace dcr
