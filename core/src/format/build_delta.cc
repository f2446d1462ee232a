// BuildDelta: scan base and target cell by cell, encode changed cells, stream them to a sink.
// With a Device the changes of each cell are found by Device::Diff over device memory; the
// encoding that follows is the same code either way.
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "dcr/context.h"
#include "dcr/delta.h"
#include "dcr/device.h"
#include "dcr/hash.h"
#include "dcr/status_macros.h"
#include "internal/chunk_scan.h"
#include "internal/context_codec.h"
#include "internal/diff_scan.h"
#include "internal/element_ops.h"
#include "internal/mapped_file.h"
#include "internal/parallel.h"
#include "internal/phase_progress.h"
#include "internal/range_hasher.h"
#include "internal/simd.h"

namespace dcr {
namespace {

double BinaryEntropyBits(uint64_t n, uint64_t k) {
  if (k == 0 || k == n) return 0;
  double p = static_cast<double>(k) / static_cast<double>(n);
  return static_cast<double>(n) * (-(p * std::log2(p) + (1 - p) * std::log2(1 - p)));
}

// Changes of one cell, found by comparing base and target.
struct CellScan {
  // The changes found, in buffers reused across cells: grown by doubling, never shrunk. Plain
  // arrays (not vectors) so the scan appends with register-held pointers.
  std::unique_ptr<uint64_t[]> pos, old_bits, new_bits;
  uint64_t cap = 0;
  uint64_t n = 0;
  // Makes room for `more` further changes.
  void Reserve(uint64_t more) {
    if (n + more <= cap) return;
    const uint64_t want = std::max<uint64_t>({cap * 2, n + more, 1024});
    auto grow = [&](std::unique_ptr<uint64_t[]>* a) {
      std::unique_ptr<uint64_t[]> b(new uint64_t[want]);
      if (n > 0) std::memcpy(b.get(), a->get(), n * sizeof(uint64_t));
      *a = std::move(b);
    };
    grow(&pos);
    grow(&old_bits);
    grow(&new_bits);
    cap = want;
  }
  // Per segment: number of changes (for stats attribution).
  std::vector<uint64_t> seg_changes;
  // XOR value histogram per segment (only with collect_entropy).
  std::vector<std::unordered_map<uint64_t, uint64_t>> seg_hist;
  // The XOR histogram of a cell of one contiguous segment of width 1 or 2, indexed by value,
  // while the cell is encoded (only with collect_entropy); emptied into seg_hist afterwards.
  std::vector<uint64_t> flat_hist;
  // The changes of the cell as positions and values, when the scan encoder left them for the
  // context-coded form (ctx_changes set); the next cell's scan overwrites them.
  bool ctx_changes = false;
  std::vector<uint64_t> ctx_pos, ctx_val;
  // With ctx_changes, what the scan had in cache for the context encoder (ContextHints): the
  // context of each change's base element, and when ctx_sampled the class choice's sample.
  std::vector<uint8_t> ctx_ctx;
  bool ctx_sampled = false;
  uint64_t ctx_sample[256] = {};
};

// What the statistics keep of a cell's scan once it is encoded (its change arrays go back to the
// pool for the next cell).
struct CellStats {
  uint64_t n = 0;
  std::vector<uint64_t> seg_changes;
  std::vector<std::unordered_map<uint64_t, uint64_t>> seg_hist;
};

// Appends the changes among n elements (the caller reserved n more).
template <typename T>
void ScanRange(const T* a, const T* b, uint64_t n, uint64_t pos_base, bool avx2, CellScan* out) {
  uint64_t* __restrict pos = out->pos.get() + out->n;
  uint64_t* __restrict ob = out->old_bits.get() + out->n;
  uint64_t* __restrict nb = out->new_bits.get() + out->n;
  uint64_t m = 0;
  internal::ForEachDifference(a, b, n, avx2, [&](uint64_t j) {
    pos[m] = pos_base + j;
    ob[m] = static_cast<uint64_t>(a[j]);
    nb[m] = static_cast<uint64_t>(b[j]);
    ++m;
  });
  out->n += m;
}

void ScanBytes(const uint8_t* a, const uint8_t* b, int width, uint64_t n, uint64_t pos_base,
               bool avx2, CellScan* out) {
  switch (width) {
    case 1:
      ScanRange(a, b, n, pos_base, avx2, out);
      break;
    case 2:
      ScanRange(reinterpret_cast<const uint16_t*>(a), reinterpret_cast<const uint16_t*>(b), n,
                pos_base, avx2, out);
      break;
    case 4:
      ScanRange(reinterpret_cast<const uint32_t*>(a), reinterpret_cast<const uint32_t*>(b), n,
                pos_base, avx2, out);
      break;
    default:
      ScanRange(reinterpret_cast<const uint64_t*>(a), reinterpret_cast<const uint64_t*>(b), n,
                pos_base, avx2, out);
      break;
  }
}

// The scan buffers of the calling thread, reused across windows and calls (no page faults from
// fresh allocations): one per worker, each taken by a worker for one cell at a time, so their
// memory (24 bytes per change of the largest cell) grows with the thread count, not with the
// window. Called on the caller's thread: a thread_local named inside a worker would be the
// worker's own, empty one.
std::vector<CellScan>& CallerScans() {
  thread_local std::vector<CellScan> scans;
  return scans;
}

// Where a build on a device finds base and target: `device` null = the host scan over the
// checkpoints' bytes. With `base`/`target` set, the tensors are resident in device memory (one
// device address per inventory tensor); otherwise each cell is uploaded from the checkpoints.
struct DeviceInputs {
  Device* device = nullptr;
  const std::vector<const void*>* base = nullptr;
  const std::vector<const void*>* target = nullptr;
  bool resident() const { return target != nullptr; }
};

// One worker's scratch for a build on a device: device allocations holding a cell's uploaded
// base and target, and host memory holding a resident cell's target bytes for the range hash.
// Grown to the largest cell, freed with the build.
class DeviceSlot {
 public:
  explicit DeviceSlot(Device* device) : device_(device) {}
  ~DeviceSlot() {
    device_->Free(base_);
    device_->Free(target_);
  }
  DeviceSlot(const DeviceSlot&) = delete;
  DeviceSlot& operator=(const DeviceSlot&) = delete;

