// Serving-space deltas: deltas between the native loader's storage images (bit-exact FP8).
#include <cstring>

#include "dcr/hash.h"
#include "dcr/runtime.h"
#include "dcr/status_macros.h"
#include "internal/element_ops.h"
#include "runtime/chunk_apply.h"

namespace dcr {

StatusOr<std::unique_ptr<Checkpoint>> StorageImage(const Storage& storage) {
  return Checkpoint::FromBytes(SafetensorsImage(storage.Views()));
}

StatusOr<DeltaStats> BuildServingDelta(const Checkpoint& base, const Checkpoint& target,
                                       const LoaderFactory& factory, int rank,
                                       const DeltaOptions& options, DeltaSink* sink) {
  Storage sb(0), st(0);
  DCR_ASSIGN_OR_RETURN(std::unique_ptr<ModelLoader> lb, factory(rank));
  DCR_RETURN_IF_ERROR(LoadCheckpoint(base, lb.get(), &sb));
  DCR_ASSIGN_OR_RETURN(std::unique_ptr<ModelLoader> lt, factory(rank));
  DCR_RETURN_IF_ERROR(LoadCheckpoint(target, lt.get(), &st));
  DCR_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> bi, StorageImage(sb));
  DCR_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ti, StorageImage(st));
  return BuildDelta(bi.get(), *ti, options, sink);
}

namespace {

struct BufferStore {
  std::vector<TensorBuffer>* bufs;
  Status Check(const Segment& sg) const {
    if (sg.tensor_index >= bufs->size()) return DataLossError("buffer index out of range");
    return internal::CheckSegmentBounds(sg, (*bufs)[sg.tensor_index].num_elements);
  }
  uint64_t Salt(uint32_t t) const { return (*bufs)[t].salt; }
  void OnSegment(const Segment&) {}
  uint64_t Read(uint32_t t, uint64_t e) const {
    const TensorBuffer& b = (*bufs)[t];
    return internal::LoadElem(b.data, b.width, e);
  }
  void Write(uint32_t t, uint64_t e, uint64_t bits) {
    const TensorBuffer& b = (*bufs)[t];
    internal::StoreElem(b.data, b.width, e, bits);
  }
};

}  // namespace

StatusOr<std::unique_ptr<StorageReceiver>> StorageReceiver::Create(Storage* storage,
                                                                   uint64_t version) {
  std::unique_ptr<StorageReceiver> r(new StorageReceiver());
  r->storage_ = storage;
  std::vector<const Storage::Buffer*> sorted;
  for (const auto& b : storage->buffers()) sorted.push_back(&b);
  std::sort(sorted.begin(), sorted.end(),
            [](const Storage::Buffer* a, const Storage::Buffer* b) { return a->name < b->name; });
  for (const Storage::Buffer* b : sorted) {
    const int w = DTypeWidth(b->dtype);
    r->buffers_.push_back(TensorBuffer{b->data, b->nbytes / w, w, TensorSalt(b->name)});
  }
  r->version_ = version;
  r->hash_ = ContentHashOf(storage->Views(), 1);
  r->running_ = r->hash_;
  return r;
}

Status StorageReceiver::BeginDelta(const FileHeader& header) {
  if (in_progress_) return FailedPreconditionError("storage receiver: a delta is in progress");
  if ((header.flags & kFlagNoBase) == 0 && header.base_hash != hash_) {
    return FailedPreconditionError("storage receiver holds image " + hash_.ToHex() +
                                   " but the serving delta's base is " + header.base_hash.ToHex());
  }
  DCR_ASSIGN_OR_RETURN(Inventory inv, Inventory::Parse(header.inventory));
  if (inv.tensors.size() != buffers_.size()) {
    return InvalidArgumentError("storage receiver: the serving delta's image has another buffer set");
  }
  for (size_t i = 0; i < inv.tensors.size(); ++i) {
    if (inv.tensors[i].num_elements() != buffers_[i].num_elements ||
        inv.tensors[i].width() != buffers_[i].width) {
      return InvalidArgumentError("storage receiver: buffer " + inv.tensors[i].name +
                                  " differs from the serving delta's image");
    }
  }
  in_progress_ = true;
  target_version_ = header.target_version;
  applied_.clear();
  running_ = hash_;
  return Status::OK();
}

Status StorageReceiver::ApplyChunk(const DecodedChunk& chunk) {
  if (!in_progress_) return FailedPreconditionError("storage receiver: no delta in progress");
  for (const Segment& sg : chunk.header.segments) {
    if (sg.tensor_index < buffers_.size() && buffers_[sg.tensor_index].width != chunk.header.elem_width) {
      return DataLossError("chunk " + std::to_string(chunk.header.chunk_id) + ": width mismatch");
    }
  }
  BufferStore store{&buffers_};
  DCR_ASSIGN_OR_RETURN(internal::ChunkSums sums, internal::ApplyChunkTwoPhase(chunk, &store));
  HashSub(&running_, sums.old_sum);
  HashAdd(&running_, sums.new_sum);
  applied_.insert(chunk.header.chunk_id);
  return Status::OK();
}

Status StorageReceiver::Finish(const Trailer& trailer) {
  if (!in_progress_) return FailedPreconditionError("storage receiver: no delta in progress");
  for (const ChunkTableEntry& e : trailer.chunks) {
    if (applied_.count(e.chunk_id) == 0) {
      return FailedPreconditionError("storage receiver: chunk " + std::to_string(e.chunk_id) +
                                     " not applied");
    }
  }
  if (running_ != trailer.target_hash) {
    return DataLossError("storage receiver: image hash after apply differs from the target's");
  }
  hash_ = running_;
  version_ = target_version_;
  in_progress_ = false;
  return Status::OK();
}

}  // namespace dcr
