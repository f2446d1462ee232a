// Overwrite forms of chunks and catch-up composition of consecutive deltas.
#include "dcr/versioning.h"

#include <xxhash.h>

#include <algorithm>
#include <string>

#include "dcr/apply.h"
#include "dcr/hash.h"
#include "dcr/status_macros.h"
#include "internal/chunk_bounds.h"
#include "receivers/value_ops.h"

namespace dcr {
namespace {

// Tensor data of `ckpt` for every tensor of `inv` (by name), checking dtype and shape.
StatusOr<std::vector<const uint8_t*>> MapTensors(const Inventory& inv, const Checkpoint& ckpt,
                                                 const char* what) {
  std::vector<const uint8_t*> out(inv.tensors.size(), nullptr);
  for (size_t i = 0; i < inv.tensors.size(); ++i) {
    const TensorInfo& t = inv.tensors[i];
    const TensorInfo* c = ckpt.Find(t.name);
    if (c == nullptr) {
      return FailedPreconditionError(std::string(what) + " has no tensor '" + t.name + "'");
    }
    if (c->dtype_name != t.dtype_name || c->shape != t.shape || c->nbytes != t.nbytes) {
      return FailedPreconditionError(std::string(what) + " tensor '" + t.name +
                                     "' differs in dtype or shape from the delta's inventory");
    }
    out[i] = ckpt.data(*c);
  }
  return out;
}

// Checks that a chunk's segments stay inside the inventory.
Status CheckSegments(const ChunkHeader& h, const Inventory& inv) {
  uint64_t total = 0;
  for (const Segment& s : h.segments) {
    if (s.tensor_index >= inv.tensors.size()) {
      return DataLossError("chunk " + std::to_string(h.chunk_id) + ": tensor index " +
                           std::to_string(s.tensor_index) + " out of range");
    }
    const TensorInfo& t = inv.tensors[s.tensor_index];
    if (t.width() != h.elem_width) {
      return DataLossError("chunk " + std::to_string(h.chunk_id) + ": element width differs");
    }
    uint64_t n = s.num_elements();
    if (n == 0) continue;
    // Highest and lowest element reached (strides may be negative).
    int64_t lo = static_cast<int64_t>(s.offset), hi = lo;
    for (uint32_t d = 0; d < s.ndim && d < kMaxSegmentDims; ++d) {
      int64_t span = static_cast<int64_t>(s.count[d] - 1) * s.stride[d];
      if (span > 0)
        hi += span;
      else
        lo += span;
    }
    if (lo < 0 || static_cast<uint64_t>(hi) >= t.num_elements()) {
      return DataLossError("chunk " + std::to_string(h.chunk_id) + ": segment outside tensor '" +
                           t.name + "'");
    }
    total += n;
  }
  if (total != h.num_elements) {
    return DataLossError("chunk " + std::to_string(h.chunk_id) + ": segments cover " +
                         std::to_string(total) + " elements, header says " +
                         std::to_string(h.num_elements));
  }
  return Status::OK();
}

// Walks sorted local positions of a chunk, resolving each to (segment, canonical element).
class PositionWalker {
 public:
  explicit PositionWalker(const std::vector<Segment>& segs) : segs_(segs) {}
  // REQUIRES: positions passed in increasing order, each < total elements.
  void Resolve(uint64_t pos, uint32_t* tensor, uint64_t* element) {
    while (pos >= start_ + segs_[seg_].num_elements()) {
      start_ += segs_[seg_].num_elements();
      ++seg_;
    }
    *tensor = segs_[seg_].tensor_index;
    *element = segs_[seg_].ElementAt(pos - start_);
  }

 private:
  const std::vector<Segment>& segs_;
  size_t seg_ = 0;
  uint64_t start_ = 0;
};

std::vector<uint64_t> PositionsOf(const DecodedChunk& c) {
  if (c.header.position_mode != PositionMode::kDense) return c.positions;
  std::vector<uint64_t> all(c.header.num_elements);
  for (uint64_t i = 0; i < all.size(); ++i) all[i] = i;
  return all;
}

bool SameSegments(const std::vector<Segment>& a, const std::vector<Segment>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].tensor_index != b[i].tensor_index || a[i].ndim != b[i].ndim ||
        a[i].offset != b[i].offset || a[i].count != b[i].count || a[i].stride != b[i].stride) {
      return false;
    }
  }
  return true;
}

}  // namespace

