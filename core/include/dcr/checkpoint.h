// Checkpoints: HF safetensors files or directories of them, read through mmap and written
// atomically.
//
// Canonical coordinates in dcr are (tensor name, element index) of a checkpoint: the element index
// is the row-major position in the tensor's shape. Every other layout (training shards, serving
// storage) is mapped to these coordinates.
//
// safetensors layout: u64 little-endian header length N, N bytes of JSON
// {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the data section; offsets are relative to the data section.
//
// A sharded checkpoint (how Hugging Face publishes every model above ~5 GB) is a directory of
// safetensors files, usually with an index `model.safetensors.index.json`
// {"metadata": {..}, "weight_map": {"tensor name": "shard file name", ..}}. Its tensors are the
// union of its shards' tensors; which shard holds a tensor is a property of the layout, not of
// the canonical coordinates, so base and target may split their tensors differently.
//
// Thread safety: a Checkpoint is immutable after Open/Parse; concurrent readers are safe.
#ifndef DCR_CORE_INCLUDE_DCR_CHECKPOINT_H_
#define DCR_CORE_INCLUDE_DCR_CHECKPOINT_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "dcr/dtype.h"
#include "dcr/progress.h"
#include "dcr/status.h"
#include "dcr/statusor.h"

namespace dcr {

struct TensorInfo {
  std::string name;
  std::string dtype_name;  // as written in the file (kept verbatim for unknown dtypes)
  DType dtype = DType::kUnknown;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // byte offset within the data section of its file
  uint64_t nbytes = 0;
  uint32_t file = 0;  // index of the file holding it (Checkpoint::files(), Inventory::files)

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
  // ToHex's inverse: false (and *h untouched) unless `hex` is exactly 32 lowercase hex digits.
  static bool FromHex(std::string_view hex, Hash128* h);
};

// One safetensors file of a checkpoint, mapped.
struct CheckpointFile {
  std::string name;  // file name inside the checkpoint directory; empty for a single file
  const uint8_t* data = nullptr;  // the whole file image
  uint64_t size = 0;
  uint64_t data_section_offset = 0;  // 8 + header length
  // The raw JSON header bytes, exactly as in the file.
  std::string header_json() const;
};

// The name of a sharded checkpoint's index file when it has one.
inline constexpr char kIndexFileName[] = "model.safetensors.index.json";

class Checkpoint {
 public:
  // Opens a checkpoint: a safetensors file, a directory of shards (with an index, or every
  // *.safetensors file in it without one), or a sharded checkpoint's index file (its directory
  // is opened). Files are mapped read-only.
  //
  // A directory's rules: the index (model.safetensors.index.json, else the only
  // *.safetensors.index.json) names every tensor's shard; shard names are plain file names in
  // the directory; every shard named exists and holds exactly the tensors the index maps to it;
  // no tensor is in two shards. Without an index no tensor may be in two files.
  //
  // Errors: kNotFound (no file; a shard the index names is missing, naming tensor and shard),
  // kDataLoss (truncated, malformed JSON, overlapping or out-of-range offsets, absurd sizes,
  // shape/size mismatch, an index that disagrees with its shards, a tensor in two shards),
  // kInvalidArgument (not a checkpoint: a dcr delta, other JSON text, a directory without
  // safetensors files, a shard name that is not a plain file name are named as such).
  static StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& path);
  // Parses an in-memory file image (takes ownership).
  static StatusOr<std::unique_ptr<Checkpoint>> FromBytes(std::vector<uint8_t> bytes);

  ~Checkpoint();
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  // Tensors in file order, then data-offset order (the order of the bytes in the files).
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // nullptr if absent.
  const TensorInfo* Find(const std::string& name) const;
  // Pointer to a tensor's first byte inside the mapping of its file.
  const uint8_t* data(const TensorInfo& t) const {
    const CheckpointFile& f = files_[t.file];
    return f.data + f.data_section_offset + t.offset;
  }
  // The __metadata__ of a single file; of the first shard for a directory.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // True when opened from a directory (or an index file).
  bool sharded() const { return sharded_; }
  // The files, sorted by name for a directory; one unnamed file otherwise.
  const std::vector<CheckpointFile>& files() const { return files_; }
  // The index file's name and bytes, verbatim; both empty when there is none.
  const std::string& index_name() const { return index_name_; }
  const std::string& index_json() const { return index_json_; }
  // The directory (sharded) or file path it was opened from; empty from FromBytes.
  const std::string& path() const { return path_; }

