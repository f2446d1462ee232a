// Copy recording and placement maps.
#include "receivers/recorder.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "dcr/dcr_c.h"
#include "dcr/status_macros.h"

namespace dcr {

uint64_t Placement::max_element() const {
  uint64_t e = elem_offset;
  for (uint32_t d = 0; d < ndim; ++d) e += (count[d] - 1) * static_cast<uint64_t>(src_stride[d]);
  return e;
}

int64_t Placement::Locate(uint64_t e) const {
  if (e < elem_offset) return -1;
  uint64_t rel = e - elem_offset;
  int64_t byte = static_cast<int64_t>(dst_offset);
  for (uint32_t d = 0; d < ndim; ++d) {
    const uint64_t s = static_cast<uint64_t>(src_stride[d]);
    const uint64_t digit = rel / s;
    if (digit >= count[d]) return -1;
    rel -= digit * s;
    byte += static_cast<int64_t>(digit) * dst_stride[d];
  }
  return rel == 0 ? byte : -1;
}

uint64_t PlacementMap::bit_preserving_bytes() const {
  uint64_t n = 0;
  for (const auto& p : placements) n += p.num_elements() * p.width;
  return n;
}
uint64_t PlacementMap::converted_bytes() const {
  uint64_t n = 0;
  for (const auto& r : converted) n += r.tensor != kConstantRegion ? r.size : 0;
  return n;
}
uint64_t PlacementMap::constant_bytes() const {
  uint64_t n = 0;
  for (const auto& r : converted) n += r.tensor == kConstantRegion ? r.size : 0;
  return n;
}
std::set<uint32_t> PlacementMap::converted_tensors() const {
  std::set<uint32_t> s;
  for (const auto& r : converted) {
    if (r.tensor != kConstantRegion) s.insert(r.tensor);
  }
  return s;
}

std::string PlacementMap::Describe() const {
  std::vector<uint64_t> bp(buffers.size()), cv(buffers.size()), cs(buffers.size());
  std::vector<uint64_t> boxes(buffers.size());
  std::vector<std::set<uint32_t>> src(buffers.size());
  for (const auto& p : placements) {
    bp[p.buffer] += p.num_elements() * p.width;
    boxes[p.buffer]++;
    src[p.buffer].insert(p.tensor);
  }
  for (const auto& r : converted) {
    if (r.tensor == kConstantRegion) {
      cs[r.buffer] += r.size;
    } else {
      cv[r.buffer] += r.size;
      src[r.buffer].insert(r.tensor);
    }
  }
  std::ostringstream os;
  for (size_t b = 0; b < buffers.size(); ++b) {
    os << buffers[b] << ": " << bp[b] << " B bit-preserving in " << boxes[b] << " boxes, " << cv[b]
       << " B converted, " << cs[b] << " B constant; from";
    for (uint32_t t : src[b]) os << " " << tensors[t];
    os << "\n";
  }
  return os.str();
}

namespace internal {
namespace {

void RecorderObserver(void* ctx, void* dst, const void* src, size_t n, int kind) {
  static_cast<CopyRecorder*>(ctx)->OnCopy(dst, src, n, kind);
}

// Dimensions of a box with count > 1 (a single element has none).
struct Shape {
  uint32_t n = 0;
  uint64_t c[3];
  int64_t s[3], d[3];
  bool operator==(const Shape& o) const {
    if (n != o.n) return false;
    for (uint32_t i = 0; i < n; ++i) {
      if (c[i] != o.c[i] || s[i] != o.s[i] || d[i] != o.d[i]) return false;
    }
    return true;
  }
};
Shape ShapeOf(const Placement& p, uint32_t from) {
  Shape s;
  for (uint32_t i = from; i < p.ndim; ++i) {
    if (p.count[i] == 1) continue;
    s.c[s.n] = p.count[i];
    s.s[s.n] = p.src_stride[i];
    s.d[s.n] = p.dst_stride[i];
    ++s.n;
  }
  return s;
}
void SetShape(Placement* p, const Shape& s) {
  p->ndim = std::max<uint32_t>(1, s.n);
  for (uint32_t i = 0; i < 3; ++i) {
    p->count[i] = 1;
    p->src_stride[i] = i == 0 ? 1 : 0;
    p->dst_stride[i] = i == 0 ? p->width : 0;
  }
  for (uint32_t i = 0; i < s.n; ++i) {
    p->count[i] = s.c[i];
    p->src_stride[i] = s.s[i];
    p->dst_stride[i] = s.d[i];
  }
}

}  // namespace

bool AppendBox(Placement* b, const Placement& r) {
  const Shape sb = ShapeOf(*b, 0), sr = ShapeOf(r, 0);
  const int64_t de = static_cast<int64_t>(r.elem_offset) - static_cast<int64_t>(b->elem_offset);
  const int64_t dd = static_cast<int64_t>(r.dst_offset) - static_cast<int64_t>(b->dst_offset);
  const int64_t w = b->width;
  // Contiguous runs (or single elements) in both spaces.
  auto is_run = [w](const Shape& s) {
    return s.n == 0 || (s.n == 1 && s.s[0] == 1 && s.d[0] == w);
  };
  if (is_run(sb) && is_run(sr)) {
    const uint64_t nb = sb.n ? sb.c[0] : 1, nr = sr.n ? sr.c[0] : 1;
    if (de == static_cast<int64_t>(nb) && dd == static_cast<int64_t>(nb) * w) {
      Shape s;
      s.n = 1;
      s.c[0] = nb + nr;
      s.s[0] = 1;
      s.d[0] = w;
      SetShape(b, s);
      return true;
    }
  }
  // One more step along the outermost dimension.
  if (sb.n >= 1) {
    Shape inner;
    for (uint32_t i = 1; i < sb.n; ++i) {
      inner.c[inner.n] = sb.c[i];
      inner.s[inner.n] = sb.s[i];
      inner.d[inner.n] = sb.d[i];
      ++inner.n;
    }
    if (inner == sr && de == static_cast<int64_t>(sb.c[0]) * sb.s[0] &&
        dd == static_cast<int64_t>(sb.c[0]) * sb.d[0]) {
      Shape s = sb;
      s.c[0] += 1;
      SetShape(b, s);
      return true;
    }
  }
  // A new outermost dimension of two steps.
  if (sb == sr && sb.n < 3 && de > 0) {
    const uint64_t span = b->max_element() - b->elem_offset + 1;
    if (static_cast<uint64_t>(de) >= span) {
      Shape s;
      s.n = sb.n + 1;
      s.c[0] = 2;
      s.s[0] = de;
      s.d[0] = dd;
      for (uint32_t i = 0; i < sb.n; ++i) {
        s.c[i + 1] = sb.c[i];
        s.s[i + 1] = sb.s[i];
        s.d[i + 1] = sb.d[i];
      }
      SetShape(b, s);
      return true;
    }
  }
  return false;
}

CopyRecorder::CopyRecorder(const Checkpoint& ckpt) {
  ScopedHookMute mute;
  std::vector<const TensorInfo*> sorted;
  for (const auto& t : ckpt.tensors()) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->name < b->name; });
  for (size_t i = 0; i < sorted.size(); ++i) {
    map_.tensors.push_back(sorted[i]->name);
    map_.tensor_dtypes.push_back(sorted[i]->dtype);
    map_.tensor_elements.push_back(sorted[i]->num_elements());
    spans_.push_back(TensorSpan{ckpt.data_section_offset() + sorted[i]->offset, sorted[i]->nbytes,
                                static_cast<uint32_t>(i),
                                static_cast<uint8_t>(sorted[i]->width())});
  }
  std::sort(spans_.begin(), spans_.end(),
            [](const TensorSpan& a, const TensorSpan& b) { return a.file_begin < b.file_begin; });
  sources_.emplace_back(ckpt.file_data(), ckpt.file_size());
}

