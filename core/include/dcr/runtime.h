// Receiver side: the serving runtime's storage and loader seam, copy interception, placement maps
// and in-place apply. (The reference rollout engine, a vLLM stand-in, is a fixture of the testing
// library.)
//
// A rollout engine places checkpoint tensors with its own rules (tensor parallelism, fused QKV and
// gate/up in its own order, vocab padding, transposed experts, FP32 buffers, FP8 quantization).
// dcr does not reimplement those rules. It runs the engine's *native loader* once under a copy hook
// (a recording load), learns where every canonical element landed, and from then on applies deltas
// in place:
//   * bit-preserving placements (the loader copied checkpoint bytes verbatim): XOR / ulp / absolute
//     values are scattered straight into the runtime's storage;
//   * converted placements (the loader wrote values it computed from a tensor: upcast norms, FP8):
//     the receiver keeps the canonical bits of those tensors (a shadow), applies the delta there
//     and re-runs the native loader on just the affected tensors (an overwrite);
//   * constants (computed from the configuration alone, e.g. rotary tables; memset padding) never
//     change with the weights.
// For FP8 serving there is a cheaper bit-exact path: a serving-space delta (BuildServingDelta) is a
// delta between the loader's storage images of base and target, so the receiver's storage is
// bit-preserving by construction and blocks whose scale did not move cost only their changed bytes.
//
// Pieces:
//   Storage, ModelLoader, LoadCheckpoint      the runtime's own world; knows nothing of deltas.
//   RecordLoad -> PlacementMap                interception (see "Interception" below).
//   ServingReplica                            the Receiver (receiver.h) of a serving replica: one
//                                             rank per serving TP rank, in-place apply,
//                                             incremental version hash, joint commit.
//   BuildServingDelta, StorageReceiver        the serving-space (FP8) path.
//
// Interception. During a recording load dcr interposes the process's memcpy, memmove, memset (and
// their _chk forms): a binary that records includes dcr/copy_interposers.h in one translation unit,
// which defines these symbols in the executable, so they take precedence over libc's for the
// executable and every shared library in it, and forward to libc's versions through
// dlsym(RTLD_NEXT). (They are not part of the dcr::receivers archive: an archive member defining
// memcpy would be linked into every program using dcr::receivers.) dcr::cuda interposes cudaMemcpy
// / cudaMemcpyAsync / cudaMemcpy2D(Async) the same way. A runtime in Python can preload a shim that
// includes the header, or report copies itself with dcr_copy_hook_note (dcr_c.h).
// Why symbol interposition and not a hook the loader calls: the loader stays unmodified and cannot
// forget a call site. Why not only that: GCC expands __builtin_memcpy inline when the size is a
// small constant, and a loader may also write storage with plain stores; those writes never reach
// a symbol. So every recording load is checked: the loader runs twice more, once into storage
// filled with 0xFF (bytes that come out equal to the 0x00-filled load but were not seen by the hook
// were written behind dcr's back: the recording fails with kFailedPrecondition naming the buffer)
// and once from a probe checkpoint whose elements all differ from the real one (a copied box whose
// bytes do not follow the checkpoint, e.g. converted in a staging buffer after the copy, is demoted
// to converted data of its tensor; any other byte that moves must lie in a region attributed to a
// tensor, else kFailedPrecondition). Copies from the checkpoint into a staging buffer and then into
// storage (bounce buffers) keep their provenance.
// Contract for loaders: place weights into storage with copy calls (memcpy / cudaMemcpy family);
// compute converted values into a staging buffer first; do it inside LoadWeight for the tensor they
// depend on (the receiver re-runs LoadWeight with the new tensor to refresh them).
//
// Thread safety: Storage and loaders are thread-compatible (one thread at a time); receivers are
// as receiver.h says; RecordLoad must not run concurrently with another RecordLoad in the same
// process.
#ifndef DCR_CORE_INCLUDE_DCR_RUNTIME_H_
#define DCR_CORE_INCLUDE_DCR_RUNTIME_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "dcr/apply.h"
#include "dcr/checkpoint.h"
#include "dcr/delta.h"
#include "dcr/dtype.h"
#include "dcr/format.h"
#include "dcr/receiver.h"
#include "dcr/status.h"
#include "dcr/statusor.h"

