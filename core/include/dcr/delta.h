// dcr deltas: START HERE.
//
// A delta turns checkpoint version `base` into version `target` bit for bit. It is a header, a set
// of independently decodable chunks and a trailer (format.h / core/FORMAT.md). Chunks cover fixed
// cells of a grid over the canonical element space (tensor, element index), so the bytes of a delta
// depend only on (base, target, options), never on threads or timing.
//
// Typical offline use:
//   DCR_ASSIGN_OR_RETURN(auto base, Checkpoint::Open("step1.safetensors"));
//   DCR_ASSIGN_OR_RETURN(auto target, Checkpoint::Open("step2.safetensors"));
//   DeltaFileSink sink("step2.dcr");
//   DCR_ASSIGN_OR_RETURN(DeltaStats st, BuildDelta(base.get(), *target, DeltaOptions{}, &sink));
//   DCR_RETURN_IF_ERROR(ApplyDeltaFile("step1.safetensors", "step2.dcr", "out.safetensors", {}));
//
// Streaming use (transports): give BuildDelta a DeltaSink that ships header, chunks and trailer as
// they are produced; receivers parse them with ParseFileHeader / ParseChunk / ParseTrailer and
// apply each chunk through an Applier (apply.h) as it arrives, in any order.
//
// Lower-level pieces (for the training side, which knows its changes without a dense target):
// Inventory + BuildGrid give the cells; EncodeChunk encodes sorted sparse changes of one cell.
//
// Thread safety: free functions are thread-safe; sinks are called from one thread at a time.
#ifndef DCR_CORE_INCLUDE_DCR_DELTA_H_
#define DCR_CORE_INCLUDE_DCR_DELTA_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/format.h"
#include "dcr/progress.h"
#include "dcr/status.h"
#include "dcr/statusor.h"

namespace dcr {

class Device;  // dcr/device.h

// The most exponent classes a context-coded chunk can have (core/FORMAT.md section 2.5).
inline constexpr int kContextClassesMax = 16;

enum class ValuePolicy : uint8_t {
  kAuto = 0,      // ulp delta for float dtypes, XOR for the rest
  kXor = 1,       // always XOR masks
  kUlpDelta = 2,  // always ordered-integer differences
  kAbsolute = 3,  // overwrite values (idempotent; used for retries and converted placements)
};

struct DeltaOptions {
  // Grid cell size in elements. Default 2^22 (8 MiB of BF16). Part of the output's identity.
  uint64_t chunk_elems = uint64_t{1} << 22;
  // Tensors with fewer elements than this are batched (per element width) into shared chunks.
  // Default 2^16.
  uint64_t small_tensor_elems = uint64_t{1} << 16;
  // zstd level for every stream. Default 1.
  int zstd_level = 1;
  // Worker threads for chunk encoding; 0 = hardware concurrency. Never changes the output.
  int threads = 0;
  ValuePolicy value_policy = ValuePolicy::kAuto;
  // Version numbers recorded in the header.
  uint64_t base_version = 0;
  uint64_t target_version = 1;
  // Emit chunks whose cell has no change (they carry only hashes). Default false.
  bool emit_unchanged = false;
  // Build a no-base delta: every chunk is a full frame (dense absolute values).
  bool full = false;
  // Context-code each chunk that has a context form (dcr/context.h: relative values, elements of
  // 2, 4 or 8 bytes) when that form is smaller than the plain one; the delta is then format
  // version 6 (core/FORMAT.md section 2.5). Its receivers need the base bits of every covered
  // element to decode it. Needs the base on the host (not with BuildDeltaFromDevice). Default
  // false: plain chunks, format version 5.
  bool context_coding = false;
  // With context_coding: the most exponent classes a context-coded chunk may have, 1 to
  // kContextClassesMax. The encoder merges neighbouring classes while a merge saves bits or there
  // are more than this. Every class costs the receivers' class pass (and the encoder's) a compare
  // per element, so fewer classes decode faster at a small size cost (README "Fewer classes").
  // Part of the options the bytes depend on. Default kContextClassesMax: the smallest records.
  int context_classes = kContextClassesMax;
  // Collect the per-tensor order-0 entropy bound of the XOR delta in DeltaStats (costs a histogram
  // update per change). Default false.
  bool collect_entropy = false;
  // The base's content hash if already known (e.g. the committed version); saves a full scan.
  // Zero = compute it.
  Hash128 known_base_hash;
  // Progress (dcr/progress.h), called on BuildDelta's thread: phase "hash base" (the base's
  // tensor bytes, about every 256 MiB; not with known_base_hash), then "diff" (or "encode" with
  // full: the target's tensor bytes scanned, once per build window), then "hash target" with
  // full. Empty (the default) = none.
  ProgressCallback progress;
};

// One file of the target checkpoint.
struct InventoryFile {
  std::string name;        // file name in the checkpoint directory; empty for a single file
  std::string json;        // its safetensors JSON header, verbatim
  uint64_t data_size = 0;  // bytes of its data section
  // Size of the safetensors file with this header.
  uint64_t file_size() const { return 8 + json.size() + data_size; }
};

// The target checkpoint's tensors in canonical order (sorted by name): tensor_index is the position
// here. Built from the target's files and their safetensors JSON headers, carried in the delta
// header; the files of a sharded target name which file holds each tensor.
struct Inventory {
  std::vector<InventoryFile> files;  // at least one; one unnamed for a single-file checkpoint
  std::string index_name;            // the index file of a sharded target; empty: none
  std::string index_json;            // its bytes, verbatim
  std::vector<TensorInfo> tensors;   // sorted by name; file and offsets as in the target's files
  std::vector<uint64_t> salts;       // TensorSalt(name) per tensor

