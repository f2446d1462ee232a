// BufferApplier and the offline refit (ApplyDeltaFile).
#include "dcr/apply.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <type_traits>

#include "dcr/context.h"
#include "dcr/hash.h"
#include "dcr/status_macros.h"
#include "internal/atomic_file.h"
#include "internal/chunk_bounds.h"
#include "internal/chunk_streams.h"
#include "internal/context_codec.h"
#include "internal/element_ops.h"
#include "internal/mapped_file.h"
#include "internal/parallel.h"
#include "internal/phase_progress.h"
#include "internal/positions.h"
#include "internal/range_hasher.h"
#include "internal/simd.h"

namespace dcr {

uint64_t ApplyValue(ValueMode mode, int width, uint64_t old_bits, uint64_t value) {
  return internal::ApplyOp(static_cast<uint8_t>(mode), width, old_bits, value);
}

namespace {

// One pass over the changes: read the current bits, compute the new ones, write them, and keep
// both for the hashes (each touched cache line is visited once, while it is hot).
template <typename T, uint8_t kOp>
void ApplyPass(const std::vector<Segment>& segments, const uint64_t* __restrict pos, uint64_t k,
               T* const* seg_data, const uint64_t* __restrict values, T* __restrict ob,
               T* __restrict nb) {
  constexpr int kW = sizeof(T);
  // The loads miss cache (changes are sparse over a large range): prefetch kAhead changes ahead
  // in the common case (one contiguous segment with listed positions).
  constexpr uint64_t kAhead = 24;
  auto change = [&](T * p, uint64_t i) __attribute__((always_inline)) {
    const T o = *p;
    const T n = static_cast<T>(internal::ApplyOp(kOp, kW, o, values[i]));
    ob[i] = o;
    nb[i] = n;
    *p = n;
  };
  if (segments.size() == 1 && segments[0].IsContiguous() && pos != nullptr) {
    T* __restrict base = seg_data[0] + segments[0].offset;
    for (uint64_t i = 0; i < k; ++i) {
      if (i + kAhead < k) __builtin_prefetch(base + pos[i + kAhead], 1);
      change(base + pos[i], i);
    }
    return;
  }
  internal::ForEachPosition(segments, pos, k,
                            [&](uint64_t i, size_t s, uint64_t e) { change(seg_data[s] + e, i); });
}

// Writes the saved bits back (a chunk that failed a check leaves storage as it found it). In
// reverse order: should a malformed chunk's segments overlap, the first visit's saved bits (the
// original ones) are written last. Failure path only.
template <typename T>
void Restore(const std::vector<Segment>& segments, const uint64_t* pos, uint64_t k,
             T* const* seg_data, const T* ob) {
  std::vector<T*> where(k);
  internal::ForEachPosition(segments, pos, k,
                            [&](uint64_t i, size_t s, uint64_t e) { where[i] = seg_data[s] + e; });
  for (uint64_t i = k; i-- > 0;) *where[i] = ob[i];
}

// Whether the covered elements, after the apply, hash to the chunk's target_range_hash.
template <typename T>
bool RangeHashMatches(const ChunkHeader& h, T* const* seg_data) {
  internal::RangeHasher rh(internal::CpuHasAvx2());
  for (size_t s = 0; s < h.segments.size(); ++s) {
    const Segment& sg = h.segments[s];
    if (sg.IsContiguous()) {
      rh.Update(seg_data[s] + sg.offset, sg.count[0] * sizeof(T));
    } else {
      for (uint64_t i = 0; i < sg.num_elements(); ++i) {
        rh.Update(seg_data[s] + sg.ElementAt(i), sizeof(T));
      }
    }
  }
  return rh.Digest() == h.target_range_hash;
}

Status BaseMismatchError(const ChunkHeader& h) {
  return FailedPreconditionError("chunk " + std::to_string(h.chunk_id) +
                                 ": current bits differ from the delta's base (wrong base, or the "
                                 "chunk was already applied)");
}
Status TargetMismatchError(const ChunkHeader& h) {
  return DataLossError("chunk " + std::to_string(h.chunk_id) +
                       ": decoded values do not produce the target bits");
}
Status RangeHashError(const ChunkHeader& h) {
  return DataLossError("chunk " + std::to_string(h.chunk_id) +
                       ": target range hash mismatch after apply (storage differs from the "
                       "target outside the changed elements)");
}

// Per-thread scratch for the old and new bits of a chunk's changes, reused across chunks (fresh
// k-sized buffers cost page faults per chunk). `nb` may be null: the streamed pass keeps only the
// old bits of absolute overwrites.
template <typename T>
void ChangeScratch(uint64_t k, T** ob, T** nb) {
  thread_local std::vector<T> old_bits, new_bits;
  if (old_bits.size() < k) old_bits.resize(k);
  *ob = old_bits.data();
  if (nb != nullptr) {
    if (new_bits.size() < k) new_bits.resize(k);
    *nb = new_bits.data();
  }
}

// Calls fn(std::integral_constant<uint8_t, kOp>) for the chunk's value mode, so each pass is
// instantiated per mode with no run-time switch per change.
template <typename Fn>
auto WithOp(ValueMode mode, Fn&& fn) {
  switch (mode) {
    case ValueMode::kXor:
      return fn(std::integral_constant<uint8_t, internal::kOpXor>{});
    case ValueMode::kUlpDelta:
      return fn(std::integral_constant<uint8_t, internal::kOpUlpDelta>{});
    case ValueMode::kAbsolute:
      break;
  }
  return fn(std::integral_constant<uint8_t, internal::kOpAbsolute>{});
}

// Calls fn(T{}) with T the unsigned element type of `width` bytes (1, 2, 4, else 8).
template <typename Fn>
auto WithWidth(int width, Fn&& fn) {
  switch (width) {
    case 1:
      return fn(uint8_t{});
    case 2:
      return fn(uint16_t{});
    case 4:
      return fn(uint32_t{});
    default:
      return fn(uint64_t{});
  }
}

// The typed apply: read-compute-write in one pass, then check the base and target bits of the
// changes against the chunk's hashes; on a mismatch the old bits are written back. All-or-
// nothing as seen by the caller (chunks cover disjoint elements, so no other apply sees the
// intermediate state).
template <typename T>
Status ApplyTyped(const DecodedChunk& chunk, const std::vector<TensorBuffer>& tensors,
                  bool verify_ranges) {
  const ChunkHeader& h = chunk.header;
  const uint64_t k = h.num_changes;
  const uint64_t* pos = h.position_mode == PositionMode::kDense ? nullptr : chunk.positions.data();
  T* seg_stack[16];
  std::vector<T*> seg_heap;
  T** seg_data = seg_stack;
  if (h.segments.size() > 16) {
    seg_heap.resize(h.segments.size());
    seg_data = seg_heap.data();
  }
  for (size_t s = 0; s < h.segments.size(); ++s)
    seg_data[s] = reinterpret_cast<T*>(tensors[h.segments[s].tensor_index].data);
  T* ob;
  T* nb;
  ChangeScratch<T>(k, &ob, &nb);
  WithOp(h.value_mode, [&](auto op) {
    ApplyPass<T, op.value>(h.segments, pos, k, seg_data, chunk.values.data(), ob, nb);
  });
  if (IsRelative(h.value_mode) && BytesHash128(ob, k * sizeof(T)) != h.base_change_hash) {
    Restore(h.segments, pos, k, seg_data, ob);
    return BaseMismatchError(h);
  }
  if (BytesHash128(nb, k * sizeof(T)) != h.target_change_hash) {
    Restore(h.segments, pos, k, seg_data, ob);
    return TargetMismatchError(h);
  }
  if (verify_ranges && !RangeHashMatches(h, seg_data)) {
    Restore(h.segments, pos, k, seg_data, ob);
    return RangeHashError(h);
  }
  return Status::OK();
}

// Changes whose positions the streamed pass (and its restore) expand at a time.
constexpr uint64_t kStreamBatch = 512;

// The streamed pass over a chunk of one contiguous segment at `base`: positions are expanded a
// batch at a time into small buffers that stay in L1, values are read from the byte planes. The
// next batch is expanded before the current one is patched, so the prefetches `ahead` changes
// ahead run across batch boundaries. Each batch's old and new bits are added to the change hashes
// while in L1: hashing k-sized arrays after the pass read them back from beyond L2 (2 x 1.6 MB at
// 5%), which cost ~5% of decode+apply. A relative op (XOR, ulp) is undone from the bits it wrote
// and its value (UndoOp), so its old bits need no k-sized copy for a restore: only an absolute
// overwrite saves them, in `ob` (null otherwise). `old_hash` is null for absolute values (no base
// check). Returns nullptr, or what is wrong with the position stream; *done = changes applied.
template <typename T, uint8_t kOp>
const char* StreamedPass(const internal::ChunkStreams& cs, T* __restrict base, T* __restrict ob,
                         internal::RangeHasher* old_hash, internal::RangeHasher* new_hash,
                         uint64_t* done) {
  constexpr int kW = sizeof(T);
  constexpr uint64_t kBatch = kStreamBatch;
  constexpr bool kSaveOld = kOp == internal::kOpAbsolute;
  const uint64_t k = cs.header.num_changes;
  // Prefetch distance in changes: about 3 KiB of storage ahead, at least 24 changes (ApplyPass's
  // distance) and at most half a batch. A fixed count of changes is too close at high change
  // rates: 24 changes are 960 bytes at 5% (BF16), where 3 KiB made decode+apply ~10% faster;
  // at 1% the floor keeps 24 (4.8 KiB ahead).
  constexpr uint64_t kAheadBytes = 3072;
  const uint64_t ahead = std::clamp<uint64_t>(
      kAheadBytes * k / std::max<uint64_t>(1, cs.header.num_elements * kW), 24, kBatch / 2);
  internal::PositionReader reader(cs);
  uint64_t pos[2][kBatch];
  T old_batch[kBatch], new_batch[kBatch];
  *done = 0;
  uint64_t n = std::min(kBatch, k);
  if (const char* bad = reader.Next(n, pos[0])) return bad;
  int cur = 0;
  for (uint64_t i = 0; i < k;) {
    const uint64_t* __restrict now = pos[cur];
    uint64_t* __restrict next = pos[cur ^ 1];
    const uint64_t next_n = std::min(kBatch, k - i - n);
    if (const char* bad = reader.Next(next_n, next)) {
      *done = i;
      return bad;
    }
    auto change = [&](uint64_t j) __attribute__((always_inline)) {
      T* p = base + now[j];
      const T o = *p;
      const T v = internal::PlaneValue<T>(cs.planes, i + j);
      const T nw = static_cast<T>(internal::ApplyOp(kOp, kW, o, v));
      if constexpr (kSaveOld) {
        ob[i + j] = o;
      } else {
        old_batch[j] = o;
      }
      new_batch[j] = nw;
      *p = nw;
    };
    uint64_t j = 0;
    for (; j + ahead < n; ++j) {
      __builtin_prefetch(base + now[j + ahead], 1);
      change(j);
    }
    for (; j < n; ++j) {
      if (j + ahead - n < next_n) __builtin_prefetch(base + next[j + ahead - n], 1);
      change(j);
    }
    if constexpr (!kSaveOld) old_hash->Update(old_batch, n * sizeof(T));
    new_hash->Update(new_batch, n * sizeof(T));
    i += n;
    n = next_n;
    cur ^= 1;
  }
  *done = k;
  return nullptr;
}

// Takes the first `count` changes back (failure path only): an absolute overwrite writes the
// saved bits `ob`, a relative op is undone from its value. The positions of the changes applied
// are a valid prefix of the stream: expanding them again cannot fail, and they are distinct, so
// each element is undone once.
template <typename T, uint8_t kOp>
void RestoreStreamed(const internal::ChunkStreams& cs, T* base, const T* ob, uint64_t count) {
  internal::PositionReader reader(cs);
  uint64_t pos[kStreamBatch];
  for (uint64_t i = 0; i < count;) {
    const uint64_t n = std::min(kStreamBatch, count - i);
    reader.Next(n, pos);
    for (uint64_t j = 0; j < n; ++j) {
      if constexpr (kOp == internal::kOpAbsolute) {
        base[pos[j]] = ob[i + j];
      } else {
        base[pos[j]] = static_cast<T>(internal::UndoOp(kOp, sizeof(T), base[pos[j]],
                                                       internal::PlaneValue<T>(cs.planes, i + j)));
      }
    }
    i += n;
  }
}

// ApplyTyped for a chunk of one contiguous segment, from its streams.
template <typename T, uint8_t kOp>
Status ApplyStreamedOp(const internal::ChunkStreams& cs, const std::vector<TensorBuffer>& tensors,
                       bool verify_ranges) {
  const ChunkHeader& h = cs.header;
  const uint64_t k = h.num_changes;
  T* const seg_data = reinterpret_cast<T*>(tensors[h.segments[0].tensor_index].data);
  T* const base = seg_data + h.segments[0].offset;
  constexpr bool kRelative = kOp != internal::kOpAbsolute;
  T* ob = nullptr;
  if constexpr (!kRelative) ChangeScratch<T>(k, &ob, nullptr);
  const bool avx2 = internal::CpuHasAvx2();
  internal::RangeHasher old_hash(avx2), new_hash(avx2);
  uint64_t done = 0;
  if (const char* bad =
          StreamedPass<T, kOp>(cs, base, ob, kRelative ? &old_hash : nullptr, &new_hash, &done)) {
    RestoreStreamed<T, kOp>(cs, base, ob, done);
    return DataLossError("chunk " + std::to_string(h.chunk_id) + ": " + bad);
  }
  if (kRelative && old_hash.Digest() != h.base_change_hash) {
    RestoreStreamed<T, kOp>(cs, base, ob, k);
    return BaseMismatchError(h);
  }
  if (new_hash.Digest() != h.target_change_hash) {
    RestoreStreamed<T, kOp>(cs, base, ob, k);
    return TargetMismatchError(h);
  }
  T* const seg_ptrs[1] = {seg_data};
  if (verify_ranges && !RangeHashMatches(h, seg_ptrs)) {
    RestoreStreamed<T, kOp>(cs, base, ob, k);
    return RangeHashError(h);
  }
  return Status::OK();
}

// Whether every segment of `h` lies inside its tensor and has the tensor's element width
// (internal/chunk_bounds.h): checked before anything of a record is decoded.
Status CheckSegments(const ChunkHeader& h, const std::vector<TensorBuffer>& tensors) {
  return internal::CheckChunkBounds(h, tensors);
}

}  // namespace

Status BufferApplier::ApplyChunk(const DecodedChunk& chunk) {
  const ChunkHeader& h = chunk.header;
  DCR_RETURN_IF_ERROR(CheckSegments(h, tensors_));
  const uint64_t k = h.num_changes;
  const bool dense = h.position_mode == PositionMode::kDense;
  if ((!dense && chunk.positions.size() != k) || chunk.values.size() != k) {
    return InvalidArgumentError("decoded chunk is inconsistent with its header");
  }
  DCR_RETURN_IF_ERROR(WithWidth(h.elem_width, [&](auto t) {
    return ApplyTyped<decltype(t)>(chunk, tensors_, verify_ranges_);
  }));
  AddVersionDelta(h.version_delta);
  return Status::OK();
}

namespace {

// The apply of a context-coded chunk of one contiguous segment at `base`, fed by the class walk
// (WalkSink): each window's changes are applied while the window's elements are in L1 (the walk
// has just read them for the class masks), and their old and new bits added to the change
// hashes a batch at a time, so no pass over the chunk's storage or over k-sized copies of the
// bits follows the decode. Context-coded values are relative (XOR, ulp), so a chunk that fails a
// check is taken back from the positions and values the walk wrote (UndoOp), not from saved
// bits.
template <typename T, uint8_t kOp>
struct ContextApply {
  T* base;
  internal::RangeHasher* old_hash;
  internal::RangeHasher* new_hash;
  uint64_t applied = 0;  // changes handed on and applied, from the first