namespace dcr {

// ---------------------------------------------------------------------------------------------
// The runtime's own world.

// Named buffers of one serving rank (host memory). Buffers are allocated filled with fill().
class Storage {
 public:
  struct Buffer {
    std::string name;
    std::string dtype_name;
    DType dtype = DType::kUnknown;
    std::vector<int64_t> shape;
    uint64_t nbytes = 0;
    uint8_t* data = nullptr;
  };

  explicit Storage(uint8_t fill = 0) : fill_(fill) {}
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  // Allocates a buffer of prod(shape) elements of `dtype_name` filled with fill().
  // kInvalidArgument on a duplicate name, an unknown dtype or a negative dimension.
  StatusOr<uint8_t*> Allocate(const std::string& name, const std::string& dtype_name,
                              const std::vector<int64_t>& shape);
  // Buffers in allocation order.
  const std::vector<Buffer>& buffers() const { return buffers_; }
  // nullptr if absent.
  Buffer* Find(const std::string& name);
  const Buffer* Find(const std::string& name) const;
  uint64_t total_bytes() const;
  uint8_t fill() const { return fill_; }
  // The buffers as safetensors tensors (in allocation order), e.g. to write an image.
  std::vector<TensorView> Views() const;

 private:
  uint8_t fill_;
  std::vector<Buffer> buffers_;
  std::vector<std::unique_ptr<uint8_t[]>> memory_;
};

// One checkpoint tensor handed to a loader (vLLM's load_weights(name, tensor) pattern). `data`
// points into the checkpoint mapping (or a shadow copy) and stays valid during the call.
struct WeightRef {
  std::string name;
  std::string dtype_name;
  DType dtype = DType::kUnknown;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  uint64_t nbytes = 0;
};

// A serving runtime's native loader. Implementations know nothing about deltas.
class ModelLoader {
 public:
  virtual ~ModelLoader() = default;
  // Allocates the rank's buffers and computes load-time buffers (e.g. rotary tables).
  virtual Status Init(Storage* storage) = 0;
  // Places one checkpoint tensor (may be called again later with new values of the same tensor:
  // it must overwrite everything it derives from that tensor). kInvalidArgument for a tensor the
  // loader has no rule for or a shape it cannot place.
  virtual Status LoadWeight(const WeightRef& weight, Storage* storage) = 0;
};

// Makes a fresh loader for serving rank `rank`.
using LoaderFactory = std::function<StatusOr<std::unique_ptr<ModelLoader>>(int rank)>;

// The ordinary dense load: Init, then LoadWeight for every tensor of `ckpt` (file order).
Status LoadCheckpoint(const Checkpoint& ckpt, ModelLoader* loader, Storage* storage);

// ---------------------------------------------------------------------------------------------
// Interception and placement maps.

// Canonical elements [box] of tensor `tensor` copied verbatim into buffer `buffer`:
//   element  elem_offset + sum_d digit_d * src_stride[d]
//   lands at dst_offset  + sum_d digit_d * dst_stride[d]   (bytes)
// digits row-major over count[0..ndim) (last fastest); src strides are nested (each at least the
// extent of the dimensions inside it), so an element has at most one digit vector.
struct Placement {
  uint32_t tensor = 0;  // index into PlacementMap::tensors
  uint32_t buffer = 0;  // index into Storage::buffers()
  uint8_t width = 2;
  uint32_t ndim = 1;
  uint64_t elem_offset = 0;
  uint64_t count[3] = {1, 1, 1};
  int64_t src_stride[3] = {1, 0, 0};
  int64_t dst_stride[3] = {2, 0, 0};
  uint64_t dst_offset = 0;

