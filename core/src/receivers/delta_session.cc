// The storage-independent half of the receiver.h contract (delta_session.h).
#include "receivers/delta_session.h"

#include <algorithm>
#include <map>

#include "dcr/hash.h"
#include "dcr/status_macros.h"
#include "internal/str_format.h"

namespace dcr {
namespace internal {

StatusOr<DeltaStart> CheckBegin(const uint8_t* header, size_t size, const VersionId& held,
                                const std::vector<const TensorInfo*>& storage, bool in_progress,
                                uint64_t in_progress_target) {
  size_t consumed = 0;
  DCR_ASSIGN_OR_RETURN(FileHeader fh, ParseFileHeader(header, size, &consumed));
  if (in_progress) {
    return FailedPreconditionError("receiver: the delta to v" + std::to_string(in_progress_target) +
                                   " is in progress");
  }
  const bool no_base = (fh.flags & kFlagNoBase) != 0;
  if (!no_base && fh.base_hash != held.hash) {
    return FailedPreconditionError("delta is for base " + fh.base_hash.ToHex() +
                                   " but this receiver holds " + held.ToString() + " (" +
                                   held.hash.ToHex() + ")");
  }
  DeltaStart ds;
  DCR_ASSIGN_OR_RETURN(ds.inventory, Inventory::FromHeader(fh));
  const Inventory& inv = ds.inventory;
  if (inv.tensors.size() != storage.size()) {
    return InvalidArgumentError("receiver holds " + std::to_string(storage.size()) +
                                " tensors, the delta's inventory has " +
                                std::to_string(inv.tensors.size()));
  }
  std::map<std::string, size_t> by_name;
  for (size_t k = 0; k < storage.size(); ++k) by_name[storage[k]->name] = k;
  ds.start = no_base ? Hash128{} : held.hash;
  for (const TensorInfo& t : inv.tensors) {
    auto it = by_name.find(t.name);
    if (it == by_name.end() || storage[it->second]->dtype_name != t.dtype_name ||
        storage[it->second]->shape != t.shape || storage[it->second]->nbytes != t.nbytes) {
      return InvalidArgumentError("receiver lacks tensor '" + t.name +
                                  "' with the delta's dtype/shape");
    }
    ds.storage.push_back(it->second);
    // Without a base the start is the identity terms alone (a full frame's version_delta carries
    // every element's term).
    if (no_base) HashAdd(&ds.start, TensorIdentityTerm(t.name, t.dtype_name, t.shape));
  }
  ds.target_number = fh.target_version;
  return ds;
}

void ChunkLedger::Reset() {
  std::lock_guard<std::mutex> lock(mu_);
  applied_.clear();
  marked_ = Hash128{};
}

StatusOr<bool> ChunkLedger::Claim(const ChunkHeader& h) {
  std::lock_guard<std::mutex> lock(mu_);
  if (applied_.insert(h.chunk_id).second) return true;
  if (IsRelative(h.value_mode)) {
    return FailedPreconditionError("chunk " + std::to_string(h.chunk_id) +
                                   " is already applied; its relative payload is refused, "
                                   "nothing written");
  }
  return false;  // an absolute payload again: idempotent, skipped
}

void ChunkLedger::Release(uint64_t chunk_id) {
  std::lock_guard<std::mutex> lock(mu_);
  applied_.erase(chunk_id);
}

void ChunkLedger::Mark(uint64_t chunk_id, const Hash128& version_delta) {
  std::lock_guard<std::mutex> lock(mu_);
  if (applied_.insert(chunk_id).second) HashAdd(&marked_, version_delta);
}

Hash128 ChunkLedger::marked() const {
  std::lock_guard<std::mutex> lock(mu_);
  return marked_;
}

std::vector<uint64_t> ChunkLedger::Missing(const Trailer& trailer, bool active) const {
  std::vector<uint64_t> ids;
  std::lock_guard<std::mutex> lock(mu_);
  for (const ChunkTableEntry& e : trailer.chunks) {
    if (!active || applied_.count(e.chunk_id) == 0) ids.push_back(e.chunk_id);
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

StatusOr<Trailer> CheckCommit(const uint8_t* trailer, size_t size, const ChunkLedger& ledger,
                              const Hash128& hash, uint64_t target_number) {
  DCR_ASSIGN_OR_RETURN(Trailer tr, ParseTrailer(trailer, size));
  std::vector<uint64_t> missing = ledger.Missing(tr, true);
  if (!missing.empty()) {
    return FailedPreconditionError("receiver: chunks not applied: " + IdList(missing) + "; v" +
                                   std::to_string(target_number) + " not committed");
  }
  Hash128 h = hash;
  HashAdd(&h, ledger.marked());
  if (h != tr.target_hash) {
    return DataLossError("receiver content hash " + h.ToHex() + " differs from the target's " +
                         tr.target_hash.ToHex() + " after all chunks");
  }
  return tr;
}

Status CheckTensorSet(const std::vector<TensorInfo>& tensors, const Checkpoint& target,
                      std::vector<const TensorInfo*>* target_of) {
  if (target.tensors().size() != tensors.size()) {
    return DataLossError("receiver holds " + std::to_string(tensors.size()) +
                         " tensors, the target has " + std::to_string(target.tensors().size()));
  }
  target_of->clear();
  for (const TensorInfo& t : tensors) {
    const TensorInfo* tt = target.Find(t.name);
    if (tt == nullptr || tt->nbytes != t.nbytes || tt->dtype_name != t.dtype_name ||
        tt->shape != t.shape) {
      return DataLossError("tensor '" + t.name + "' differs from the target in name/dtype/shape");
    }
    target_of->push_back(tt);
  }
  return Status();
}

Status TensorDiffers(const TensorInfo& t, uint64_t byte) {
  const int w = std::max(1, t.width());
  return DataLossError("tensor '" + t.name + "' differs from the target at element " +
                       std::to_string(byte / static_cast<uint64_t>(w)) + " (byte " +
                       std::to_string(byte) + ")");
}

}  // namespace internal
}  // namespace dcr
