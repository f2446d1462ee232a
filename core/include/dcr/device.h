// Devices: the memory a receiver's weights live in and the operations dcr runs on it.
//
// A Device owns allocations in its memory and runs the few bulk operations a refit needs over
// them: uploads and downloads, device-to-device copies, the gather/scatter of a chunk's changes,
// the diff of two arrays (delta construction), the additive content hash of a range (hash.h
// RangeHash) and a byte comparison. Two backends implement it with the same results, bit for bit:
//   * host: every operation run by the CPU over host memory (the code path of the GPU without a
//     GPU: CI runs it, and a laptop runs a cluster scenario on it);
//   * cuda: the CUDA kernels of core/cuda (only when dcr is built with CUDA; OpenDevice says why
//     not otherwise).
// The per-element logic of both is core/src/internal/element_ops.h.
//
// Addresses: a "device address" is a pointer into an allocation of the same Device (plus an
// offset); host arrays are ordinary host memory. Operations are synchronous: when one returns OK
// its effect is complete and visible to every later call from any thread.
//
// Thread safety: every Device method may be called concurrently from any number of threads (the
// CUDA backend gives each concurrent call its own stream and staging arrays). Concurrent writes
// to the same device bytes are the caller's race.
//
// On top of a Device: DeviceApplier (apply.h's Applier over device tensors or a PlacementMap) and
// MakeDeviceReceiver (receiver.h's Receiver whose storage is device memory).
#ifndef DCR_CORE_INCLUDE_DCR_DEVICE_H_
#define DCR_CORE_INCLUDE_DCR_DEVICE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dcr/apply.h"
#include "dcr/format.h"
#include "dcr/hash.h"
#include "dcr/receiver.h"
#include "dcr/runtime.h"
#include "dcr/status.h"
#include "dcr/statusor.h"

namespace dcr {

// Where a receiver's weights live. Scenario and CLI names: "cpu", "host", "cuda".
//   kCpu:  plain host receivers (BufferReceiver), the default; no Device is involved.
//   kHost: the device path on the host backend.
//   kCuda: the CUDA backend.
enum class DeviceKind { kCpu, kHost, kCuda };

// "cpu" / "host" / "cuda" -> kind; kInvalidArgument naming the accepted names otherwise.
StatusOr<DeviceKind> ParseDeviceKind(const std::string& name);
// The name ParseDeviceKind accepts.
const char* DeviceKindName(DeviceKind kind);

// The changes between two arrays of elements (Device::Diff): ascending positions, the value that
// turns old into new under the chosen ValueMode (element_ops.h EncodeValue), and the old and new
// bits, all zero-extended to 64 bits.
struct DeviceDiffResult {
  std::vector<uint64_t> positions;
  std::vector<uint64_t> values;
  std::vector<uint64_t> old_bits;
  std::vector<uint64_t> new_bits;
};

class Device {
 public:
  virtual ~Device() = default;

  // "host", or "cuda:0 (NVIDIA H200, cc 9.0, 139 GiB)".
  virtual std::string name() const = 0;
  virtual DeviceKind kind() const = 0;

  // `bytes` of device memory (contents undefined), aligned to 256 bytes; a zero-byte request
  // returns a distinct valid address. kResourceExhausted "out of device memory on <name>: ..."
  // when the device cannot hold it; other errors as the backend reports them.
  virtual StatusOr<void*> Allocate(uint64_t bytes) = 0;
  // Releases an allocation of this device. REQUIRES: `p` was returned by Allocate and not freed,
  // or is null (no-op).
  virtual void Free(void* p) = 0;

  // Copies `bytes` host -> device, device -> host, device -> device. Ranges must not overlap.
  virtual Status Upload(void* dev_dst, const void* host_src, uint64_t bytes) = 0;
  virtual Status Download(void* host_dst, const void* dev_src, uint64_t bytes) = 0;
  virtual Status Copy(void* dev_dst, const void* dev_src, uint64_t bytes) = 0;

  // For i in [0, n): old_bits[i] = the `width`-byte element at device address read_addr[i];
  // new_bits[i] = ApplyValue(mode, width, old_bits[i], values[i]). Nothing is written on the
  // device. read_addr, values, old_bits, new_bits are host arrays of n entries.
  // REQUIRES: width is 1, 2, 4 or 8; every address naturally aligned for `width`.
  virtual Status Gather(const uint64_t* read_addr, const uint64_t* values, uint64_t n, int width,
                        ValueMode mode, uint64_t* old_bits, uint64_t* new_bits) = 0;
  // For i in [0, n): writes the low `width` bytes of new_bits[i] at every device address
  // write_addr[write_begin[i] .. write_begin[i+1]). Host arrays: write_begin has n + 1 entries
  // (write_begin[0] = 0), write_addr write_begin[n]. REQUIRES as Gather.
  virtual Status Scatter(const uint64_t* write_addr, const uint64_t* write_begin,
                         const uint64_t* new_bits, uint64_t n, int width) = 0;

  // The elements i < n where the `width`-byte elements at device addresses old_data and new_data
  // differ, with their values under `mode`, copied to the host. kInvalidArgument for a width
  // other than 1, 2, 4, 8.
  virtual StatusOr<DeviceDiffResult> Diff(const void* old_data, const void* new_data, uint64_t n,
                                          int width, ValueMode mode) = 0;

  // hash.h RangeHash(salt, <the same bytes on the host>, width, begin, count) of the tensor whose
  // element 0 is at device address `data`.
  virtual StatusOr<Hash128> RangeHash(uint64_t salt, const void* data, int width, uint64_t begin,
                                      uint64_t count) = 0;