  uint64_t num_elements() const { return count[0] * count[1] * count[2]; }
  uint64_t min_element() const { return elem_offset; }
  uint64_t max_element() const;
  // Byte offset in the buffer of canonical element `e`, or -1 if `e` is not in this box.
  int64_t Locate(uint64_t e) const;
};

// Bytes of a buffer written from data the loader computed (not copied from the checkpoint).
// tensor = index of the tensor being loaded when they were written; kConstantRegion for bytes
// written outside any LoadWeight (Init: rotary tables) or by memset (padding).
inline constexpr uint32_t kConstantRegion = 0xFFFFFFFFu;
struct ConvertedRegion {
  uint32_t tensor = kConstantRegion;
  uint32_t buffer = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
};

struct PlacementMap {
  std::vector<std::string> tensors;  // canonical names, sorted (the delta inventory order)
  std::vector<DType> tensor_dtypes;
  std::vector<uint64_t> tensor_elements;
  std::vector<std::string> buffers;   // Storage buffer names, allocation order
  std::vector<Placement> placements;  // bit-preserving
  std::vector<ConvertedRegion> converted;
  uint64_t copies_observed = 0;  // hooked calls during the recording load
  // Sums over placements / regions.
  uint64_t bit_preserving_bytes() const;
  uint64_t converted_bytes() const;  // tensor-attributed regions
  uint64_t constant_bytes() const;
  // Tensors with at least one converted region.
  std::set<uint32_t> converted_tensors() const;
  // One line per buffer: "name: N bytes bit-preserving, M converted (tensors...), K constant".
  std::string Describe() const;
};

struct RecordOptions {
  // Re-run the load into 0xFF-filled storage and fail on writes the hook did not see. Default on.
  bool check_unobserved_writes = true;
  // Re-run the load from a probe checkpoint (every element's lowest bit flipped) and check the
  // placements against it. Default on.
  bool probe = true;
};

// Recording load of `ckpt` through `factory(rank)` into `*storage` (fresh; filled with 0).
// Errors: the loader's own; kFailedPrecondition when the checks above find writes that dcr cannot
// attribute (the message names the buffer and byte offset); kInternal if another recording is
// active; kInvalidArgument for a sharded checkpoint (copies are recorded from one file image).
StatusOr<PlacementMap> RecordLoad(const Checkpoint& ckpt, const LoaderFactory& factory, int rank,
                                  std::unique_ptr<ModelLoader>* loader, Storage* storage,
                                  const RecordOptions& options = {});

// ---------------------------------------------------------------------------------------------
// Receivers.

struct ReplicaOptions {
  RecordOptions record;
};

// One serving replica: `tp` ranks (each with its own storage, native loader instance and
// placement map) that apply canonical deltas in place and commit together: a Receiver
// (receiver.h) over the runtime's storage.
//
// Apply (ApplyRecord): for every change the replica reads the current bits from the element's
// owner (the shadow for tensors with converted placements, else the first bit-preserving
// placement on the lowest rank), sums the element hash terms of old and new bits and compares
// them with the chunk's base_change_hash (relative payloads) and target_change_hash before
// anything is written (kFailedPrecondition / kDataLoss and no write on mismatch). Then it writes
// every placement on every rank and the shadow. Records are applied one at a time (concurrent
// calls are serialized). A chunk already applied: its relative payload is refused
// (kFailedPrecondition), its absolute payload skipped (OK); nothing is written either way.
// Commit re-loads converted tensors touched by the delta through the native loader (or the
// reload callback of Attach) before the version is reported whole; a reload error leaves the
// delta in progress. Verify runs a dense load of the target through a fresh native loader per
// rank and compares every buffer byte for byte (Create); for attached storage, whose loader is
// the runtime's, it compares every placed element and every shadow with the target (Attach).
class ServingReplica : public Receiver {
 public:
  // Records the load of `base` on every rank. The replica then holds version `base_version` whose
  // content hash is base.ContentHash().
  static StatusOr<std::unique_ptr<ServingReplica>> Create(int tp, const LoaderFactory& factory,
                                                          const Checkpoint& base,
                                                          uint64_t base_version,
                                                          const ReplicaOptions& options = {});
  // One rank of storage the runtime owns: the placement map recorded for it and the address of
  // each of its buffers (in map.buffers order). The buffers must outlive the replica.
  struct AttachedRank {
    PlacementMap map;
    std::vector<uint8_t*> buffers;
  };
  // Re-runs the runtime's loader on one converted tensor of rank `rank` with new canonical bytes.
  using ReloadFn = std::function<Status(int rank, const WeightRef& weight)>;
  // A replica over storage the runtime loaded itself (e.g. through the C API's recorder), holding
  // `base` (its tensors are the mapped ones) as version `base_version`. `reload` may be empty:
  // Commit then fails with kFailedPrecondition when a converted tensor changed. Errors:
  // kInvalidArgument (no ranks, buffer addresses that do not match a map, maps naming different
  // tensors, a mapped tensor missing from `base`).
  static StatusOr<std::unique_ptr<ServingReplica>> Attach(std::vector<AttachedRank> ranks,
                                                          const Checkpoint& base,
                                                          uint64_t base_version, ReloadFn reload);
  ~ServingReplica() override;

