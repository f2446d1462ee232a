// Applying decoded chunks to storage.
//
// An Applier owns a destination for canonical elements. BufferApplier holds one mutable buffer per
// inventory tensor (host memory). Serving runtimes implement
// Applier over their own storage and placement maps (receiver side), CUDA over device memory.
//
// Chunk application is atomic per chunk: for relative payloads (XOR, ulp) the current bits at the
// changed positions are checked against the chunk's base_change_hash (kFailedPrecondition on
// mismatch, e.g. a delta for the wrong base or a chunk applied twice), and a refused chunk leaves
// nothing written. The runtime appliers check before they write; BufferApplier checks after its
// single pass over the storage and takes the chunk's changes back (XOR and ulp undone from their
// values, absolute overwrites from saved bits). Absolute payloads are idempotent and always
// applicable: they are how interrupted or doubtful chunks are repaired.
//
// Thread safety: ApplyChunk may be called concurrently for chunks covering disjoint elements
// (chunks of one delta always are).
#ifndef DCR_CORE_INCLUDE_DCR_APPLY_H_
#define DCR_CORE_INCLUDE_DCR_APPLY_H_

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "dcr/delta.h"
#include "dcr/progress.h"
#include "dcr/status.h"

namespace dcr {

// Applies the per-element operation of a value mode to `old_bits` (width bytes): the shared
// per-element logic (also compiled for CUDA in core/src/internal/element_ops.h).
uint64_t ApplyValue(ValueMode mode, int width, uint64_t old_bits, uint64_t value);

class Applier {
 public:
  virtual ~Applier() = default;
  // Applies one chunk. On error nothing of this chunk is left written.
  virtual Status ApplyChunk(const DecodedChunk& chunk) = 0;
};

struct TensorBuffer {
  uint8_t* data = nullptr;
  uint64_t num_elements = 0;
  int width = 1;
  uint64_t salt = 0;
};

// Applier over one mutable buffer per inventory tensor (index = tensor_index).
class BufferApplier : public Applier {
 public:
  explicit BufferApplier(std::vector<TensorBuffer> tensors) : tensors_(std::move(tensors)) {}
  Status ApplyChunk(const DecodedChunk& chunk) override;
  // Decodes and applies one chunk record (header + streams), with the checks and the all-or-
  // nothing outcome of DecodeChunk + ApplyChunk. Chunks of one contiguous range (every chunk of a
  // large tensor) are patched straight from their streams, a batch of changes at a time: no u64
  // position and value arrays are written and read back. `num_changes` (may be null) receives
  // the chunk's change count. Thread-safe as ApplyChunk.
  Status ApplyRecord(const uint8_t* data, size_t size, uint64_t* num_changes = nullptr);
  // ApplyRecord for a record whose header the caller parsed: `header`, `header_size` and
  // `record_size` are what ParseChunkHeader(data, size, ...) returned for these bytes, which the
  // header is not parsed or checksummed from again. The same outcome as ApplyRecord.
  Status ApplyParsedRecord(const uint8_t* data, size_t size, const ChunkHeader& header,
                           size_t header_size, size_t record_size, uint64_t* num_changes = nullptr);
  // Also checks the target_range_hash over every covered element after applying (reads the whole
  // range). Default off.
  void set_verify_ranges(bool v) { verify_ranges_ = v; }
  // Sum of version_delta over the applied chunks: the content hash of the buffers moved by this
  // much (hash.h is additive). For absolute chunks applied over non-base bits this is the move
  // from the base, as if the chunk had been applied to the base.
  Hash128 hash_delta() const {
    std::lock_guard<std::mutex> lock(mu_);
    return hash_delta_;
  }

 private:
  // Adds an applied chunk's version_delta to hash_delta().
  void AddVersionDelta(const Hash128& d);
  std::vector<TensorBuffer> tensors_;
  bool verify_ranges_ = false;
  mutable std::mutex mu_;
  Hash128 hash_delta_;
};

struct ApplyOptions {
  int threads = 0;           // 0 = hardware concurrency
  bool verify_base = true;   // hash the base and compare with the delta's base_hash
  bool verify_full = false;  // recompute the output's content hash from scratch at the end
  // Progress (dcr/progress.h), called on ApplyDeltaFile's thread: phases "hash base" (with
  // verify_base and a base; about every 256 MiB), "copy base" (tensor bytes, per tensor),
  // "apply" (the delta's chunk bytes, as chunks finish), "rehash" (with verify_full). Empty (the
  // default) = none.
  ProgressCallback progress;
  // Called with the opened delta before anything is read from the base or written; an error
  // ends the apply with no output (e.g. VerifyDeltaFile of dcr/signing.h: only a delta signed by
  // a trusted key is applied). Empty (the default) = none.
  std::function<Status(const DeltaReader&)> check_delta;
  // Called with the output's tensors (read-only mappings of the written files) after the target
  // hash matched and before the output is moved into place; an error ends the apply with no
  // output (e.g. CheckCommitment of dcr/commitment.h against the trainer's signed root). Empty
  // (the default) = none.
  std::function<Status(const std::vector<TensorView>&)> check_output;
};

struct ApplyStats {
  uint64_t chunks = 0;
  uint64_t changes = 0;
  Hash128 result_hash;
};

// Offline refit: writes `out_path` = base + delta, atomically (temp + rename). Refuses a base whose
// content hash differs from the delta's base_hash (kFailedPrecondition) and leaves no output on
// any error. The result is proven by the incremental content hash (and, with verify_full, a full
// rehash) matching the delta's target_hash.
// Memory: base and delta are read through read-only mappings; the output is allocated in full
// first (a full filesystem is kResourceExhausted) and written with pwrite, never through a
// writable mapping. Anonymous memory is a per-thread buffer of the largest chunk's covered
// elements plus its decoded streams (about (3 x width + 2) x chunk_elems bytes), not the
// checkpoint: core/docs/large-checkpoints.md. A chunk covering over 1 GiB is refused
// (kResourceExhausted).
StatusOr<ApplyStats> ApplyDeltaFile(const std::string& base_path, const std::string& delta_path,
                                    const std::string& out_path, const ApplyOptions& options);

}  // namespace dcr

#endif  // DCR_CORE_INCLUDE_DCR_APPLY_H_