  // Makes the device allocations at least `bytes` long (the base's only when `with_base`).
  Status Reserve(uint64_t bytes, bool with_base) {
    if (bytes <= cap_ && (base_ != nullptr || !with_base)) return Status::OK();
    const uint64_t want = std::max(bytes, cap_);
    device_->Free(base_);
    device_->Free(target_);
    base_ = target_ = nullptr;
    cap_ = 0;
    DCR_ASSIGN_OR_RETURN(target_, device_->Allocate(want));
    if (with_base) {
      DCR_ASSIGN_OR_RETURN(base_, device_->Allocate(want));
    }
    cap_ = want;
    return Status::OK();
  }
  uint8_t* base() const { return static_cast<uint8_t*>(base_); }
  uint8_t* target() const { return static_cast<uint8_t*>(target_); }
  std::vector<uint8_t>& host() { return host_; }

 private:
  Device* device_;
  void* base_ = nullptr;
  void* target_ = nullptr;
  uint64_t cap_ = 0;
  std::vector<uint8_t> host_;
};

// Checks a device's diff of n elements before its changes are used: the arrays agree in length
// and the positions ascend below n.
Status CheckDiffResult(const DeviceDiffResult& r, uint64_t n, const Device& device) {
  const size_t k = r.positions.size();
  bool ok = r.old_bits.size() == k && r.new_bits.size() == k && k <= n;
  for (size_t i = 0; ok && i < k; ++i) {
    ok = r.positions[i] < n && (i == 0 || r.positions[i - 1] < r.positions[i]);
  }
  if (ok) return Status::OK();
  return InternalError("device " + device.name() + ": its diff of " + std::to_string(n) +
                       " elements returned malformed changes");
}

// Views of resident device tensors (their data: device addresses) for DeviceContentHashOf.
std::vector<TensorView> DeviceViews(const std::vector<TensorInfo>& tensors,
                                    const std::vector<const void*>& data) {
  std::vector<TensorView> views;
  views.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo& t = tensors[i];
    views.push_back(TensorView{t.name, t.dtype_name, t.shape, data[i], t.nbytes});
  }
  return views;
}

// One BuildDelta call: the inputs bound to the target's inventory, the running statistics and
// the position in the output stream. BuildDelta runs its steps in production order (delta.h
// ProductionOrder): Bind, EmitHeader, BuildWindow per window, EmitTrailer, Finish.
class DeltaBuilder {
 public:
  // `base` and `target` are the checkpoints (null when `dev` is resident; base null with
  // options.full); `inv` is the target's inventory.
  DeltaBuilder(const Checkpoint* base, const Checkpoint* target, Inventory inv,
               const DeviceInputs& dev, const DeltaOptions& options, DeltaSink* sink)
      : base_(base),
        target_(target),
        dev_(dev),
        options_(options),
        sink_(sink),
        inv_(std::move(inv)),
        avx2_(internal::CpuHasAvx2()),
        threads_(internal::ResolveThreads(options.threads)),
        scans_(CallerScans()) {}

  // Checks that base and target have the same tensors (names, dtypes, shapes) unless
  // options.full, and records each tensor's bytes in both. kFailedPrecondition otherwise;
  // kInvalidArgument when resident device tensors do not match the inventory.
  Status Bind();
  // Serializes the file header and hands it to the sink.
  Status EmitHeader();
  // Scans and encodes cells [begin, end) of the grid on all threads, then hands their chunks to
  // the sink in cell order.
  Status BuildWindow(uint64_t begin, uint64_t end);
  // Serializes the trailer (chunk table and target hash) and hands it to the sink.
  Status EmitTrailer();
  // The statistics of the finished delta.
  DeltaStats Finish();

  uint64_t cells() const { return grid_.size(); }
  int threads() const { return threads_; }
  // Tensor bytes of the target, and those covered by cells [begin, end) of the grid.
  uint64_t dense_bytes() const { return stats_.dense_bytes; }
  uint64_t CellBytes(uint64_t begin, uint64_t end) const {
    uint64_t bytes = 0;
    for (uint64_t c = begin; c < end; ++c) bytes += grid_[c].num_elements * grid_[c].width;
    return bytes;
  }

