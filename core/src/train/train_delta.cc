// Per-rank delta construction: each (model-parallel, data-parallel) unit diffs the buffer slices
// it owns and relabels changes to positions of canonical chunks through the discovered pieces;
// residual tensors go through the exporter as absolute overwrites; Merge writes one delta.
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <set>

#include "dcr/device.h"
#include "dcr/hash.h"
#include "dcr/status_macros.h"
#include "dcr/train.h"
#include "internal/diff_scan.h"
#include "train/train_internal.h"

namespace dcr {

namespace {

struct Run {
  uint64_t src = 0;  // element index in the buffer
  uint64_t len = 0;
  uint64_t pos = 0;  // position of the first element in the chunk
};

struct UChunk {
  uint64_t id = 0;
  int buffer = 0;
  int width = 2;
  DType dtype = DType::kBF16;
  std::vector<Segment> segs;
  std::vector<Run> runs;  // in position order
  uint64_t n = 0;
};

struct DepRange {
  int buffer = 0;
  uint64_t begin = 0, end = 0;
  int residual = 0;
};

// Target-range hash of a chunk: XXH3-128 of its covered target bytes, in position order.
Hash128 CoveredHash(const uint8_t* data, size_t size) {
  XXH128_hash_t h = XXH3_128bits(data, size);
  return Hash128{h.low64, h.high64};
}

MapPiece Slab(const MapPiece& p, uint64_t i) {
  MapPiece q = p;
  q.ndim = p.ndim - 1;
  q.src_offset = p.src_offset + static_cast<uint64_t>(static_cast<int64_t>(i) * p.src_stride[0]);
  q.dst_offset = p.dst_offset + static_cast<uint64_t>(static_cast<int64_t>(i) * p.dst_stride[0]);
  for (uint32_t d = 0; d + 1 < p.ndim; ++d) {
    q.count[d] = p.count[d + 1];
    q.src_stride[d] = p.src_stride[d + 1];
    q.dst_stride[d] = p.dst_stride[d + 1];
  }
  for (uint32_t d = q.ndim; d < kMaxSegmentDims; ++d) {
    q.count[d] = 0;
    q.src_stride[d] = q.dst_stride[d] = 0;
  }
  return q;
}

// Local elements [a, e) of box p (row-major digit order) as boxes, in order.
void Decompose(const MapPiece& p, uint64_t a, uint64_t e, std::vector<MapPiece>* out) {
  if (a >= e) return;
  if (p.ndim == 1) {
    MapPiece q = p;
    q.src_offset += static_cast<uint64_t>(static_cast<int64_t>(a) * p.src_stride[0]);
    q.dst_offset += static_cast<uint64_t>(static_cast<int64_t>(a) * p.dst_stride[0]);
    q.count[0] = e - a;
    out->push_back(q);
    return;
  }
  uint64_t inner = 1;
  for (uint32_t d = 1; d < p.ndim; ++d) inner *= p.count[d];
  uint64_t ia = a / inner;
  const uint64_t ib = e / inner;
  if (ia == ib) {
    Decompose(Slab(p, ia), a - ia * inner, e - ia * inner, out);
    return;
  }
  if (a % inner != 0) {
    Decompose(Slab(p, ia), a % inner, inner, out);
    ++ia;
  }
  if (ib > ia) {
    MapPiece q = p;
    q.src_offset += static_cast<uint64_t>(static_cast<int64_t>(ia) * p.src_stride[0]);
    q.dst_offset += static_cast<uint64_t>(static_cast<int64_t>(ia) * p.dst_stride[0]);
    q.count[0] = ib - ia;
    out->push_back(q);
  }
  if (e % inner != 0) Decompose(Slab(p, ib), 0, e % inner, out);
}

// Drops dimensions of count 1 (keeps at least one).
MapPiece Normalize(const MapPiece& p) {
  MapPiece q = p;
  uint32_t k = 0;
  for (uint32_t d = 0; d < p.ndim; ++d) {
    if (p.count[d] == 1) continue;
    q.count[k] = p.count[d];
    q.src_stride[k] = p.src_stride[d];
    q.dst_stride[k] = p.dst_stride[d];
    ++k;
  }
  if (k == 0) {
    q.count[0] = 1;
    q.src_stride[0] = q.dst_stride[0] = 1;
    k = 1;
  }
  q.ndim = k;
  for (uint32_t d = k; d < kMaxSegmentDims; ++d) {
    q.count[d] = 0;
    q.src_stride[d] = q.dst_stride[d] = 0;
  }
  return q;
}

// First local index whose source index is >= x (source indices increase with local indices).
uint64_t LowerBound(const MapPiece& p, uint64_t x) {
  uint64_t lo = 0, hi = p.num_elements();
  while (lo < hi) {
    const uint64_t mid = lo + (hi - lo) / 2;
    if (p.SrcAt(mid) < x)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

void AddRun(UChunk* c, uint64_t src, uint64_t len, uint64_t pos) {
  if (!c->runs.empty()) {
    Run& b = c->runs.back();
    if (b.src + b.len == src && b.pos + b.len == pos) {
      b.len += len;
      return;
    }
  }
  c->runs.push_back(Run{src, len, pos});
}

// XXH3-128 of the covered target bytes of a chunk (runs in position order), streamed run by run.
Hash128 ChunkRangeHash(const UChunk& c, const uint8_t* next, XXH3_state_t* xs) {
  const uint64_t w = static_cast<uint64_t>(c.width);
  if (c.runs.size() == 1) return CoveredHash(next + c.runs[0].src * w, c.n * w);
  XXH3_128bits_reset(xs);
  for (const Run& r : c.runs) XXH3_128bits_update(xs, next + r.src * w, r.len * w);
  XXH128_hash_t h = XXH3_128bits_digest(xs);
  return Hash128{h.low64, h.high64};
}

// Appends the changed elements of run `r` to (pos, old, new) starting at index *k (the arrays
// have room for r.len more entries).
template <typename T>
void DiffRunT(const uint8_t* prev, const uint8_t* next, const Run& r, uint64_t* __restrict pos,
              uint64_t* __restrict old_bits, uint64_t* __restrict new_bits, size_t* k) {
  const T* a = reinterpret_cast<const T*>(prev) + r.src;
  const T* b = reinterpret_cast<const T*>(next) + r.src;
  size_t n = *k;
  internal::ForEachDifference(a, b, r.len, internal::CpuHasAvx2(), [&](uint64_t j) {
    pos[n] = r.pos + j;
    old_bits[n] = a[j];
    new_bits[n] = b[j];
    ++n;
  });
  *k = n;
}

void DiffRun(int w, const uint8_t* prev, const uint8_t* next, const Run& r, uint64_t* pos,
             uint64_t* old_bits, uint64_t* new_bits, size_t* k) {
  switch (w) {
    case 1:
      DiffRunT<uint8_t>(prev, next, r, pos, old_bits, new_bits, k);
      break;
    case 2:
      DiffRunT<uint16_t>(prev, next, r, pos, old_bits, new_bits, k);
      break;
    case 4:
      DiffRunT<uint32_t>(prev, next, r, pos, old_bits, new_bits, k);
      break;
    default:
      DiffRunT<uint64_t>(prev, next, r, pos, old_bits, new_bits, k);
      break;
  }
}

std::vector<TensorView> HeaderViews(const std::vector<TensorSpec>& canon) {
  std::vector<TensorView> v;
  for (const auto& t : canon)
    v.push_back(TensorView{t.name, t.dtype, t.shape, nullptr, t.nbytes()});
  return v;
}

constexpr uint64_t kResidualIdBit = uint64_t{1} << 63;

}  // namespace

struct TrainDeltaBuilder::Unit {
  int rank = 0;
  int dp = 0;
  std::vector<UChunk> chunks;
  std::vector<DepRange> deps;
};

namespace internal {

// How a unit reads the buffers of its rank, old (`prev`) and new (`next`): what
// TrainDeltaBuilder::BuildUnitWith needs of them.
class RankBuffers {
 public:
  virtual ~RankBuffers() = default;
  // Writes the changed elements of chunk `c` in position order to (pos, old_bits, new_bits),
  // which have room for c.n entries, and their number to *k.
  virtual Status DiffChunk(const UChunk& c, uint64_t* pos, uint64_t* old_bits, uint64_t* new_bits,
                           size_t* k) = 0;
  // The chunk's target_range_hash: XXH3-128 of its covered new bytes in position order.
  virtual StatusOr<Hash128> RangeHash(const UChunk& c) = 0;
  // Whether elements [begin, end) of buffer `b` (`width` bytes each) differ between old and new.
  virtual StatusOr<bool> Differs(int b, uint64_t begin, uint64_t end, uint64_t width) = 0;
};

}  // namespace internal

namespace {

// A rank's buffers in host memory: the difference scan of internal/diff_scan.h.
class HostRankBuffers : public internal::RankBuffers {
 public:
  HostRankBuffers(const std::vector<std::vector<uint8_t>>& prev,
                  const std::vector<std::vector<uint8_t>>& next)
      : prev_(prev), next_(next), xs_(XXH3_createState(), &XXH3_freeState) {}
  Status Init() const {
    return xs_ ? Status::OK() : ResourceExhaustedError("train delta: cannot allocate a hash state");
  }
  Status DiffChunk(const UChunk& c, uint64_t* pos, uint64_t* old_bits, uint64_t* new_bits,
                   size_t* k) override {
    *k = 0;
    for (const Run& r : c.runs) {
      DiffRun(c.width, prev_[c.buffer].data(), next_[c.buffer].data(), r, pos, old_bits, new_bits,
              k);
    }
    return Status::OK();
  }
  StatusOr<Hash128> RangeHash(const UChunk& c) override {
    return ChunkRangeHash(c, next_[c.buffer].data(), xs_.get());
  }
  StatusOr<bool> Differs(int b, uint64_t begin, uint64_t end, uint64_t width) override {
    return std::memcmp(prev_[b].data() + begin * width, next_[b].data() + begin * width,
                       (end - begin) * width) != 0;
  }

 private:
  const std::vector<std::vector<uint8_t>>& prev_;
  const std::vector<std::vector<uint8_t>>& next_;
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> xs_;
};

// A chunk's runs grouped by source position for the device: runs (in source order) at most
// kSpanGap elements apart share a span, and each span is one Device::Diff and one Download.
constexpr uint64_t kSpanGap = uint64_t{1} << 16;

struct Span {
  uint64_t begin = 0, end = 0;  // buffer elements
  uint64_t host = 0;            // element offset of its downloaded new bytes in the host buffer
};

// A rank's buffers in device memory (device addresses of each buffer's element 0).
class DeviceRankBuffers : public internal::RankBuffers {
 public:
  DeviceRankBuffers(Device* device, const std::vector<const void*>& prev,
                    const std::vector<const void*>& next)
      : device_(device), prev_(prev), next_(next) {}

  Status DiffChunk(const UChunk& c, uint64_t* pos, uint64_t* old_bits, uint64_t* new_bits,
                   size_t* k) override {
    DCR_RETURN_IF_ERROR(Plan(c));
    const uint64_t w = static_cast<uint64_t>(c.width);
    changes_.clear();
    for (size_t si = 0; si < spans_.size(); ++si) {
      const Span& sp = spans_[si];
      const uint64_t n = sp.end - sp.begin;
      DCR_ASSIGN_OR_RETURN(DeviceDiffResult d, device_->Diff(Addr(prev_[c.buffer], sp.begin * w),
                                                             Addr(next_[c.buffer], sp.begin * w), n,
                                                             c.width, ValueMode::kXor));
      const size_t m = d.positions.size();
      if (d.old_bits.size() != m || d.new_bits.size() != m ||
          !std::is_sorted(d.positions.begin(), d.positions.end()) ||
          (m > 0 && d.positions.back() >= n)) {
        return InternalError("device " + device_->name() + ": its diff of " + std::to_string(n) +
                             " elements returned malformed changes");
      }
      // The changes inside each run of this span, relabelled to chunk positions.
      for (size_t ri = span_runs_[si]; ri < span_runs_[si + 1]; ++ri) {
        const Run& r = c.runs[order_[ri]];
        const uint64_t lo = r.src - sp.begin, hi = lo + r.len;
        auto it = std::lower_bound(d.positions.begin(), d.positions.end(), lo);
        for (; it != d.positions.end() && *it < hi; ++it) {
          const size_t j = static_cast<size_t>(it - d.positions.begin());
          changes_.push_back({r.pos + (*it - lo), d.old_bits[j], d.new_bits[j]});
        }
      }
    }
    std::sort(changes_.begin(), changes_.end(),
              [](const Change& a, const Change& b) { return a.pos < b.pos; });
    for (size_t i = 0; i < changes_.size(); ++i) {
      pos[i] = changes_[i].pos;
      old_bits[i] = changes_[i].old_bits;
      new_bits[i] = changes_[i].new_bits;
    }
    *k = changes_.size();
    return Status::OK();
  }

  StatusOr<Hash128> RangeHash(const UChunk& c) override {
    DCR_RETURN_IF_ERROR(Plan(c));
    const uint64_t w = static_cast<uint64_t>(c.width);
    host_.resize(static_cast<size_t>(
        spans_.empty() ? 0 : (spans_.back().host + spans_.back().end - spans_.back().begin) * w));
    for (const Span& sp : spans_) {
      DCR_RETURN_IF_ERROR(device_->Download(host_.data() + sp.host * w,
                                            Addr(next_[c.buffer], sp.begin * w),
                                            (sp.end - sp.begin) * w));
    }
    // The covered bytes in position order (runs are in position order).
    XXH3_state_t* xs = XXH3_createState();
    if (xs == nullptr) return ResourceExhaustedError("train delta: cannot allocate a hash state");
    XXH3_128bits_reset(xs);
    for (size_t i = 0; i < c.runs.size(); ++i) {
      const Run& r = c.runs[i];
      const Span& sp = spans_[run_span_[i]];
      XXH3_128bits_update(xs, host_.data() + (sp.host + r.src - sp.begin) * w, r.len * w);
    }
    const XXH128_hash_t h = XXH3_128bits_digest(xs);
    XXH3_freeState(xs);
    return Hash128{h.low64, h.high64};
  }

  StatusOr<bool> Differs(int b, uint64_t begin, uint64_t end, uint64_t width) override {
    const uint64_t bytes = (end - begin) * width;
    DCR_ASSIGN_OR_RETURN(uint64_t first,
                         device_->FirstDifference(Addr(prev_[b], begin * width),
                                                  Addr(next_[b], begin * width), bytes));
    return first != bytes;
  }

 private:
  struct Change {
    uint64_t pos, old_bits, new_bits;
  };
  static const void* Addr(const void* base, uint64_t byte_offset) {
    return static_cast<const uint8_t*>(base) + byte_offset;
  }
  // Groups the runs of `c` into spans (once per chunk: DiffChunk and RangeHash share it).
  Status Plan(const UChunk& c) {
    if (planned_ == &c) return Status::OK();
    order_.resize(c.runs.size());
    for (size_t i = 0; i < order_.size(); ++i) order_[i] = i;
    std::stable_sort(order_.begin(), order_.end(),
                     [&](size_t a, size_t b) { return c.runs[a].src < c.runs[b].src; });
    spans_.clear();
    span_runs_.clear();
    run_span_.assign(c.runs.size(), 0);
    uint64_t host = 0;
    for (size_t i = 0; i < order_.size(); ++i) {
      const Run& r = c.runs[order_[i]];
      if (spans_.empty() || r.src > spans_.back().end + kSpanGap) {
        if (!spans_.empty()) host += spans_.back().end - spans_.back().begin;
        spans_.push_back(Span{r.src, r.src + r.len, host});
        span_runs_.push_back(i);
      } else {
        spans_.back().end = std::max(spans_.back().end, r.src + r.len);
      }
      run_span_[order_[i]] = spans_.size() - 1;
    }
    span_runs_.push_back(order_.size());
    planned_ = &c;
    return Status::OK();
  }

  Device* device_;
  const std::vector<const void*>& prev_;
  const std::vector<const void*>& next_;
  const UChunk* planned_ = nullptr;
  std::vector<size_t> order_;  // run indices in source order
  std::vector<Span> spans_;
  std::vector<size_t> span_runs_;  // spans_[s] holds order_[span_runs_[s] .. span_runs_[s + 1])
  std::vector<size_t> run_span_;   // per run (position order): its span
  std::vector<Change> changes_;
  std::vector<uint8_t> host_;
};

}  // namespace

TrainDeltaBuilder::~TrainDeltaBuilder() = default;

int TrainDeltaBuilder::num_units() const { return static_cast<int>(units_.size()); }

StatusOr<std::unique_ptr<TrainDeltaBuilder>> TrainDeltaBuilder::Create(
    std::shared_ptr<const TrainStructure> s, std::shared_ptr<const LayoutMap> map,
    std::shared_ptr<const Exporter> exporter, const ShardSet& base,
    const TrainDeltaOptions& options) {
  if (options.chunk_elems == 0) return InvalidArgumentError("train delta: chunk_elems must be > 0");
  if (exporter == nullptr || &exporter->structure() != s.get()) {
    return InvalidArgumentError("train delta: the exporter is not the layout's");
  }
  if (base.buffers.size() != s->ranks().size()) {
    return InvalidArgumentError("train delta: base shards do not match the layout's ranks");
  }
  auto bld = std::unique_ptr<TrainDeltaBuilder>(new TrainDeltaBuilder());
  bld->s_ = s;
  bld->map_ = map;
  bld->exporter_ = std::move(exporter);
  bld->options_ = options;
  const auto& ranks = s->ranks();
  const auto& canon = s->canonical();
  for (const auto& t : canon) bld->salts_.push_back(TensorSalt(t.name));
  {
    std::vector<uint64_t> offs;
    const std::vector<TensorView> views = HeaderViews(canon);
    const std::string h = BuildSafetensorsHeader(views, {}, &offs);
    bld->inventory_json_ = h.substr(8);
    bld->target_.SetSingleFile(bld->inventory_json_);
    if (options.shard_bytes > 0) {
      DCR_ASSIGN_OR_RETURN(ShardedLayout layout, PlanShardedCheckpoint(views, options.shard_bytes));
      bld->target_.files.clear();
      for (size_t k = 0; k < layout.names.size(); ++k) {
        std::vector<TensorView> part(
            views.begin() + static_cast<std::ptrdiff_t>(layout.ranges[k].first),
            views.begin() + static_cast<std::ptrdiff_t>(layout.ranges[k].second));
        bld->target_.files.push_back(
            TargetFile{layout.names[k], BuildSafetensorsHeader(part, {}, nullptr).substr(8)});
      }
      bld->target_.index_name = kIndexFileName;
      bld->target_.index = layout.index_json;
    }
  }
  const int dp = s->layout().dp;
  const auto& pieces = map->pieces();
  for (size_t r = 0; r < ranks.size(); ++r) {
    for (int d = 0; d < dp; ++d) {
      Unit u;
      u.rank = static_cast<int>(r);
      u.dp = d;
      const uint64_t unit_id = r * static_cast<uint64_t>(dp) + static_cast<uint64_t>(d);
      for (size_t b = 0; b < ranks[r].buffers.size(); ++b) {
        uint64_t lo, hi;
        s->OwnedRange(static_cast<int>(r), static_cast<int>(b), d, &lo, &hi);
        if (lo >= hi) continue;
        UChunk cur;
        auto flush = [&]() {
          if (cur.n == 0) return;
          cur.id = (unit_id << 32) | u.chunks.size();
          u.chunks.push_back(std::move(cur));
          cur = UChunk();
        };
        auto begin = std::lower_bound(pieces.begin(), pieces.end(),
                                      std::make_pair(static_cast<int>(r), static_cast<int>(b)),
                                      [](const MapPiece& p, const std::pair<int, int>& k) {
                                        return std::make_pair(p.rank, p.buffer) < k;
                                      });
        for (auto it = begin; it != pieces.end() && it->rank == static_cast<int>(r) &&
                              it->buffer == static_cast<int>(b);
             ++it) {
          const MapPiece& p = *it;
          uint64_t a = LowerBound(p, lo);
          const uint64_t e = LowerBound(p, hi);
          while (a < e) {
            cur.buffer = static_cast<int>(b);
            cur.dtype = ranks[r].buffers[b].dtype;
            cur.width = ranks[r].buffers[b].width();
            const uint64_t take = std::min(options.chunk_elems - cur.n, e - a);
            std::vector<MapPiece> sub;
            Decompose(p, a, a + take, &sub);
            for (const MapPiece& raw : sub) {
              const MapPiece q = Normalize(raw);
              cur.segs.push_back(q.CanonicalBox());
              const uint64_t n = q.num_elements();
              const uint64_t last = q.count[q.ndim - 1];
              if (q.src_stride[q.ndim - 1] == 1) {
                for (uint64_t row = 0; row < n / last; ++row) {
                  AddRun(&cur, q.SrcAt(row * last), last, cur.n + row * last);
                }
              } else {
                for (uint64_t k = 0; k < n; ++k) AddRun(&cur, q.SrcAt(k), 1, cur.n + k);
              }
              cur.n += n;
            }
            a += take;
            if (cur.n == options.chunk_elems) flush();
          }
        }
        flush();
      }
      // Residual dependencies inside the owned slices.
      const auto& res = map->residual();
      for (size_t i = 0; i < res.size(); ++i) {
        for (const ReadRange& rr : res[i].deps) {
          if (rr.rank != static_cast<int>(r)) continue;
          uint64_t lo, hi;
          s->OwnedRange(static_cast<int>(r), rr.buffer, d, &lo, &hi);
          const uint64_t b0 = std::max(lo, rr.begin), b1 = std::min(hi, rr.begin + rr.count);
          if (b0 < b1) u.deps.push_back(DepRange{rr.buffer, b0, b1, static_cast<int>(i)});
        }
      }
      bld->units_.push_back(std::move(u));
    }
  }
  // Content hash of the base version, from the shards: identity terms, each unit's own elements,
  // residual elements through the exporter.
  Hash128 total;
  for (const auto& t : canon) HashAdd(&total, TensorIdentityTerm(t.name, t.dtype, t.shape));
  std::vector<Hash128> part(bld->units_.size());
  internal::ParallelForEach(bld->units_.size(), options.threads, [&](uint64_t k) {
    const Unit& u = bld->units_[k];
    Hash128 h;
    for (const UChunk& c : u.chunks) {
      const uint8_t* data = base.data(u.rank, c.buffer);
      size_t seg = 0;
      uint64_t seg_base = 0;
      for (const Run& r : c.runs) {
        for (uint64_t i = 0; i < r.len; ++i) {
          const uint64_t pos = r.pos + i;
          while (pos >= seg_base + c.segs[seg].num_elements())
            seg_base += c.segs[seg++].num_elements();
          const Segment& sg = c.segs[seg];
          const uint64_t elem = sg.ElementAt(pos - seg_base);
          HashAdd(&h, ElementTerm(bld->salts_[sg.tensor_index], elem,
                                  LoadBits(data, c.width, r.src + i)));
        }
      }
    }
    part[k] = h;
  });
  for (const auto& h : part) HashAdd(&total, h);
  ShardSetReader reader(*s, base);
  for (const ResidualTensor& rt : map->residual()) {
    const TensorSpec& spec = canon[rt.tensor];
    std::vector<uint8_t> out(spec.nbytes());
    DCR_RETURN_IF_ERROR(bld->exporter_->ExportTensor(reader, rt.tensor, out.data()));
    const int w = DTypeWidth(DTypeFromName(spec.dtype));
    for (const Segment& sg : rt.elements) {
      HashAdd(&total, RangeHash(bld->salts_[rt.tensor], out.data(), w, sg.offset, sg.count[0]));
    }
  }
  bld->base_hash_ = total;
  return bld;
}

StatusOr<UnitDelta> TrainDeltaBuilder::BuildUnit(
    int unit, const std::vector<std::vector<uint8_t>>& prev_rank,
    const std::vector<std::vector<uint8_t>>& next_rank) const {
  if (unit < 0 || unit >= num_units())
    return InvalidArgumentError("train delta: unit out of range");
  const Unit& u = units_[unit];
  const RankSpec& rk = s_->ranks()[u.rank];
  if (prev_rank.size() != rk.buffers.size() || next_rank.size() != rk.buffers.size()) {
    return InvalidArgumentError("train delta: rank " + std::to_string(u.rank) +
                                " shards do not match the layout (buffer count)");
  }
  for (size_t b = 0; b < rk.buffers.size(); ++b) {
    const uint64_t nb = rk.buffers[b].numel * rk.buffers[b].width();
    if (prev_rank[b].size() != nb || next_rank[b].size() != nb) {
      return InvalidArgumentError("train delta: rank " + std::to_string(u.rank) + " buffer " +
                                  rk.buffers[b].name + " has the wrong size");
    }
  }
  HostRankBuffers buffers(prev_rank, next_rank);
  DCR_RETURN_IF_ERROR(buffers.Init());
  return BuildUnitWith(unit, &buffers);
}

StatusOr<UnitDelta> TrainDeltaBuilder::BuildUnitOnDevice(
    int unit, Device* device, const std::vector<const void*>& prev_rank,
    const std::vector<const void*>& next_rank) const {
  if (unit < 0 || unit >= num_units())
    return InvalidArgumentError("train delta: unit out of range");
  if (device == nullptr) return InvalidArgumentError("train delta: no device");
  const Unit& u = units_[unit];
  const RankSpec& rk = s_->ranks()[u.rank];
  if (prev_rank.size() != rk.buffers.size() || next_rank.size() != rk.buffers.size()) {
    return InvalidArgumentError("train delta: rank " + std::to_string(u.rank) +
                                " device buffers do not match the layout (buffer count)");
  }
  for (size_t b = 0; b < rk.buffers.size(); ++b) {
    if (prev_rank[b] == nullptr || next_rank[b] == nullptr) {
      return InvalidArgumentError("train delta: rank " + std::to_string(u.rank) + " buffer " +
                                  rk.buffers[b].name + " has no device address");
    }
  }
  DeviceRankBuffers buffers(device, prev_rank, next_rank);
  StatusOr<UnitDelta> out = BuildUnitWith(unit, &buffers);
  if (!out.ok()) {
    return out.status().WithContext("train delta: unit " + std::to_string(unit) + " on device " +
                                    device->name());
  }
  return out;
}

StatusOr<UnitDelta> TrainDeltaBuilder::BuildUnitWith(int unit,
                                                     internal::RankBuffers* buffers) const {
  const Unit& u = units_[unit];
  const RankSpec& rk = s_->ranks()[u.rank];
  UnitDelta out;
  out.unit = unit;
  std::unique_ptr<uint64_t[]> pos, olds, news;
  uint64_t cap = 0;
  for (const UChunk& c : u.chunks) {
    // Room for every covered element (uninitialized); only the changes found are copied out.
    if (cap < c.n) {
      cap = c.n;
      pos.reset(new uint64_t[cap]);
      olds.reset(new uint64_t[cap]);
      news.reset(new uint64_t[cap]);
    }
    size_t k = 0;
    DCR_RETURN_IF_ERROR(buffers->DiffChunk(c, pos.get(), olds.get(), news.get(), &k));
    for (const Run& r : c.runs) out.scanned_bytes += r.len * static_cast<uint64_t>(c.width);
    if (k == 0) continue;
    // Encoded straight from the scan's arrays (no copy into vectors).
    ChunkChangesView cc;
    cc.chunk_id = c.id;
    cc.width = static_cast<uint8_t>(c.width);
    cc.segments = &c.segs;
    cc.num_elements = c.n;
    cc.num_changes = k;
    cc.positions = pos.get();
    cc.old_bits = olds.get();
    cc.new_bits = news.get();
    cc.dense = false;
    DCR_ASSIGN_OR_RETURN(cc.target_range_hash, buffers->RangeHash(c));
    out.changes += k;
    DCR_ASSIGN_OR_RETURN(std::vector<uint8_t> rec,
                         EncodeChunk(cc, ChooseValueMode(options_.value_policy, c.dtype), salts_,
                                     options_.zstd_level));
    out.chunks.emplace_back(c.id, std::move(rec));
  }
  std::set<int> flagged;
  for (const DepRange& d : u.deps) {
    const uint64_t w = static_cast<uint64_t>(rk.buffers[d.buffer].width());
    out.scanned_bytes += (d.end - d.begin) * w;
    if (flagged.count(d.residual)) continue;
    DCR_ASSIGN_OR_RETURN(bool differs, buffers->Differs(d.buffer, d.begin, d.end, w));
    if (differs) flagged.insert(d.residual);
  }
  out.affected_residual.assign(flagged.begin(), flagged.end());
  return out;
}

StatusOr<UnitDelta> TrainDeltaBuilder::BuildResidual(const std::vector<UnitDelta>& units,
                                                     const ShardSet& prev,
                                                     const ShardSet& next) const {
  std::set<int> affected;
  for (const auto& u : units)
    affected.insert(u.affected_residual.begin(), u.affected_residual.end());
  UnitDelta out;
  out.unit = -1;
  const auto& canon = s_->canonical();
  ShardSetReader rp(*s_, prev), rn(*s_, next);
  for (int i : affected) {
    const ResidualTensor& rt = map_->residual()[i];
    const TensorSpec& spec = canon[rt.tensor];
    const int w = DTypeWidth(DTypeFromName(spec.dtype));
    std::vector<uint8_t> a(spec.nbytes()), b(spec.nbytes());
    DCR_RETURN_IF_ERROR(exporter_->ExportTensor(rp, rt.tensor, a.data()));
    DCR_RETURN_IF_ERROR(exporter_->ExportTensor(rn, rt.tensor, b.data()));
    for (const ReadRange& d : rt.deps) {
      out.scanned_bytes +=
          2 * d.count * static_cast<uint64_t>(s_->ranks()[d.rank].buffers[d.buffer].width());
    }
    // Chunks over the residual elements, chunk_elems at a time.
    uint64_t k = 0;
    size_t si = 0;
    uint64_t soff = 0;  // consumed elements of rt.elements[si]
    while (si < rt.elements.size()) {
      ChunkChanges cc;
      cc.chunk_id = kResidualIdBit | (static_cast<uint64_t>(i) << 24) | k++;
      cc.width = static_cast<uint8_t>(w);
      std::vector<uint8_t> covered;
      while (si < rt.elements.size() && cc.num_elements < options_.chunk_elems) {
        const Segment& sg = rt.elements[si];
        const uint64_t take = std::min(sg.count[0] - soff, options_.chunk_elems - cc.num_elements);
        const uint64_t begin = sg.offset + soff;
        cc.segments.push_back(Segment::Range(rt.tensor, begin, take));
        for (uint64_t j = 0; j < take; ++j) {
          const uint64_t x = LoadBits(a.data(), w, begin + j), y = LoadBits(b.data(), w, begin + j);
          if (x != y) {
            cc.positions.push_back(cc.num_elements + j);
            cc.old_bits.push_back(x);
            cc.new_bits.push_back(y);
          }
        }
        covered.insert(covered.end(), b.data() + begin * w, b.data() + (begin + take) * w);
        cc.num_elements += take;
        soff += take;
        if (soff == sg.count[0]) {
          ++si;
          soff = 0;
        }
      }
      if (cc.positions.empty()) continue;
      cc.target_range_hash = CoveredHash(covered.data(), covered.size());
      out.changes += cc.positions.size();
      DCR_ASSIGN_OR_RETURN(std::vector<uint8_t> rec,
                           EncodeChunk(cc, ValueMode::kAbsolute, salts_, options_.zstd_level));
      out.chunks.emplace_back(cc.chunk_id, std::move(rec));
    }
    out.affected_residual.push_back(i);
  }
  return out;
}

StatusOr<TrainDeltaStats> TrainDeltaBuilder::Merge(std::vector<UnitDelta> units, UnitDelta residual,
                                                   DeltaSink* sink) {
  TrainDeltaStats st;
  st.canonical_elements = map_->stats().canonical_elements;
  st.affine_elements = map_->stats().affine_elements;
  std::vector<std::pair<uint64_t, std::vector<uint8_t>>> all;
  for (auto& u : units) {
    st.affine_changes += u.changes;
    st.scanned_bytes += u.scanned_bytes;
    for (auto& c : u.chunks) all.push_back(std::move(c));
  }
  st.residual_changes = residual.changes;
  st.residual_tensors_exported = residual.affected_residual.size();
  st.residual_gathered_bytes = residual.scanned_bytes;
  for (auto& c : residual.chunks) all.push_back(std::move(c));
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 1; i < all.size(); ++i) {
    if (all[i].first == all[i - 1].first) {
      return InternalError("train delta: duplicate chunk id " + std::to_string(all[i].first));
    }
  }
  FileHeader fh;
  fh.flags = 0;
  fh.base_version = version_;
  fh.base_hash = base_hash_;
  const uint64_t target_version = next_target_ != 0 ? next_target_ : version_ + 1;
  fh.target_version = target_version;
  fh.files = target_.files;
  fh.index_name = target_.index_name;
  fh.index = target_.index;
  fh.chunk_elems = options_.chunk_elems;
  const std::vector<uint8_t> hb = SerializeFileHeader(fh);
  DCR_RETURN_IF_ERROR(sink->OnHeader(hb));
  uint64_t offset = hb.size();
  Trailer tr;
  Hash128 target = base_hash_;
  for (auto& [id, rec] : all) {
    size_t hs = 0, rs = 0;
    DCR_ASSIGN_OR_RETURN(ChunkHeader ch, ParseChunkHeader(rec.data(), rec.size(), &hs, &rs));
    if (rs != rec.size()) return InternalError("train delta: chunk record size mismatch");
    HashAdd(&target, ch.version_delta);  // additive content-hash move of this chunk
    DCR_RETURN_IF_ERROR(sink->OnChunk(ch, rec));
    tr.chunks.push_back(ChunkTableEntry{id, offset, rec.size()});
    offset += rec.size();
  }
  tr.target_hash = target;
  const std::vector<uint8_t> tb = SerializeTrailer(tr, offset);
  DCR_RETURN_IF_ERROR(sink->OnTrailer(tb));
  st.chunks = all.size();
  st.payload_bytes = offset + tb.size();
  st.base_hash = base_hash_;
  st.target_hash = target;
  base_hash_ = target;
  version_ = target_version;
  next_target_ = 0;
  return st;
}

StatusOr<TrainDeltaStats> TrainDeltaBuilder::BuildStep(const ShardSet& prev, const ShardSet& next,
                                                       DeltaSink* sink) {
  if (prev.buffers.size() != s_->ranks().size() || next.buffers.size() != s_->ranks().size()) {
    return InvalidArgumentError("train delta: shards do not match the layout's ranks");
  }
  std::vector<StatusOr<UnitDelta>> res(units_.size(),
                                       StatusOr<UnitDelta>(InternalError("not run")));
  internal::ParallelForEach(units_.size(), options_.threads, [&](uint64_t k) {
    const int r = units_[k].rank;
    res[k] = BuildUnit(static_cast<int>(k), prev.buffers[r], next.buffers[r]);
  });
  std::vector<UnitDelta> units;
  for (auto& x : res) {
    if (!x.ok()) return x.status();
    units.push_back(std::move(x).value());
  }
  DCR_ASSIGN_OR_RETURN(UnitDelta residual, BuildResidual(units, prev, next));
  return Merge(std::move(units), std::move(residual), sink);
}

StatusOr<TrainDeltaStats> TrainDeltaBuilder::BuildStepOnDevice(const ShardSet& prev,
                                                               const ShardSet& next, Device* device,
                                                               DeltaSink* sink) {
  if (device == nullptr) return InvalidArgumentError("train delta: no device");
  if (prev.buffers.size() != s_->ranks().size() || next.buffers.size() != s_->ranks().size()) {
    return InvalidArgumentError("train delta: shards do not match the layout's ranks");
  }
  std::vector<StatusOr<UnitDelta>> res(units_.size(),
                                       StatusOr<UnitDelta>(InternalError("not run")));
  const int dp = s_->layout().dp;
  for (size_t r = 0; r < s_->ranks().size(); ++r) {
    const RankSpec& rk = s_->ranks()[r];
    // The rank's old and new buffers in device memory, freed when its units are built.
    std::vector<void*> held;
    struct Release {
      Device* device;
      std::vector<void*>* held;
      ~Release() {
        for (void* p : *held) device->Free(p);
      }
    } release{device, &held};
    std::vector<const void*> dprev, dnext;
    for (size_t b = 0; b < rk.buffers.size(); ++b) {
      const uint64_t nb = rk.buffers[b].numel * rk.buffers[b].width();
      for (const ShardSet* set : {&prev, &next}) {
        if (set->buffers[r].size() != rk.buffers.size() || set->buffers[r][b].size() != nb) {
          return InvalidArgumentError("train delta: rank " + std::to_string(r) + " buffer " +
                                      rk.buffers[b].name + " has the wrong size");
        }
        StatusOr<void*> p = device->Allocate(nb);
        if (!p.ok()) {
          return p.status().WithContext("train delta: rank " + std::to_string(r) + " on device " +
                                        device->name());
        }
        held.push_back(*p);
        DCR_RETURN_IF_ERROR(device->Upload(*p, set->buffers[r][b].data(), nb));
        (set == &prev ? dprev : dnext).push_back(*p);
      }
    }
    internal::ParallelForEach(static_cast<uint64_t>(dp), options_.threads, [&](uint64_t d) {
      const uint64_t k = r * static_cast<uint64_t>(dp) + d;
      res[k] = BuildUnitOnDevice(static_cast<int>(k), device, dprev, dnext);
    });
    for (int d = 0; d < dp; ++d) {
      const StatusOr<UnitDelta>& x = res[r * static_cast<uint64_t>(dp) + static_cast<uint64_t>(d)];
      if (!x.ok()) return x.status();
    }
  }
  std::vector<UnitDelta> units;
  for (auto& x : res) units.push_back(std::move(x).value());
  DCR_ASSIGN_OR_RETURN(UnitDelta residual, BuildResidual(units, prev, next));
  return Merge(std::move(units), std::move(residual), sink);
}

}  // namespace dcr
