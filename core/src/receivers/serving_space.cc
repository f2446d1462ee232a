// Serving-space deltas: deltas between the native loader's storage images (bit-exact FP8).
#include <cstring>

#include "dcr/hash.h"
#include "dcr/runtime.h"
#include "dcr/status_macros.h"

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

StorageReceiver::StorageReceiver(std::vector<ReceiverTensor> tensors, VersionId held,
                                 LoaderFactory factory, int rank)
    : BufferReceiver(std::move(tensors), held), factory_(std::move(factory)), rank_(rank) {}

std::unique_ptr<StorageReceiver> StorageReceiver::Create(Storage* storage, uint64_t version,
                                                         LoaderFactory factory, int rank) {
  std::vector<ReceiverTensor> tensors;
  for (const Storage::Buffer& b : storage->buffers()) {
    ReceiverTensor t;
    t.info.name = b.name;
    t.info.dtype_name = b.dtype_name;
    t.info.dtype = b.dtype;
    t.info.shape = b.shape;
    t.info.nbytes = b.nbytes;
    t.data = b.data;
    tensors.push_back(std::move(t));
  }
  const VersionId held{version, ContentHashOf(storage->Views(), 1)};
  return std::unique_ptr<StorageReceiver>(
      new StorageReceiver(std::move(tensors), held, std::move(factory), rank));
}

Status StorageReceiver::Verify(const Checkpoint& target) const {
  if (!factory_) return BufferReceiver::Verify(target);
  Storage fresh(0);
  DCR_ASSIGN_OR_RETURN(std::unique_ptr<ModelLoader> loader, factory_(rank_));
  DCR_RETURN_IF_ERROR(LoadCheckpoint(target, loader.get(), &fresh));
  DCR_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> image, StorageImage(fresh));
  return BufferReceiver::Verify(*image);
}

}  // namespace dcr
