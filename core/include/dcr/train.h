// Training side: the placement of a model's parameters on Megatron-like ranks, the exporter seam,
// exporter-probed affine maps, and per-rank delta construction. (The reference training state and
// its exporter are fixtures of the testing library.)
//
// The pieces, in the order a trainer uses them:
//  1. TrainLayout (tp, pp, ep, dp, distributed optimizer, tied embeddings, conversions) and
//     TrainStructure: where every training parameter lives on which model-parallel rank, in which
//     buffer, at which offset. Rank shards hold the BF16 (or FP32) parameter bits:
//       - column-parallel linears split by rows, row-parallel linears by columns;
//       - fused QKV per tensor-parallel rank, interleaved per grouped-query group
//         ([q heads of group 0, k0, v0, q heads of group 1, k1, v1, ...]), q/k heads optionally in
//         the interleaved-pair RoPE layout (HF stores the half-split layout);
//       - fused gate/up ([gate rows; up rows] per rank);
//       - vocab-parallel embedding / output layer padded to a multiple of vocab_pad * tp rows;
//       - tied embeddings (with pp > 1 the last stage holds a replica of the embedding);
//       - replicated norms (FP32 when fp32_norms) and routers;
//       - MoE experts split over ep ranks and stored grouped and transposed per rank:
//         weight1 [local experts, hidden, 2 * moe_inter / tp] (gate columns then up columns),
//         weight2 [local experts, moe_inter / tp, hidden];
//       - with the distributed optimizer, parameters are packed into flat buffers per rank
//         (dense BF16, expert BF16, FP32) that cut across tensor boundaries; each data-parallel
//         rank owns a contiguous slice of every flat buffer. Without it, each parameter is its own
//         buffer owned by data-parallel rank 0.
//  2. The trainer's shards (ShardSet): the parameter bits of every rank after a step.
//  3. Exporter: the framework's ordinary converter from rank shards to canonical tensors. It knows
//     nothing about deltas. Besides index maps it may do conversions that are not (the reference
//     one: FP32 norms stored as BF16, a per-row scale folded into down_proj, and the affine RoPE
//     permutation).
//  4. LayoutMap::Discover: probes the exporter with coordinate-tagged shards (several passes of
//     16-bit digits plus check passes) and compresses the result into pieces: source boxes of a
//     rank buffer -> boxes of a canonical tensor (offset, up to 4 (count, stride) dims). Canonical
//     elements that do not come out as an index map are residual; the exporter's reads while
//     exporting a residual tensor are recorded as its dependencies.
//  5. TrainDeltaBuilder: one work unit per (model-parallel rank, data-parallel rank). A unit diffs
//     only the buffer slices it owns, relabels changes to chunk positions of its pieces (chunks in
//     canonical coordinates, no gathering) and encodes them (EncodeChunk). Residual tensors whose
//     dependencies changed are re-exported (old and new) and sent as absolute overwrites.
//     Replicas (tensor-parallel copies of norms, expert-parallel copies of dense parameters, the
//     tied embedding replica) have no map and are sent once. Merge writes one delta stream whose
//     ApplyDeltaFile(base canonical file) equals the exporter's output of the new state.
//
// Thread safety: TrainStructure, Exporter and LayoutMap are immutable after creation and safe to
// share. TrainDeltaBuilder::BuildUnit is const and may run
// concurrently for distinct units; Merge/BuildStep need exclusive access.
#ifndef DCR_CORE_INCLUDE_DCR_TRAIN_H_
#define DCR_CORE_INCLUDE_DCR_TRAIN_H_

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/delta.h"
#include "dcr/format.h"
#include "dcr/model.h"
#include "dcr/status.h"
#include "dcr/statusor.h"