 private:
  // Encodes `cell` into `*out`, its changes collected in `sc` (and on a device through `slot`);
  // false on failure.
  bool EncodeCell(const GridCell& cell, CellScan* sc, DeviceSlot* slot,
                  StatusOr<std::vector<uint8_t>>* out) const;
  // EncodeCell for one contiguous range with a base: scan and encode in one pass.
  bool EncodeContiguousCell(const GridCell& cell, CellScan* sc,
                            StatusOr<std::vector<uint8_t>>* out) const;
  // Collects the changes of a cell into `sc` (every element with options.full) and returns the
  // hash of its target bytes; `all_float` says whether every segment has a float dtype.
  Hash128 ScanCell(const GridCell& cell, CellScan* sc, bool* all_float) const;
  // ScanCell on the device: the cell's base and target uploaded into `slot` (or read where they
  // are resident), the changes found by Device::Diff, the range hash over the target's bytes on
  // the host (downloaded into `slot` when resident).
  Status DeviceScanCell(const GridCell& cell, CellScan* sc, DeviceSlot* slot, bool* all_float,
                        Hash128* range_hash) const;
  // Adds a cell's changes, bytes and histogram to the per-tensor statistics.
  void AccountCell(const GridCell& cell, const CellStats& sc, const std::vector<uint8_t>& bytes);
  // Replaces the plain record `*bytes` of `cell` with its context-coded form when it has one and
  // it is the smaller, from the changes the scan left in `sc` (ctx_changes) or else from the
  // record itself; the plain record then moves to `*plain` (left empty otherwise).
  Status ContextCode(const GridCell& cell, const CellScan& sc, std::vector<uint8_t>* bytes,
                     std::vector<uint8_t>* plain) const;
  // Hands one encoded chunk to the sink and records it in the chunk table; `plain` is the plain
  // form of a context-coded record (the sink's OnContextChunk), empty for a plain one.
  Status EmitChunk(const std::vector<uint8_t>& bytes, const std::vector<uint8_t>& plain);

