// CUDA receivers (dcr::cuda): the CUDA backend of dcr/device.h and stream-taking entry points over
// it, behind a header without CUDA types.
//
// Device pointers are void*; streams are opaque (a cudaStream_t passed as void*, nullptr = the
// default stream). Every function returns a dcr::Status: CUDA errors become kInternal (or
// kUnavailable when no device is present) with the CUDA message, and the sticky error is cleared;
// nothing aborts. The per-element logic is core/src/internal/element_ops.h, compiled for the
// device, so CPU tests exercise it. Only available when dcr was built with CUDA (target dcr::cuda).
//
// Appliers follow apply.h: a chunk is checked before anything is written (the old bits at the
// changed positions are gathered on the device, the packed-bits hashes compared on the host), then
// scattered in place. Positions arrive decoded on the host; the canonical element index of every
// change (and, for placement maps, every destination address) is computed on the host and uploaded
// with the values: the cost is proportional to the change, never to the model.
//
// Thread safety: as dcr/device.h (appliers take concurrent chunks covering disjoint elements).
#ifndef DCR_CORE_INCLUDE_DCR_CUDA_APPLY_H_
#define DCR_CORE_INCLUDE_DCR_CUDA_APPLY_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "dcr/apply.h"
#include "dcr/checkpoint.h"
#include "dcr/device.h"
#include "dcr/format.h"
#include "dcr/runtime.h"
#include "dcr/status.h"
#include "dcr/statusor.h"

namespace dcr {
namespace cuda {

// True when a CUDA device is usable (driver present, at least one device).
bool DeviceAvailable();
// "cuda:0 (NVIDIA H200, cc 9.0, 139 GiB)" or the reason there is none.
std::string DeviceDescription();

// The CUDA backend of dcr/device.h on device `index`. `stream` (a cudaStream_t as void*) null:
// each concurrent call runs on a stream of its own; otherwise every call runs on `stream`,
// ordered with the caller's work on it. Errors as OpenDevice(DeviceKind::kCuda, index).
// dcr::OpenDevice is the entry point of product code; this is for callers holding a stream.
StatusOr<std::unique_ptr<Device>> OpenCudaDevice(int index, void* stream = nullptr);
// The checks of OpenCudaDevice, nothing kept open.
Status ProbeCudaDevice(int index);

// The device types of dcr/device.h under their names in this header.
using DeviceTensor = ::dcr::DeviceTensor;
using DeviceApplier = ::dcr::DeviceApplier;
using DeviceDiffResult = ::dcr::DeviceDiffResult;

// The functions below run on the current CUDA device through OpenCudaDevice(current, stream)
// and the generic appliers of dcr/device.h (kUnavailable without a usable device).

// An Applier over device tensors indexed like the delta's inventory (an offline refit on the GPU,
// or a rank's storage image under serving-space deltas): dcr::MakeDeviceApplier.
StatusOr<std::unique_ptr<DeviceApplier>> MakeDeviceApplier(std::vector<DeviceTensor> tensors,
                                                           void* stream);

// An Applier over a serving rank's device buffers laid out by a PlacementMap (recorded with the
// runtime's loader copying through cudaMemcpy): every change is scattered to all its bit-preserving
// placements. Tensors with converted placements are refused with kFailedPrecondition naming the
// tensor (re-load them on the host, or use serving-space deltas). `device_buffers[b]` is the device
// address of map.buffers[b]. Elements are owned by their first placement (see ServingReplica).
StatusOr<std::unique_ptr<DeviceApplier>> MakePlacementApplier(const PlacementMap& map,
                                                              std::vector<void*> device_buffers,
                                                              void* stream);

// Delta construction on the GPU: compares `n` elements of `width` bytes at old/new (device) and
// returns the changed positions (ascending) and their values under `mode` (XOR mask, zigzag ulp
// difference or new bits), copied to the host.
StatusOr<DeviceDiffResult> DeviceDiff(const void* old_data, const void* new_data, uint64_t n,
                                      int width, ValueMode mode, void* stream);

// Additive content-hash terms (hash.h RangeHash) of elements [begin, begin+count) of a device
// tensor: equals RangeHash(salt, host copy, width, begin, count).
StatusOr<Hash128> DeviceRangeHash(uint64_t salt, const void* data, int width, uint64_t begin,
                                  uint64_t count, void* stream);

}  // namespace cuda
}  // namespace dcr

#endif  // DCR_CORE_INCLUDE_DCR_CUDA_APPLY_H_