StatusOr<std::vector<uint8_t>> OverwriteChunkFromCheckpoints(const Checkpoint& base,
                                                             const Checkpoint& target,
                                                             const DeltaOptions& options,
                                                             uint64_t chunk_id) {
  Inventory inv = Inventory::FromCheckpoint(target);
  DCR_ASSIGN_OR_RETURN(std::vector<const uint8_t*> bdata, MapTensors(inv, base, "base"));
  DCR_ASSIGN_OR_RETURN(std::vector<const uint8_t*> tdata, MapTensors(inv, target, "target"));
  std::vector<GridCell> grid = BuildGrid(inv, options);
  const GridCell* cell = nullptr;
  for (const GridCell& g : grid) {
    if (g.chunk_id == chunk_id) {
      cell = &g;
      break;
    }
  }
  if (cell == nullptr) {
    return NotFoundError("no chunk " + std::to_string(chunk_id) + " in the grid (" +
                         std::to_string(grid.size()) + " cells)");
  }
  ChunkChanges ch;
  ch.chunk_id = cell->chunk_id;
  ch.width = cell->width;
  ch.segments = cell->segments;
  ch.num_elements = cell->num_elements;
  uint64_t local = 0;
  XXH3_state_t* st = XXH3_createState();
  if (st == nullptr) return ResourceExhaustedError("overwrite form: XXH3 state");
  XXH3_128bits_reset(st);
  const int w = cell->width;
  for (const Segment& s : cell->segments) {
    const uint8_t* b = bdata[s.tensor_index];
    const uint8_t* t = tdata[s.tensor_index];
    uint64_t n = s.num_elements();
    for (uint64_t i = 0; i < n; ++i, ++local) {
      uint64_t e = s.ElementAt(i);
      XXH3_128bits_update(st, t + e * static_cast<uint64_t>(w), static_cast<size_t>(w));
      uint64_t ob = LoadBits(b, w, e);
      uint64_t nb = LoadBits(t, w, e);
      if (ob != nb) {
        ch.positions.push_back(local);
        ch.old_bits.push_back(ob);
        ch.new_bits.push_back(nb);
      }
    }
  }
  XXH128_hash_t rh = XXH3_128bits_digest(st);
  XXH3_freeState(st);
  ch.target_range_hash = Hash128{rh.low64, rh.high64};
  if (ch.positions.empty()) return std::vector<uint8_t>{};
  return EncodeChunk(ch, ValueMode::kAbsolute, inv.salts, options.zstd_level);
}

StatusOr<std::vector<uint8_t>> OverwriteChunkFromRelative(const uint8_t* record, size_t size,
                                                          const Inventory& inventory,
                                                          const Checkpoint& base, int zstd_level) {
  {
    // The segments fit the tensors before anything of the record is decoded.
    DCR_ASSIGN_OR_RETURN(ChunkHeader bounds, ParseChunkHeader(record, size, nullptr, nullptr));
    DCR_RETURN_IF_ERROR(internal::CheckChunkBounds(bounds, inventory));
  }
  DCR_ASSIGN_OR_RETURN(DecodedChunk dc, DecodeChunk(record, size));
  const ChunkHeader& h = dc.header;
  if (!IsRelative(h.value_mode)) return std::vector<uint8_t>(record, record + size);
  DCR_RETURN_IF_ERROR(CheckSegments(h, inventory));
  DCR_ASSIGN_OR_RETURN(std::vector<const uint8_t*> bdata, MapTensors(inventory, base, "base"));
  ChunkChanges ch;
  ch.chunk_id = h.chunk_id;
  ch.width = h.elem_width;
  ch.segments = h.segments;
  ch.num_elements = h.num_elements;
  ch.target_range_hash = h.target_range_hash;
  ch.positions = PositionsOf(dc);
  if (dc.values.size() != ch.positions.size()) {
    return DataLossError("chunk " + std::to_string(h.chunk_id) + ": value count mismatch");
  }
  ch.old_bits.resize(ch.positions.size());
  ch.new_bits.resize(ch.positions.size());
  PositionWalker walk(h.segments);
  for (size_t k = 0; k < ch.positions.size(); ++k) {
    uint32_t tensor = 0;
    uint64_t e = 0;
    walk.Resolve(ch.positions[k], &tensor, &e);
    uint64_t ob = LoadBits(bdata[tensor], h.elem_width, e);
    ch.old_bits[k] = ob;
    ch.new_bits[k] = ApplyValue(h.value_mode, h.elem_width, ob, dc.values[k]);
  }
  if (PackedBitsHash(ch.old_bits.data(), ch.old_bits.size(), h.elem_width) != h.base_change_hash) {
    return FailedPreconditionError("chunk " + std::to_string(h.chunk_id) +
                                   ": the base bits do not match the chunk's base_change_hash "
                                   "(wrong base for this delta)");
  }
  return EncodeChunk(ch, ValueMode::kAbsolute, inventory.salts, zstd_level);
}