namespace dcr {

namespace internal {
class RankBuffers;  // train_delta.cc
}  // namespace internal

struct TrainLayout {
  int tp = 1;                 // tensor parallel
  int pp = 1;                 // pipeline parallel (layers split into contiguous stages)
  int ep = 1;                 // expert parallel (MoE presets only)
  int dp = 1;                 // data parallel (slices flat buffers with the distributed optimizer)
  bool dist_opt = false;      // distributed optimizer: flat buffers, dp-sliced ownership
  int tied = -1;              // -1: the preset's value; 0/1 overrides tied embeddings
  bool fp32_norms = true;     // norms trained and stored in FP32 on ranks, exported as BF16
  bool rope_permute = true;   // q/k heads in interleaved-pair RoPE layout on ranks
  int fold_layers = 0;        // last N dense-MLP layers: FP32 per-row scale folded into down_proj
  int64_t vocab_pad = 128;    // vocab rows padded to a multiple of vocab_pad * tp
  int64_t bucket_align = 64;  // element alignment of parameters inside flat buffers

  // "tp=2,pp=2,ep=1,dp=2,dist_opt=1,tied=0,fp32_norms=1,rope_permute=1,fold_layers=1,
  // vocab_pad=128,bucket_align=64" (any subset; spaces ignored). kInvalidArgument naming the key.
  static StatusOr<TrainLayout> Parse(const std::string& text);
  std::string ToString() const;
};

// Where a training parameter lives.
struct LocalParam {
  std::string name;     // Megatron-style name, unique within its rank
  int buffer = 0;       // index into the rank's buffers
  uint64_t offset = 0;  // element offset in the buffer
  uint64_t numel = 0;
  std::vector<int64_t> shape;  // local shape
  uint64_t key = 0;            // init/gradient stream; equal for replicas of one parameter
  bool replica = false;        // a copy of a parameter held (and exported) elsewhere
};

struct BufferSpec {
  std::string name;
  DType dtype = DType::kBF16;
  uint64_t numel = 0;
  int width() const { return DTypeWidth(dtype); }
};

struct RankSpec {
  int pp = 0, tp = 0, ep = 0;
  std::vector<BufferSpec> buffers;
  std::vector<LocalParam> params;
  std::map<std::string, int> index;  // param name -> position in params
  // Index of the parameter called `name`, or -1.
  int FindParam(const std::string& name) const;
};

// The placement of every parameter of a model under a layout. Immutable.
class TrainStructure {
 public:
  // Errors: kInvalidArgument naming the field (tp not dividing kv_heads, ep on a dense model,
  // experts not divisible by ep, more stages than layers, ...); kUnimplemented for a tensor the
  // layout cannot place.
  static StatusOr<std::shared_ptr<const TrainStructure>> Create(const ModelConfig& cfg,
                                                                const TrainLayout& layout);
  // The placement a layout spec describes, for any tensor set (no preset): `tensors` are the
  // canonical tensors (a checkpoint's inventory, any order), `spec_json` says where each lives:
  //   {"ranks": N,
  //    "tensors": [{"tensor": NAME, "split": "rows" | "columns" | "whole", "ranks": [r, ...]},
  //                ...]}
  // "rows" cuts dimension 0 into len(ranks) equal contiguous parts, part i on ranks[i] (a
  // column-parallel linear); "columns" cuts dimension 1 so (a row-parallel linear; 2 or more
  // dimensions); "whole" puts the tensor on every listed rank, ranks[0] its owner and the others
  // replicas. Every model-parallel rank holds one buffer per parameter (named as the tensor, in
  // its dtype) and the layout has no pipeline, expert or data parallelism (dp 1). Every tensor
  // must be placed exactly once and every rank must hold something. Errors: kInvalidArgument
  // naming the entry ("layout spec: tensors[2] (w): ...") for JSON that does not parse, an
  // unknown key, an unknown tensor, a tensor placed twice (overlapping coverage) or not at all
  // (missing coverage), an unknown split, a rank out of range or listed twice, a dimension the
  // split does not divide, a split along a dimension the tensor lacks, a rank holding nothing,
  // or a dtype without a width.
  static StatusOr<std::shared_ptr<const TrainStructure>> FromLayoutSpec(
      const std::string& spec_json, const std::vector<TensorSpec>& tensors);
  const ModelConfig& config() const { return cfg_; }
  const TrainLayout& layout() const { return layout_; }
  // Canonical tensors (sorted by name): ModelInventory of the (possibly re-tied) config.
  const std::vector<TensorSpec>& canonical() const { return canonical_; }
  // Model-parallel ranks, id = (pp * ep + ep_rank) * tp + tp_rank.
  const std::vector<RankSpec>& ranks() const { return ranks_; }
  int RankId(int pp, int ep, int tp) const { return (pp * layout_.ep + ep) * layout_.tp + tp; }
  int64_t padded_vocab() const { return padded_vocab_; }
  // Multi-head latent attention (q/kv LoRA projections) instead of q/k/v_proj.
  bool is_mla() const { return mla_; }
  int StageOfLayer(int64_t layer) const;
  int64_t FirstLayerOfStage(int stage) const;
  // Element range [begin, end) of buffer `b` of rank `r` owned by data-parallel rank `d`.
  void OwnedRange(int r, int b, int d, uint64_t* begin, uint64_t* end) const;
  uint64_t total_shard_bytes() const;  // all buffers of all model-parallel ranks