  const Checkpoint* base_;
  const Checkpoint* target_;
  const DeviceInputs dev_;
  const DeltaOptions& options_;
  DeltaSink* sink_;
  const Inventory inv_;
  const bool avx2_;
  const int threads_;
  std::vector<CellScan>& scans_;
  std::vector<std::unique_ptr<DeviceSlot>> slots_;  // per worker, with a device
  std::vector<const uint8_t*> base_ptr_, target_ptr_;
  std::vector<GridCell> grid_;
  DeltaStats stats_;
  Trailer trailer_;
  Hash128 target_hash_;
  uint64_t offset_ = 0;
  std::vector<std::unordered_map<uint64_t, uint64_t>> tensor_hist_;
};

std::string ShapeText(const TensorInfo& t) {
  std::string s = "[";
  for (size_t i = 0; i < t.shape.size(); ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
  return s + "] " + t.dtype_name;
}

Status Incompatible(const std::string& what) {
  return FailedPreconditionError(
      what +
      "; a delta needs the same tensor names, dtypes and shapes in base and target: send a "
      "full frame instead (`dcr diff --full TARGET -o OUT`, or method full in a scenario)");
}

Status DeltaBuilder::Bind() {
  if (!options_.full && base_ == nullptr && !dev_.resident()) {
    return InvalidArgumentError(
        "a delta needs a base checkpoint (or options.full for a full frame)");
  }
  if (options_.chunk_elems == 0) return InvalidArgumentError("chunk_elems must be positive");
  DCR_RETURN_IF_ERROR(CheckContextClasses(options_.context_classes));
  if (options_.context_coding && !options_.full && dev_.resident()) {
    return InvalidArgumentError(
        "context coding needs the base on the host; a delta built from device-resident tensors "
        "is plain");
  }
  base_ptr_.assign(inv_.tensors.size(), nullptr);
  target_ptr_.assign(inv_.tensors.size(), nullptr);
  if (dev_.resident()) {
    const size_t n = inv_.tensors.size();
    if (dev_.target->size() != n || (!options_.full && dev_.base->size() != n)) {
      return InvalidArgumentError("device delta: " + std::to_string(n) +
                                  " tensors in the inventory but " +
                                  std::to_string(dev_.target->size()) + " target and " +
                                  std::to_string(dev_.base->size()) + " base device addresses");
    }
    for (size_t i = 0; i < n; ++i) {
      if ((*dev_.target)[i] == nullptr || (!options_.full && (*dev_.base)[i] == nullptr)) {
        return InvalidArgumentError("device delta: no device address for tensor '" +
                                    inv_.tensors[i].name + "'");
      }
    }
  } else {
    if (!options_.full) DCR_RETURN_IF_ERROR(CheckDeltaCompatible(*base_, *target_));
    for (size_t i = 0; i < inv_.tensors.size(); ++i) {
      const TensorInfo& t = inv_.tensors[i];
      target_ptr_[i] = target_->data(t);
      if (options_.full) continue;
      base_ptr_[i] = base_->data(*base_->Find(t.name));  // present: CheckDeltaCompatible
    }
    // Both checkpoints are read once, window by window, in grid order: sequential reads whose
    // pages are marked done after each window (BuildWindow), so checkpoints larger than memory
    // are diffed with a bounded working set. Advised per tensor: a checkpoint's tensors may lie
    // in several files.
    for (size_t i = 0; i < inv_.tensors.size(); ++i) {
      internal::AdviseSequential(target_ptr_[i], inv_.tensors[i].nbytes);
      if (!options_.full) internal::AdviseSequential(base_ptr_[i], inv_.tensors[i].nbytes);
    }
  }
  stats_.tensors.resize(inv_.tensors.size());
  for (size_t i = 0; i < inv_.tensors.size(); ++i) {
    stats_.tensors[i].name = inv_.tensors[i].name;
    stats_.tensors[i].dtype_name = inv_.tensors[i].dtype_name;
    stats_.tensors[i].elements = inv_.tensors[i].num_elements();
    stats_.tensors[i].dense_bytes = inv_.tensors[i].nbytes;
    stats_.elements += inv_.tensors[i].num_elements();
    stats_.dense_bytes += inv_.tensors[i].nbytes;
  }
  if (options_.collect_entropy) tensor_hist_.resize(inv_.tensors.size());
  return Status::OK();
}

Status DeltaBuilder::EmitHeader() {
  FileHeader fh;
  fh.flags = options_.full ? kFlagNoBase : 0;
  if (options_.context_coding && !options_.full) {
    fh.flags |= kFlagContext;
    trailer_.compact = true;  // version 8
  }
  fh.base_version = options_.base_version;
  fh.target_version = options_.target_version;
  if (!options_.full) {
    if (options_.known_base_hash != Hash128{}) {
      fh.base_hash = options_.known_base_hash;
    } else if (dev_.resident()) {
      internal::PhaseProgress progress(options_.progress, "hash base", inv_.data_size());
      DCR_ASSIGN_OR_RETURN(fh.base_hash,
                           DeviceContentHashOf(dev_.device, DeviceViews(inv_.tensors, *dev_.base),
                                               options_.threads));
      progress.Add(inv_.data_size());
      progress.Finish();
    } else {
      fh.base_hash = base_->ContentHash(options_.threads, options_.progress, "hash base");
    }
  }
  inv_.ToHeader(&fh);
  fh.chunk_elems = options_.chunk_elems;
  std::vector<uint8_t> hb = SerializeFileHeader(fh);
  DCR_RETURN_IF_ERROR(sink_->OnHeader(hb));
  offset_ = hb.size();
  stats_.base_hash = fh.base_hash;
  target_hash_ = fh.base_hash;
  grid_ = BuildGrid(inv_, options_);
  return Status::OK();
}

bool DeltaBuilder::EncodeContiguousCell(const GridCell& cell, CellScan* sc,
                                        StatusOr<std::vector<uint8_t>>* out) const {
  const Segment& sg = cell.segments[0];
  ChunkScanInput in;
  in.chunk_id = cell.chunk_id;
  in.width = cell.width;
  in.segments = &cell.segments;
  in.base = base_ptr_[sg.tensor_index] + sg.offset * cell.width;
  in.target = target_ptr_[sg.tensor_index] + sg.offset * cell.width;
  in.avx2 = avx2_;
  in.emit_unchanged = options_.emit_unchanged;
  if (options_.collect_entropy) {
    sc->flat_hist.assign(size_t{1} << (8 * cell.width), 0);
    in.xor_counts = sc->flat_hist.data();
  }
  sc->ctx_changes = options_.context_coding && !options_.full;
  sc->ctx_sampled = sc->ctx_changes && cell.width >= 2;
  sc->ctx_ctx.clear();
  if (sc->ctx_changes) {
    in.positions = &sc->ctx_pos;
    in.values = &sc->ctx_val;
    in.contexts = &sc->ctx_ctx;
    if (sc->ctx_sampled) in.context_sample = sc->ctx_sample;
  }
  const DType dt = inv_.tensors[sg.tensor_index].dtype;
  ChunkScanResult res;
  *out = EncodeChunkScan(
      in, ChooseValueMode(options_.value_policy, DTypeIsFloat(dt) ? DType::kBF16 : DType::kU8),
      inv_.salts, options_.zstd_level, &res);
  sc->n = res.num_changes;
  sc->seg_hist.clear();
  sc->seg_changes.assign(1, res.num_changes);
  return out->ok();
}

Hash128 DeltaBuilder::ScanCell(const GridCell& cell, CellScan* sc, bool* all_float) const {
  sc->n = 0;
  sc->Reserve(0);  // buffers exist (non-null) even for a cell without changes
  sc->seg_hist.clear();
  sc->seg_changes.assign(cell.segments.size(), 0);
  if (options_.collect_entropy) sc->seg_hist.resize(cell.segments.size());
  internal::RangeHasher rh(avx2_);
  uint64_t pos_base = 0;
  *all_float = true;
  for (size_t s = 0; s < cell.segments.size(); ++s) {
    const Segment& sg = cell.segments[s];
    const TensorInfo& t = inv_.tensors[sg.tensor_index];
    *all_float = *all_float && DTypeIsFloat(t.dtype);
    const uint64_t byte_off = sg.offset * cell.width;
    const uint64_t n = sg.count[0];
    const uint8_t* tp = target_ptr_[sg.tensor_index] + byte_off;
    const uint64_t before = sc->n;
    if (options_.full) {
      rh.Update(tp, n * cell.width);
      sc->Reserve(n);
      for (uint64_t i = 0; i < n; ++i) {
        sc->pos[sc->n + i] = pos_base + i;
        sc->new_bits[sc->n + i] = LoadBits(tp, cell.width, i);
      }
      sc->n += n;
    } else {
      // Scan and hash block by block: the hash reads the target bytes while the scan has just
      // brought them into cache (one pass over memory instead of two).
      const uint8_t* bp = base_ptr_[sg.tensor_index] + byte_off;
      const uint64_t block = internal::kScanBlockBytes / cell.width;
      for (uint64_t b0 = 0; b0 < n; b0 += block) {
        const uint64_t m = std::min(block, n - b0);
        const uint64_t off = b0 * cell.width;
        sc->Reserve(m);
        ScanBytes(bp + off, tp + off, cell.width, m, pos_base + b0, avx2_, sc);
        rh.Update(tp + off, m * cell.width);
      }
    }
    sc->seg_changes[s] = sc->n - before;
    if (options_.collect_entropy) {
      for (uint64_t i = before; i < sc->n; ++i) {
        ++sc->seg_hist[s][sc->old_bits[i] ^ sc->new_bits[i]];
      }
    }
    pos_base += n;
  }
  return rh.Digest();
}

Status DeltaBuilder::DeviceScanCell(const GridCell& cell, CellScan* sc, DeviceSlot* slot,
                                    bool* all_float, Hash128* range_hash) const {
  Device* device = dev_.device;
  const std::vector<Segment>& segs = cell.segments;
  const uint64_t w = cell.width;
  sc->n = 0;
  sc->Reserve(0);  // buffers exist (non-null) even for a cell without changes
  sc->seg_hist.clear();
  sc->seg_changes.assign(segs.size(), 0);
  if (options_.collect_entropy) sc->seg_hist.resize(segs.size());
  *all_float = true;
  for (const Segment& sg : segs)
    *all_float = *all_float && DTypeIsFloat(inv_.tensors[sg.tensor_index].dtype);
  const ValueMode mode =
      ChooseValueMode(options_.value_policy, *all_float ? DType::kBF16 : DType::kU8);
  // The cell's bytes on the device: resident tensors where they are, otherwise the segments
  // uploaded back to back into the slot (so one Diff covers the whole cell).
  const uint64_t cell_bytes = cell.num_elements * w;
  if (dev_.resident()) {
    slot->host().resize(cell_bytes);
  } else if (!options_.full) {
    DCR_RETURN_IF_ERROR(slot->Reserve(cell_bytes, true));
  }
  internal::RangeHasher rh(avx2_);
  uint64_t pos_base = 0;
  for (const Segment& sg : segs) {
    const uint64_t byte_off = sg.offset * w;
    const uint64_t bytes = sg.count[0] * w;
    const uint8_t* tp;  // the segment's target bytes on the host
    if (dev_.resident()) {
      uint8_t* host = slot->host().data() + pos_base * w;
      DCR_RETURN_IF_ERROR(device->Download(
          host, static_cast<const uint8_t*>((*dev_.target)[sg.tensor_index]) + byte_off, bytes));
      tp = host;
    } else {
      tp = target_ptr_[sg.tensor_index] + byte_off;
      if (!options_.full) {  // a full frame compares nothing: its bytes stay on the host
        DCR_RETURN_IF_ERROR(device->Upload(slot->target() + pos_base * w, tp, bytes));
        DCR_RETURN_IF_ERROR(device->Upload(slot->base() + pos_base * w,
                                           base_ptr_[sg.tensor_index] + byte_off, bytes));
      }
    }
    rh.Update(tp, bytes);
    if (options_.full) {
      const uint64_t n = sg.count[0];
      sc->Reserve(n);
      for (uint64_t i = 0; i < n; ++i) {
        sc->pos[sc->n + i] = pos_base + i;
        sc->new_bits[sc->n + i] = LoadBits(tp, cell.width, i);
      }
      sc->n += n;
    }
    pos_base += sg.count[0];
  }
  *range_hash = rh.Digest();
  if (options_.full) {
    for (size_t s = 0; s < segs.size(); ++s) sc->seg_changes[s] = segs[s].count[0];
    return Status::OK();
  }
  // Appends the changes of n elements whose first is at position pos0 of the cell.
  auto diff = [&](const void* old_data, const void* new_data, uint64_t n, uint64_t pos0) -> Status {
    DCR_ASSIGN_OR_RETURN(DeviceDiffResult r, device->Diff(old_data, new_data, n, cell.width, mode));
    DCR_RETURN_IF_ERROR(CheckDiffResult(r, n, *device));
    const uint64_t k = r.positions.size();
    sc->Reserve(k);
    for (uint64_t i = 0; i < k; ++i) sc->pos[sc->n + i] = pos0 + r.positions[i];
    if (k > 0) {
      std::memcpy(sc->old_bits.get() + sc->n, r.old_bits.data(), k * sizeof(uint64_t));
      std::memcpy(sc->new_bits.get() + sc->n, r.new_bits.data(), k * sizeof(uint64_t));
    }
    sc->n += k;
    return Status::OK();
  };
  if (dev_.resident()) {
    pos_base = 0;
    for (const Segment& sg : segs) {
      const uint64_t byte_off = sg.offset * w;
      DCR_RETURN_IF_ERROR(
          diff(static_cast<const uint8_t*>((*dev_.base)[sg.tensor_index]) + byte_off,
               static_cast<const uint8_t*>((*dev_.target)[sg.tensor_index]) + byte_off, sg.count[0],
               pos_base));
      pos_base += sg.count[0];
    }
  } else {
    DCR_RETURN_IF_ERROR(diff(slot->base(), slot->target(), cell.num_elements, 0));
  }
  // Changes per segment (positions ascend through the segments in order).
  uint64_t i = 0, end = 0;
  for (size_t s = 0; s < segs.size(); ++s) {
    end += segs[s].count[0];
    const uint64_t before = i;
    while (i < sc->n && sc->pos[i] < end) ++i;
    sc->seg_changes[s] = i - before;
    if (options_.collect_entropy) {
      for (uint64_t j = before; j < i; ++j) ++sc->seg_hist[s][sc->old_bits[j] ^ sc->new_bits[j]];
    }
  }
  return Status::OK();
}

bool DeltaBuilder::EncodeCell(const GridCell& cell, CellScan* sc, DeviceSlot* slot,
                              StatusOr<std::vector<uint8_t>>* out) const {
  bool all_float = true;
  ChunkChangesView ch;
  sc->ctx_changes = false;
  sc->ctx_sampled = false;
  sc->ctx_ctx.clear();
  if (dev_.device != nullptr) {
    Status s = DeviceScanCell(cell, sc, slot, &all_float, &ch.target_range_hash);
    if (!s.ok()) {
      *out = s.WithContext("chunk " + std::to_string(cell.chunk_id) + " on device " +
                           dev_.device->name());
      return false;
    }
  } else if (!options_.full && cell.segments.size() == 1 && cell.segments[0].IsContiguous() &&
             (!options_.collect_entropy || cell.width <= 2)) {
    // One contiguous range (every cell of a large tensor); the entropy statistics of 1- and
    // 2-byte elements are counted by value in the same pass.
    return EncodeContiguousCell(cell, sc, out);
  } else {
    ch.target_range_hash = ScanCell(cell, sc, &all_float);
  }
  ch.chunk_id = cell.chunk_id;
  ch.width = cell.width;
  ch.segments = &cell.segments;
  ch.num_elements = cell.num_elements;
  ch.num_changes = sc->n;
  ch.positions = sc->pos.get();
  ch.old_bits = options_.full ? nullptr : sc->old_bits.get();
  ch.new_bits = sc->new_bits.get();
  if (sc->n == 0 && !options_.emit_unchanged && !options_.full) {
    *out = std::vector<uint8_t>();
    return true;
  }
  ch.dense = options_.full;
  ValueMode mode =
      options_.full ? ValueMode::kAbsolute
                    : ChooseValueMode(options_.value_policy, all_float ? DType::kBF16 : DType::kU8);
  *out = EncodeChunk(ch, mode, inv_.salts, options_.zstd_level);
  if (out->ok() && options_.context_coding && !options_.full && dev_.device == nullptr) {
    // The changes for the context-coded form: the scan's positions, the values of `mode`.
    sc->ctx_changes = true;
    sc->ctx_pos.assign(sc->pos.get(), sc->pos.get() + sc->n);
    sc->ctx_val.resize(sc->n);
    const int w = cell.width;
    for (uint64_t i = 0; i < sc->n; ++i) {
      sc->ctx_val[i] =
          internal::EncodeValue(static_cast<uint8_t>(mode), w, sc->old_bits[i], sc->new_bits[i]);
    }
    if (w >= 2) {
      // The base bits of the changes give their contexts (8 bits below the sign).
      sc->ctx_ctx.resize(sc->n);
      for (uint64_t i = 0; i < sc->n; ++i) {
        sc->ctx_ctx[i] = static_cast<uint8_t>(sc->old_bits[i] >> (8 * w - 9));
      }
    }
  }
  return out->ok();
}

void DeltaBuilder::AccountCell(const GridCell& cell, const CellStats& sc,
                               const std::vector<uint8_t>& bytes) {
  const uint64_t cell_changes = sc.n;
  for (size_t s = 0; s < cell.segments.size(); ++s) {
    auto& ts = stats_.tensors[cell.segments[s].tensor_index];
    ts.changed += options_.full ? 0 : sc.seg_changes[s];
    if (!bytes.empty()) {
      // Attribute the chunk's bytes by changes (by elements when none changed).
      double share = cell_changes > 0
                         ? static_cast<double>(sc.seg_changes[s]) / cell_changes
                         : static_cast<double>(cell.segments[s].num_elements()) / cell.num_elements;
      ts.payload_bytes += static_cast<uint64_t>(std::llround(share * bytes.size()));
    }
    if (options_.collect_entropy) {
      for (const auto& [v, c] : sc.seg_hist[s]) {
        tensor_hist_[cell.segments[s].tensor_index][v] += c;
      }
    }
  }
}

Status DeltaBuilder::ContextCode(const GridCell& cell, const CellScan& sc,
                                 std::vector<uint8_t>* bytes, std::vector<uint8_t>* plain) const {
  plain->clear();
  size_t hsize = 0, rsize = 0;
  DCR_ASSIGN_OR_RETURN(ChunkHeader h,
                       ParseChunkHeader(bytes->data(), bytes->size(), &hsize, &rsize));
  if (!ContextCodable(h)) return Status::OK();
  const uint64_t w = cell.width;
  thread_local std::vector<uint8_t> gathered;
  const uint8_t* base;
  if (cell.segments.size() == 1) {
    base = base_ptr_[cell.segments[0].tensor_index] + cell.segments[0].offset * w;
  } else {
    gathered.resize(cell.num_elements * w);
    uint8_t* p = gathered.data();
    for (const Segment& sg : cell.segments) {
      std::memcpy(p, base_ptr_[sg.tensor_index] + sg.offset * w, sg.count[0] * w);
      p += sg.count[0] * w;
    }
    base = gathered.data();
  }
  if (sc.ctx_changes && sc.ctx_pos.size() == h.num_changes) {
    internal::ContextHints hints;
    if (sc.ctx_ctx.size() == h.num_changes) hints.contexts = sc.ctx_ctx.data();
    if (sc.ctx_sampled) hints.sample = sc.ctx_sample;
    std::vector<uint8_t> ctx = internal::EncodeContextRecord(
        h, sc.ctx_pos.data(), sc.ctx_val.data(), base, hints, options_.context_classes);
    if (ctx.size() < bytes->size()) {
      *plain = std::move(*bytes);
      *bytes = std::move(ctx);
    }
    return Status::OK();
  }
  DCR_ASSIGN_OR_RETURN(std::vector<uint8_t> ctx,
                       EncodeContextChunk(bytes->data(), bytes->size(), base, cell.num_elements * w,
                                          options_.context_classes));
  if (ctx.size() < bytes->size()) {
    *plain = std::move(*bytes);
    *bytes = std::move(ctx);
  }
  return Status::OK();
}

Status DeltaBuilder::EmitChunk(const std::vector<uint8_t>& bytes,
                               const std::vector<uint8_t>& plain) {
  size_t hsize = 0, rsize = 0;
  DCR_ASSIGN_OR_RETURN(ChunkHeader h, ParseChunkHeader(bytes.data(), bytes.size(), &hsize, &rsize));
  HashAdd(&target_hash_, h.version_delta);
  if (plain.empty()) {
    DCR_RETURN_IF_ERROR(sink_->OnChunk(h, bytes));
  } else {
    DCR_RETURN_IF_ERROR(sink_->OnContextChunk(h, bytes, plain));
  }
  trailer_.chunks.push_back({h.chunk_id, offset_, bytes.size()});
  offset_ += bytes.size();
  stats_.chunks++;
  if (IsContextCoded(h)) stats_.context_chunks++;
  return Status::OK();
}

Status DeltaBuilder::BuildWindow(uint64_t begin, uint64_t end) {
  const size_t cells = end - begin;
  std::vector<StatusOr<std::vector<uint8_t>>> encoded(cells,
                                                      Status(StatusCode::kInternal, "not run"));
  const size_t workers = std::min<size_t>(cells, static_cast<size_t>(threads_));
  if (scans_.size() < workers) scans_.resize(workers);
  if (dev_.device != nullptr) {
    while (slots_.size() < workers) slots_.push_back(std::make_unique<DeviceSlot>(dev_.device));
  }
  std::mutex mu;
  std::vector<size_t> idle;  // worker slots: scans_[i] and slots_[i]
  for (size_t w = 0; w < workers; ++w) idle.push_back(w);
  std::vector<CellStats> stats(cells);
  std::vector<std::vector<uint8_t>> plain(cells);  // plain forms of context-coded records
  internal::ParallelFor(cells, threads_, [&](uint64_t k) {
    size_t slot;
    {
      std::lock_guard<std::mutex> lock(mu);
      slot = idle.back();  // at most `workers` cells are encoded at once
      idle.pop_back();
    }
    CellScan* sc = &scans_[slot];
    bool ok = EncodeCell(grid_[begin + k], sc,
                         dev_.device != nullptr ? slots_[slot].get() : nullptr, &encoded[k]);
    if (ok && options_.context_coding && !options_.full && !encoded[k]->empty()) {
      Status s = ContextCode(grid_[begin + k], *sc, &*encoded[k], &plain[k]);
      if (!s.ok()) {
        encoded[k] = s;
        ok = false;
      }
    }
    stats[k].n = sc->n;
    stats[k].seg_changes.swap(sc->seg_changes);
    if (!sc->flat_hist.empty()) {
      // The values counted into the histogram of the cell's one segment (the counter array is
      // kept for the next cell and zeroed when it is used).
      sc->seg_hist.resize(1);
      for (size_t v = 0; v < sc->flat_hist.size(); ++v) {
        if (sc->flat_hist[v] != 0) sc->seg_hist[0][v] = sc->flat_hist[v];
      }
      sc->flat_hist.clear();
    }
    stats[k].seg_hist.swap(sc->seg_hist);
    std::lock_guard<std::mutex> lock(mu);
    idle.push_back(slot);
    return ok;
  });
  for (size_t k = 0; k < cells; ++k) {
    if (!encoded[k].ok()) return encoded[k].status();
    const std::vector<uint8_t>& bytes = *encoded[k];
    AccountCell(grid_[begin + k], stats[k], bytes);
    if (!bytes.empty()) DCR_RETURN_IF_ERROR(EmitChunk(bytes, plain[k]));
    std::vector<uint8_t>().swap(plain[k]);
    if (dev_.resident()) continue;
    for (const Segment& sg : grid_[begin + k].segments) {
      const uint64_t off = sg.offset * grid_[begin + k].width;
      const uint64_t n = sg.num_elements() * grid_[begin + k].width;
      internal::AdviseDone(target_ptr_[sg.tensor_index] + off, n);
      if (!options_.full) internal::AdviseDone(base_ptr_[sg.tensor_index] + off, n);
    }
  }
  return Status::OK();
}

Status DeltaBuilder::EmitTrailer() {
  if (options_.full && dev_.resident()) {
    internal::PhaseProgress progress(options_.progress, "hash target", inv_.data_size());
    DCR_ASSIGN_OR_RETURN(target_hash_,
                         DeviceContentHashOf(dev_.device, DeviceViews(inv_.tensors, *dev_.target),
                                             options_.threads));
    progress.Add(inv_.data_size());
    progress.Finish();
  } else if (options_.full) {
    target_hash_ = target_->ContentHash(options_.threads, options_.progress, "hash target");
  }
  trailer_.target_hash = target_hash_;
  std::vector<uint8_t> tb = SerializeTrailer(trailer_, offset_);
  DCR_RETURN_IF_ERROR(sink_->OnTrailer(tb));
  stats_.payload_bytes = offset_ + tb.size();
  stats_.target_hash = target_hash_;
  return Status::OK();
}

DeltaStats DeltaBuilder::Finish() {
  for (size_t i = 0; i < stats_.tensors.size(); ++i) {
    auto& ts = stats_.tensors[i];
    stats_.changed += ts.changed;
    if (options_.collect_entropy) {
      double bits = BinaryEntropyBits(ts.elements, ts.changed);
      for (const auto& [v, c] : tensor_hist_[i]) {
        double p = static_cast<double>(c) / static_cast<double>(ts.changed);
        bits -= static_cast<double>(c) * std::log2(p);
      }
      ts.xor_entropy_bits = bits;
      stats_.entropy_bound_bits += bits;
    }
  }
  return std::move(stats_);
}

}  // namespace

Status CheckDeltaCompatible(const Checkpoint& base, const Checkpoint& target) {
  for (const TensorInfo& t : target.tensors()) {
    const TensorInfo* bt = base.Find(t.name);
    if (bt == nullptr)
      return Incompatible("tensor '" + t.name + "' is in the target but not in the base");
    if (bt->dtype_name != t.dtype_name || bt->shape != t.shape) {
      return Incompatible("tensor '" + t.name + "' is " + ShapeText(*bt) + " in the base but " +
                          ShapeText(t) + " in the target");
    }
  }
  for (const TensorInfo& t : base.tensors()) {
    if (target.Find(t.name) == nullptr) {
      return Incompatible("tensor '" + t.name + "' is in the base but not in the target (removed)");
    }
  }
  return Status::OK();
}

ProductionOrder::ProductionOrder(uint64_t units, uint64_t window)
    : units_(units), window_(std::max<uint64_t>(window, 1)) {}

ProductionOrder ProductionOrder::ForBuild(uint64_t cells, int threads) {
  return ProductionOrder(cells, BuildWindowCells(threads));
}

ProductionOrder ProductionOrder::ForMergedCells(uint64_t chunks, double cells_per_chunk,
                                                int threads) {
  const double window =
      std::ceil(static_cast<double>(BuildWindowCells(threads)) / cells_per_chunk - 1e-9);
  return ProductionOrder(chunks, window >= 1 ? static_cast<uint64_t>(window) : 1);
}

uint64_t ProductionOrder::GroupFirst(uint64_t blob) const {
  if (blob == 0 || blob > units_) return blob;
  return 1 + WindowBegin((blob - 1) / window_);
}

uint64_t ProductionOrder::GroupLast(uint64_t blob) const {
  if (blob == 0 || blob > units_) return blob;
  return WindowEnd((blob - 1) / window_);
}

uint64_t BuildWindowCells(int threads) {
  return static_cast<uint64_t>(std::max(threads, 1)) * kBuildWindowCellsPerThread;
}

namespace {

StatusOr<DeltaStats> Build(DeltaBuilder& builder, const DeltaOptions& options) {
  DCR_RETURN_IF_ERROR(builder.Bind());
  DCR_RETURN_IF_ERROR(builder.EmitHeader());
  const ProductionOrder order = ProductionOrder::ForBuild(builder.cells(), builder.threads());
  internal::PhaseProgress progress(options.progress, options.full ? "encode" : "diff",
                                   builder.dense_bytes());
  for (uint64_t w = 0; w < order.num_windows(); ++w) {
    DCR_RETURN_IF_ERROR(builder.BuildWindow(order.WindowBegin(w), order.WindowEnd(w)));
    progress.Add(builder.CellBytes(order.WindowBegin(w), order.WindowEnd(w)));
  }
  progress.Finish();
  DCR_RETURN_IF_ERROR(builder.EmitTrailer());
  return builder.Finish();
}

}  // namespace

StatusOr<DeltaStats> BuildDelta(const Checkpoint* base, const Checkpoint& target,
                                const DeltaOptions& options, DeltaSink* sink) {
  return BuildDeltaOnDevice(base, target, options, nullptr, sink);
}

StatusOr<DeltaStats> BuildDeltaOnDevice(const Checkpoint* base, const Checkpoint& target,
                                        const DeltaOptions& options, Device* device,
                                        DeltaSink* sink) {
  DeviceInputs dev;
  dev.device = device;
  DeltaBuilder builder(base, &target, Inventory::FromCheckpoint(target), dev, options, sink);
  return Build(builder, options);
}

StatusOr<DeltaStats> BuildDeltaFromDevice(const DeviceDeltaInputs& inputs,
                                          const DeltaOptions& options, Device* device,
                                          DeltaSink* sink) {
  if (device == nullptr) return InvalidArgumentError("device delta: no device");
  DeviceInputs dev;
  dev.device = device;
  dev.base = &inputs.base;
  dev.target = &inputs.target;
  DeltaBuilder builder(nullptr, nullptr, inputs.inventory, dev, options, sink);
  return Build(builder, options);
}

StatusOr<DeltaStats> BuildDeltaFiles(const std::string& base_path, const std::string& target_path,
                                     const DeltaOptions& options, Device* device, DeltaSink* sink) {
  std::unique_ptr<Checkpoint> base;
  if (!options.full) {
    DCR_ASSIGN_OR_RETURN(base, Checkpoint::Open(base_path));
  }
  DCR_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> target, Checkpoint::Open(target_path));
  return BuildDeltaOnDevice(base.get(), *target, options, device, sink);
}

}  // namespace dcr
