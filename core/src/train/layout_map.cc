// Map discovery: probe the exporter with coordinate-tagged shards and compress what comes out as
// index maps into affine pieces; everything else is residual.
#include <algorithm>
#include <cstring>
#include <map>
#include <tuple>

#include "dcr/hash.h"
#include "dcr/status_macros.h"
#include "dcr/train.h"
#include "train/train_internal.h"

namespace dcr {

uint64_t MapPiece::num_elements() const {
  uint64_t n = 1;
  for (uint32_t d = 0; d < ndim; ++d) n *= count[d];
  return n;
}

uint64_t MapPiece::SrcAt(uint64_t i) const {
  uint64_t e = src_offset;
  for (int d = static_cast<int>(ndim) - 1; d >= 0; --d) {
    e += static_cast<uint64_t>(static_cast<int64_t>(i % count[d]) * src_stride[d]);
    i /= count[d];
  }
  return e;
}

Segment MapPiece::CanonicalBox() const {
  Segment s;
  s.tensor_index = tensor;
  s.ndim = ndim;
  s.offset = dst_offset;
  s.count = count;
  s.stride = dst_stride;
  return s;
}

namespace {

// Records every range the exporter reads.
class TracingReader : public ShardReader {
 public:
  explicit TracingReader(const ShardReader& inner) : inner_(inner) {}
  const uint8_t* Read(int r, int b, uint64_t begin, uint64_t count) const override {
    reads_.push_back(ReadRange{r, b, begin, count});
    return inner_.Read(r, b, begin, count);
  }
  std::vector<ReadRange> Ranges() const {
    std::vector<ReadRange> v = reads_;
    std::sort(v.begin(), v.end(), [](const ReadRange& a, const ReadRange& b) {
      return std::tie(a.rank, a.buffer, a.begin) < std::tie(b.rank, b.buffer, b.begin);
    });
    std::vector<ReadRange> out;
    for (const auto& x : v) {
      if (!out.empty() && out.back().rank == x.rank && out.back().buffer == x.buffer &&
          x.begin <= out.back().begin + out.back().count) {
        out.back().count =
            std::max(out.back().begin + out.back().count, x.begin + x.count) - out.back().begin;
      } else {
        out.push_back(x);
      }
    }
    return out;
  }

 private:
  const ShardReader& inner_;
  mutable std::vector<ReadRange> reads_;
};

inline uint64_t TagMix(uint64_t g, int pass) {
  return internal::Mix64(g * 0x9E3779B97F4A7C15ULL +
                         static_cast<uint64_t>(pass) * 0xA0761D6478BD642FULL + 0x5EED);
}

inline uint64_t WidthMask(int w) { return w >= 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * w)) - 1; }

// The tag of source element g in pass p at width w. Digit passes carry digit p of g in the low
// `db` bits; check passes (p >= digit_passes) carry only hash bits.
inline uint64_t Tag(uint64_t g, int p, int w, int digit_passes, int db) {
  const uint64_t mix = TagMix(g, p);
  uint64_t v;
  if (p < digit_passes) {
    const uint64_t dmask = (uint64_t{1} << db) - 1;
    v = ((g >> (p * db)) & dmask) | (mix << db);
  } else {
    v = mix;
  }
  return v & WidthMask(w);
}

struct Box {
  uint32_t ndim = 1;
  uint64_t soff = 0, doff = 0;
  std::array<uint64_t, kMaxSegmentDims> count{};
  std::array<int64_t, kMaxSegmentDims> ss{}, ds{};
  bool SameShape(const Box& o) const {
    if (ndim != o.ndim) return false;
    for (uint32_t d = 0; d < ndim; ++d) {
      if (count[d] != o.count[d] || ss[d] != o.ss[d] || ds[d] != o.ds[d]) return false;
    }
    return true;
  }
};