CopyRecorder::~CopyRecorder() { Stop(); }

void CopyRecorder::AddSource(const uint8_t* file_base, uint64_t file_size) {
  ScopedHookMute mute;
  std::lock_guard<std::mutex> l(mu_);
  sources_.emplace_back(file_base, file_size);
}

void CopyRecorder::AddBuffer(const std::string& name, uint8_t* data, uint64_t nbytes) {
  ScopedHookMute mute;
  std::lock_guard<std::mutex> l(mu_);
  map_.buffers.push_back(name);
  buffer_ranges_.emplace_back(reinterpret_cast<uintptr_t>(data), nbytes);
  buffer_order_.push_back(static_cast<uint32_t>(buffer_ranges_.size() - 1));
  std::sort(buffer_order_.begin(), buffer_order_.end(), [this](uint32_t a, uint32_t b) {
    return buffer_ranges_[a].first < buffer_ranges_[b].first;
  });
}

int64_t CopyRecorder::TensorIndex(const std::string& name) const {
  auto it = std::lower_bound(map_.tensors.begin(), map_.tensors.end(), name);
  if (it == map_.tensors.end() || *it != name) return -1;
  return it - map_.tensors.begin();
}

Status CopyRecorder::Start() {
  if (started_) return Status::OK();
  if (!CopyInterposersLinked()) {
    return FailedPreconditionError(
        "recording load: this binary does not interpose memcpy; include dcr/copy_interposers.h in "
        "one translation unit of the executable (or preload a shim that does)");
  }
  if (dcr_copy_hook_install(&RecorderObserver, this) != DCR_OK) {
    return InternalError("recording load: another copy recording is active in this process");
  }
  started_ = true;
  return Status::OK();
}