  // Receiver (see the class comment for what is specific to a replica).
  Status Begin(const uint8_t* header, size_t size) override;
  Status ApplyRecord(const uint8_t* record, size_t size) override;
  Status Commit(const uint8_t* trailer, size_t size) override;
  // Abandons a delta in progress (the storage may be mixed; repair with absolute chunks or reload).
  void Abort() override;
  // Also marks every converted tensor for re-loading at Commit (the chunk's tensors are unknown).
  Status MarkApplied(uint64_t chunk_id, const Hash128& version_delta) override;
  Status Verify(const Checkpoint& target) const override;
  VersionId held() const override;
  bool in_delta() const override;
  std::vector<uint64_t> MissingChunks(const Trailer& trailer) const override;

  // ApplyRecord after its decode step, for a caller that holds the record's decoded form (e.g.
  // a benchmark timing the apply apart from the decode). Same checks and outcome.
  Status ApplyDecoded(const DecodedChunk& chunk);

  int tp() const;
  bool committed() const { return !in_delta(); }  // true when no delta is in progress
  uint64_t version() const;                       // last committed version
  Hash128 version_hash() const;                   // last committed content hash
  Hash128 running_hash() const;                   // incremental hash of what is applied so far
  // REQUIRES: built by Create (attached storage belongs to the runtime).
  const Storage& storage(int rank) const;
  using Receiver::storage;  // the Receiver whose bytes a commitment covers (receiver.h)
  const PlacementMap& placement(int rank) const;
  // Bytes held as canonical shadows (tensors with converted placements).
  uint64_t shadow_bytes() const;

  struct Impl;

 private:
  explicit ServingReplica(std::unique_ptr<Impl> impl);
  // Ownership election, shadows and the held version, shared by Create and Attach.
  static StatusOr<std::unique_ptr<ServingReplica>> Build(std::unique_ptr<Impl> impl,
                                                         const Checkpoint& base,
                                                         uint64_t base_version);
  std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------------------------------------
// Serving-space deltas (bit-exact FP8 at the cost of the changed bytes of the storage image).

// The storage image of a rank as a safetensors checkpoint (buffers are tensors, names as in the
// storage; bytes copied).
StatusOr<std::unique_ptr<Checkpoint>> StorageImage(const Storage& storage);

// Sender side: runs the native loader of `rank` on base and target and builds the delta between
// the two storage images into `sink`. The receiver's storage version hash is the image's content
// hash. Cost: two dense loads of the rank plus a delta build over its storage bytes.
StatusOr<DeltaStats> BuildServingDelta(const Checkpoint& base, const Checkpoint& target,
                                       const LoaderFactory& factory, int rank,
                                       const DeltaOptions& options, DeltaSink* sink);

// Receiver side of a serving-space delta: a BufferReceiver over the buffers of one rank's
// storage (identity placement; buffers are the image's tensors), holding the image's version.
// Verify compares the storage with a dense load of a canonical target through the rank's native
// loader when a loader factory was given, else with `target` read as a storage image.
class StorageReceiver : public BufferReceiver {
 public:
  // `storage` must outlive the receiver. The held version's hash is computed from the storage.
  // `factory` may be empty (Verify then takes its target as a storage image).
  static std::unique_ptr<StorageReceiver> Create(Storage* storage, uint64_t version,
                                                 LoaderFactory factory = nullptr, int rank = 0);
  Status Verify(const Checkpoint& target) const override;

 private:
  StorageReceiver(std::vector<ReceiverTensor> tensors, VersionId held, LoaderFactory factory,
                  int rank);
  LoaderFactory factory_;
  int rank_;
};

}  // namespace dcr

#endif  // DCR_CORE_INCLUDE_DCR_RUNTIME_H_