  // Parses a single file's safetensors JSON header (without the u64 length prefix). kDataLoss if
  // malformed.
  static StatusOr<Inventory> Parse(const std::string& json);
  // The target of a delta header: its files' headers and index. kDataLoss if malformed, a
  // tensor is in two files, the file names are not plain unique names, or the index disagrees
  // with the files (the rules of Checkpoint::Open for a directory).
  static StatusOr<Inventory> FromHeader(const FileHeader& header);
  static Inventory FromCheckpoint(const Checkpoint& ckpt);
  // Sets header->files, index_name and index from this inventory.
  void ToHeader(FileHeader* header) const;
  int Find(const std::string& name) const;  // -1 if absent
  bool sharded() const { return files.size() != 1 || !files[0].name.empty(); }
  // Bytes of all data sections together.
  uint64_t data_size() const;
};

// One cell of the chunk grid.
struct GridCell {
  uint64_t chunk_id = 0;
  uint8_t width = 1;
  std::vector<Segment> segments;  // contiguous ranges
  uint64_t num_elements = 0;
};

// Deterministic grid: each tensor with >= small_tensor_elems elements is split into ranges of
// chunk_elems; smaller tensors are batched per width into cells of up to chunk_elems elements.
std::vector<GridCell> BuildGrid(const Inventory& inv, const DeltaOptions& options);

// Sparse changes of one chunk, ready to encode. Positions index the chunk's covered elements.
struct ChunkChanges {
  uint64_t chunk_id = 0;
  uint8_t width = 2;
  std::vector<Segment> segments;
  uint64_t num_elements = 0;
  std::vector<uint64_t> positions;  // strictly increasing
  std::vector<uint64_t> old_bits;   // per position (ignored for kAbsolute and full frames)
  std::vector<uint64_t> new_bits;   // per position
  Hash128 target_range_hash;        // over all covered elements (caller computes)
  bool dense = false;               // positions are all elements: full frame
};

// Maps a chunk's local positions to (segment index, canonical element index). Fast when positions
// are queried in increasing order (restarts otherwise).
class SegmentCursor {
 public:
  explicit SegmentCursor(const std::vector<Segment>& segments);
  // REQUIRES: pos < total covered elements.
  void Locate(uint64_t pos, uint32_t* segment, uint64_t* element);