 private:
  TrainStructure() = default;
  ModelConfig cfg_;
  TrainLayout layout_;
  std::vector<TensorSpec> canonical_;
  std::vector<RankSpec> ranks_;
  int64_t padded_vocab_ = 0;
  bool mla_ = false;
  std::vector<int64_t> stage_begin_;
};

// Bytes of every buffer of every model-parallel rank (the rank shards).
struct ShardSet {
  std::vector<std::vector<std::vector<uint8_t>>> buffers;  // [rank][buffer] bytes
  const uint8_t* data(int r, int b) const { return buffers[r][b].data(); }
  static ShardSet Zeros(const TrainStructure& s);
};

// Read access to rank shards (lets map discovery observe what the exporter reads).
class ShardReader {
 public:
  virtual ~ShardReader() = default;
  // Elements [begin, begin+count) of buffer `b` of rank `r`.
  virtual const uint8_t* Read(int r, int b, uint64_t begin, uint64_t count) const = 0;
};

class ShardSetReader : public ShardReader {
 public:
  ShardSetReader(const TrainStructure& s, const ShardSet& set) : s_(s), set_(set) {}
  const uint8_t* Read(int r, int b, uint64_t begin, uint64_t count) const override;

 private:
  const TrainStructure& s_;
  const ShardSet& set_;
};

// The framework's converter: rank shards -> canonical tensors. Knows nothing about deltas. The
// training framework implements ExportTensor (its ordinary conversion code); map discovery probes
// it and the delta builder re-runs it for residual tensors.
class Exporter {
 public:
  explicit Exporter(std::shared_ptr<const TrainStructure> s) : s_(std::move(s)) {}
  virtual ~Exporter() = default;
  // Writes canonical tensor `t` (index into structure().canonical()) to `out`
  // (canonical()[t].nbytes() bytes). Must be safe to call concurrently for distinct tensors.
  virtual Status ExportTensor(const ShardReader& shards, size_t t, uint8_t* out) const = 0;
  // All canonical tensors back to back in canonical order.
  StatusOr<std::vector<uint8_t>> ExportAll(const ShardReader& shards, int threads = 0) const;
  // A safetensors file image / file of the canonical checkpoint.
  StatusOr<std::vector<uint8_t>> ExportFileImage(const ShardReader& shards, int threads = 0) const;
  Status ExportFile(const ShardReader& shards, const std::string& path, int threads = 0) const;
  // The same checkpoint as a Hugging Face shard directory (WriteShardedCheckpoint).
  Status ExportDirectory(const ShardReader& shards, const std::string& dir, uint64_t shard_bytes,
                         int threads = 0) const;
  const TrainStructure& structure() const { return *s_; }