  static void Run(void* ctx, const uint64_t* __restrict pos, const uint64_t* __restrict vals,
                  uint64_t count) {
    auto* a = static_cast<ContextApply*>(ctx);
    T* __restrict const base = a->base;
    T old_batch[kStreamBatch], new_batch[kStreamBatch];
    for (uint64_t i = 0; i < count;) {
      const uint64_t n = std::min(kStreamBatch, count - i);
      for (uint64_t j = 0; j < n; ++j) {
        T* p = base + pos[i + j];
        const T o = *p;
        const T nw = static_cast<T>(internal::ApplyOp(kOp, sizeof(T), o, vals[i + j]));
        old_batch[j] = o;
        new_batch[j] = nw;
        *p = nw;
      }
      a->old_hash->Update(old_batch, n * sizeof(T));
      a->new_hash->Update(new_batch, n * sizeof(T));
      i += n;
    }
    a->applied += count;
  }

  // Takes back the first `count` changes of pos[] and vals[] (failure path only).
  void Undo(const uint64_t* pos, const uint64_t* vals, uint64_t count) const {
    for (uint64_t i = count; i-- > 0;) {
      base[pos[i]] = static_cast<T>(internal::UndoOp(kOp, sizeof(T), base[pos[i]], vals[i]));
    }
  }
};

// The decoded changes of a context-coded chunk, per thread and reused (the undo log of
// ApplyContextInPlace).
DecodedChunk& ContextScratch() {
  thread_local DecodedChunk dc;
  return dc;
}

// Decodes a context-coded chunk of one contiguous segment against its storage and applies it
// in the same pass (ContextApply); all-or-nothing like ApplyTyped.
template <typename T, uint8_t kOp>
Status ApplyContextInPlace(const uint8_t* data, size_t size, const ChunkHeader& h,
                           const std::vector<TensorBuffer>& tensors, bool verify_ranges) {
  T* const seg_data = reinterpret_cast<T*>(tensors[h.segments[0].tensor_index].data);
  const bool avx2 = internal::CpuHasAvx2();
  internal::RangeHasher old_hash(avx2), new_hash(avx2);
  ContextApply<T, kOp> ap{seg_data + h.segments[0].offset, &old_hash, &new_hash};
  const internal::WalkSink sink{&ContextApply<T, kOp>::Run, &ap};
  DecodedChunk& dc = ContextScratch();
  const Status st =
      internal::DecodeContextRecord(data, size, reinterpret_cast<const uint8_t*>(ap.base),
                                    h.num_elements * sizeof(T), &dc, false, &sink);
  if (!st.ok()) {
    ap.Undo(dc.positions.data(), dc.values.data(), ap.applied);
    return st;
  }
  const uint64_t k = h.num_changes;
  if (old_hash.Digest() != h.base_change_hash) {
    ap.Undo(dc.positions.data(), dc.values.data(), k);
    return BaseMismatchError(h);
  }
  if (new_hash.Digest() != h.target_change_hash) {
    ap.Undo(dc.positions.data(), dc.values.data(), k);
    return TargetMismatchError(h);
  }
  T* const seg_ptrs[1] = {seg_data};
  if (verify_ranges && !RangeHashMatches(h, seg_ptrs)) {
    ap.Undo(dc.positions.data(), dc.values.data(), k);
    return RangeHashError(h);
  }
  return Status::OK();
}

// Whether a record's header says it is context-coded (the compact header's magic, or the position
// mode byte of a "DCRC" header; the header is checked in full by whatever decodes it).
bool LooksContextCoded(const uint8_t* data, size_t size) {
  if (size >= 4 && std::memcmp(data, kContextChunkMagic, 4) == 0) return true;
  return size > 16 && (data[16] == static_cast<uint8_t>(PositionMode::kContext) ||
                       data[16] == static_cast<uint8_t>(PositionMode::kContextV7));
}

}  // namespace

Status BufferApplier::ApplyRecord(const uint8_t* data, size_t size, uint64_t* num_changes) {
  size_t hsize = 0, rsize = 0;
  DCR_ASSIGN_OR_RETURN(ChunkHeader h, ParseChunkHeader(data, size, &hsize, &rsize));
  return ApplyParsedRecord(data, size, h, hsize, rsize, num_changes);
}

Status BufferApplier::ApplyParsedRecord(const uint8_t* data, size_t size, const ChunkHeader& h,
                                        size_t hsize, size_t rsize, uint64_t* num_changes) {
  // No exception leaves: an allocation the record asks for that fails is a Status.
  return internal::NoThrow("applying a chunk record", [&]() -> Status {
    if (LooksContextCoded(data, size)) {
      // Decoded against the buffers' current bits (the base), then applied as a plain chunk.
      DCR_RETURN_IF_ERROR(CheckSegments(h, tensors_));
      if (num_changes != nullptr) *num_changes = h.num_changes;
      const int w = h.elem_width;
      if (h.segments.size() == 1 && h.segments[0].IsContiguous() && IsRelative(h.value_mode) &&
          (w == 2 || w == 4 || w == 8)) {
        DCR_RETURN_IF_ERROR(WithWidth(h.elem_width, [&](auto t) {
          return WithOp(h.value_mode, [&](auto op) -> Status {
            if constexpr (op.value == internal::kOpAbsolute) {
              return InternalError("absolute values are not context-coded");
            } else {
              return ApplyContextInPlace<decltype(t), op.value>(data, size, h, tensors_,
                                                                verify_ranges_);
            }
          });
        }));
        AddVersionDelta(h.version_delta);
        return Status::OK();
      }
      thread_local std::vector<uint8_t> gathered;
      const uint8_t* base;
      const uint64_t bytes = h.num_elements * h.elem_width;
      if (h.segments.size() == 1 && h.segments[0].IsContiguous()) {
        base = tensors_[h.segments[0].tensor_index].data + h.segments[0].offset * h.elem_width;
      } else {
        DCR_RETURN_IF_ERROR(GatherCoveredBits(h, tensors_, &gathered));
        base = gathered.data();
      }
      // ApplyChunk checks the change hashes (and takes the chunk back on a mismatch).
      thread_local DecodedChunk dc;
      DCR_RETURN_IF_ERROR(internal::DecodeContextRecord(data, size, base, bytes, &dc, false));
      return ApplyChunk(dc);
    }
    // The segments fit the tensors before anything of the record is decoded.
    DCR_RETURN_IF_ERROR(CheckSegments(h, tensors_));
    internal::ChunkStreams cs;
    DCR_RETURN_IF_ERROR(internal::DecodeChunkStreams(data, size, h, hsize, rsize, &cs));
    if (num_changes != nullptr) *num_changes = h.num_changes;
    if (h.segments.size() != 1 || !h.segments[0].IsContiguous()) {
      // Batched small tensors and strided cells: the general path over expanded arrays.
      thread_local DecodedChunk dc;
      DCR_RETURN_IF_ERROR(internal::ExpandChunk(std::move(cs), &dc));
      return ApplyChunk(dc);
    }
    DCR_RETURN_IF_ERROR(WithWidth(h.elem_width, [&](auto t) {
      return WithOp(h.value_mode, [&](auto op) {
        return ApplyStreamedOp<decltype(t), op.value>(cs, tensors_, verify_ranges_);
      });
    }));
    AddVersionDelta(h.version_delta);
    return Status::OK();
  });
}

void BufferApplier::AddVersionDelta(const Hash128& d) {
  std::lock_guard<std::mutex> lock(mu_);
  HashAdd(&hash_delta_, d);
}

namespace {

// ---- the offline refit's output writer ----
//
// The output is written with pwrite into an AtomicFile whose blocks are allocated first
// (posix_fallocate: a full filesystem is kResourceExhausted before anything is written), never
// through a writable mapping (where a full disk or an I/O error would be a SIGBUS). Memory: the
// base is copied from its read-only mapping in blocks of kCopyBlockBytes, and each chunk's covered
// elements are read into a per-thread scratch buffer (the chunk's num_elements x elem_width
// bytes: chunk_elems x width for BuildDelta's grid), patched there and written back. Anonymous
// memory therefore does not grow with the checkpoint. A chunk of one contiguous range that no other
// chunk overlaps (every chunk of BuildDelta's grid for a large tensor) reads its range from the
// base instead and the base copy skips it, so each of those output bytes is written once.

constexpr uint64_t kCopyBlockBytes = uint64_t{8} << 20;
// The largest covered range of one chunk the writer takes into memory (the per-thread scratch);
// a record covering more is refused (kResourceExhausted) rather than allocated.
constexpr uint64_t kMaxChunkWindowBytes = uint64_t{1} << 30;

// Where an output tensor lives: element e is at byte offset + e * width of `file`.
struct OutputTensor {
  internal::AtomicFile* file = nullptr;
  uint64_t offset = 0;
  uint64_t num_elements = 0;
  int width = 1;
  const uint8_t* base = nullptr;  // the tensor's bytes in the base mapping; null: zeros
};

// Calls fn(tensor, byte offset in the tensor, bytes) for the covered elements of `h`'s segments
// in covered order, as runs of contiguous bytes (the innermost dimension when its stride is 1,
// else single elements; adjacent runs of one tensor merged). REQUIRES: CheckSegments(h, ...)
// passed for these tensors.
template <typename Fn>
Status ForEachRun(const ChunkHeader& h, const std::vector<OutputTensor>& tensors, Fn&& fn) {
  const uint64_t w = h.elem_width;
  const OutputTensor* run_tensor = nullptr;
  uint64_t run_off = 0, run_bytes = 0;
  for (const Segment& sg : h.segments) {
    const OutputTensor& t = tensors[sg.tensor_index];
    const uint32_t last = sg.ndim - 1;
    const uint64_t inner = sg.stride[last] == 1 ? sg.count[last] : 1;
    const uint64_t runs = sg.num_elements() / inner;
    for (uint64_t r = 0; r < runs; ++r) {
      const uint64_t off = sg.ElementAt(r * inner) * w;
      if (run_tensor == &t && run_bytes > 0 && run_off + run_bytes == off) {
        run_bytes += inner * w;
        continue;
      }
      if (run_bytes > 0) DCR_RETURN_IF_ERROR(fn(*run_tensor, run_off, run_bytes));
      run_tensor = &t;
      run_off = off;
      run_bytes = inner * w;
    }
  }
  if (run_bytes > 0) DCR_RETURN_IF_ERROR(fn(*run_tensor, run_off, run_bytes));
  return Status::OK();
}

// A byte range [begin, end) of tensor `tensor` that one chunk covers alone.
struct Span {
  size_t tensor;
  uint64_t begin, end;
};

// The chunks of the delta that cover one contiguous range each (every chunk of BuildDelta's grid
// for a large tensor) and whose ranges overlap no other such chunk: fused[i] says whether chunk
// i is one, and *spans lists their ranges sorted. For these the base bytes are not copied first:
// the chunk reads them from the base itself and writes the output once. A chunk whose header does
// not parse or check is left to the apply pass, which reports it.
void FusedChunks(const DeltaReader& delta, const std::vector<TensorBuffer>& shapes,
                 std::vector<bool>* fused, std::vector<Span>* spans) {
  fused->assign(delta.num_chunks(), false);
  std::vector<std::pair<Span, size_t>> found;
  for (size_t i = 0; i < delta.num_chunks(); ++i) {
    size_t hsize = 0, rsize = 0;
    auto h = ParseChunkHeader(delta.chunk_data(i), delta.chunk_size(i), &hsize, &rsize);
    if (!h.ok() || h->segments.size() != 1 || !h->segments[0].IsContiguous()) continue;
    if (!CheckSegments(*h, shapes).ok()) continue;
    const Segment& sg = h->segments[0];
    const uint64_t w = h->elem_width;
    found.push_back({Span{sg.tensor_index, sg.offset * w, (sg.offset + sg.count[0]) * w}, i});
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
    return a.first.tensor != b.first.tensor ? a.first.tensor < b.first.tensor
                                            : a.first.begin < b.first.begin;
  });
  std::vector<bool> overlaps(found.size(), false);
  for (size_t k = 1; k < found.size(); ++k) {
    if (found[k].first.tensor == found[k - 1].first.tensor &&
        found[k].first.begin < found[k - 1].first.end) {
      overlaps[k] = overlaps[k - 1] = true;
    }
  }
  spans->clear();
  for (size_t k = 0; k < found.size(); ++k) {
    if (overlaps[k]) continue;
    (*fused)[found[k].second] = true;
    spans->push_back(found[k].first);
  }
}

Status PRead(internal::AtomicFile* f, uint8_t* p, uint64_t n, uint64_t off) {
  while (n > 0) {
    ssize_t got =
        ::pread(f->fd(), p, std::min<uint64_t>(n, uint64_t{1} << 30), static_cast<off_t>(off));
    if (got < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("read " + f->tmp_path(), errno);
    }
    if (got == 0) return DataLossError("read " + f->tmp_path() + ": unexpected end of file");
    p += got;
    off += static_cast<uint64_t>(got);
    n -= static_cast<uint64_t>(got);
  }
  return Status::OK();
}

// Copies every tensor's base bytes into its file except the ranges in `skip` (sorted; the fused
// chunks write those), in blocks on `threads` threads; writeback of each block is started at
// once, so dirty pages do not pile up, and the base block read is marked done. A tensor without a
// base stays as allocated: zeros.
Status CopyBaseTensors(const std::vector<OutputTensor>& tensors, const std::vector<Span>& skip,
                       int threads, internal::PhaseProgress* progress) {
  struct Block {
    size_t t;
    uint64_t begin, bytes;
  };
  std::vector<Block> blocks;
  auto add = [&](size_t t, uint64_t begin, uint64_t end) {
    for (uint64_t b = begin; b < end; b += kCopyBlockBytes) {
      blocks.push_back({t, b, std::min(kCopyBlockBytes, end - b)});
    }
  };
  size_t k = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t n = tensors[i].num_elements * static_cast<uint64_t>(tensors[i].width);
    uint64_t at = 0;
    for (; k < skip.size() && skip[k].tensor == i; ++k) {
      add(i, at, skip[k].begin);
      at = skip[k].end;
    }
    add(i, at, n);
  }
  if (tensors.empty() || blocks.empty()) return Status::OK();
  std::mutex mu;
  Status first_error;
  internal::ParallelFor(blocks.size(), threads, [&](uint64_t k) {
    const Block& b = blocks[k];
    const OutputTensor& t = tensors[b.t];
    if (t.base == nullptr) return true;
    Status s = t.file->PWrite(t.base + b.begin, b.bytes, t.offset + b.begin);
    if (s.ok()) {
      (void)::sync_file_range(t.file->fd(), static_cast<off_t>(t.offset + b.begin),
                              static_cast<off_t>(b.bytes), SYNC_FILE_RANGE_WRITE);
      internal::AdviseDone(t.base + b.begin, b.bytes);
      progress->Add(b.bytes);
      return true;
    }
    std::lock_guard<std::mutex> lock(mu);
    if (first_error.ok()) first_error = s;
    return false;
  });
  return first_error;
}

