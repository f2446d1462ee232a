// Receivers over plain buffers (BufferReceiver), the receiver of the full-checkpoint reference
// stream, the whole-delta helpers, and the blobs of the full-checkpoint reference stream.
#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>

#include "dcr/apply.h"
#include "dcr/checkpoint.h"
#include "dcr/delta.h"
#include "dcr/device.h"
#include "dcr/hash.h"
#include "dcr/receiver.h"
#include "dcr/status_macros.h"
#include "dcr/transport.h"
#include "internal/chunk_bounds.h"
#include "internal/safetensors.h"
#include "internal/str_format.h"
#include "receivers/delta_session.h"

namespace dcr {

using internal::IdList;

namespace {

uint64_t ReadU64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
void PutU64(std::vector<uint8_t>* out, uint64_t v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  out->insert(out->end(), p, p + 8);
}

// Compares every tensor of `tensors` (bytes at `data[i]`) with the target checkpoint, byte for
// byte: same tensor set, names, dtypes, shapes and bytes.
Status CompareTensors(const std::vector<TensorInfo>& tensors,
                      const std::vector<const uint8_t*>& data, const Checkpoint& target) {
  std::vector<const TensorInfo*> target_of;
  DCR_RETURN_IF_ERROR(internal::CheckTensorSet(tensors, target, &target_of));
  for (size_t k = 0; k < tensors.size(); ++k) {
    const uint8_t* a = data[k];
    const uint8_t* b = target.data(*target_of[k]);
    if (std::memcmp(a, b, tensors[k].nbytes) != 0) {
      uint64_t i = 0;
      while (i < tensors[k].nbytes && a[i] == b[i]) ++i;
      return internal::TensorDiffers(tensors[k], i);
    }
  }
  return Status();
}

// The receiver of the full-checkpoint reference stream (FullStreamBlobs): rebuilds the file
// image from its slices. The stream carries no version: held() is {0, zero hash} and
// MissingChunks is empty (a missing slice fails Commit).
// With a device, Commit loads the image's tensors onto it (MakeFullReceiver(device)).
// Sizes from the stream are bounded before memory is committed: the header blob must hold the
// file's whole safetensors header, and the file size it claims must be the one that header's
// tensors give (at most kMaxFullStreamBytes); the image is reserved at that size (address space,
// no resident memory) and filled as slices arrive, so its resident memory is what the slices
// applied wrote, not what a header claims.
class FullReceiver : public Receiver {
 public:
  // The largest file a full stream may claim (16 TiB).
  static constexpr uint64_t kMaxFullStreamBytes = uint64_t{1} << 44;

  explicit FullReceiver(std::shared_ptr<Device> device = nullptr) : device_(std::move(device)) {}