// One-dimensional boxes over a sequence of (source, canonical) pairs sorted by source: maximal
// runs with constant source and canonical steps.
std::vector<Box> FitRuns(const std::vector<std::pair<uint64_t, uint64_t>>& seq) {
  std::vector<Box> boxes;
  const size_t n = seq.size();
  size_t k = 0;
  while (k < n) {
    Box b;
    b.soff = seq[k].first;
    b.doff = seq[k].second;
    b.count[0] = 1;
    b.ss[0] = 1;
    b.ds[0] = 1;
    if (k + 1 < n) {
      const int64_t ds = static_cast<int64_t>(seq[k + 1].first - seq[k].first);
      const int64_t dc = static_cast<int64_t>(seq[k + 1].second - seq[k].second);
      size_t j = k + 1;
      while (j + 1 < n && static_cast<int64_t>(seq[j + 1].first - seq[j].first) == ds &&
             static_cast<int64_t>(seq[j + 1].second - seq[j].second) == dc) {
        ++j;
      }
      b.count[0] = j - k + 1;
      b.ss[0] = ds;
      b.ds[0] = dc;
      k = j + 1;
    } else {
      k = n;
    }
    boxes.push_back(b);
  }
  return boxes;
}

// Merges runs of same-shaped (level - 1)-dimensional boxes with constant offset steps into one
// box of `level` dimensions. Returns whether anything merged.
bool MergeLevel(uint32_t level, std::vector<Box>* boxes) {
  const std::vector<Box>& in = *boxes;
  std::vector<Box> out;
  size_t i = 0;
  bool merged_any = false;
  while (i < in.size()) {
    size_t j = i;
    if (i + 1 < in.size() && in[i].ndim == level - 1 && in[i].SameShape(in[i + 1])) {
      const int64_t dso = static_cast<int64_t>(in[i + 1].soff - in[i].soff);
      const int64_t ddo = static_cast<int64_t>(in[i + 1].doff - in[i].doff);
      j = i + 1;
      while (j + 1 < in.size() && in[i].SameShape(in[j + 1]) &&
             static_cast<int64_t>(in[j + 1].soff - in[j].soff) == dso &&
             static_cast<int64_t>(in[j + 1].doff - in[j].doff) == ddo) {
        ++j;
      }
      Box m;
      m.ndim = level;
      m.soff = in[i].soff;
      m.doff = in[i].doff;
      m.count[0] = j - i + 1;
      m.ss[0] = dso;
      m.ds[0] = ddo;
      for (uint32_t d = 0; d < level - 1; ++d) {
        m.count[d + 1] = in[i].count[d];
        m.ss[d + 1] = in[i].ss[d];
        m.ds[d + 1] = in[i].ds[d];
      }
      out.push_back(m);
      merged_any = true;
    } else {
      out.push_back(in[i]);
    }
    i = j + 1;
  }
  *boxes = std::move(out);
  return merged_any;
}

// Fits boxes to a sequence of (source, canonical) pairs sorted by source: runs first, then runs
// of runs, up to kMaxSegmentDims dimensions.
std::vector<Box> FitBoxes(const std::vector<std::pair<uint64_t, uint64_t>>& seq) {
  std::vector<Box> boxes = FitRuns(seq);
  for (uint32_t level = 2; level <= kMaxSegmentDims; ++level) {
    if (!MergeLevel(level, &boxes)) break;
  }
  return boxes;
}

// The state of one map discovery. The source space numbers every element of every buffer of
// every model-parallel rank globally (buffer by buffer); the canonical space numbers every
// element of every canonical tensor. The tag passes fill, per canonical element, the source id
// its digits decode to and whether the check passes confirm it.
struct Discovery {
  struct BufRef {
    int r, b;
    uint64_t base, numel;
    int w;
  };
  std::vector<BufRef> bufs;  // in source-id order
  uint64_t total = 0;        // source elements
  int db = 8;                // bits of the source id carried per digit pass
  int digit_passes = 0;
  int passes = 0;                            // digit passes + check passes
  std::vector<uint64_t> tensor_off;          // first canonical element per tensor, then the total
  std::vector<int> tensor_w;                 // element width per tensor
  std::vector<uint64_t> decoded;             // per canonical element: decoded source id
  std::vector<uint8_t> valid;                // per canonical element: check passes agree
  std::vector<std::vector<ReadRange>> deps;  // per tensor: the source ranges the exporter reads

  uint64_t canon_total() const { return tensor_off.back(); }
  // The buffer holding source element g and g's index in it.
  size_t Locate(uint64_t g, uint64_t* i) const {
    size_t lo = 0, hi = bufs.size();
    while (hi - lo > 1) {
      size_t mid = (lo + hi) / 2;
      if (bufs[mid].base <= g)
        lo = mid;
      else
        hi = mid;
    }
    *i = g - bufs[lo].base;
    return lo;
  }
};

