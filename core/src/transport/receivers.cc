// Receiver backends (delta onto an in-memory base copy; full-checkpoint image) and the blobs of
// the full-checkpoint reference stream.
#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstring>
#include <map>
#include <mutex>

#include "dcr/apply.h"
#include "dcr/checkpoint.h"
#include "dcr/delta.h"
#include "dcr/hash.h"
#include "dcr/status_macros.h"
#include "dcr/transport.h"

namespace dcr {

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

// Compares every tensor of the image (laid out by `tensors`, data section at `data`) with the
// target checkpoint, byte for byte.
Status CompareTensors(const std::vector<TensorInfo>& tensors, const uint8_t* data,
                      const std::string& target_path) {
  DCR_ASSIGN_OR_RETURN(auto target, Checkpoint::Open(target_path));
  if (target->tensors().size() != tensors.size()) {
    return DataLossError("receiver holds " + std::to_string(tensors.size()) + " tensors, target " +
                         target_path + " has " + std::to_string(target->tensors().size()));
  }
  for (const TensorInfo& t : tensors) {
    const TensorInfo* tt = target->Find(t.name);
    if (tt == nullptr || tt->nbytes != t.nbytes || tt->dtype_name != t.dtype_name ||
        tt->shape != t.shape) {
      return DataLossError("tensor '" + t.name + "' differs from the target in name/dtype/shape");
    }
    const uint8_t* a = data + t.offset;
    const uint8_t* b = target->data(*tt);
    if (std::memcmp(a, b, t.nbytes) != 0) {
      uint64_t i = 0;
      while (i < t.nbytes && a[i] == b[i]) ++i;
      int w = std::max(1, t.width());
      return DataLossError("tensor '" + t.name + "' differs from the target at element " +
                           std::to_string(i / static_cast<uint64_t>(w)) + " (byte " +
                           std::to_string(i) + ")");
    }
  }
  return Status();
}

class DeltaReceiver : public ReceiverBackend {
 public:
  Status Init(const std::string& base_path) {
    DCR_ASSIGN_OR_RETURN(base_, Checkpoint::Open(base_path));
    base_hash_ = base_->ContentHash();
    // The receiver's storage: a private in-memory copy of the base (what a serving process
    // holds); filled here, before the refit starts.
    image_.resize(base_->file_size());
    std::memcpy(image_.data(), base_->file_data(), image_.size());
    data_off_ = base_->data_section_offset();
    return Status();
  }

  Status Begin(const uint8_t* data, size_t size) override {
    size_t consumed = 0;
    DCR_ASSIGN_OR_RETURN(FileHeader fh, ParseFileHeader(data, size, &consumed));
    if (fh.flags & kFlagNoBase) {
      return FailedPreconditionError("delta receiver got a no-base (full frame) delta");
    }
    if (fh.base_hash != base_hash_) {
      return FailedPreconditionError("delta is for base " + fh.base_hash.ToHex() +
                                     " but this receiver holds " + base_hash_.ToHex());
    }
    DCR_ASSIGN_OR_RETURN(Inventory inv, Inventory::Parse(fh.inventory));
    std::vector<TensorBuffer> buffers;
    for (size_t i = 0; i < inv.tensors.size(); ++i) {
      const TensorInfo& t = inv.tensors[i];
      const TensorInfo* bt = base_->Find(t.name);
      if (bt == nullptr || bt->dtype_name != t.dtype_name || bt->shape != t.shape) {
        return FailedPreconditionError("receiver's base lacks tensor '" + t.name +
                                       "' with the delta's dtype/shape");
      }
      TensorBuffer tb;
      tb.data = image_.data() + data_off_ + bt->offset;
      tb.width = std::max(1, bt->width());
      tb.num_elements = bt->nbytes / static_cast<uint64_t>(tb.width);
      tb.salt = TensorSalt(t.name);
      buffers.push_back(tb);
    }
    applier_ = std::make_unique<BufferApplier>(std::move(buffers));
    return Status();
  }

