// Internal: a device receiver loaded from a committed image instead of a checkpoint's files.
#ifndef DCR_CORE_SRC_RECEIVERS_DEVICE_IMAGE_H_
#define DCR_CORE_SRC_RECEIVERS_DEVICE_IMAGE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/device.h"
#include "dcr/statusor.h"

namespace dcr::internal {

// A device receiver (dcr/device.h) with the tensors of `layout` (names, dtypes, shapes, in its
// order), whose bytes are read at tensor_bytes[k] for tensor k instead of from the checkpoint's
// files (a receiver's committed image, laid out as the files of its base, one or many shards).
// held() is version `number` with the content hash of what was uploaded, so a caller compares
// it with the version it expects. Errors: kInvalidArgument without a device, or when
// tensor_bytes does not give every tensor; MakeDeviceReceiver's otherwise.
StatusOr<std::unique_ptr<DeviceReceiver>> MakeDeviceReceiverFromImage(
    std::shared_ptr<Device> device, const Checkpoint& layout,
    const std::vector<const uint8_t*>& tensor_bytes, uint64_t number);

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_RECEIVERS_DEVICE_IMAGE_H_