 private:
  const std::vector<Segment>& segs_;
  size_t s_ = 0;
  uint64_t base_ = 0;
};

// The same changes as spans over arrays the caller owns (encoders that collect changes in their
// own buffers avoid copying them into vectors).
struct ChunkChangesView {
  uint64_t chunk_id = 0;
  uint8_t width = 2;
  const std::vector<Segment>* segments = nullptr;
  uint64_t num_elements = 0;
  uint64_t num_changes = 0;
  const uint64_t* positions = nullptr;  // num_changes, strictly increasing
  const uint64_t* old_bits = nullptr;   // num_changes; nullptr = no old bits (kAbsolute, full
                                        // frames: no base_change_hash). Non-null even when empty.
  const uint64_t* new_bits = nullptr;   // num_changes
  Hash128 target_range_hash;
  bool dense = false;
};

// Encodes one chunk record (ChunkHeader + streams). `value_mode` must be kAbsolute when
// changes.dense is a full frame without base. Hashes of changes are computed from salts.
StatusOr<std::vector<uint8_t>> EncodeChunk(const ChunkChanges& changes, ValueMode value_mode,
                                           const std::vector<uint64_t>& salts, int zstd_level);
StatusOr<std::vector<uint8_t>> EncodeChunk(const ChunkChangesView& changes, ValueMode value_mode,
                                           const std::vector<uint64_t>& salts, int zstd_level);

// Picks the value mode for a dtype under a policy.
ValueMode ChooseValueMode(ValuePolicy policy, DType dtype);

// Receives a delta as it is built. Calls arrive in order: header, chunks (ascending chunk_id),
// trailer; in a signed stream (kFlagSigned, dcr/signing.h's SigningSink) each manifest record
// comes before the chunks it lists.
class DeltaSink {
 public:
  virtual ~DeltaSink() = default;
  virtual Status OnHeader(const std::vector<uint8_t>& bytes) = 0;
  virtual Status OnChunk(const ChunkHeader& header, const std::vector<uint8_t>& bytes) = 0;
  // A context-coded chunk record `bytes` (position mode 3, core/FORMAT.md section 2.5) together
  // with `plain`, the record of the same chunk in its plain encoding: the bytes the encoder wrote
  // before context coding, which ContextChunkToPlain gives back from `bytes` and the base. Only
  // `bytes` is part of the stream; `plain` lets a sink vouch for both forms (SigningSink lists
  // both SHA-256s, so that a relay may forward either). The default passes `bytes` to OnChunk.
  virtual Status OnContextChunk(const ChunkHeader& header, const std::vector<uint8_t>& bytes,
                                const std::vector<uint8_t>& plain);
  // A manifest record (dcr/manifest.h), part of the stream like a chunk but not in the trailer's
  // chunk table. The default refuses it (kUnimplemented): a sink that cannot place it.
  virtual Status OnManifest(const std::vector<uint8_t>& bytes);
  virtual Status OnTrailer(const std::vector<uint8_t>& bytes) = 0;
};

// Accumulates a delta in memory.
class DeltaMemorySink : public DeltaSink {
 public:
  Status OnHeader(const std::vector<uint8_t>& bytes) override;
  Status OnChunk(const ChunkHeader& header, const std::vector<uint8_t>& bytes) override;
  Status OnManifest(const std::vector<uint8_t>& bytes) override;
  Status OnTrailer(const std::vector<uint8_t>& bytes) override;
  const std::vector<uint8_t>& bytes() const { return bytes_; }
  std::vector<uint8_t> Release() { return std::move(bytes_); }