  Status ApplyChunk(const uint8_t* data, size_t size) override {
    if (!applier_) return FailedPreconditionError("chunk before the delta header");
    return applier_->ApplyRecord(data, size);
  }

  Status Finish(const uint8_t* data, size_t size) override {
    if (!applier_) return FailedPreconditionError("trailer before the delta header");
    DCR_ASSIGN_OR_RETURN(Trailer tr, ParseTrailer(data, size));
    Hash128 h = base_hash_;
    Hash128 d = applier_->hash_delta();
    HashAdd(&h, d);
    if (h != tr.target_hash) {
      return DataLossError("receiver content hash " + h.ToHex() + " differs from the target's " +
                           tr.target_hash.ToHex() + " after all chunks");
    }
    return Status();
  }

  Status Verify(const std::string& target_path) override {
    std::vector<TensorInfo> tensors = base_->tensors();
    return CompareTensors(tensors, image_.data() + data_off_, target_path);
  }

 private:
  std::unique_ptr<Checkpoint> base_;
  Hash128 base_hash_;
  std::vector<uint8_t> image_;
  uint64_t data_off_ = 0;
  std::unique_ptr<BufferApplier> applier_;
};

class FullReceiver : public ReceiverBackend {
 public:
  Status Begin(const uint8_t* data, size_t size) override {
    if (size < 16) return DataLossError("full stream header too short");
    uint64_t file_size = ReadU64(data);
    uint64_t json_len = ReadU64(data + 8);
    if (json_len > size - 16 || 8 + json_len > file_size || file_size > (uint64_t{1} << 44)) {
      return DataLossError("full stream header inconsistent");
    }
    image_.assign(file_size, 0);
    std::memcpy(image_.data(), data + 8, size - 8);
    header_end_ = size - 8;
    return Status();
  }
  Status ApplyChunk(const uint8_t* data, size_t size) override {
    if (image_.empty()) return FailedPreconditionError("full stream: slice before the header");
    if (size < 8) return DataLossError("full stream slice too short");
    uint64_t off = ReadU64(data);
    uint64_t n = size - 8;
    if (off < header_end_ || off > image_.size() || n > image_.size() - off) {
      return DataLossError("full stream slice @" + std::to_string(off) + " outside the file");
    }
    std::memcpy(image_.data() + off, data + 8, n);
    return Status();
  }
  Status Finish(const uint8_t* data, size_t size) override {
    if (size < 24) return DataLossError("full stream trailer too short");
    if (ReadU64(data) != image_.size()) return DataLossError("full stream trailer: size mismatch");
    uint64_t want = ReadU64(data + 16);
    uint64_t got = XXH3_64bits(image_.data(), image_.size());
    if (want != got) return DataLossError("full stream: file checksum mismatch after all slices");
    return Status();
  }
  Status Verify(const std::string& target_path) override {
    DCR_ASSIGN_OR_RETURN(auto mine, Checkpoint::FromBytes(image_));
    return CompareTensors(mine->tensors(), mine->file_data() + mine->data_section_offset(),
                          target_path);
  }

 private:
  std::vector<uint8_t> image_;
  uint64_t header_end_ = 0;
};

}  // namespace

StatusOr<std::unique_ptr<ReceiverBackend>> MakeDeltaReceiver(const std::string& base_path) {
  auto r = std::make_unique<DeltaReceiver>();
  DCR_RETURN_IF_ERROR(r->Init(base_path));
  return std::unique_ptr<ReceiverBackend>(std::move(r));
}

std::unique_ptr<ReceiverBackend> MakeFullReceiver() { return std::make_unique<FullReceiver>(); }

Status FullStreamBlobs(const std::string& path, uint64_t slice_bytes,
                       const std::function<Status(BlobKind, std::vector<uint8_t>)>& emit) {
  if (slice_bytes == 0) return InvalidArgumentError("full stream: slice_bytes must be > 0");
  DCR_ASSIGN_OR_RETURN(auto ckpt, Checkpoint::Open(path));
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