  Status Begin(const uint8_t* data, size_t size) override {
    if (size < 16) return DataLossError("full stream header too short");
    const uint64_t file_size = ReadU64(data);
    const uint64_t json_len = ReadU64(data + 8);
    if (json_len != size - 16) {
      return DataLossError("full stream header: " + std::to_string(size - 16) +
                           " bytes of safetensors header follow, its length field says " +
                           std::to_string(json_len));
    }
    if (json_len > internal::kMaxSafetensorsHeaderBytes) {
      return DataLossError("full stream header: a safetensors header of " +
                           std::to_string(json_len) + " bytes exceeds the 100 MiB limit");
    }
    std::vector<TensorInfo> tensors;
    std::map<std::string, std::string> metadata;
    uint64_t data_end = 0;
    Status parsed =
        internal::ParseSafetensorsJson(reinterpret_cast<const char*>(data + 16), json_len,
                                       UINT64_MAX, &tensors, &metadata, &data_end);
    if (!parsed.ok()) return parsed.WithContext("full stream header");
    if (data_end > kMaxFullStreamBytes - 8 - json_len || file_size != 8 + json_len + data_end) {
      return DataLossError(
          "full stream header claims a file of " + std::to_string(file_size) +
          " bytes; its safetensors header describes " + std::to_string(8 + json_len) + " + " +
          std::to_string(data_end) +
          (data_end > kMaxFullStreamBytes - 8 - json_len ? " (over the 16 TiB limit)" : ""));
    }
    if (device_ != nullptr) {  // refused before any slice when the device cannot hold the file
      auto probe = device_->Allocate(file_size);
      if (!probe.ok()) return probe.status().WithContext("full stream onto " + device_->name());
      device_->Free(*probe);
    }
    on_device_.reset();
    committed_ = false;
    std::vector<uint8_t>().swap(image_);
    DCR_RETURN_IF_ERROR(internal::NoThrow("full stream: reserving the file image", [&] {
      image_.reserve(file_size);
      image_.assign(data + 8, data + size);
      return Status();
    }));
    header_end_ = size - 8;
    file_size_ = file_size;
    received_.clear();
    return Status();
  }
  Status ApplyRecord(const uint8_t* data, size_t size) override {
    if (image_.empty()) return FailedPreconditionError("full stream: slice before the header");
    if (size < 8) return DataLossError("full stream slice too short");
    uint64_t off = ReadU64(data);
    uint64_t n = size - 8;
    if (off < header_end_ || off > file_size_ || n > file_size_ - off) {
      return DataLossError("full stream slice @" + std::to_string(off) + " outside the file");
    }
    {
      // Within the reserved capacity: the image never moves, only new pages are touched (zeros
      // up to this slice's end, written under the lock before any slice beyond them is copied).
      std::lock_guard<std::mutex> lock(mu_);
      if (off + n > image_.size()) image_.resize(off + n);
      received_[off] = n;
    }
    std::memcpy(image_.data() + off, data + 8, n);
    return Status();
  }
  Status Commit(const uint8_t* data, size_t size) override {
    if (size < 24) return DataLossError("full stream trailer too short");
    if (ReadU64(data) != file_size_) return DataLossError("full stream trailer: size mismatch");
    // Every byte of the data section came in a slice (slices tile it; overlaps count once).
    uint64_t covered_to = header_end_;
    for (const auto& [off, n] : received_) {
      if (off > covered_to) break;
      covered_to = std::max(covered_to, off + n);
    }
    if (covered_to != file_size_) {
      return DataLossError("full stream: no slice brought bytes " + std::to_string(covered_to) +
                           " of the file's " + std::to_string(file_size_));
    }
    uint64_t want = ReadU64(data + 16);
    uint64_t got = XXH3_64bits(image_.data(), image_.size());
    if (want != got) return DataLossError("full stream: file checksum mismatch after all slices");
    if (device_ != nullptr) {
      DCR_ASSIGN_OR_RETURN(auto ckpt, Checkpoint::FromBytes(image_));
      auto rx = MakeDeviceReceiver(device_, *ckpt);
      if (!rx.ok()) return rx.status().WithContext("full stream: loading onto " + device_->name());
      on_device_ = std::move(*rx);
      std::vector<uint8_t>().swap(image_);
    }
    committed_ = true;
    return Status();
  }
  void Abort() override {
    std::vector<uint8_t>().swap(image_);
    received_.clear();
  }
  Status MarkApplied(uint64_t, const Hash128&) override {
    return UnimplementedError("full stream receiver: slices cannot be marked applied");
  }
  Status Verify(const Checkpoint& target) const override {
    if (device_ != nullptr) {
      if (on_device_ == nullptr) return FailedPreconditionError("full stream: not committed");
      return on_device_->Verify(target);
    }
    DCR_ASSIGN_OR_RETURN(auto mine, Checkpoint::FromBytes(image_));
    std::vector<const uint8_t*> data;
    for (const TensorInfo& t : mine->tensors()) data.push_back(mine->data(t));
    return CompareTensors(mine->tensors(), data, target);
  }
  VersionId held() const override { return VersionId{}; }
  bool in_delta() const override { return !image_.empty() && !committed_; }
  std::vector<uint64_t> MissingChunks(const Trailer&) const override { return {}; }

 private:
  std::shared_ptr<Device> device_;             // null: the image stays in host memory
  std::unique_ptr<DeviceReceiver> on_device_;  // device_: the committed file's tensors
  std::vector<uint8_t> image_;  // reserved at file_size_, filled up to the last slice's end
  uint64_t header_end_ = 0;
  uint64_t file_size_ = 0;
  std::mutex mu_;                          // guards image_'s size and received_ in ApplyRecord
  std::map<uint64_t, uint64_t> received_;  // slices applied: offset -> bytes
  bool committed_ = false;
};

}  // namespace

std::string VersionId::ToString() const {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "v%" PRIu64 ":%08" PRIx64, number, hash.hi >> 32);
  return buf;
}