 private:
  std::vector<uint8_t> bytes_;
};

// Writes a delta file atomically: chunks go to a fresh temporary `path`.tmp.XXXXXX (as
// WriteSafetensors makes it); OnTrailer fsyncs and renames it over `path`.
// If destroyed before the trailer, the temporary file is removed and `path` is untouched.
namespace internal {
class AtomicFile;
}  // namespace internal

class DeltaFileSink : public DeltaSink {
 public:
  explicit DeltaFileSink(std::string path);
  ~DeltaFileSink() override;
  Status OnHeader(const std::vector<uint8_t>& bytes) override;
  Status OnChunk(const ChunkHeader& header, const std::vector<uint8_t>& bytes) override;
  Status OnManifest(const std::vector<uint8_t>& bytes) override;
  Status OnTrailer(const std::vector<uint8_t>& bytes) override;

 private:
  std::string path_;
  std::unique_ptr<internal::AtomicFile> file_;  // the temporary, from OnHeader to OnTrailer
};

// Per-tensor statistics of a built delta (also what `dcr inspect` reports).
struct TensorDeltaStats {
  std::string name;
  std::string dtype_name;
  uint64_t elements = 0;
  uint64_t changed = 0;
  uint64_t payload_bytes = 0;  // share of chunk bytes attributed by changes (batched chunks split)
  uint64_t dense_bytes = 0;
  double xor_entropy_bits = 0;  // order-0 entropy bound of the XOR delta, bits (positions + values)
};

struct DeltaStats {
  uint64_t elements = 0;
  uint64_t changed = 0;
  uint64_t chunks = 0;
  uint64_t context_chunks = 0;  // of them, context-coded (DeltaOptions::context_coding)
  uint64_t payload_bytes = 0;   // whole delta stream
  uint64_t dense_bytes = 0;     // tensor bytes of the target
  double entropy_bound_bits = 0;
  Hash128 base_hash;
  Hash128 target_hash;
  std::vector<TensorDeltaStats> tensors;
};

// Whether a delta from `base` to `target` can be built: the same tensor names, each with the same
// dtype and shape. kFailedPrecondition otherwise, naming the first tensor that is missing from one
// side or differs (with both shapes and dtypes) and saying that a full frame is the way
// (`dcr diff --full`, method full). Reads only the headers.
Status CheckDeltaCompatible(const Checkpoint& base, const Checkpoint& target);

// Builds the delta from `base` to `target` (base may be null only with options.full).
// Errors: kFailedPrecondition as CheckDeltaCompatible if the inventories differ and !full;
// sink errors are returned as is. The sink receives the blobs in the order of
// ProductionOrder::ForBuild (below); the grid is BuildGrid(Inventory::FromCheckpoint(target)).
StatusOr<DeltaStats> BuildDelta(const Checkpoint* base, const Checkpoint& target,
                                const DeltaOptions& options, DeltaSink* sink);

// ---- building on a device (dcr/device.h) ----
//
// The three functions below find the changed elements with Device::Diff over device memory and
// encode them on BuildDelta's host worker threads with the same encoder, so the delta's bytes
// equal BuildDelta's for the same (base, target, options), on every backend. Only how changes are
// found (and, for tensors resident on the device, how content hashes are computed) differs. Each
// cell's covered target bytes are hashed on the host (the chunk's target_range_hash is XXH3-128,
// format.h). Errors: those of BuildDelta, and the device's with the device and chunk named
// (kResourceExhausted when it cannot hold an allocation); on any error the sink gets no trailer,
// so a DeltaFileSink leaves no file. `device` must stay usable for the call; it is used from the
// worker threads concurrently (Device methods are thread-safe).

// BuildDelta with the changes found on `device`: each worker thread uploads its cell's base and
// target bytes from the checkpoints into two device allocations of the largest cell's size, so
// device memory stays at 2 x threads x the largest cell's bytes (2 x 16 x 8 MiB with 16 threads
// and BF16 cells of 2^22 elements). The base's content hash is the checkpoint's (host). A full
// frame (options.full) compares nothing and uploads nothing. `device` null = BuildDelta.
StatusOr<DeltaStats> BuildDeltaOnDevice(const Checkpoint* base, const Checkpoint& target,
                                        const DeltaOptions& options, Device* device,
                                        DeltaSink* sink);

// BuildDeltaOnDevice of the checkpoints at `base_path` and `target_path` (safetensors files or
// shard directories, as Checkpoint::Open takes them; base_path unused with options.full): what a
// sender process's builder thread calls. Errors of Checkpoint::Open as they are.
StatusOr<DeltaStats> BuildDeltaFiles(const std::string& base_path, const std::string& target_path,
                                     const DeltaOptions& options, Device* device, DeltaSink* sink);

// A delta's base and target resident in device memory, as a training process holds its
// parameters: one device address per tensor of the target's inventory, element 0 of the tensor's
// bytes (inventory.tensors[i].nbytes, little-endian as in a safetensors file). The base has the
// same tensors (names, dtypes, shapes) as the inventory.
struct DeviceDeltaInputs {
  Inventory inventory;              // the target's tensors (canonical order) and files
  std::vector<const void*> base;    // per inventory tensor; may be empty with options.full
  std::vector<const void*> target;  // per inventory tensor
};

// The delta from the resident base to the resident target: Device::Diff over the tensors where
// they are; each cell's target bytes downloaded into a host buffer of the largest cell's size per
// worker thread for its range hash (the model is never copied to the host as a whole). The base's
// content hash (unless options.known_base_hash), and the target's with options.full, are
// computed with Device::RangeHash on the device. kInvalidArgument when `device` is null or the
// address lists do not match the inventory.
StatusOr<DeltaStats> BuildDeltaFromDevice(const DeviceDeltaInputs& inputs,
                                          const DeltaOptions& options, Device* device,
                                          DeltaSink* sink);

// ---- production order ----

// Grid cells per worker thread in one of BuildDelta's build windows.
inline constexpr uint64_t kBuildWindowCellsPerThread = 4;

// Cells in one of BuildDelta's build windows with `threads` worker threads (values below 1 count
// as 1): threads x kBuildWindowCellsPerThread.
uint64_t BuildWindowCells(int threads);

// The order in which BuildDelta produces a delta's blobs: a pure function of the number of grid
// cells and the worker thread count, never of the data or of timing. Blob 0 is the header, blob
// 1 + c is grid cell c, blob units() + 1 is the trailer.
//
// BuildDelta hands the header to its sink before it scans anything. It then scans and encodes the
// cells window by window (window() consecutive cells, all threads on one window) and, once a whole
// window is encoded, hands that window's chunks to the sink in cell order (a cell without a record
// is skipped); then the trailer. Blobs thus become available in groups: {header}, each window,
// {trailer}. The bytes of the delta do not depend on the windows.
//
// A simulator that merges grid cells into coarser chunks describes the same production with
// ForMergedCells, one unit per merged chunk.
//
// Thread safety: immutable; safe to share.
class ProductionOrder {
 public:
  // `units` units produced in windows of `window` units (0 counts as 1).
  ProductionOrder(uint64_t units, uint64_t window);
  // BuildDelta's order for a grid of `cells` cells built with `threads` worker threads (resolved:
  // DeltaOptions::threads with 0 replaced by the hardware concurrency).
  static ProductionOrder ForBuild(uint64_t cells, int threads);
  // The order of `chunks` chunks that each stand for `cells_per_chunk` grid cells (> 0; may be
  // fractional), built with `threads` worker threads: windows of
  // ceil(BuildWindowCells(threads) / cells_per_chunk) chunks, at least one.
  static ProductionOrder ForMergedCells(uint64_t chunks, double cells_per_chunk, int threads);