// Numbers both spaces and picks the passes: enough digit passes of `db` bits to spell every
// source id, then two check passes.
Discovery NumberSpaces(const TrainStructure& s) {
  Discovery d;
  const auto& ranks = s.ranks();
  int min_width = 8;
  for (size_t r = 0; r < ranks.size(); ++r) {
    for (size_t b = 0; b < ranks[r].buffers.size(); ++b) {
      const auto& bs = ranks[r].buffers[b];
      d.bufs.push_back({static_cast<int>(r), static_cast<int>(b), d.total, bs.numel, bs.width()});
      d.total += bs.numel;
      min_width = std::min(min_width, bs.width());
    }
  }
  d.db = min_width >= 2 ? 16 : 8;
  int bits = 1;
  while (bits < 64 && (d.total >> bits) != 0) ++bits;
  d.digit_passes = (bits + d.db - 1) / d.db;
  const int check_passes = 2;
  d.passes = d.digit_passes + check_passes;
  const auto& canon = s.canonical();
  d.tensor_off.assign(canon.size() + 1, 0);
  d.tensor_w.resize(canon.size());
  for (size_t t = 0; t < canon.size(); ++t) {
    d.tensor_w[t] = DTypeWidth(DTypeFromName(canon[t].dtype));
    d.tensor_off[t + 1] = d.tensor_off[t] + canon[t].num_elements();
  }
  d.decoded.assign(d.canon_total(), 0);
  d.valid.assign(d.canon_total(), 1);
  d.deps.resize(canon.size());
  return d;
}

// Fills every source buffer with the tags of pass p.
void WriteTags(const Discovery& d, int p, int threads, ShardSet* tags) {
  internal::ParallelForEach(d.bufs.size(), threads, [&](uint64_t k) {
    const Discovery::BufRef& br = d.bufs[k];
    uint8_t* out = tags->buffers[br.r][br.b].data();
    for (uint64_t i = 0; i < br.numel; ++i) {
      const uint64_t v = Tag(br.base + i, p, br.w, d.digit_passes, d.db);
      std::memcpy(out + i * br.w, &v, br.w);  // little-endian
    }
  });
}

// Exports every canonical tensor from the tags of pass p and folds what comes out into the
// decoded ids (digit passes) or the validity flags (check passes). Pass 0 also records the
// ranges each tensor's export reads.
Status ExportAndDecode(const Exporter& exporter, const ShardSet& tags, int p, int threads,
                       Discovery* d) {
  const TrainStructure& s = exporter.structure();
  const auto& canon = s.canonical();
  ShardSetReader reader(s, tags);
  std::vector<Status> st(canon.size());
  internal::ParallelForEach(canon.size(), threads, [&](uint64_t t) {
    std::vector<uint8_t> out(canon[t].nbytes());
    if (p == 0) {
      TracingReader tr(reader);
      st[t] = exporter.ExportTensor(tr, t, out.data());
      d->deps[t] = tr.Ranges();
    } else {
      st[t] = exporter.ExportTensor(reader, t, out.data());
    }
    if (!st[t].ok()) return;
    const int w = d->tensor_w[t];
    const uint64_t n = canon[t].num_elements();
    uint64_t* dec = d->decoded.data() + d->tensor_off[t];
    uint8_t* ok = d->valid.data() + d->tensor_off[t];
    const uint64_t dmask = (uint64_t{1} << d->db) - 1;
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t v = LoadBits(out.data(), w, i);
      if (p < d->digit_passes) {
        dec[i] |= (v & dmask) << (p * d->db);
      } else {
        ok[i] &= static_cast<uint8_t>(v == Tag(dec[i], p, w, d->digit_passes, d->db));
      }
    }
  });
  for (auto& x : st) DCR_RETURN_IF_ERROR(x);
  return Status::OK();
}

// The canonical elements split into index-mapped ones and the rest.
struct Classified {
  // (buffer ref index, tensor) -> (source index in the buffer, canonical index in the tensor).
  std::map<std::pair<size_t, uint32_t>, std::vector<std::pair<uint64_t, uint64_t>>> seqs;
  // Per tensor: 1 for each residual element (empty when the tensor has none).
  std::vector<std::vector<uint8_t>> residual_mask;
};