void CopyRecorder::Stop() {
  if (!started_) return;
  dcr_copy_hook_remove();
  started_ = false;
}

int CopyRecorder::FindBuffer(uintptr_t addr) const {
  // Last buffer starting at or before addr.
  int lo = 0, hi = static_cast<int>(buffer_order_.size()) - 1, found = -1;
  while (lo <= hi) {
    const int mid = (lo + hi) / 2;
    if (buffer_ranges_[buffer_order_[mid]].first <= addr) {
      found = mid;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  if (found < 0) return -1;
  const auto& r = buffer_ranges_[buffer_order_[found]];
  return addr < r.first + r.second ? static_cast<int>(buffer_order_[found]) : -1;
}

void CopyRecorder::ResolveSource(uintptr_t src, uint64_t n, std::vector<Piece>* out) const {
  out->clear();
  if (src == 0) {
    out->push_back(Piece{n, -1, 0});
    return;
  }
  for (const auto& s : sources_) {
    const uintptr_t base = reinterpret_cast<uintptr_t>(s.first);
    if (src >= base && src < base + s.second) {
      uint64_t off = src - base;
      uint64_t left = n;
      while (left > 0) {
        // Tensor containing file offset `off`.
        auto it =
            std::upper_bound(spans_.begin(), spans_.end(), off,
                             [](uint64_t o, const TensorSpan& t) { return o < t.file_begin; });
        uint64_t take;
        if (it != spans_.begin() && off < std::prev(it)->file_begin + std::prev(it)->nbytes) {
          const TensorSpan& t = *std::prev(it);
          take = std::min(left, t.file_begin + t.nbytes - off);
          out->push_back(Piece{take, t.index, off - t.file_begin});
        } else {
          const uint64_t next = it != spans_.end() ? it->file_begin : ~uint64_t{0};
          take = std::min(left, next - off);
          out->push_back(Piece{take, -1, 0});
        }
        off += take;
        left -= take;
      }
      return;
    }
  }
  // Staging memory that holds checkpoint bytes?
  uint64_t done = 0;
  while (done < n) {
    const uintptr_t a = src + done;
    auto it = provenance_.upper_bound(a);
    if (it != provenance_.begin() && std::prev(it)->second.end > a) {
      const auto& p = *std::prev(it);
      const uint64_t take = std::min<uint64_t>(n - done, p.second.end - a);
      out->push_back(Piece{take, p.second.tensor, p.second.tensor_byte + (a - p.first)});
      done += take;
    } else {
      const uint64_t next = it != provenance_.end() ? it->first : ~uintptr_t{0};
      const uint64_t take = std::min<uint64_t>(n - done, next - a);
      if (!out->empty() && out->back().tensor < 0) {
        out->back().len += take;
      } else {
        out->push_back(Piece{take, -1, 0});
      }
      done += take;
    }
  }
}

void CopyRecorder::EraseProvenance(uintptr_t a, uintptr_t b) {
  if (provenance_.empty()) return;
  auto it = provenance_.upper_bound(a);
  if (it != provenance_.begin()) {
    auto prev = std::prev(it);
    if (prev->second.end > a) {
      Prov tail = prev->second;
      const uintptr_t old_end = prev->second.end;
      prev->second.end = a;
      if (old_end > b) {
        tail.tensor_byte += b - prev->first;
        tail.end = old_end;
        provenance_[b] = tail;
      }
      if (prev->second.end == prev->first) provenance_.erase(prev);
    }
  }
  it = provenance_.lower_bound(a);
  while (it != provenance_.end() && it->first < b) {
    if (it->second.end > b) {
      Prov tail = it->second;
      tail.tensor_byte += b - it->first;
      provenance_.erase(it);
      provenance_[b] = tail;
      break;
    }
    it = provenance_.erase(it);
  }
}

void CopyRecorder::AddRegion(uint32_t tensor, uint32_t buffer, uint64_t off, uint64_t size) {
  if (!map_.converted.empty()) {
    ConvertedRegion& last = map_.converted.back();
    if (last.tensor == tensor && last.buffer == buffer && last.offset + last.size == off) {
      last.size += size;
      return;
    }
  }
  map_.converted.push_back(ConvertedRegion{tensor, buffer, off, size});
}

void CopyRecorder::CloseBox(uint64_t key) {
  auto it = open_.find(key);
  if (it == open_.end()) return;
  auto lc = last_closed_.find(key);
  if (lc != last_closed_.end() && AppendBox(&map_.placements[lc->second], it->second)) {
    open_.erase(it);
    return;
  }
  map_.placements.push_back(it->second);
  last_closed_[key] = map_.placements.size() - 1;
  open_.erase(it);
}

void CopyRecorder::AddRun(uint32_t tensor, uint64_t elem, uint64_t count, uint32_t buffer,
                          uint64_t dst_off, uint8_t width) {
  Placement r;
  r.tensor = tensor;
  r.buffer = buffer;
  r.width = width;
  r.ndim = 1;
  r.elem_offset = elem;
  r.count[0] = count;
  r.src_stride[0] = 1;
  r.dst_stride[0] = width;
  r.dst_offset = dst_off;
  const uint64_t key = (uint64_t{tensor} << 32) | buffer;
  auto it = open_.find(key);
  if (it != open_.end()) {
    if (AppendBox(&it->second, r)) return;
    CloseBox(key);
  }
  open_.emplace(key, r);
}

void CopyRecorder::OnCopy(void* dst_ptr, const void* src_ptr, size_t n, int kind) {
  std::unique_lock<std::mutex> l(mu_);
  if (buffer_ranges_.empty()) {
    pending_.push_back(Raw{dst_ptr, src_ptr, n, kind});
    return;
  }
  ++map_.copies_observed;
  const uintptr_t dst = reinterpret_cast<uintptr_t>(dst_ptr);
  const int buf = FindBuffer(dst);
  if (buf < 0) {
    // Not storage: track checkpoint provenance of staging memory.
    EraseProvenance(dst, dst + n);
    if (kind == DCR_COPY_FILL || src_ptr == nullptr) return;
    std::vector<Piece> pieces;
    ResolveSource(reinterpret_cast<uintptr_t>(src_ptr), n, &pieces);
    uint64_t at = 0;
    for (const Piece& p : pieces) {
      if (p.tensor >= 0) {
        provenance_[dst + at] =
            Prov{dst + at + p.len, static_cast<uint32_t>(p.tensor), p.tensor_byte};
      }
      at += p.len;
    }
    return;
  }
  // Clip to the buffer; the rest (another buffer) is handled recursively.
  const auto& range = buffer_ranges_[buf];
  const uint64_t off = dst - range.first;
  const uint64_t len = std::min<uint64_t>(n, range.second - off);
  if (kind == DCR_COPY_FILL || src_ptr == nullptr) {
    AddRegion(kConstantRegion, buf, off, len);
  } else {
    std::vector<Piece> pieces;
    ResolveSource(reinterpret_cast<uintptr_t>(src_ptr), len, &pieces);
    uint64_t at = 0;
    for (const Piece& p : pieces) {
      bool placed = false;
      if (p.tensor >= 0) {
        const uint8_t w = DTypeWidth(map_.tensor_dtypes[p.tensor]);
        if (p.tensor_byte % w == 0 && p.len % w == 0) {
          AddRun(static_cast<uint32_t>(p.tensor), p.tensor_byte / w, p.len / w, buf, off + at, w);
          placed = true;
        }
      }
      if (!placed) {
        const uint32_t t = p.tensor >= 0          ? static_cast<uint32_t>(p.tensor)
                           : current_tensor_ >= 0 ? static_cast<uint32_t>(current_tensor_)
                                                  : kConstantRegion;
        AddRegion(t, buf, off + at, p.len);
      }
      at += p.len;
    }
  }
  if (len < n) {
    l.unlock();
    OnCopy(reinterpret_cast<uint8_t*>(dst_ptr) + len,
           src_ptr ? static_cast<const uint8_t*>(src_ptr) + len : nullptr, n - len, kind);
  }
}

void CopyRecorder::ReplayPending() {
  ScopedHookMute mute;
  std::vector<Raw> raw;
  {
    std::lock_guard<std::mutex> l(mu_);
    raw.swap(pending_);
  }
  const int64_t t = current_tensor_;
  current_tensor_ = -1;  // writes before any tensor's load are constants
  for (const Raw& r : raw) OnCopy(r.dst, r.src, r.n, r.kind);
  current_tensor_ = t;
}

PlacementMap CopyRecorder::Finish() {
  ScopedHookMute mute;
  Stop();
  std::lock_guard<std::mutex> l(mu_);
  std::vector<uint64_t> keys;
  for (const auto& kv : open_) keys.push_back(kv.first);
  for (uint64_t k : keys) CloseBox(k);
  return map_;
}

}  // namespace internal
}  // namespace dcr