// ---- BufferReceiver ----

BufferReceiver::BufferReceiver(std::vector<ReceiverTensor> tensors, VersionId held)
    : tensors_(std::move(tensors)),
      held_(held),
      ledger_(std::make_unique<internal::ChunkLedger>()) {}

BufferReceiver::~BufferReceiver() = default;

StatusOr<std::unique_ptr<BufferReceiver>> BufferReceiver::Load(const std::string& path,
                                                               uint64_t number) {
  DCR_ASSIGN_OR_RETURN(auto ckpt, Checkpoint::Open(path));
  return Copy(*ckpt, number);
}

std::unique_ptr<BufferReceiver> BufferReceiver::Copy(const Checkpoint& ckpt, uint64_t number) {
  // The receiver's storage: a private in-memory copy of the data section (what a serving process
  // holds), filled here, before any delta arrives. A sharded checkpoint's tensors are copied
  // back to back, in the checkpoint's tensor order.
  std::vector<uint8_t> bytes;
  std::vector<ReceiverTensor> tensors;
  if (!ckpt.sharded()) {
    const uint64_t off = ckpt.data_section_offset();
    bytes.assign(ckpt.file_data() + off, ckpt.file_data() + ckpt.file_size());
    for (const TensorInfo& t : ckpt.tensors()) tensors.push_back({t, bytes.data() + t.offset});
  } else {
    bytes.resize(ckpt.total_tensor_bytes());
    uint64_t at = 0;
    for (const TensorInfo& t : ckpt.tensors()) {
      if (t.nbytes > 0) std::memcpy(bytes.data() + at, ckpt.data(t), t.nbytes);
      tensors.push_back({t, bytes.data() + at});
      at += t.nbytes;
    }
  }
  auto r =
      std::make_unique<BufferReceiver>(std::move(tensors), VersionId{number, ckpt.ContentHash()});
  r->owned_ = std::move(bytes);  // the vector's buffer does not move
  return r;
}

Status BufferReceiver::Begin(const uint8_t* header, size_t size) {
  DCR_ASSIGN_OR_RETURN(internal::DeltaStart ds,
                       internal::CheckBegin(header, size, held_, internal::StorageInfos(tensors_),
                                            applier_ != nullptr, target_number_));
  applier_ = std::make_unique<BufferApplier>(internal::DeltaTensors<TensorBuffer>(ds, tensors_));
  target_number_ = ds.target_number;
  start_ = ds.start;
  ledger_->Reset();
  return Status();
}

Status BufferReceiver::ApplyRecord(const uint8_t* record, size_t size) {
  if (!applier_) return FailedPreconditionError("receiver: chunk record before the delta header");
  size_t header_size = 0, record_size = 0;
  DCR_ASSIGN_OR_RETURN(ChunkHeader h, ParseChunkHeader(record, size, &header_size, &record_size));
  DCR_ASSIGN_OR_RETURN(bool claimed, ledger_->Claim(h));
  if (!claimed) return Status();
  Status s = applier_->ApplyParsedRecord(record, size, h, header_size, record_size);
  if (!s.ok()) ledger_->Release(h.chunk_id);
  return s;
}

Status BufferReceiver::Commit(const uint8_t* trailer, size_t size) {
  if (!applier_) return FailedPreconditionError("receiver: trailer with no delta in progress");
  Hash128 h = start_;
  HashAdd(&h, applier_->hash_delta());
  DCR_ASSIGN_OR_RETURN(Trailer tr,
                       internal::CheckCommit(trailer, size, *ledger_, h, target_number_));
  held_ = VersionId{target_number_, tr.target_hash};
  Abort();
  return Status();
}

void BufferReceiver::Abort() {
  applier_.reset();
  ledger_->Reset();
}

Status BufferReceiver::MarkApplied(uint64_t chunk_id, const Hash128& version_delta) {
  if (!applier_) return FailedPreconditionError("receiver: no delta in progress");
  ledger_->Mark(chunk_id, version_delta);
  return Status();
}

