// The device applier with BufferApplier's hash accounting (internal), for receivers.
#ifndef DCR_CORE_SRC_RECEIVERS_DEVICE_APPLIER_H_
#define DCR_CORE_SRC_RECEIVERS_DEVICE_APPLIER_H_

#include <memory>
#include <vector>

#include "dcr/device.h"

namespace dcr {
namespace internal {

// MakeDeviceApplier whose hash_delta() is the sum of the applied chunks' version_delta (as
// BufferApplier's: for an absolute chunk applied over bits other than the base, the move from the
// base), so a receiver accounts a full frame and MarkApplied's deltas as BufferReceiver does.
std::unique_ptr<DeviceApplier> MakeVersionDeltaDeviceApplier(std::shared_ptr<Device> device,
                                                             std::vector<DeviceTensor> tensors);

}  // namespace internal
}  // namespace dcr

#endif  // DCR_CORE_SRC_RECEIVERS_DEVICE_APPLIER_H_