  uint64_t units() const { return units_; }
  uint64_t window() const { return window_; }
  uint64_t num_windows() const { return (units_ + window_ - 1) / window_; }
  // Window w holds units [WindowBegin(w), WindowEnd(w)). REQUIRES: w < num_windows().
  uint64_t WindowBegin(uint64_t w) const { return w * window_; }
  uint64_t WindowEnd(uint64_t w) const { return std::min(units_, (w + 1) * window_); }
  // First and last blob (inclusive) of the group produced together with blob `blob`: the header
  // and the trailer are groups of their own. REQUIRES: blob <= units() + 1.
  uint64_t GroupFirst(uint64_t blob) const;
  uint64_t GroupLast(uint64_t blob) const;

 private:
  uint64_t units_;
  uint64_t window_;
};

// ---- parsing ----

// Header bytes: parses and checks magic, version, checksum. `consumed` receives its size.
// kDataLoss on truncation/corruption, kFailedPrecondition on an unsupported format version.
StatusOr<FileHeader> ParseFileHeader(const uint8_t* data, size_t size, size_t* consumed);
// Writes `header` with the format version EncodedFormatVersion(header) (its format_version field
// is not used).
std::vector<uint8_t> SerializeFileHeader(const FileHeader& header);
// The version a header is written with: 6 when it uses a version-6 feature (kFlagSigned,
// kFlagContext), else
// kPlainFormatVersion (5), so a delta without one is the same bytes as a version 5 encoder's.
uint32_t EncodedFormatVersion(const FileHeader& header);

// One chunk record starting at `data`: header checked; `record_size` receives header+streams.
StatusOr<ChunkHeader> ParseChunkHeader(const uint8_t* data, size_t size, size_t* header_size,
                                       size_t* record_size);

StatusOr<Trailer> ParseTrailer(const uint8_t* data, size_t size);
std::vector<uint8_t> SerializeTrailer(const Trailer& trailer, uint64_t trailer_offset);

// A decoded chunk: positions and values in canonical terms (still relative for XOR/ulp modes).
struct DecodedChunk {
  ChunkHeader header;
  std::vector<uint64_t> positions;  // local positions; empty for kDense (all elements)
  std::vector<uint64_t> values;     // per change: mask / zigzag delta / absolute bits
};

// Decodes a whole chunk record (header + streams): verifies checksums and counts, decompresses.
// Errors: kDataLoss for any inconsistency. Never reads outside [data, data+size). It allocates
// what the header's counts allow (up to 2^34 changes): a record from outside is decoded through
// DeltaReader::Decode, or by an applier or receiver, which check its segments against the
// tensors first.
StatusOr<DecodedChunk> DecodeChunk(const uint8_t* data, size_t size);
// The same into `out`, reusing its buffers (receivers decoding chunk after chunk avoid fresh
// allocations). On error `out` holds unspecified contents.
Status DecodeChunkInto(const uint8_t* data, size_t size, DecodedChunk* out);

// A whole delta in memory or mapped from a file, with its chunk table checked.
class DeltaReader {
 public:
  static StatusOr<std::unique_ptr<DeltaReader>> Open(const std::string& path);
  static StatusOr<std::unique_ptr<DeltaReader>> FromBytes(std::vector<uint8_t> bytes);
  ~DeltaReader();

  const FileHeader& header() const { return header_; }
  const Trailer& trailer() const { return trailer_; }
  const Inventory& inventory() const { return inventory_; }
  size_t num_chunks() const { return trailer_.chunks.size(); }
  // The record bytes of chunk table entry i.
  const uint8_t* chunk_data(size_t i) const { return data_ + trailer_.chunks[i].offset; }
  size_t chunk_size(size_t i) const { return trailer_.chunks[i].size; }
  // Decodes chunk table entry i (DecodeChunk) once its segments fit the inventory's tensors
  // (indices, widths, every element inside its tensor, no tensor covered more than once over):
  // so it allocates at most what the tensors it names hold. kDataLoss otherwise.
  StatusOr<DecodedChunk> Decode(size_t i) const;
  Status DecodeInto(size_t i, DecodedChunk* out) const;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  DeltaReader() = default;
  Status Init();
  std::vector<uint8_t> owned_;
  void* map_ = nullptr;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  FileHeader header_;
  Trailer trailer_;
  Inventory inventory_;
};

}  // namespace dcr

#endif  // DCR_CORE_INCLUDE_DCR_DELTA_H_
