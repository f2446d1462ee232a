// SampleContextSize (dcr/context.h): both forms of a sample of a delta's grid cells.
#include <algorithm>
#include <cstring>
#include <mutex>

#include "dcr/context.h"
#include "dcr/hash.h"
#include "dcr/status_macros.h"
#include "internal/parallel.h"

namespace dcr {

StatusOr<ContextSizeSample> SampleContextSize(const Checkpoint& base, const Checkpoint& target,
                                              const DeltaOptions& options, uint64_t max_cells,
                                              std::vector<ContextSampleRecord>* records) {
  DCR_RETURN_IF_ERROR(CheckDeltaCompatible(base, target));
  if (options.chunk_elems == 0) return InvalidArgumentError("chunk_elems must be positive");
  DCR_RETURN_IF_ERROR(CheckContextClasses(options.context_classes));
  const Inventory inv = Inventory::FromCheckpoint(target);
  const std::vector<GridCell> grid = BuildGrid(inv, options);
  std::vector<uint64_t> cells;
  if (max_cells == 0 || max_cells >= grid.size()) {
    for (uint64_t c = 0; c < grid.size(); ++c) cells.push_back(c);
  } else {
    for (uint64_t i = 0; i < max_cells; ++i) cells.push_back(i * grid.size() / max_cells);
  }
  ContextSizeSample out;
  out.cells = grid.size();
  out.sampled_cells = cells.size();
  std::mutex mu;
  Status first_error;
  std::vector<ContextSampleRecord> kept(records != nullptr ? cells.size() : 0);
  internal::ParallelFor(cells.size(), options.threads, [&](uint64_t j) {
    const GridCell& cell = grid[cells[j]];
    const int w = cell.width;
    std::vector<uint8_t> a(cell.num_elements * w), b(cell.num_elements * w);
    bool all_float = true;
    uint64_t at = 0;
    for (const Segment& sg : cell.segments) {
      const TensorInfo& t = inv.tensors[sg.tensor_index];
      all_float = all_float && DTypeIsFloat(t.dtype);
      const uint64_t bytes = sg.count[0] * w;
      std::memcpy(a.data() + at, base.data(*base.Find(t.name)) + sg.offset * w, bytes);
      std::memcpy(b.data() + at, target.data(t) + sg.offset * w, bytes);
      at += bytes;
    }
    ChunkChanges c;
    c.chunk_id = cell.chunk_id;
    c.width = cell.width;
    c.segments = cell.segments;
    c.num_elements = cell.num_elements;
    for (uint64_t i = 0; i < cell.num_elements; ++i) {
      if (std::memcmp(a.data() + i * w, b.data() + i * w, w) == 0) continue;
      c.positions.push_back(i);
      c.old_bits.push_back(LoadBits(a.data(), w, i));
      c.new_bits.push_back(LoadBits(b.data(), w, i));
    }
    ContextSizeSample s;
    s.elements = cell.num_elements;
    s.changes = c.positions.size();
    s.dense_bytes = b.size();
    Status err;
    if (!c.positions.empty() || options.emit_unchanged) {
      c.target_range_hash = BytesHash128(b.data(), b.size());
      const ValueMode mode =
          ChooseValueMode(options.value_policy, all_float ? DType::kBF16 : DType::kU8);
      StatusOr<std::vector<uint8_t>> plain = EncodeChunk(c, mode, inv.salts, options.zstd_level);
      if (plain.ok()) {
        s.chunks = 1;
        s.plain_bytes = plain->size();
        s.context_bytes = plain->size();
        auto h = ParseChunkHeader(plain->data(), plain->size(), nullptr, nullptr);
        if (h.ok() && ContextCodable(*h)) {
          auto ctx = EncodeContextChunk(plain->data(), plain->size(), a.data(), a.size(),
                                        options.context_classes);
          if (ctx.ok() && ctx->size() < plain->size()) {
            s.context_bytes = ctx->size();
            s.context_chunks = 1;
            if (records != nullptr) kept[j] = ContextSampleRecord{std::move(*ctx), std::move(a)};
          } else if (!ctx.ok()) {
            err = ctx.status();
          }
        } else if (!h.ok()) {
          err = h.status();
        }
      } else {
        err = plain.status();
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    if (!err.ok()) {
      if (first_error.ok()) first_error = err;
      return false;
    }
    out.chunks += s.chunks;
    out.context_chunks += s.context_chunks;
    out.elements += s.elements;
    out.changes += s.changes;
    out.plain_bytes += s.plain_bytes;
    out.context_bytes += s.context_bytes;
    out.dense_bytes += s.dense_bytes;
    return true;
  });
  DCR_RETURN_IF_ERROR(first_error);
  for (ContextSampleRecord& r : kept) {
    if (!r.record.empty()) records->push_back(std::move(r));
  }
  return out;
}

}  // namespace dcr