StatusOr<CatchUpStats> ComposeDeltas(const std::vector<const DeltaReader*>& deltas,
                                     const Checkpoint& target, const DeltaOptions& options,
                                     DeltaSink* sink) {
  if (deltas.empty()) return InvalidArgumentError("compose: no deltas");
  const FileHeader& first = deltas.front()->header();
  for (size_t i = 0; i < deltas.size(); ++i) {
    const FileHeader& h = deltas[i]->header();
    if (h.flags & kFlagNoBase) {
      return InvalidArgumentError("compose: delta " + std::to_string(i) + " is a full frame");
    }
    if (!h.SameTarget(first) || h.chunk_elems != first.chunk_elems) {
      return InvalidArgumentError("compose: delta " + std::to_string(i) +
                                  " has a different inventory or grid");
    }
    if (i > 0) {
      const DeltaReader* prev = deltas[i - 1];
      if (h.base_version != prev->header().target_version ||
          h.base_hash != prev->trailer().target_hash) {
        return InvalidArgumentError("compose: delta " + std::to_string(i) + " (base v" +
                                    std::to_string(h.base_version) + ") does not continue delta " +
                                    std::to_string(i - 1) + " (target v" +
                                    std::to_string(prev->header().target_version) + ")");
      }
    }
  }
  const DeltaReader* last = deltas.back();
  const Inventory& inv = last->inventory();
  DCR_ASSIGN_OR_RETURN(std::vector<const uint8_t*> tdata, MapTensors(inv, target, "target"));
  if (target.ContentHash(options.threads) != last->trailer().target_hash) {
    return FailedPreconditionError(
        "compose: the target checkpoint's hash differs from the last "
        "delta's target hash");
  }

  // chunk id -> per delta index into its chunk table (-1 if absent).
  std::map<uint64_t, std::vector<int>> where;
  for (size_t i = 0; i < deltas.size(); ++i) {
    const Trailer& t = deltas[i]->trailer();
    for (size_t c = 0; c < t.chunks.size(); ++c) {
      std::vector<int>& w = where[t.chunks[c].chunk_id];
      if (w.empty()) w.assign(deltas.size(), -1);
      w[i] = static_cast<int>(c);
    }
  }

  CatchUpStats stats;
  stats.composed = static_cast<int>(deltas.size());
  FileHeader out_header = first;
  out_header.flags = 0;
  out_header.target_version = last->header().target_version;
  std::vector<uint8_t> hbytes = SerializeFileHeader(out_header);
  DCR_RETURN_IF_ERROR(sink->OnHeader(hbytes));
  uint64_t offset = hbytes.size();
  Trailer trailer;
  trailer.target_hash = last->trailer().target_hash;

  for (const auto& [chunk_id, idx] : where) {
    std::vector<DecodedChunk> dec(deltas.size());
    std::vector<std::vector<uint64_t>> pos(deltas.size());
    const ChunkHeader* ref = nullptr;
    Hash128 range_hash;
    ValueMode mode = ValueMode::kAbsolute;
    bool have_mode = false;
    std::vector<uint64_t> all;
    for (size_t i = 0; i < deltas.size(); ++i) {
      if (idx[i] < 0) continue;
      DCR_ASSIGN_OR_RETURN(dec[i], deltas[i]->Decode(static_cast<size_t>(idx[i])));
      const ChunkHeader& h = dec[i].header;
      if (ref == nullptr) {
        DCR_RETURN_IF_ERROR(CheckSegments(h, inv));
        ref = &dec[i].header;
      } else if (!SameSegments(ref->segments, h.segments) || ref->elem_width != h.elem_width) {
        return InvalidArgumentError("compose: chunk " + std::to_string(chunk_id) +
                                    " covers different elements in delta " + std::to_string(i));
      }
      if (!IsRelative(h.value_mode)) {
        return FailedPreconditionError(
            "compose: chunk " + std::to_string(chunk_id) + " of delta " + std::to_string(i) +
            " is absolute: the bits before it are unknown without the base (send a full frame)");
      }
      if (!have_mode) {
        mode = h.value_mode;
        have_mode = true;
      }
      range_hash = h.target_range_hash;  // the latest delta touching the cell wins
      pos[i] = PositionsOf(dec[i]);
      if (dec[i].values.size() != pos[i].size()) {
        return DataLossError("compose: chunk " + std::to_string(chunk_id) + " value count");
      }
      all.insert(all.end(), pos[i].begin(), pos[i].end());
    }
    std::sort(all.begin(), all.end());
    all.erase(std::unique(all.begin(), all.end()), all.end());
    ChunkChanges ch;
    ch.chunk_id = chunk_id;
    ch.width = ref->elem_width;
    ch.segments = ref->segments;
    ch.num_elements = ref->num_elements;
    ch.target_range_hash = range_hash;
    std::vector<size_t> cursor(deltas.size(), 0);
    PositionWalker walk(ref->segments);
    const int w = ref->elem_width;
    for (uint64_t p : all) {
      uint32_t tensor = 0;
      uint64_t e = 0;
      walk.Resolve(p, &tensor, &e);
      const uint64_t nb = LoadBits(tdata[tensor], w, e);
      uint64_t cur = nb;
      for (size_t i = deltas.size(); i-- > 0;) {
        if (idx[i] < 0) continue;
        size_t& c = cursor[i];
        while (c < pos[i].size() && pos[i][c] < p) ++c;
        if (c < pos[i].size() && pos[i][c] == p) {
          cur = internal::InverseValue(dec[i].header.value_mode, w, cur, dec[i].values[c]);
        }
      }
      if (cur == nb) {
        ++stats.cancelled;
        continue;
      }
      ch.positions.push_back(p);
      ch.old_bits.push_back(cur);
      ch.new_bits.push_back(nb);
    }
    if (ch.positions.empty() && !options.emit_unchanged) continue;
    stats.changes += ch.positions.size();
    DCR_ASSIGN_OR_RETURN(std::vector<uint8_t> rec,
                         EncodeChunk(ch, mode, inv.salts, options.zstd_level));
    size_t hsize = 0, rsize = 0;
    DCR_ASSIGN_OR_RETURN(ChunkHeader oh, ParseChunkHeader(rec.data(), rec.size(), &hsize, &rsize));
    DCR_RETURN_IF_ERROR(sink->OnChunk(oh, rec));
    trailer.chunks.push_back(ChunkTableEntry{chunk_id, offset, rec.size()});
    offset += rec.size();
    ++stats.chunks;
  }
  std::vector<uint8_t> tbytes = SerializeTrailer(trailer, offset);
  DCR_RETURN_IF_ERROR(sink->OnTrailer(tbytes));
  stats.payload_bytes = offset + tbytes.size();
  return stats;
}

