// The storage-independent half of the receiver.h contract (internal), shared by the receivers
// that apply chunks through an Applier with an additive hash_delta (BufferReceiver, the device
// receiver): Begin's checks, the chunk ledger of the delta in progress, Commit's proof and
// Verify's tensor-set check and message.
#ifndef DCR_CORE_SRC_RECEIVERS_DELTA_SESSION_H_
#define DCR_CORE_SRC_RECEIVERS_DELTA_SESSION_H_

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/delta.h"
#include "dcr/receiver.h"
#include "dcr/statusor.h"

namespace dcr {
namespace internal {

// What Begin establishes for a delta over a receiver's storage.
struct DeltaStart {
  uint64_t target_number = 0;
  Hash128 start;                // the held hash, or the identity terms alone for a full frame
  Inventory inventory;          // the delta's tensors, in tensor_index order
  std::vector<size_t> storage;  // storage[i]: index into the receiver's tensors of inventory i
};

// Begin's checks (receiver.h) of the serialized file header against a receiver holding `held`
// over tensors described by `storage`: kDataLoss (corrupt header), kFailedPrecondition (a delta in
// progress, when `in_progress`, naming `in_progress_target`; or another base, naming both
// hashes), kInvalidArgument (the inventory does not match the storage).
StatusOr<DeltaStart> CheckBegin(const uint8_t* header, size_t size, const VersionId& held,
                                const std::vector<const TensorInfo*>& storage, bool in_progress,
                                uint64_t in_progress_target);

// The descriptions of a receiver's storage, for CheckBegin. `Tensor` has a TensorInfo `info`
// (ReceiverTensor, DeviceReceiverTensor); the pointers are into `tensors`.
template <typename Tensor>
std::vector<const TensorInfo*> StorageInfos(const std::vector<Tensor>& tensors) {
  std::vector<const TensorInfo*> storage;
  for (const Tensor& t : tensors) storage.push_back(&t.info);
  return storage;
}

// The applier's tensors of the delta `ds` over the receiver's storage `tensors` (those given to
// CheckBegin): one `Target` (TensorBuffer, DeviceTensor) per inventory tensor, in tensor_index
// order, over the data of its storage tensor, with the inventory's width (at least 1), element
// count and salt.
template <typename Target, typename Tensor>
std::vector<Target> DeltaTensors(const DeltaStart& ds, const std::vector<Tensor>& tensors) {
  std::vector<Target> out;
  for (size_t i = 0; i < ds.inventory.tensors.size(); ++i) {
    const TensorInfo& t = ds.inventory.tensors[i];
    Target d;
    d.data = tensors[ds.storage[i]].data;
    d.width = std::max(1, t.width());
    d.num_elements = t.nbytes / static_cast<uint64_t>(d.width);
    d.salt = ds.inventory.salts[i];
    out.push_back(d);
  }
  return out;
}

// The chunks of the delta in progress: those claimed (being applied) or applied, and the sum of
// MarkApplied's version deltas. Thread-safe.
class ChunkLedger {
 public:
  // Forgets everything (a new delta, or none).
  void Reset();
  // A record of chunk `h` is about to be applied. OK(true): claimed, apply it (Release it if the
  // apply fails); OK(false): an absolute payload of a chunk already applied, skip it;
  // kFailedPrecondition: a relative payload of a chunk already applied, refused.
  StatusOr<bool> Claim(const ChunkHeader& h);
  void Release(uint64_t chunk_id);
  // MarkApplied: counts the chunk as applied (once) with its version delta.
  void Mark(uint64_t chunk_id, const Hash128& version_delta);
  Hash128 marked() const;
  // The chunks of `trailer` not claimed, sorted (all of them when `active` is false).
  std::vector<uint64_t> Missing(const Trailer& trailer, bool active) const;

 private:
  mutable std::mutex mu_;
  std::set<uint64_t> applied_;  // guarded by mu_
  Hash128 marked_;              // guarded by mu_
};

// Commit's proof (receiver.h): parses the trailer, refuses it with kFailedPrecondition naming the
// chunks of its table not applied, and with kDataLoss when `hash` (the start plus the applier's
// hash_delta) plus the ledger's marked sum differs from the target hash. Returns the trailer.
StatusOr<Trailer> CheckCommit(const uint8_t* trailer, size_t size, const ChunkLedger& ledger,
                              const Hash128& hash, uint64_t target_number);

// Verify's first half: the receiver's tensors `tensors` and `target`'s are the same set with the
// same dtypes and shapes (kDataLoss otherwise). target_of[k] receives target's tensor of
// tensors[k].
Status CheckTensorSet(const std::vector<TensorInfo>& tensors, const Checkpoint& target,
                      std::vector<const TensorInfo*>* target_of);
// Verify's refusal: tensor `t` differs from the target at byte `byte`.
Status TensorDiffers(const TensorInfo& t, uint64_t byte);

}  // namespace internal
}  // namespace dcr

#endif  // DCR_CORE_SRC_RECEIVERS_DELTA_SESSION_H_