 private:
  std::shared_ptr<const TrainStructure> s_;
};

// A fixed affine map piece: elements of a source box in buffer `buffer` of rank `rank` are the
// elements of a canonical box of tensor `tensor`; both boxes share the digits (row-major over
// count, last dimension fastest), and source indices increase with the digit order.
struct MapPiece {
  int rank = 0;
  int buffer = 0;
  uint32_t tensor = 0;
  uint32_t ndim = 1;
  uint64_t src_offset = 0;
  std::array<uint64_t, kMaxSegmentDims> count{};
  std::array<int64_t, kMaxSegmentDims> src_stride{};
  std::array<int64_t, kMaxSegmentDims> dst_stride{};
  uint64_t dst_offset = 0;
  uint64_t num_elements() const;
  uint64_t SrcAt(uint64_t local) const;
  Segment CanonicalBox() const;  // the canonical side as a Segment
};

struct ReadRange {
  int rank = 0, buffer = 0;
  uint64_t begin = 0, count = 0;
};

struct ResidualTensor {
  uint32_t tensor = 0;
  std::vector<Segment> elements;  // residual canonical elements (contiguous ranges)
  uint64_t num_elements = 0;
  std::vector<ReadRange> deps;  // what the exporter read to produce the tensor
};

struct MapStats {
  uint64_t canonical_elements = 0;
  uint64_t affine_elements = 0;
  uint64_t residual_elements = 0;
  uint64_t pieces = 0;
  int passes = 0;  // exporter runs used by the probe
  double affine_share() const {
    return canonical_elements ? double(affine_elements) / double(canonical_elements) : 0;
  }
};

class LayoutMap {
 public:
  // Probes `exporter` (ExportAll on tagged shards), once per layout.
  static StatusOr<std::shared_ptr<const LayoutMap>> Discover(const Exporter& exporter,
                                                             int threads = 0);
  const std::vector<MapPiece>& pieces() const { return pieces_; }  // by (rank, buffer, source)
  const std::vector<ResidualTensor>& residual() const { return residual_; }
  const MapStats& stats() const { return stats_; }

 private:
  LayoutMap() = default;
  std::vector<MapPiece> pieces_;
  std::vector<ResidualTensor> residual_;
  MapStats stats_;
};

struct TrainDeltaOptions {
  uint64_t chunk_elems = uint64_t{1} << 22;  // max covered elements per chunk
  int zstd_level = 1;
  int threads = 0;  // 0 = hardware concurrency; never changes the output
  ValuePolicy value_policy = ValuePolicy::kAuto;  // affine chunks; residual chunks are absolute
  // 0: the target is the exporter's single safetensors file. > 0: the exporter's checkpoint as a
  // shard directory split at this many bytes (Exporter::ExportDirectory, PlanShardedCheckpoint);
  // the delta's header names those files and the index, so applying it writes that directory.
  uint64_t shard_bytes = 0;
};

// Output of one work unit (one rank's contribution to a delta).
struct UnitDelta {
  int unit = 0;
  std::vector<std::pair<uint64_t, std::vector<uint8_t>>> chunks;  // (chunk id, record)
  std::vector<int> affected_residual;  // indices into LayoutMap::residual()
  uint64_t scanned_bytes = 0;          // shard bytes compared (old + new counted once)
  uint64_t changes = 0;
};

struct TrainDeltaStats {
  uint64_t canonical_elements = 0;
  uint64_t affine_elements = 0;
  uint64_t affine_changes = 0;
  uint64_t residual_changes = 0;
  uint64_t residual_tensors_exported = 0;
  uint64_t residual_gathered_bytes = 0;  // shard bytes read by residual re-exports
  uint64_t scanned_bytes = 0;
  uint64_t chunks = 0;
  uint64_t payload_bytes = 0;
  Hash128 base_hash;
  Hash128 target_hash;
  double affine_change_share() const {
    uint64_t n = affine_changes + residual_changes;
    return n ? double(affine_changes) / double(n) : 1.0;
  }
};

class TrainDeltaBuilder {
 public:
  // Prepares the units' chunks and computes the content hash of the canonical checkpoint of
  // `base` from the shards (each rank its own elements, residual tensors via `exporter`, the one
  // `map` was discovered from). kInvalidArgument if the exporter's structure is not `s`.
  static StatusOr<std::unique_ptr<TrainDeltaBuilder>> Create(
      std::shared_ptr<const TrainStructure> s, std::shared_ptr<const LayoutMap> map,
      std::shared_ptr<const Exporter> exporter, const ShardSet& base,
      const TrainDeltaOptions& options);
  ~TrainDeltaBuilder();