  // The index of the first byte where device ranges a[0, bytes) and b[0, bytes) differ; `bytes`
  // if they are equal.
  virtual StatusOr<uint64_t> FirstDifference(const void* a, const void* b, uint64_t bytes) = 0;
};

// Opens backend `kind` (kHost or kCuda), device `index` (the CUDA ordinal; the host backend has
// only index 0). Errors: kInvalidArgument for kCpu (not a device) or a bad index of the host
// backend; kUnavailable naming CUDA and the reason when dcr was built without CUDA ("dcr was
// built without CUDA"), or no usable device is present ("CUDA: no usable device: <CUDA's error>",
// an index out of range names the device count).
StatusOr<std::unique_ptr<Device>> OpenDevice(DeviceKind kind, int index = 0);
// The checks of OpenDevice, nothing kept open.
Status ProbeDevice(DeviceKind kind, int index = 0);

// Options of the host backend.
struct HostDeviceOptions {
  // Bytes the device's allocations may hold together; beyond it Allocate fails with
  // kResourceExhausted as a full GPU would. 0 (the default) = no limit but the host's.
  uint64_t memory_bytes = 0;
};
// The host backend (what OpenDevice(kHost) returns, with default options). It also checks that
// the ranges of Upload, Download, Copy, Diff, RangeHash and FirstDifference lie inside its
// allocations (kInvalidArgument otherwise), so host code passing host pointers as device
// addresses fails here as it would on a GPU.
std::unique_ptr<Device> MakeHostDevice(const HostDeviceOptions& options = {});

// The local rank of this process on its host, from the launcher's environment: LOCAL_RANK,
// SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_RANK (the first set, as a non-negative integer); -1 if
// none is set (or none parses).
int LocalRankFromEnvironment();

// ---- appliers over device memory ----

// A canonical tensor in device memory (like TensorBuffer): `data` a device address of `device`.
struct DeviceTensor {
  void* data = nullptr;
  uint64_t num_elements = 0;
  int width = 2;
  uint64_t salt = 0;  // TensorSalt(name)
};

// An Applier whose storage is device memory. ApplyChunk decodes nothing itself: the canonical
// element and device address(es) of every change are computed on the calling (host) thread; the
// old bits are gathered on the device and the chunk's packed-bits hashes checked on the host
// before anything is written (a refused chunk writes nothing); then the new bits are scattered.
// Cost on the device and the host is proportional to the chunk's changes, never to the model.
// Thread safety: ApplyChunk may run concurrently for chunks covering disjoint elements.
class DeviceApplier : public Applier {
 public:
  // The additive content-hash movement of the applied chunks (terms of the actual old and new
  // bits, so an absolute chunk applied twice moves it once).
  virtual Hash128 hash_delta() const = 0;
};

// An applier over `tensors` indexed like the delta's inventory (tensor_index). Errors of
// ApplyChunk: those of apply.h (kFailedPrecondition for bits other than the chunk's base,
// kDataLoss for corrupt chunks or segments that do not fit `tensors`) and the device's.
std::unique_ptr<DeviceApplier> MakeDeviceApplier(std::shared_ptr<Device> device,
                                                 std::vector<DeviceTensor> tensors);

// An applier over a serving rank's device buffers laid out by `map` (runtime.h): every change is
// scattered to all its bit-preserving placements; `buffers[b]` is the device address of
// map.buffers[b]. Chunks touching a tensor with converted placements are refused with
// kFailedPrecondition naming it (re-load it through the runtime's loader, or use serving-space
// deltas). kInvalidArgument when buffers.size() != map.buffers.size().
StatusOr<std::unique_ptr<DeviceApplier>> MakeDevicePlacementApplier(std::shared_ptr<Device> device,
                                                                    const PlacementMap& map,
                                                                    std::vector<void*> buffers);

// ---- the device receiver ----

// One tensor of a DeviceReceiver's storage: its description and its device address.
struct DeviceReceiverTensor {
  TensorInfo info;
  void* data = nullptr;
};

// A Receiver (receiver.h contract, the conformance suite runs it) whose storage is device memory:
// one allocation per tensor of the base checkpoint, loaded through Upload. The content hash is
// computed with RangeHash on the device (it equals the file's). Chunk records are decoded on the
// calling (host) thread and applied by a DeviceApplier (ApplyRecord runs concurrently for
// distinct chunks). Verify uploads the target, tensor by tensor in pieces of at most 64 MiB, into
// one device scratch allocation reused for every piece and compares with FirstDifference: the
// model is never copied back. The receiver frees its allocations when destroyed and holds a
// reference to its device.
class DeviceReceiver : public Receiver {
 public:
  // The storage, in the base checkpoint's tensor order (device addresses of device()). Written in
  // place by ApplyRecord; a caller may read it between calls.
  virtual const std::vector<DeviceReceiverTensor>& tensors() const = 0;
  virtual Device* device() const = 0;
};

// A device receiver holding the checkpoint at `base_path` (a file or a shard directory, as
// BufferReceiver::Load takes it) as version `number`. Errors: those of Checkpoint::Open;
// kResourceExhausted when the device cannot hold the checkpoint (everything allocated is freed
// first); the device's errors.
StatusOr<std::unique_ptr<DeviceReceiver>> MakeDeviceReceiver(std::shared_ptr<Device> device,
                                                             const std::string& base_path,
                                                             uint64_t number = 0);
// The same from a checkpoint already open.
StatusOr<std::unique_ptr<DeviceReceiver>> MakeDeviceReceiver(std::shared_ptr<Device> device,
                                                             const Checkpoint& base,
                                                             uint64_t number = 0);

}  // namespace dcr

#endif  // DCR_CORE_INCLUDE_DCR_DEVICE_H_
