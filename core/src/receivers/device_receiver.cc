// The device receiver (dcr/device.h): receiver.h's contract over device memory. The contract's
// storage-independent half is delta_session.h (shared with BufferReceiver); this file holds the
// device half: the load, the applier over the allocations, and Verify on the device.
#include <algorithm>

#include "dcr/checkpoint.h"
#include "dcr/delta.h"
#include "dcr/device.h"
#include "dcr/hash.h"
#include "dcr/status_macros.h"
#include "internal/chunk_bounds.h"
#include "receivers/codec_device.h"
#include "receivers/delta_session.h"
#include "receivers/device_applier.h"
#include "receivers/device_image.h"

namespace dcr {
namespace {

// Verify's scratch: at most this many bytes of the target on the device at a time.
constexpr uint64_t kVerifyPiece = uint64_t{64} << 20;

class DeviceReceiverImpl : public DeviceReceiver {
 public:
  explicit DeviceReceiverImpl(std::shared_ptr<Device> device) : device_(std::move(device)) {}
  // Over `tensors` the caller holds (not freed), holding `held`.
  DeviceReceiverImpl(std::shared_ptr<Device> device, std::vector<DeviceReceiverTensor> tensors,
                     VersionId held)
      : device_(std::move(device)), owned_(false), tensors_(std::move(tensors)), held_(held) {}
  ~DeviceReceiverImpl() override {
    if (!owned_) return;
    for (const DeviceReceiverTensor& t : tensors_) device_->Free(t.data);
  }

  // Allocates and uploads every tensor of `base` (its bytes at bytes[k] for tensor k, or in
  // the checkpoint's files when `bytes` is empty), then hashes the device copy.
  Status Load(const Checkpoint& base, uint64_t number,
              const std::vector<const uint8_t*>& bytes = {}) {
    for (size_t k = 0; k < base.tensors().size(); ++k) {
      const TensorInfo& t = base.tensors()[k];
      auto p = device_->Allocate(t.nbytes);
      if (!p.ok()) {
        return p.status().WithContext("loading tensor '" + t.name + "' (" +
                                      std::to_string(t.nbytes) + " bytes) onto " + device_->name());
      }
      tensors_.push_back({t, *p});
      DCR_RETURN_IF_ERROR(device_->Upload(*p, bytes.empty() ? base.data(t) : bytes[k], t.nbytes)
                              .WithContext("uploading tensor '" + t.name + "'"));
    }
    std::vector<TensorView> views;
    for (const DeviceReceiverTensor& t : tensors_) {
      views.push_back(
          TensorView{t.info.name, t.info.dtype_name, t.info.shape, t.data, t.info.nbytes});
    }
    DCR_ASSIGN_OR_RETURN(Hash128 hash, DeviceContentHashOf(device_.get(), views, 0));
    held_ = VersionId{number, hash};
    return Status();
  }

  Status Begin(const uint8_t* header, size_t size) override {
    DCR_ASSIGN_OR_RETURN(internal::DeltaStart ds,
                         internal::CheckBegin(header, size, held_, internal::StorageInfos(tensors_),
                                              applier_ != nullptr, target_number_));
    applier_ = internal::MakeVersionDeltaDeviceApplier(
        device_, internal::DeltaTensors<DeviceTensor>(ds, tensors_));
    bounds_ = internal::TensorBounds(ds.inventory);
    target_number_ = ds.target_number;
    start_ = ds.start;
    ledger_.Reset();
    return Status();
  }

  Status ApplyRecord(const uint8_t* record, size_t size) override {
    if (!applier_) return FailedPreconditionError("receiver: chunk record before the delta header");
    size_t header_size = 0, record_size = 0;
    DCR_ASSIGN_OR_RETURN(ChunkHeader h, ParseChunkHeader(record, size, &header_size, &record_size));
    // The segments fit the tensors before anything of the record is decoded.
    DCR_RETURN_IF_ERROR(internal::CheckChunkBounds(h, bounds_));
    DCR_ASSIGN_OR_RETURN(bool claimed, ledger_.Claim(h));
    if (!claimed) return Status();
    // Decoded on the calling thread into its own reused buffers.
    thread_local DecodedChunk chunk;
    Status s = internal::NoThrow("receiver: decoding a chunk record",
                                 [&] { return DecodeChunkInto(record, size, &chunk); });
    if (s.ok()) s = applier_->ApplyChunk(chunk);
    if (!s.ok()) ledger_.Release(h.chunk_id);
    return s;
  }

  Status Commit(const uint8_t* trailer, size_t size) override {
    if (!applier_) return FailedPreconditionError("receiver: trailer with no delta in progress");
    Hash128 h = start_;
    HashAdd(&h, applier_->hash_delta());
    DCR_ASSIGN_OR_RETURN(Trailer tr,
                         internal::CheckCommit(trailer, size, ledger_, h, target_number_));
    held_ = VersionId{target_number_, tr.target_hash};
    Abort();
    return Status();
  }

  void Abort() override {
    applier_.reset();
    ledger_.Reset();
  }