// An element is an index map when the digit passes decode a source id in range whose check-pass
// tags come out bit for bit, source and canonical element widths agree, and no other element
// already claimed that source element.
Classified ClassifyElements(const Discovery& d, const std::vector<TensorSpec>& canon) {
  Classified out;
  out.residual_mask.resize(canon.size());
  std::vector<uint8_t> claimed(d.total, 0);
  for (size_t t = 0; t < canon.size(); ++t) {
    const uint64_t n = canon[t].num_elements();
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t c = d.tensor_off[t] + i;
      bool ok = d.valid[c] != 0 && d.decoded[c] < d.total;
      uint64_t si = 0;
      size_t ref = 0;
      if (ok) {
        ref = d.Locate(d.decoded[c], &si);
        ok = d.bufs[ref].w == d.tensor_w[t] && !claimed[d.decoded[c]];
      }
      if (ok) {
        claimed[d.decoded[c]] = 1;
        out.seqs[{ref, static_cast<uint32_t>(t)}].push_back({si, i});
      } else {
        if (out.residual_mask[t].empty()) out.residual_mask[t].assign(n, 0);
        out.residual_mask[t][i] = 1;
      }
    }
  }
  return out;
}

// The affine pieces of the index-mapped elements, sorted by (rank, buffer, source offset).
std::vector<MapPiece> FitPieces(const Discovery& d, Classified* c) {
  std::vector<MapPiece> pieces;
  for (auto& [key, seq] : c->seqs) {
    std::sort(seq.begin(), seq.end());
    for (const Box& bx : FitBoxes(seq)) {
      MapPiece pc;
      pc.rank = d.bufs[key.first].r;
      pc.buffer = d.bufs[key.first].b;
      pc.tensor = key.second;
      pc.ndim = bx.ndim;
      pc.src_offset = bx.soff;
      pc.dst_offset = bx.doff;
      pc.count = bx.count;
      pc.src_stride = bx.ss;
      pc.dst_stride = bx.ds;
      pieces.push_back(pc);
    }
  }
  std::sort(pieces.begin(), pieces.end(), [](const MapPiece& a, const MapPiece& b) {
    return std::tie(a.rank, a.buffer, a.src_offset) < std::tie(b.rank, b.buffer, b.src_offset);
  });
  return pieces;
}

// The residual elements of each tensor as contiguous ranges, with the ranges its export reads.
std::vector<ResidualTensor> ResidualTensors(const Discovery& d, const Classified& c) {
  std::vector<ResidualTensor> out;
  for (size_t t = 0; t < c.residual_mask.size(); ++t) {
    if (c.residual_mask[t].empty()) continue;
    ResidualTensor rt;
    rt.tensor = static_cast<uint32_t>(t);
    const auto& m = c.residual_mask[t];
    for (uint64_t i = 0; i < m.size();) {
      if (!m[i]) {
        ++i;
        continue;
      }
      uint64_t j = i;
      while (j < m.size() && m[j]) ++j;
      rt.elements.push_back(Segment::Range(static_cast<uint32_t>(t), i, j - i));
      rt.num_elements += j - i;
      i = j;
    }
    rt.deps = d.deps[t];
    out.push_back(std::move(rt));
  }
  return out;
}

}  // namespace

StatusOr<std::shared_ptr<const LayoutMap>> LayoutMap::Discover(const Exporter& exporter,
                                                               int threads) {
  const TrainStructure& s = exporter.structure();
  Discovery d = NumberSpaces(s);
  ShardSet tags = ShardSet::Zeros(s);
  for (int p = 0; p < d.passes; ++p) {
    WriteTags(d, p, threads, &tags);
    DCR_RETURN_IF_ERROR(ExportAndDecode(exporter, tags, p, threads, &d));
  }
  Classified classified = ClassifyElements(d, s.canonical());
  auto map = std::shared_ptr<LayoutMap>(new LayoutMap());
  map->pieces_ = FitPieces(d, &classified);
  map->residual_ = ResidualTensors(d, classified);
  for (const MapPiece& pc : map->pieces_) map->stats_.affine_elements += pc.num_elements();
  for (const ResidualTensor& rt : map->residual_) {
    map->stats_.residual_elements += rt.num_elements;
  }
  map->stats_.canonical_elements = d.canon_total();
  map->stats_.pieces = map->pieces_.size();
  map->stats_.passes = d.passes;
  if (map->stats_.affine_elements + map->stats_.residual_elements != d.canon_total()) {
    return InternalError("map discovery: affine + residual elements do not cover the checkpoint");
  }
  return std::shared_ptr<const LayoutMap>(std::move(map));
}

}  // namespace dcr