  // Units: (model-parallel rank r, data-parallel rank d), id = r * dp + d.
  int num_units() const;
  // The chunks of one unit: diff of its owned slices between `prev` and `next` (the buffers of its
  // rank only), projected to canonical chunks. REQUIRES: prev is the version of the last Merge
  // (or Create). Thread-safe for distinct units.
  StatusOr<UnitDelta> BuildUnit(int unit, const std::vector<std::vector<uint8_t>>& prev_rank,
                                const std::vector<std::vector<uint8_t>>& next_rank) const;
  // BuildUnit over the rank's buffers in memory of `device` (dcr/device.h), as a training rank
  // holds them: prev_rank[b] / next_rank[b] are device addresses of buffer b's element 0 (its
  // numel x width bytes). The same UnitDelta as BuildUnit for the same bytes: changes found by
  // Device::Diff, one call per span of each chunk (the chunk's runs in buffer order, grouped
  // where they are at most 2^16 elements apart: the device work of a chunk of contiguous pieces is
  // its covered elements), encoded on the calling thread; each chunk's covered new bytes
  // downloaded for its range hash (one span at a time: host memory of about one chunk); residual
  // dependencies compared with Device::FirstDifference. Errors: kInvalidArgument for a bad unit,
  // a null device or address, or a buffer count unlike the layout's; the device's, with the unit
  // and device named. Thread-safe for distinct units. REQUIRES: the buffers have the layout's
  // sizes.
  StatusOr<UnitDelta> BuildUnitOnDevice(int unit, Device* device,
                                        const std::vector<const void*>& prev_rank,
                                        const std::vector<const void*>& next_rank) const;
  // Residual overwrites for the tensors flagged by the units (exporter run on prev and next).
  StatusOr<UnitDelta> BuildResidual(const std::vector<UnitDelta>& units, const ShardSet& prev,
                                    const ShardSet& next) const;
  // Writes header, all chunks (by id) and trailer to `sink`; advances base version and hash.
  StatusOr<TrainDeltaStats> Merge(std::vector<UnitDelta> units, UnitDelta residual,
                                  DeltaSink* sink);
  // All of the above (units in parallel).
  StatusOr<TrainDeltaStats> BuildStep(const ShardSet& prev, const ShardSet& next, DeltaSink* sink);
  // BuildStep with the units built on `device`: one model-parallel rank at a time, its old and
  // new buffers uploaded (device memory holds two copies of one rank's buffers) and its
  // data-parallel units built in parallel by BuildUnitOnDevice; residual tensors re-exported on
  // the host from `prev` and `next`. The same delta bytes as BuildStep. Errors: BuildStep's, and
  // the device's (kResourceExhausted when it cannot hold a rank) with the rank or unit named;
  // nothing reaches `sink` before every unit is built.
  StatusOr<TrainDeltaStats> BuildStepOnDevice(const ShardSet& prev, const ShardSet& next,
                                              Device* device, DeltaSink* sink);

  // The version numbers the next Merge (or BuildStep) writes in its header: base_version `base`
  // (the version of the shards given as prev) and target_version `target`; after it, version()
  // is `target`. Without a call: version() and version() + 1. REQUIRES: target > base.
  void SetNextVersions(uint64_t base, uint64_t target) {
    version_ = base;
    next_target_ = target;
  }
  Hash128 base_hash() const { return base_hash_; }
  uint64_t version() const { return version_; }
  const std::string& inventory_json() const { return inventory_json_; }

 private:
  TrainDeltaBuilder() = default;
  struct Unit;
  // BuildUnit over the old and new buffers of the unit's rank, in host or device memory.
  StatusOr<UnitDelta> BuildUnitWith(int unit, internal::RankBuffers* buffers) const;
  std::shared_ptr<const TrainStructure> s_;
  std::shared_ptr<const LayoutMap> map_;
  std::shared_ptr<const Exporter> exporter_;
  TrainDeltaOptions options_;
  std::vector<Unit> units_;
  std::vector<uint64_t> salts_;
  std::string inventory_json_;  // the exporter's single-file header
  FileHeader target_;           // files and index of the target (its other fields unused)
  Hash128 base_hash_;
  uint64_t version_ = 0;
  uint64_t next_target_ = 0;  // 0: version_ + 1
};

}  // namespace dcr

#endif  // DCR_CORE_INCLUDE_DCR_TRAIN_H_