Status BufferReceiver::Verify(const Checkpoint& target) const {
  std::vector<TensorInfo> infos;
  std::vector<const uint8_t*> data;
  for (const ReceiverTensor& t : tensors_) {
    infos.push_back(t.info);
    data.push_back(t.data);
  }
  return CompareTensors(infos, data, target);
}

VersionId BufferReceiver::held() const { return held_; }
bool BufferReceiver::in_delta() const { return applier_ != nullptr; }

std::vector<uint64_t> BufferReceiver::MissingChunks(const Trailer& trailer) const {
  return ledger_->Missing(trailer, applier_ != nullptr);
}

// ---- whole-delta helpers ----

Status BeginDelta(const DeltaReader& reader, Receiver* receiver) {
  size_t header_size = 0;
  DCR_RETURN_IF_ERROR(ParseFileHeader(reader.data(), reader.size(), &header_size).status());
  return receiver->Begin(reader.data(), header_size);
}

Status CommitDelta(const DeltaReader& reader, Receiver* receiver) {
  // DeltaReader checked the trailer offset (the u64 before the checksum and the end magic).
  const uint64_t trailer_offset = ReadU64(reader.data() + reader.size() - 24);
  return receiver->Commit(reader.data() + trailer_offset, reader.size() - trailer_offset);
}

Status ApplyDelta(const DeltaReader& reader, Receiver* receiver, const std::vector<size_t>& order) {
  DCR_RETURN_IF_ERROR(BeginDelta(reader, receiver));
  if (order.empty()) {
    for (size_t i = 0; i < reader.num_chunks(); ++i) {
      DCR_RETURN_IF_ERROR(receiver->ApplyRecord(reader.chunk_data(i), reader.chunk_size(i)));
    }
  } else {
    for (size_t i : order) {
      if (i >= reader.num_chunks()) return InvalidArgumentError("ApplyDelta: index out of range");
      DCR_RETURN_IF_ERROR(receiver->ApplyRecord(reader.chunk_data(i), reader.chunk_size(i)));
    }
  }
  return CommitDelta(reader, receiver);
}

Status VerifyFile(const Receiver& receiver, const std::string& target_path) {
  DCR_ASSIGN_OR_RETURN(auto target, Checkpoint::Open(target_path));
  return receiver.Verify(*target);
}

// ---- the full-checkpoint reference stream ----

std::unique_ptr<Receiver> MakeFullReceiver() { return std::make_unique<FullReceiver>(); }

std::unique_ptr<Receiver> MakeFullReceiver(std::shared_ptr<Device> device) {
  return std::make_unique<FullReceiver>(std::move(device));
}

Status FullStreamBlobs(const std::string& path, uint64_t slice_bytes,
                       const std::function<Status(BlobKind, std::vector<uint8_t>)>& emit) {
  if (slice_bytes == 0) return InvalidArgumentError("full stream: slice_bytes must be > 0");
  DCR_ASSIGN_OR_RETURN(auto ckpt, Checkpoint::Open(path));
  if (ckpt->sharded()) {
    return InvalidArgumentError(
        "full stream: " + path + " is a sharded checkpoint (" +
        std::to_string(ckpt->files().size()) +
        " shards); the full-checkpoint stream sends one safetensors file: use method delta, or "
        "one file per checkpoint");
  }
  const uint8_t* file = ckpt->file_data();
  const uint64_t size = ckpt->file_size();
  const uint64_t data_off = ckpt->data_section_offset();
  std::vector<uint8_t> header;
  PutU64(&header, size);
  header.insert(header.end(), file, file + data_off);
  DCR_RETURN_IF_ERROR(emit(BlobKind::kHeader, std::move(header)));
  uint64_t chunks = 0;
  for (uint64_t off = data_off; off < size; off += slice_bytes) {
    uint64_t n = std::min(slice_bytes, size - off);
    std::vector<uint8_t> blob;
    blob.reserve(8 + n);
    PutU64(&blob, off);
    blob.insert(blob.end(), file + off, file + off + n);
    DCR_RETURN_IF_ERROR(emit(BlobKind::kChunk, std::move(blob)));
    ++chunks;
  }
  std::vector<uint8_t> trailer;
  PutU64(&trailer, size);
  PutU64(&trailer, chunks);
  PutU64(&trailer, XXH3_64bits(file, size));
  return emit(BlobKind::kTrailer, std::move(trailer));
}

}  // namespace dcr
