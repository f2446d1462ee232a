// CUDA receivers (dcr::cuda): apply, diff and hash kernels behind a header without CUDA types.
//
// Device pointers are void*; streams are opaque (a cudaStream_t passed as void*, nullptr = the
// default stream). Every function returns a dcr::Status: CUDA errors become kInternal (or
// kUnavailable when no device is present) with the CUDA message, and the sticky error is cleared;
// nothing aborts. The per-element logic is core/src/internal/element_ops.h, compiled for the device,
// so CPU tests exercise it. Only available when dcr was built with CUDA (target dcr::cuda).
//
// Appliers follow apply.h: a chunk is checked before anything is written (the old bits at the
// changed positions are gathered on the device, the packed-bits hashes compared on the host), then
// scattered in place. Positions arrive decoded on the host; the canonical element index of every
// change (and, for placement maps, every destination address) is computed on the host and uploaded
// with the values: the cost is proportional to the change, never to the model.
//
// Thread safety: an applier is used by one thread at a time (it owns staging buffers).
#ifndef DCR_CORE_INCLUDE_DCR_CUDA_APPLY_H_
#define DCR_CORE_INCLUDE_DCR_CUDA_APPLY_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "dcr/apply.h"
#include "dcr/checkpoint.h"
#include "dcr/format.h"
#include "dcr/runtime.h"
#include "dcr/status.h"
#include "dcr/statusor.h"

namespace dcr {
namespace cuda {

// True when a CUDA device is usable (driver present, at least one device).
bool DeviceAvailable();
// "NVIDIA H200, cc 9.0, 139 GiB" or the reason there is none.
std::string DeviceDescription();

// A canonical tensor in device memory (like TensorBuffer).
struct DeviceTensor {
  void* data = nullptr;
  uint64_t num_elements = 0;
  int width = 2;
  uint64_t salt = 0;  // TensorSalt(name)
};

// An Applier over device tensors indexed like the delta's inventory (an offline refit on the GPU,
// or a rank's storage image under serving-space deltas). hash_delta() accumulates the additive
// version-hash movement of the applied chunks (terms of the actual old and new bits).
class DeviceApplier : public Applier {
 public:
  virtual Hash128 hash_delta() const = 0;
};
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
struct DeviceDiffResult {
  std::vector<uint64_t> positions;
  std::vector<uint64_t> values;
  std::vector<uint64_t> old_bits;
  std::vector<uint64_t> new_bits;
};
StatusOr<DeviceDiffResult> DeviceDiff(const void* old_data, const void* new_data, uint64_t n,
                                      int width, ValueMode mode, void* stream);

// Additive content-hash terms (hash.h RangeHash) of elements [begin, begin+count) of a device
// tensor: equals RangeHash(salt, host copy, width, begin, count).
StatusOr<Hash128> DeviceRangeHash(uint64_t salt, const void* data, int width, uint64_t begin,
                                  uint64_t count, void* stream);

}  // namespace cuda
}  // namespace dcr

#endif  // DCR_CORE_INCLUDE_DCR_CUDA_APPLY_H_
