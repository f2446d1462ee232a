// The device half of the in-memory C API (dcr/codec_c.h *_device functions), internal: the work
// over a Device lives in dcr::receivers beside the host path it mirrors; the entry points, which
// open devices (dcr::devices), call it.
#ifndef DCR_CORE_SRC_RECEIVERS_CODEC_DEVICE_H_
#define DCR_CORE_SRC_RECEIVERS_CODEC_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "dcr/codec_c.h"
#include "dcr/device.h"
#include "dcr/hash.h"
#include "dcr/status.h"
#include "dcr/statusor.h"

namespace dcr::internal {

// A host backend (dcr/device.h MakeHostDevice) that also takes the host ranges `adopted`
// (address, bytes) as its memory: the range checks of its operations pass inside them as inside
// its allocations. It never frees them. What a device call on caller-held host tensors runs on.
std::unique_ptr<Device> MakeHostDeviceOver(std::vector<std::pair<const void*, uint64_t>> adopted);

// dcr_encode_delta / dcr_apply_delta / dcr_tensors_hash with every descriptor's `data` an address
// of `device` (codec_c.h's contracts; `options` already defaulted by the caller).
StatusOr<std::vector<uint8_t>> EncodeOnDevice(Device* device, const dcr_tensor* base, size_t n_base,
                                              const dcr_tensor* target, size_t n_target,
                                              const dcr_codec_options& options);
Status ApplyOnDevice(std::shared_ptr<Device> device, const dcr_tensor* tensors, size_t n,
                     const void* delta, size_t size, const dcr_codec_options& options,
                     dcr_apply_result* result);
// dcr_placement_map_create whose destinations are addresses of `device` (the map keeps it):
// dcr_apply_delta_placed and dcr_placement_map_write then scatter to them on the device.
// REQUIRES: out is not null.
Status CreatePlacementMapOnDevice(std::shared_ptr<Device> device, const dcr_tensor* tensors,
                                  size_t n, const dcr_placement* placements, size_t n_placements,
                                  dcr_placement_map** out);
StatusOr<Hash128> HashOnDevice(Device* device, const dcr_tensor* tensors, size_t n,
                               int32_t threads);

// A device receiver (dcr/device.h) over `tensors`, device memory the caller holds: the receiver
// neither allocates nor frees it and writes it in place. It holds `held` (taken on trust).
std::unique_ptr<DeviceReceiver> MakeBorrowingDeviceReceiver(
    std::shared_ptr<Device> device, std::vector<DeviceReceiverTensor> tensors, VersionId held);

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_RECEIVERS_CODEC_DEVICE_H_
