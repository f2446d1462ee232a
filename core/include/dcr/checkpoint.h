// Checkpoints: HF safetensors files, read through mmap and written atomically.
//
// Canonical coordinates in dcr are (tensor name, element index) of a checkpoint: the element index
// is the row-major position in the tensor's shape. Every other layout (training shards, serving
// storage) is mapped to these coordinates.
//
// safetensors layout: u64 little-endian header length N, N bytes of JSON
// {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the data section; offsets are relative to the data section.
//
// Thread safety: a Checkpoint is immutable after Open/Parse; concurrent readers are safe.
#ifndef DCR_CORE_INCLUDE_DCR_CHECKPOINT_H_
#define DCR_CORE_INCLUDE_DCR_CHECKPOINT_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dcr/dtype.h"
#include "dcr/status.h"
#include "dcr/statusor.h"

namespace dcr {

struct TensorInfo {
  std::string name;
  std::string dtype_name;  // as written in the file (kept verbatim for unknown dtypes)
  DType dtype = DType::kUnknown;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // byte offset within the data section
  uint64_t nbytes = 0;

  int width() const { return DTypeWidth(dtype); }
  // nbytes / width (for kUnknown: nbytes).
  uint64_t num_elements() const { return nbytes / static_cast<uint64_t>(width()); }
};

// A tensor to write: the bytes are borrowed for the duration of the call.
struct TensorView {
  std::string name;
  std::string dtype_name;  // safetensors dtype string
  std::vector<int64_t> shape;
  const void* data = nullptr;
  uint64_t nbytes = 0;
};

// 128-bit content hash (see hash.h for its definition).
struct Hash128 {
  uint64_t lo = 0;
  uint64_t hi = 0;
  bool operator==(const Hash128& o) const { return lo == o.lo && hi == o.hi; }
  bool operator!=(const Hash128& o) const { return !(*this == o); }
  // 32 lowercase hex digits, hi first.
  std::string ToHex() const;
};

class Checkpoint {
 public:
  // Maps `path` read-only and parses its header. Errors: kNotFound (no file), kDataLoss
  // (truncated, malformed JSON, overlapping or out-of-range offsets, absurd sizes, shape/size
  // mismatch), kInvalidArgument (not a safetensors file: a directory, a dcr delta, a sharded
  // checkpoint's model.safetensors.index.json or other JSON text are named as such).
  static StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& path);
  // Parses an in-memory file image (takes ownership).
  static StatusOr<std::unique_ptr<Checkpoint>> FromBytes(std::vector<uint8_t> bytes);

  ~Checkpoint();
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  // Tensors in data-offset order (the order of the bytes in the file).
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // nullptr if absent.
  const TensorInfo* Find(const std::string& name) const;
  // Pointer to a tensor's first byte inside the mapping.
  const uint8_t* data(const TensorInfo& t) const { return data_section_ + t.offset; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // The whole file image (header included), e.g. for address-range lookups by an interceptor.
  const uint8_t* file_data() const { return file_; }
  uint64_t file_size() const { return file_size_; }
  uint64_t data_section_offset() const { return static_cast<uint64_t>(data_section_ - file_); }
  // The raw JSON header bytes, exactly as in the file.
  std::string header_json() const;
  uint64_t total_tensor_bytes() const;

  // Content hash of the checkpoint (hash.h ContentHash over all tensors). Computed once, cached;
  // uses `threads` worker threads (0 = hardware concurrency). Thread-compatible, not thread-safe.
  Hash128 ContentHash(int threads = 0) const;

 private:
  Checkpoint() = default;
  Status Parse();

  std::vector<uint8_t> owned_;
  void* map_ = nullptr;
  uint64_t map_size_ = 0;
  const uint8_t* file_ = nullptr;
  uint64_t file_size_ = 0;
  const uint8_t* data_section_ = nullptr;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
  mutable bool hash_valid_ = false;
  mutable Hash128 hash_;
};

// Builds the JSON header for `tensors` laid out back to back in the given order (8-byte padded
// with spaces as safetensors does) and returns (header bytes including the u64 length prefix,
// per-tensor offsets).
std::string BuildSafetensorsHeader(const std::vector<TensorView>& tensors,
                                   const std::map<std::string, std::string>& metadata,
                                   std::vector<uint64_t>* offsets);

// The bytes of the safetensors file of `tensors` (header, then the tensors back to back): what
// WriteSafetensors writes, in memory (Checkpoint::FromBytes reads it back).
std::vector<uint8_t> SafetensorsImage(const std::vector<TensorView>& tensors,
                                      const std::map<std::string, std::string>& metadata = {});

// Writes a safetensors file atomically: a fresh temporary `path`.tmp.XXXXXX (random suffix,
// created exclusively: nothing planted at the name is followed) is allocated in full, written,
// fsynced and renamed over `path`, keeping an existing `path`'s permission bits; on any error
// nothing is left at `path` or at the temporary name. A full filesystem is kResourceExhausted;
// EACCES / EROFS are kFailedPrecondition.
Status WriteSafetensors(const std::string& path, const std::vector<TensorView>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

// Writes `size` bytes atomically to `path`, as WriteSafetensors writes its file.
Status WriteFileAtomic(const std::string& path, const void* data, size_t size);
// Reads a whole file.
StatusOr<std::vector<uint8_t>> ReadFile(const std::string& path);

}  // namespace dcr

#endif  // DCR_CORE_INCLUDE_DCR_CHECKPOINT_H_
