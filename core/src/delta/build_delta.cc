// BuildDelta: scan base and target cell by cell, encode changed cells, stream them to a sink.
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <unordered_map>

#include "dcr/delta.h"
#include "dcr/hash.h"
#include "dcr/status_macros.h"
#include "internal/element_ops.h"
#include "internal/parallel.h"
#include "internal/diff_scan.h"
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
    case 1: ScanRange(a, b, n, pos_base, avx2, out); break;
    case 2: ScanRange(reinterpret_cast<const uint16_t*>(a), reinterpret_cast<const uint16_t*>(b), n, pos_base, avx2, out); break;
    case 4: ScanRange(reinterpret_cast<const uint32_t*>(a), reinterpret_cast<const uint32_t*>(b), n, pos_base, avx2, out); break;
    default: ScanRange(reinterpret_cast<const uint64_t*>(a), reinterpret_cast<const uint64_t*>(b), n, pos_base, avx2, out); break;
  }
}

}  // namespace

StatusOr<DeltaStats> BuildDelta(const Checkpoint* base, const Checkpoint& target,
                                const DeltaOptions& options, DeltaSink* sink) {
  if (!options.full && base == nullptr) {
    return InvalidArgumentError("a delta needs a base checkpoint (or options.full for a full frame)");
  }
  if (options.chunk_elems == 0) return InvalidArgumentError("chunk_elems must be positive");
  const Inventory inv = Inventory::FromCheckpoint(target);
  std::vector<const uint8_t*> base_ptr(inv.tensors.size(), nullptr);
  std::vector<const uint8_t*> target_ptr(inv.tensors.size(), nullptr);
  for (size_t i = 0; i < inv.tensors.size(); ++i) {
    const TensorInfo& t = inv.tensors[i];
    target_ptr[i] = target.data(t);
    if (options.full) continue;
    const TensorInfo* bt = base->Find(t.name);
    if (bt == nullptr) {
      return FailedPreconditionError("tensor '" + t.name +
                                     "' is in the target but not in the base; build a full delta");
    }
    if (bt->dtype_name != t.dtype_name || bt->shape != t.shape) {
      return FailedPreconditionError("tensor '" + t.name +
                                     "' differs in dtype or shape between base and target");
    }
    base_ptr[i] = base->data(*bt);
  }
  if (!options.full && base->tensors().size() != inv.tensors.size()) {
    return FailedPreconditionError("the base has tensors the target lacks; build a full delta");
  }

  DeltaStats stats;
  stats.tensors.resize(inv.tensors.size());
  for (size_t i = 0; i < inv.tensors.size(); ++i) {
    stats.tensors[i].name = inv.tensors[i].name;
    stats.tensors[i].dtype_name = inv.tensors[i].dtype_name;
    stats.tensors[i].elements = inv.tensors[i].num_elements();
    stats.tensors[i].dense_bytes = inv.tensors[i].nbytes;
    stats.elements += inv.tensors[i].num_elements();
    stats.dense_bytes += inv.tensors[i].nbytes;
  }
  FileHeader fh;
  fh.flags = options.full ? kFlagNoBase : 0;
  fh.base_version = options.base_version;
  fh.target_version = options.target_version;
  if (!options.full) {
    fh.base_hash = options.known_base_hash != Hash128{} ? options.known_base_hash
                                                        : base->ContentHash(options.threads);
  }
  fh.inventory = inv.json;
  fh.chunk_elems = options.chunk_elems;
  std::vector<uint8_t> hb = SerializeFileHeader(fh);
  DCR_RETURN_IF_ERROR(sink->OnHeader(hb));
  uint64_t offset = hb.size();
  stats.base_hash = fh.base_hash;

  const std::vector<GridCell> grid = BuildGrid(inv, options);
  const bool avx2 = internal::CpuHasAvx2();
  const int threads = internal::ResolveThreads(options.threads);
  const size_t window = static_cast<size_t>(threads) * 4;
  Trailer trailer;
  Hash128 target_hash = fh.base_hash;
  std::vector<std::unordered_map<uint64_t, uint64_t>> tensor_hist(
      options.collect_entropy ? inv.tensors.size() : 0);

  // Scan buffers live per calling thread and are reused across windows and calls. Workers must
  // see the caller's instance: bind a plain reference (a thread_local named inside the worker
  // lambda would be the worker's own, empty one).
  thread_local std::vector<CellScan> caller_scans;
  std::vector<CellScan>& scans = caller_scans;
  for (size_t w0 = 0; w0 < grid.size(); w0 += window) {
    const size_t w1 = std::min(grid.size(), w0 + window);
    std::vector<StatusOr<std::vector<uint8_t>>> encoded(w1 - w0, Status(StatusCode::kInternal, "not run"));
    // Scan buffers are reused across windows (no page faults from fresh allocations).
    if (scans.size() < w1 - w0) scans.resize(w1 - w0);
    internal::ParallelFor(w1 - w0, threads, [&](uint64_t k) {
      const GridCell& cell = grid[w0 + k];
      CellScan& sc = scans[k];
      if (!options.full && !options.collect_entropy && cell.segments.size() == 1 &&
          cell.segments[0].IsContiguous()) {
        // One contiguous range (every cell of a large tensor): scan and encode in one pass.
        const Segment& sg = cell.segments[0];
        ChunkScanInput in;
        in.chunk_id = cell.chunk_id;
        in.width = cell.width;
        in.segments = &cell.segments;
        in.base = base_ptr[sg.tensor_index] + sg.offset * cell.width;
        in.target = target_ptr[sg.tensor_index] + sg.offset * cell.width;
        in.avx2 = avx2;
        in.emit_unchanged = options.emit_unchanged;
        const DType dt = inv.tensors[sg.tensor_index].dtype;
        ChunkScanResult res;
        encoded[k] = EncodeChunkScan(
            in, ChooseValueMode(options.value_policy, DTypeIsFloat(dt) ? DType::kBF16 : DType::kU8),
            inv.salts, options.zstd_level, &res);
        sc.n = res.num_changes;
        sc.seg_hist.clear();
        sc.seg_changes.assign(1, res.num_changes);
        return encoded[k].ok();
      }
      sc.n = 0;
      sc.Reserve(0);  // buffers exist (non-null) even for a cell without changes
      sc.seg_hist.clear();
      sc.seg_changes.assign(cell.segments.size(), 0);
      if (options.collect_entropy) sc.seg_hist.resize(cell.segments.size());
      internal::RangeHasher rh(avx2);
      uint64_t pos_base = 0;
      bool all_float = true;
      for (size_t s = 0; s < cell.segments.size(); ++s) {
        const Segment& sg = cell.segments[s];
        const TensorInfo& t = inv.tensors[sg.tensor_index];
        all_float = all_float && DTypeIsFloat(t.dtype);
        const uint64_t byte_off = sg.offset * cell.width;
        const uint64_t n = sg.count[0];
        const uint8_t* tp = target_ptr[sg.tensor_index] + byte_off;
        const uint64_t before = sc.n;
        if (options.full) {
          rh.Update(tp, n * cell.width);
          sc.Reserve(n);
          for (uint64_t i = 0; i < n; ++i) {
            sc.pos[sc.n + i] = pos_base + i;
            sc.new_bits[sc.n + i] = LoadBits(tp, cell.width, i);
          }
          sc.n += n;
        } else {
          // Scan and hash block by block: the hash reads the target bytes while the scan has
          // just brought them into cache (one pass over memory instead of two).
          const uint8_t* bp = base_ptr[sg.tensor_index] + byte_off;
          const uint64_t block = internal::kScanBlockBytes / cell.width;
          for (uint64_t b0 = 0; b0 < n; b0 += block) {
            const uint64_t m = std::min(block, n - b0);
            const uint64_t off = b0 * cell.width;
            sc.Reserve(m);
            ScanBytes(bp + off, tp + off, cell.width, m, pos_base + b0, avx2, &sc);
            rh.Update(tp + off, m * cell.width);
          }
        }
        sc.seg_changes[s] = sc.n - before;
        if (options.collect_entropy) {
          for (uint64_t i = before; i < sc.n; ++i) ++sc.seg_hist[s][sc.old_bits[i] ^ sc.new_bits[i]];
        }
        pos_base += n;
      }
      ChunkChangesView ch;
      ch.chunk_id = cell.chunk_id;
      ch.width = cell.width;
      ch.segments = &cell.segments;
      ch.num_elements = cell.num_elements;
      ch.num_changes = sc.n;
      ch.positions = sc.pos.get();
      ch.old_bits = options.full ? nullptr : sc.old_bits.get();
      ch.new_bits = sc.new_bits.get();
      ch.target_range_hash = rh.Digest();
      if (sc.n == 0 && !options.emit_unchanged && !options.full) {
        encoded[k] = std::vector<uint8_t>();
        return true;
      }
      ch.dense = options.full;
      ValueMode mode = options.full ? ValueMode::kAbsolute
                                    : ChooseValueMode(options.value_policy,
                                                      all_float ? DType::kBF16 : DType::kU8);
      encoded[k] = EncodeChunk(ch, mode, inv.salts, options.zstd_level);
      return encoded[k].ok();
    });
    for (size_t k = 0; k < w1 - w0; ++k) {
      if (!encoded[k].ok()) return encoded[k].status();
      const std::vector<uint8_t>& bytes = *encoded[k];
      const CellScan& sc = scans[k];
      const GridCell& cell = grid[w0 + k];
      uint64_t cell_changes = sc.n;
      for (size_t s = 0; s < cell.segments.size(); ++s) {
        auto& ts = stats.tensors[cell.segments[s].tensor_index];
        ts.changed += options.full ? 0 : sc.seg_changes[s];
        if (!bytes.empty()) {
          // Attribute the chunk's bytes by changes (by elements when none changed).
          double share = cell_changes > 0
                             ? static_cast<double>(sc.seg_changes[s]) / cell_changes
                             : static_cast<double>(cell.segments[s].num_elements()) /
                                   cell.num_elements;
          ts.payload_bytes += static_cast<uint64_t>(std::llround(share * bytes.size()));
        }
        if (options.collect_entropy) {
          for (const auto& [v, c] : sc.seg_hist[s]) tensor_hist[cell.segments[s].tensor_index][v] += c;
        }
      }
      if (bytes.empty()) continue;
      size_t hsize = 0, rsize = 0;
      DCR_ASSIGN_OR_RETURN(ChunkHeader h, ParseChunkHeader(bytes.data(), bytes.size(), &hsize, &rsize));
      HashAdd(&target_hash, h.version_delta);
      DCR_RETURN_IF_ERROR(sink->OnChunk(h, bytes));
      trailer.chunks.push_back({h.chunk_id, offset, bytes.size()});
      offset += bytes.size();
      stats.chunks++;
    }
  }
  if (options.full) target_hash = target.ContentHash(options.threads);
  trailer.target_hash = target_hash;
  std::vector<uint8_t> tb = SerializeTrailer(trailer, offset);
  DCR_RETURN_IF_ERROR(sink->OnTrailer(tb));
  stats.payload_bytes = offset + tb.size();
  stats.target_hash = target_hash;
  for (size_t i = 0; i < stats.tensors.size(); ++i) {
    auto& ts = stats.tensors[i];
    stats.changed += ts.changed;
    if (options.collect_entropy) {
      double bits = BinaryEntropyBits(ts.elements, ts.changed);
      for (const auto& [v, c] : tensor_hist[i]) {
        double p = static_cast<double>(c) / static_cast<double>(ts.changed);
        bits -= static_cast<double>(c) * std::log2(p);
      }
      ts.xor_entropy_bits = bits;
      stats.entropy_bound_bits += bits;
    }
  }
  return stats;
}

}  // namespace dcr