// Decodes one chunk record and applies it to the output files: its covered elements are read
// (in covered order) into the calling thread's scratch, which is then one contiguous range of
// elements, patched with the checks of BufferApplier::ApplyRecord, and written back. Thread-safe
// for chunks covering disjoint elements. Nothing is written back when a check fails.
// With `from_base` the covered elements are read from the base instead (zeros without one): for
// the fused chunks, whose range the base copy skipped.
Status ApplyRecordToFiles(const uint8_t* data, size_t size, const std::vector<OutputTensor>& out,
                          const std::vector<TensorBuffer>& shapes, bool from_base,
                          uint64_t* num_changes, Hash128* version_delta) {
  internal::ChunkStreams cs;
  const bool context = LooksContextCoded(data, size);
  // The segments fit the tensors before anything of the record is decoded.
  DCR_ASSIGN_OR_RETURN(cs.header, ParseChunkHeader(data, size, nullptr, nullptr));
  DCR_RETURN_IF_ERROR(CheckSegments(cs.header, shapes));
  if (!context) DCR_RETURN_IF_ERROR(internal::DecodeChunkStreams(data, size, &cs));
  ChunkHeader& h = cs.header;
  const uint64_t bytes = h.num_elements * h.elem_width;  // num_elements <= 2^34: no overflow
  if (bytes > kMaxChunkWindowBytes) {
    return ResourceExhaustedError("chunk " + std::to_string(h.chunk_id) + " covers " +
                                  std::to_string(bytes) + " bytes, over the " +
                                  std::to_string(kMaxChunkWindowBytes) +
                                  "-byte window the offline refit holds per thread");
  }
  thread_local std::vector<uint8_t> scratch;
  if (scratch.size() < bytes) scratch.resize(bytes);
  uint8_t* p = scratch.data();
  DCR_RETURN_IF_ERROR(ForEachRun(h, out, [&](const OutputTensor& t, uint64_t off, uint64_t n) {
    Status s;
    if (!from_base) {
      s = PRead(t.file, p, n, t.offset + off);
    } else if (t.base != nullptr) {
      std::memcpy(p, t.base + off, n);
      internal::AdviseDone(t.base + off, n);
    } else {
      std::memset(p, 0, n);
    }
    p += n;
    return s;
  }));
  // The covered elements, gathered, are elements 0 .. num_elements-1 of one buffer: the chunk
  // applies there as a chunk of one contiguous segment (positions index covered elements).
  const std::vector<Segment> segments = std::move(h.segments);
  h.segments = {Segment::Range(0, 0, h.num_elements)};
  const std::vector<TensorBuffer> window = {
      TensorBuffer{scratch.data(), h.num_elements, h.elem_width, 0}};
  if (context) {
    // Decoded against the gathered base bits, then applied to them as a plain chunk.
    thread_local DecodedChunk dc;
    DCR_RETURN_IF_ERROR(
        internal::DecodeContextRecord(data, size, scratch.data(), bytes, &dc, false));
    dc.header.segments = h.segments;
    DCR_RETURN_IF_ERROR(WithWidth(
        h.elem_width, [&](auto t) { return ApplyTyped<decltype(t)>(dc, window, false); }));
  } else {
    DCR_RETURN_IF_ERROR(WithWidth(h.elem_width, [&](auto t) {
      return WithOp(h.value_mode, [&](auto op) {
        return ApplyStreamedOp<decltype(t), op.value>(cs, window, false);
      });
    }));
  }
  h.segments = segments;
  p = scratch.data();
  DCR_RETURN_IF_ERROR(ForEachRun(h, out, [&](const OutputTensor& t, uint64_t off, uint64_t n) {
    Status s = t.file->PWrite(p, n, t.offset + off);
    p += n;
    return s;
  }));
  *num_changes = h.num_changes;
  *version_delta = h.version_delta;
  return Status::OK();
}

}  // namespace