  // The first file's image, header and data section: the whole checkpoint when !sharded().
  const uint8_t* file_data() const { return files_[0].data; }
  uint64_t file_size() const { return files_[0].size; }
  uint64_t data_section_offset() const { return files_[0].data_section_offset; }
  std::string header_json() const { return files_[0].header_json(); }
  // Bytes of all files together.
  uint64_t total_file_bytes() const;
  uint64_t total_tensor_bytes() const;

  // Content hash of the checkpoint (hash.h ContentHash over all tensors). Computed once, cached;
  // uses `threads` worker threads (0 = hardware concurrency). Thread-compatible, not thread-safe.
  Hash128 ContentHash(int threads = 0) const;
  // The same, reporting the tensor bytes hashed to `progress` (dcr/progress.h) as phase `phase`
  // (static storage), about every 256 MiB; a cached hash reports its total at once.
  Hash128 ContentHash(int threads, const ProgressCallback& progress, std::string_view phase) const;

 private:
  struct Mapping {
    void* map = nullptr;
    uint64_t size = 0;
  };
  Checkpoint() = default;
  // Parses files_[i] and appends its tensors (file = i).
  Status ParseFile(uint32_t i, std::map<std::string, std::string>* metadata);
  Status OpenDirectory(const std::string& dir, const std::string& index_path);
  Status BuildIndex();

  std::vector<uint8_t> owned_;
  std::vector<Mapping> maps_;
  std::vector<CheckpointFile> files_;
  bool sharded_ = false;
  std::string path_;
  std::string index_name_, index_json_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
  mutable bool hash_valid_ = false;
  mutable Hash128 hash_;
};

// The files of a sharded checkpoint as an index describes them: tensor name -> shard file name.
struct ShardIndex {
  std::map<std::string, std::string> weight_map;
  std::vector<std::string> shards;  // the distinct file names, sorted
};

// Parses a model.safetensors.index.json document strictly: a JSON object with an object
// "weight_map" whose values are plain file names (no '/', not "." or "..", not hidden); duplicate
// keys refused. kDataLoss (malformed) or kInvalidArgument (a name that is not a plain file name).
StatusOr<ShardIndex> ParseShardIndex(const std::string& json);

// Checks the tensors of a set of shards against an index: every tensor of shard `files[i]` is
// mapped to that shard, and every tensor the index names is in the shard it is mapped to.
// `tensors` carry file = index into `files`. kDataLoss naming the tensor and the shards.
Status CheckShardIndex(const ShardIndex& index, const std::vector<std::string>& files,
                       const std::vector<TensorInfo>& tensors);

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

// How WriteShardedCheckpoint splits `tensors` (only names and nbytes are read): shard k holds
// tensors [ranges[k].first, ranges[k].second) under names[k]; index_json is the index file's
// bytes. kInvalidArgument for no tensors or a name given twice.
struct ShardedLayout {
  std::vector<std::string> names;
  std::vector<std::pair<size_t, size_t>> ranges;
  std::string index_json;
};
StatusOr<ShardedLayout> PlanShardedCheckpoint(const std::vector<TensorView>& tensors,
                                              uint64_t max_shard_bytes);

// Writes a sharded checkpoint as Hugging Face lays it out: tensors in the given order, a new
// shard file whenever the next tensor would take the current one past `max_shard_bytes` (a
// tensor larger than that gets a shard of its own), files
// model-00001-of-0000N.safetensors, and model.safetensors.index.json with
// {"metadata": {"total_size": ..}, "weight_map": {..}} (names sorted). `metadata` goes into every
// shard's __metadata__. The directory appears whole or not at all: it is written under a
// temporary name beside `dir` and renamed into place. An existing `dir` is replaced whole when it
// holds only checkpoint files (*.safetensors, *.safetensors.index.json); one holding anything else
// is refused (kFailedPrecondition) and left untouched.
Status WriteShardedCheckpoint(const std::string& dir, const std::vector<TensorView>& tensors,
                              uint64_t max_shard_bytes,
                              const std::map<std::string, std::string>& metadata = {});

// Writes `size` bytes atomically to `path`, as WriteSafetensors writes its file.
Status WriteFileAtomic(const std::string& path, const void* data, size_t size);
// Reads a whole file.
StatusOr<std::vector<uint8_t>> ReadFile(const std::string& path);

}  // namespace dcr

#endif  // DCR_CORE_INCLUDE_DCR_CHECKPOINT_H_