  Status MarkApplied(uint64_t chunk_id, const Hash128& version_delta) override {
    if (!applier_) return FailedPreconditionError("receiver: no delta in progress");
    ledger_.Mark(chunk_id, version_delta);
    return Status();
  }

  Status Verify(const Checkpoint& target) const override {
    std::vector<TensorInfo> infos;
    uint64_t largest = 0;
    for (const DeviceReceiverTensor& t : tensors_) {
      infos.push_back(t.info);
      largest = std::max(largest, t.info.nbytes);
    }
    std::vector<const TensorInfo*> target_of;
    DCR_RETURN_IF_ERROR(internal::CheckTensorSet(infos, target, &target_of));
    const uint64_t piece = std::min(largest, kVerifyPiece);
    DCR_ASSIGN_OR_RETURN(void* scratch, device_->Allocate(piece));
    struct Scratch {
      Device* d;
      void* p;
      ~Scratch() { d->Free(p); }
    } hold{device_.get(), scratch};
    for (size_t k = 0; k < tensors_.size(); ++k) {
      const DeviceReceiverTensor& t = tensors_[k];
      const uint8_t* want = target.data(*target_of[k]);
      for (uint64_t off = 0; off < t.info.nbytes; off += piece) {
        const uint64_t n = std::min(piece, t.info.nbytes - off);
        DCR_RETURN_IF_ERROR(device_->Upload(scratch, want + off, n));
        DCR_ASSIGN_OR_RETURN(
            uint64_t at,
            device_->FirstDifference(static_cast<const uint8_t*>(t.data) + off, scratch, n));
        if (at < n) return internal::TensorDiffers(t.info, off + at);
      }
    }
    return Status();
  }

  VersionId held() const override { return held_; }
  bool in_delta() const override { return applier_ != nullptr; }
  std::vector<uint64_t> MissingChunks(const Trailer& trailer) const override {
    return ledger_.Missing(trailer, applier_ != nullptr);
  }

  const std::vector<DeviceReceiverTensor>& tensors() const override { return tensors_; }
  Device* device() const override { return device_.get(); }

 private:
  const std::shared_ptr<Device> device_;
  const bool owned_ = true;  // the allocations are the receiver's (freed with it)
  std::vector<DeviceReceiverTensor> tensors_;
  VersionId held_;
  // The delta in progress.
  std::unique_ptr<DeviceApplier> applier_;     // null when none
  std::vector<internal::TensorBound> bounds_;  // the delta's tensors, for its records' segments
  uint64_t target_number_ = 0;
  Hash128 start_;
  internal::ChunkLedger ledger_;
};

}  // namespace

StatusOr<std::unique_ptr<DeviceReceiver>> MakeDeviceReceiver(std::shared_ptr<Device> device,
                                                             const Checkpoint& base,
                                                             uint64_t number) {
  if (device == nullptr) return InvalidArgumentError("MakeDeviceReceiver: no device");
  auto r = std::make_unique<DeviceReceiverImpl>(std::move(device));
  // On error the receiver is destroyed here, freeing whatever was allocated.
  DCR_RETURN_IF_ERROR(r->Load(base, number));
  return std::unique_ptr<DeviceReceiver>(std::move(r));
}

namespace internal {

std::unique_ptr<DeviceReceiver> MakeBorrowingDeviceReceiver(
    std::shared_ptr<Device> device, std::vector<DeviceReceiverTensor> tensors, VersionId held) {
  return std::make_unique<DeviceReceiverImpl>(std::move(device), std::move(tensors), held);
}

StatusOr<std::unique_ptr<DeviceReceiver>> MakeDeviceReceiverFromImage(
    std::shared_ptr<Device> device, const Checkpoint& layout,
    const std::vector<const uint8_t*>& tensor_bytes, uint64_t number) {
  if (device == nullptr) return InvalidArgumentError("MakeDeviceReceiverFromImage: no device");
  if (tensor_bytes.size() != layout.tensors().size()) {
    return InvalidArgumentError(
        "MakeDeviceReceiverFromImage: " + std::to_string(tensor_bytes.size()) +
        " tensor images for " + std::to_string(layout.tensors().size()) + " tensors");
  }
  for (size_t k = 0; k < tensor_bytes.size(); ++k) {
    if (tensor_bytes[k] == nullptr && layout.tensors()[k].nbytes > 0) {
      return InvalidArgumentError("MakeDeviceReceiverFromImage: no image of tensor '" +
                                  layout.tensors()[k].name + "'");
    }
  }
  auto r = std::make_unique<DeviceReceiverImpl>(std::move(device));
  DCR_RETURN_IF_ERROR(r->Load(layout, number, tensor_bytes));
  return std::unique_ptr<DeviceReceiver>(std::move(r));
}

}  // namespace internal

StatusOr<std::unique_ptr<DeviceReceiver>> MakeDeviceReceiver(std::shared_ptr<Device> device,
                                                             const std::string& base_path,
                                                             uint64_t number) {
  DCR_ASSIGN_OR_RETURN(auto ckpt, Checkpoint::Open(base_path));
  return MakeDeviceReceiver(std::move(device), *ckpt, number);
}

}  // namespace dcr