StatusOr<ApplyStats> ApplyDeltaFile(const std::string& base_path, const std::string& delta_path,
                                    const std::string& out_path, const ApplyOptions& options) {
  DCR_ASSIGN_OR_RETURN(auto delta, DeltaReader::Open(delta_path));
  if (options.check_delta) {
    Status checked = options.check_delta(*delta);
    if (!checked.ok()) return checked.WithContext(delta_path);
  }
  const FileHeader& fh = delta->header();
  const Inventory& inv = delta->inventory();
  const bool no_base = (fh.flags & kFlagNoBase) != 0;
  std::unique_ptr<Checkpoint> base;
  if (!no_base) {
    DCR_ASSIGN_OR_RETURN(base, Checkpoint::Open(base_path));
    for (const TensorInfo& t : inv.tensors) {
      const TensorInfo* bt = base->Find(t.name);
      if (bt == nullptr || bt->dtype_name != t.dtype_name || bt->shape != t.shape) {
        return FailedPreconditionError("base " + base_path +
                                       " does not match the delta's tensor '" + t.name +
                                       "' (missing, or another dtype/shape)");
      }
    }
    if (base->tensors().size() != inv.tensors.size()) {
      return FailedPreconditionError("base " + base_path + " has tensors the delta's target lacks");
    }
    // Read once front to back (the hash, then the copy): sequential, marked done as it goes.
    for (const TensorInfo& t : base->tensors()) internal::AdviseSequential(base->data(t), t.nbytes);
    if (options.verify_base) {
      Hash128 bh = base->ContentHash(options.threads, options.progress, "hash base");
      if (bh != fh.base_hash) {
        return FailedPreconditionError("base " + base_path + " has content hash " + bh.ToHex() +
                                       " but the delta was built for " + fh.base_hash.ToHex());
      }
    }
  }
  // The output: one file, or a directory of the target's shards (and its index) that appears
  // whole on commit. Each file is allocated in full and its header written first.
  std::unique_ptr<internal::AtomicDirectory> dir;
  if (inv.sharded()) {
    DCR_ASSIGN_OR_RETURN(dir, internal::AtomicDirectory::Create(out_path));
  }
  std::vector<std::unique_ptr<internal::AtomicFile>> files;
  std::vector<uint64_t> data_sections;
  for (const InventoryFile& f : inv.files) {
    DCR_ASSIGN_OR_RETURN(auto file,
                         internal::AtomicFile::Create(dir ? dir->FilePath(f.name) : out_path));
    DCR_RETURN_IF_ERROR(file->Reserve(f.file_size()));
    std::string head(8, '\0');
    const uint64_t hlen = f.json.size();
    std::memcpy(head.data(), &hlen, 8);
    head += f.json;
    DCR_RETURN_IF_ERROR(file->PWrite(head.data(), head.size(), 0));
    data_sections.push_back(head.size());
    files.push_back(std::move(file));
  }
  std::vector<OutputTensor> out;
  std::vector<TensorBuffer> shapes;  // sizes and widths for CheckSegments (no storage)
  for (size_t i = 0; i < inv.tensors.size(); ++i) {
    const TensorInfo& t = inv.tensors[i];
    OutputTensor o;
    o.file = files[t.file].get();
    o.offset = data_sections[t.file] + t.offset;
    o.num_elements = t.num_elements();
    o.width = t.width();
    if (!no_base) o.base = base->data(*base->Find(t.name));
    out.push_back(o);
    shapes.push_back(TensorBuffer{nullptr, t.num_elements(), t.width(), inv.salts[i]});
  }
  uint64_t tensor_bytes = 0;
  for (const TensorInfo& t : inv.tensors) tensor_bytes += t.nbytes;
  std::vector<bool> fused;
  std::vector<Span> spans;
  FusedChunks(*delta, shapes, &fused, &spans);
  if (!no_base) {
    // The phase counts every tensor byte; the fused chunks' ranges, which the apply pass takes
    // from the base, are counted at its start.
    internal::PhaseProgress progress(options.progress, "copy base", tensor_bytes);
    for (const Span& sp : spans) progress.Add(sp.end - sp.begin);
    DCR_RETURN_IF_ERROR(CopyBaseTensors(out, spans, options.threads, &progress));
    progress.Finish();
  }
  // Starting hash: the base's (verified above) or, without a base, the identity terms alone (a
  // full frame's version_delta carries every element's term).
  Hash128 start = fh.base_hash;
  if (no_base) {
    start = Hash128{};
    for (const TensorInfo& t : inv.tensors)
      HashAdd(&start, TensorIdentityTerm(t.name, t.dtype_name, t.shape));
  }
  std::mutex mu;
  Status first_error;
  Hash128 moved;
  std::atomic<uint64_t> changes{0};
  uint64_t chunk_bytes = 0;
  for (size_t i = 0; i < delta->num_chunks(); ++i) chunk_bytes += delta->chunk_size(i);
  internal::PhaseProgress progress(options.progress, "apply", chunk_bytes);
  // The fused chunks first (they write ranges no other chunk was found to cover), then the rest,
  // which read their covered elements back from the output as the base copy and the fused chunks
  // left it.
  std::vector<uint64_t> order[2];
  for (uint64_t i = 0; i < delta->num_chunks(); ++i) order[fused[i] ? 0 : 1].push_back(i);
  for (int pass = 0; pass < 2 && first_error.ok(); ++pass) {
    const std::vector<uint64_t>& chunks = order[pass];
    internal::ParallelFor(chunks.size(), options.threads, [&](uint64_t j) {
      const uint64_t i = chunks[j];
      uint64_t k = 0;
      Hash128 d;
      Status s = internal::NoThrow("applying a chunk", [&] {
        return ApplyRecordToFiles(delta->chunk_data(i), delta->chunk_size(i), out, shapes,
                                  pass == 0, &k, &d);
      });
      if (s.ok()) progress.Add(delta->chunk_size(i));
      std::lock_guard<std::mutex> lock(mu);
      if (s.ok()) {
        changes += k;
        HashAdd(&moved, d);
        return true;
      }
      if (first_error.ok()) first_error = s.WithContext("chunk table entry " + std::to_string(i));
      return false;
    });
  }
  DCR_RETURN_IF_ERROR(first_error);
  progress.Finish();
  Hash128 result = start;
  HashAdd(&result, moved);
  if (result != delta->trailer().target_hash) {
    return DataLossError("refit result hash " + result.ToHex() +
                         " differs from the delta's target " +
                         delta->trailer().target_hash.ToHex());
  }
  if (options.verify_full || options.check_output) {
    // Rehash (and hand over) what is in the files, through read-only mappings of them.
    struct Map {
      void* data = nullptr;
      uint64_t size = 0;
      ~Map() {
        if (data != nullptr) ::munmap(data, size);
      }
    };
    std::vector<Map> maps(files.size());
    for (size_t f = 0; f < files.size(); ++f) {
      DCR_RETURN_IF_ERROR(
          internal::MapReadOnly(files[f]->tmp_path(), &maps[f].data, &maps[f].size));
      if (maps[f].size != inv.files[f].file_size()) {
        return DataLossError(files[f]->tmp_path() + " has " + std::to_string(maps[f].size) +
                             " bytes, not " + std::to_string(inv.files[f].file_size()));
      }
      internal::AdviseSequential(maps[f].data, maps[f].size);
    }
    std::vector<TensorView> views;
    for (const TensorInfo& t : inv.tensors) {
      const auto* bytes = static_cast<const uint8_t*>(maps[t.file].data);
      views.push_back(TensorView{t.name, t.dtype_name, t.shape,
                                 bytes + data_sections[t.file] + t.offset, t.nbytes});
    }
    if (options.verify_full) {
      internal::PhaseProgress rehash(options.progress, "rehash", tensor_bytes);
      const Hash128 full = ContentHashOf(views, options.threads);
      rehash.Finish();
      if (full != delta->trailer().target_hash) {
        return DataLossError("full rehash of the output differs from the delta's target hash");
      }
    }
    if (options.check_output) DCR_RETURN_IF_ERROR(options.check_output(views));
  }
  for (auto& file : files) DCR_RETURN_IF_ERROR(file->Commit());
  if (dir) {
    if (!inv.index_name.empty()) {
      DCR_RETURN_IF_ERROR(WriteFileAtomic(dir->FilePath(inv.index_name), inv.index_json.data(),
                                          inv.index_json.size()));
    }
    DCR_RETURN_IF_ERROR(dir->Commit());
  }
  ApplyStats st;
  st.chunks = delta->num_chunks();
  st.changes = changes.load();
  st.result_hash = result;
  return st;
}

}  // namespace dcr