StatusOr<CatchUpStats> BuildCatchUp(const std::vector<const DeltaReader*>& deltas,
                                    const Checkpoint& target, const CatchUpOptions& options,
                                    DeltaSink* sink) {
  bool full = deltas.empty() || static_cast<int>(deltas.size()) > options.max_compose;
  if (!full) {
    uint64_t sum = 0;
    for (const DeltaReader* d : deltas) sum += d->size();
    full = static_cast<double>(sum) >
           options.full_frame_fraction * static_cast<double>(target.total_tensor_bytes());
  }
  if (!full) {
    // An absolute chunk in the chain makes the composition impossible without the base: it is
    // refused before anything reaches the sink (checked up front).
    bool composable = true;
    for (const DeltaReader* d : deltas) {
      if (d->header().flags & kFlagNoBase) composable = false;
      for (size_t i = 0; composable && i < d->num_chunks(); ++i) {
        size_t hs = 0, rs = 0;
        StatusOr<ChunkHeader> h = ParseChunkHeader(d->chunk_data(i), d->chunk_size(i), &hs, &rs);
        if (!h.ok()) return h.status();
        if (!IsRelative(h->value_mode)) composable = false;
      }
    }
    if (composable) {
      DeltaOptions o = options.delta_options;
      return ComposeDeltas(deltas, target, o, sink);
    }
  }
  DeltaOptions o = options.delta_options;
  o.full = true;
  if (!deltas.empty()) {
    o.chunk_elems = deltas.back()->header().chunk_elems;
    o.target_version = deltas.back()->header().target_version;
  }
  DCR_ASSIGN_OR_RETURN(DeltaStats ds, BuildDelta(nullptr, target, o, sink));
  CatchUpStats stats;
  stats.full_frame = true;
  stats.chunks = ds.chunks;
  stats.changes = ds.changed;
  stats.payload_bytes = ds.payload_bytes;
  return stats;
}

}  // namespace dcr
