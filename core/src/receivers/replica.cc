// ServingReplica: one receiver per serving TP rank, in-place apply, joint commit.
#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

#include "dcr/hash.h"
#include "dcr/runtime.h"
#include "dcr/status_macros.h"
#include "internal/chunk_bounds.h"
#include "internal/element_ops.h"
#include "receivers/chunk_apply.h"
#include "receivers/placement_iter.h"

namespace dcr {

struct ServingReplica::Impl {
  struct Rank {
    Storage storage{0};                   // Create: the rank's storage (Attach: unused)
    std::unique_ptr<ModelLoader> loader;  // Create: the native loader (Attach: none)
    PlacementMap map;
    std::vector<uint8_t*> buffers;  // address of each of map.buffers
  };
  struct Entry {  // one placement of a tensor somewhere in the replica
    uint8_t* data;
    const Placement* box;
    bool primary;
    mutable internal::PlacementRun run;  // last run hit (positions arrive sorted)
    int64_t Find(uint64_t e) const {
      if (run.Contains(e)) return run.Find(e);
      return internal::LocateWithRun(*box, e, &run);
    }
  };

  int tp = 1;
  std::vector<std::unique_ptr<Rank>> ranks;
  LoaderFactory factory;  // Create: Verify's dense loads (Attach: none)
  ReloadFn reload;        // re-runs the loader on one converted tensor of one rank
  std::vector<std::string> tensors;
  std::vector<std::string> dtype_names;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<uint64_t> salts, elements;
  std::vector<int> widths;
  std::vector<internal::TensorBound> bounds;   // elements and width per tensor, for records
  std::vector<std::vector<Entry>> entries;     // per tensor
  std::vector<std::vector<uint8_t>> shadow;    // per tensor; empty = none
  std::vector<std::vector<int>> reload_ranks;  // per tensor: ranks with converted regions of it
  uint64_t version = 0;
  Hash128 hash, running;
  bool in_progress = false;
  uint64_t target_version = 0;
  std::set<uint64_t> applied;
  std::set<uint32_t> dirty;
  uint32_t last_dirty = ~0u;  // the tensor last inserted into `dirty` (changes come in runs)
  std::mutex mu;  // ApplyRecord may be called concurrently (receiver.h); chunks are serialized

  // ---- the element store used by ApplyChunkTwoPhase ----
  Status Check(const Segment& sg) const {
    if (sg.tensor_index >= tensors.size()) return DataLossError("tensor index out of range");
    return internal::CheckSegmentBounds(sg, elements[sg.tensor_index]);
  }
  uint64_t Salt(uint32_t t) const { return salts[t]; }
  // Entries of the segment's tensor whose element range meets the segment's (the others cannot
  // hold any of its elements: e.g. another rank's rows).
  std::vector<const Entry*> active;
  void OnSegment(const Segment& sg) {
    active.clear();
    if (sg.tensor_index >= entries.size()) return;
    int64_t lo = static_cast<int64_t>(sg.offset), hi = lo;
    for (uint32_t d = 0; d < sg.ndim; ++d) {
      const int64_t span = static_cast<int64_t>(sg.count[d] - 1) * sg.stride[d];
      if (span < 0)
        lo += span;
      else
        hi += span;
    }
    for (const Entry& en : entries[sg.tensor_index]) {
      if (static_cast<int64_t>(en.box->min_element()) <= hi &&
          static_cast<int64_t>(en.box->max_element()) >= lo) {
        active.push_back(&en);
      }
    }
  }
  uint64_t Read(uint32_t t, uint64_t e) const {
    const int w = widths[t];
    if (!shadow[t].empty()) return internal::LoadElem(shadow[t].data(), w, e);
    for (const Entry* enp : active) {
      const Entry& en = *enp;
      if (!en.primary) continue;
      const int64_t off = en.Find(e);
      if (off >= 0) return internal::LoadElem(en.data + off, w, 0);
    }
    return 0;  // unreachable after Create's ownership check
  }
  void Write(uint32_t t, uint64_t e, uint64_t bits) {
    const int w = widths[t];
    if (!shadow[t].empty()) {
      internal::StoreElem(shadow[t].data(), w, e, bits);
      if (!reload_ranks[t].empty() && last_dirty != t) {  // a set insert per change was costly
        dirty.insert(t);
        last_dirty = t;
      }
    }
    for (const Entry* en : active) {
      const int64_t off = en->Find(e);
      if (off >= 0) internal::StoreElem(en->data + off, w, 0, bits);
    }
  }
};

ServingReplica::ServingReplica(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ServingReplica::~ServingReplica() = default;

StatusOr<std::unique_ptr<ServingReplica>> ServingReplica::Create(int tp,
                                                                 const LoaderFactory& factory,
                                                                 const Checkpoint& base,
                                                                 uint64_t base_version,
                                                                 const ReplicaOptions& options) {
  if (tp < 1) return InvalidArgumentError("replica: tp must be >= 1");
  auto impl = std::make_unique<Impl>();
  impl->tp = tp;
  for (int r = 0; r < tp; ++r) {
    auto rank = std::make_unique<Impl::Rank>();
    DCR_ASSIGN_OR_RETURN(
        rank->map, RecordLoad(base, factory, r, &rank->loader, &rank->storage, options.record));
    for (const Storage::Buffer& b : rank->storage.buffers()) rank->buffers.push_back(b.data);
    impl->ranks.push_back(std::move(rank));
  }
  impl->factory = factory;
  Impl* m = impl.get();
  impl->reload = [m](int r, const WeightRef& w) {
    Impl::Rank& rk = *m->ranks[r];
    return rk.loader->LoadWeight(w, &rk.storage);
  };
  return Build(std::move(impl), base, base_version);
}

StatusOr<std::unique_ptr<ServingReplica>> ServingReplica::Attach(std::vector<AttachedRank> ranks,
                                                                 const Checkpoint& base,
                                                                 uint64_t base_version,
                                                                 ReloadFn reload) {
  if (ranks.empty()) return InvalidArgumentError("replica: no ranks to attach");
  auto impl = std::make_unique<Impl>();
  impl->tp = static_cast<int>(ranks.size());
  for (AttachedRank& ar : ranks) {
    if (ar.buffers.size() != ar.map.buffers.size()) {
      return InvalidArgumentError("replica: a rank's buffer addresses do not match its map");
    }
    if (!impl->ranks.empty() && ar.map.tensors != impl->ranks[0]->map.tensors) {
      return InvalidArgumentError("replica: the ranks' maps name different tensors");
    }
    auto rank = std::make_unique<Impl::Rank>();
    rank->map = std::move(ar.map);
    rank->buffers = std::move(ar.buffers);
    impl->ranks.push_back(std::move(rank));
  }
  impl->reload = std::move(reload);
  return Build(std::move(impl), base, base_version);
}

StatusOr<std::unique_ptr<ServingReplica>> ServingReplica::Build(std::unique_ptr<Impl> impl,
                                                                const Checkpoint& base,
                                                                uint64_t base_version) {
  const int tp = impl->tp;
  const PlacementMap& m0 = impl->ranks[0]->map;
  const size_t nt = m0.tensors.size();
  impl->tensors = m0.tensors;
  impl->entries.resize(nt);
  impl->shadow.resize(nt);
  impl->reload_ranks.resize(nt);
  for (size_t t = 0; t < nt; ++t) {
    const TensorInfo* ti = base.Find(m0.tensors[t]);
    if (ti == nullptr) {
      return InvalidArgumentError("replica: the base lacks the mapped tensor " + m0.tensors[t]);
    }
    impl->dtype_names.push_back(ti->dtype_name);
    impl->shapes.push_back(ti->shape);
    impl->salts.push_back(TensorSalt(ti->name));
    impl->elements.push_back(ti->num_elements());
    impl->widths.push_back(ti->width());
    impl->bounds.push_back(internal::TensorBound{ti->num_elements(), std::max(1, ti->width())});
  }
  for (int r = 0; r < tp; ++r) {
    Impl::Rank& rk = *impl->ranks[r];
    for (const Placement& p : rk.map.placements) {
      impl->entries[p.tensor].push_back(Impl::Entry{rk.buffers[p.buffer], &p, false, {}});
    }
    for (uint32_t t : rk.map.converted_tensors()) impl->reload_ranks[t].push_back(r);
  }
  // Ownership: every element of a tensor without converted placements is owned by the first box
  // (lowest rank first) that holds it. A tensor whose boxes cannot be split into owning and
  // duplicate ones, or with elements placed nowhere, is held as a canonical shadow instead.
  for (size_t t = 0; t < nt; ++t) {
    bool need_shadow = !impl->reload_ranks[t].empty();
    if (!need_shadow) {
      std::vector<uint32_t> owner(impl->elements[t], 0xFFFFFFFFu);
      auto& ents = impl->entries[t];
      for (size_t i = 0; i < ents.size(); ++i) {
        internal::ForEachPlaced(*ents[i].box, [&](uint64_t e, uint64_t) {
          if (owner[e] == 0xFFFFFFFFu) owner[e] = static_cast<uint32_t>(i);
        });
      }
      need_shadow = std::find(owner.begin(), owner.end(), 0xFFFFFFFFu) != owner.end();
      for (size_t i = 0; i < ents.size() && !need_shadow; ++i) {
        uint64_t mine = 0, total = 0;
        internal::ForEachPlaced(*ents[i].box, [&](uint64_t e, uint64_t) {
          mine += owner[e] == i;
          ++total;
        });
        if (mine != 0 && mine != total) need_shadow = true;
        ents[i].primary = mine == total;
      }
    }
    if (need_shadow) {
      const TensorInfo* ti = base.Find(impl->tensors[t]);
      impl->shadow[t].assign(base.data(*ti), base.data(*ti) + ti->nbytes);
      for (auto& en : impl->entries[t]) en.primary = false;
    }
  }
  impl->version = base_version;
  impl->hash = base.ContentHash();
  impl->running = impl->hash;
  return std::unique_ptr<ServingReplica>(new ServingReplica(std::move(impl)));
}

Status ServingReplica::Begin(const uint8_t* bytes, size_t size) {
  Impl& m = *impl_;
  size_t consumed = 0;
  DCR_ASSIGN_OR_RETURN(FileHeader header, ParseFileHeader(bytes, size, &consumed));
  if (m.in_progress) return FailedPreconditionError("replica: a delta is already in progress");
  const bool no_base = (header.flags & kFlagNoBase) != 0;
  if (!no_base && header.base_hash != m.hash) {
    return FailedPreconditionError("replica holds version " + std::to_string(m.version) + " (" +
                                   m.hash.ToHex() + ") but the delta's base is " +
                                   header.base_hash.ToHex());
  }
  DCR_ASSIGN_OR_RETURN(Inventory inv, Inventory::FromHeader(header));
  if (inv.tensors.size() != m.tensors.size()) {
    return InvalidArgumentError("replica: the delta's inventory has " +
                                std::to_string(inv.tensors.size()) +
                                " tensors, the runtime loaded " + std::to_string(m.tensors.size()));
  }
  for (size_t t = 0; t < inv.tensors.size(); ++t) {
    const TensorInfo& ti = inv.tensors[t];
    if (ti.name != m.tensors[t] || ti.dtype_name != m.dtype_names[t] || ti.shape != m.shapes[t]) {
      return InvalidArgumentError("replica: the delta's tensor " + ti.name +
                                  " differs from the loaded tensor " + m.tensors[t]);
    }
  }
  m.in_progress = true;
  m.target_version = header.target_version;
  m.applied.clear();
  m.dirty.clear();
  m.last_dirty = ~0u;
  m.running = m.hash;
  return Status::OK();
}

Status ServingReplica::ApplyRecord(const uint8_t* record, size_t size) {
  if (!impl_->in_progress) {
    return FailedPreconditionError("replica: chunk record with no delta in progress");
  }
  // The segments fit the tensors before anything of the record is decoded.
  DCR_ASSIGN_OR_RETURN(ChunkHeader h, ParseChunkHeader(record, size, nullptr, nullptr));
  DCR_RETURN_IF_ERROR(internal::CheckChunkBounds(h, impl_->bounds));
  thread_local DecodedChunk chunk;  // buffers reused across records
  DCR_RETURN_IF_ERROR(internal::NoThrow("replica: decoding a chunk record",
                                        [&] { return DecodeChunkInto(record, size, &chunk); }));
  return ApplyDecoded(chunk);
}

Status ServingReplica::ApplyDecoded(const DecodedChunk& chunk) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  if (!m.in_progress) return FailedPreconditionError("replica: no delta in progress (Begin)");
  const uint64_t id = chunk.header.chunk_id;
  if (m.applied.count(id) != 0) {
    if (IsRelative(chunk.header.value_mode)) {
      return FailedPreconditionError("replica: chunk " + std::to_string(id) +
                                     " is already applied; its relative payload is refused, "
                                     "nothing written");
    }
    return Status::OK();  // an absolute payload again: idempotent, skipped
  }
  for (const Segment& sg : chunk.header.segments) {
    if (sg.tensor_index < m.widths.size() && m.widths[sg.tensor_index] != chunk.header.elem_width) {
      return DataLossError("chunk " + std::to_string(id) + ": element width differs from tensor " +
                           m.tensors[sg.tensor_index]);
    }
  }
  DCR_ASSIGN_OR_RETURN(internal::ChunkSums sums, internal::ApplyChunkTwoPhase(chunk, &m));
  HashSub(&m.running, sums.old_sum);
  HashAdd(&m.running, sums.new_sum);
  m.applied.insert(id);
  return Status::OK();
}

Status ServingReplica::MarkApplied(uint64_t chunk_id, const Hash128& version_delta) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  if (!m.in_progress) return FailedPreconditionError("replica: no delta in progress");
  if (!m.applied.insert(chunk_id).second) return Status::OK();
  HashAdd(&m.running, version_delta);
  // Which tensors the chunk touched is not known here: every converted tensor is re-loaded.
  for (uint32_t t = 0; t < m.reload_ranks.size(); ++t) {
    if (!m.reload_ranks[t].empty()) m.dirty.insert(t);
  }
  return Status::OK();
}

std::vector<uint64_t> ServingReplica::MissingChunks(const Trailer& trailer) const {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  std::vector<uint64_t> ids;
  for (const ChunkTableEntry& e : trailer.chunks) {
    if (!m.in_progress || m.applied.count(e.chunk_id) == 0) ids.push_back(e.chunk_id);
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

Status ServingReplica::Commit(const uint8_t* bytes, size_t size) {
  Impl& m = *impl_;
  DCR_ASSIGN_OR_RETURN(Trailer trailer, ParseTrailer(bytes, size));
  if (!m.in_progress) return FailedPreconditionError("replica: no delta in progress");
  for (const ChunkTableEntry& e : trailer.chunks) {
    if (m.applied.count(e.chunk_id) == 0) {
      return FailedPreconditionError("replica: chunk " + std::to_string(e.chunk_id) +
                                     " not applied; version not committed");
    }
  }
  if (m.running != trailer.target_hash) {
    return DataLossError("replica: content hash after apply " + m.running.ToHex() +
                         " differs from the target's " + trailer.target_hash.ToHex());
  }
  // Converted placements: re-run the native loader on the changed tensors only.
  for (uint32_t t : m.dirty) {
    WeightRef w;
    w.name = m.tensors[t];
    w.dtype_name = m.dtype_names[t];
    w.dtype = DTypeFromName(w.dtype_name);
    w.shape = m.shapes[t];
    w.data = m.shadow[t].data();
    w.nbytes = m.shadow[t].size();
    for (int r : m.reload_ranks[t]) {
      if (!m.reload) {
        return FailedPreconditionError("replica: converted tensor " + w.name +
                                       " changed but no reload callback was given");
      }
      DCR_RETURN_IF_ERROR(m.reload(r, w).WithContext("re-loading converted tensor " + w.name +
                                                     " on rank " + std::to_string(r)));
    }
  }
  m.dirty.clear();
  m.last_dirty = ~0u;
  m.version = m.target_version;
  m.hash = m.running;
  m.in_progress = false;
  return Status::OK();
}

void ServingReplica::Abort() {
  impl_->in_progress = false;
  impl_->running = impl_->hash;
}

namespace {

// First differing byte of two equal-sized ranges, as a message for tensor/buffer `what`.
Status FirstDifference(const std::string& what, const uint8_t* a, const uint8_t* b, uint64_t n) {
  if (std::memcmp(a, b, n) == 0) return Status::OK();
  uint64_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return DataLossError(what + " differs from the target at byte " + std::to_string(i));
}

}  // namespace

Status ServingReplica::Verify(const Checkpoint& target) const {
  const Impl& m = *impl_;
  if (m.factory) {
    // A dense load of the target through the native loader, rank by rank.
    for (int r = 0; r < m.tp; ++r) {
      const Impl::Rank& rk = *m.ranks[r];
      Storage fresh(0);
      DCR_ASSIGN_OR_RETURN(std::unique_ptr<ModelLoader> loader, m.factory(r));
      DCR_RETURN_IF_ERROR(LoadCheckpoint(target, loader.get(), &fresh));
      const auto& mine = rk.storage.buffers();
      const auto& want = fresh.buffers();
      if (mine.size() != want.size()) {
        return DataLossError("rank " + std::to_string(r) + ": the dense load has " +
                             std::to_string(want.size()) + " buffers, the replica " +
                             std::to_string(mine.size()));
      }
      for (size_t b = 0; b < mine.size(); ++b) {
        if (mine[b].name != want[b].name || mine[b].nbytes != want[b].nbytes) {
          return DataLossError("rank " + std::to_string(r) + ": buffer " + mine[b].name +
                               " differs from the dense load's " + want[b].name);
        }
        DCR_RETURN_IF_ERROR(FirstDifference("rank " + std::to_string(r) + " buffer " + mine[b].name,
                                            mine[b].data, want[b].data, mine[b].nbytes));
      }
    }
    return Status::OK();
  }
  // Attached storage: the runtime's loader is not dcr's to run. Every placed element and every
  // shadow is compared with the target's bits (converted regions are the runtime's).
  for (size_t t = 0; t < m.tensors.size(); ++t) {
    const TensorInfo* ti = target.Find(m.tensors[t]);
    if (ti == nullptr || ti->dtype_name != m.dtype_names[t] || ti->shape != m.shapes[t]) {
      return DataLossError("tensor '" + m.tensors[t] +
                           "' differs from the target in name/dtype/shape");
    }
    const uint8_t* want = target.data(*ti);
    const int w = m.widths[t];
    if (!m.shadow[t].empty()) {
      DCR_RETURN_IF_ERROR(FirstDifference("shadow of tensor '" + m.tensors[t] + "'",
                                          m.shadow[t].data(), want, ti->nbytes));
    }
    for (const Impl::Entry& en : m.entries[t]) {
      Status s;
      internal::ForEachPlaced(*en.box, [&](uint64_t e, uint64_t off) {
        if (s.ok() && std::memcmp(en.data + off, want + e * static_cast<uint64_t>(w),
                                  static_cast<size_t>(w)) != 0) {
          s = DataLossError("tensor '" + m.tensors[t] + "' differs from the target at element " +
                            std::to_string(e) + " (a placed copy)");
        }
      });
      DCR_RETURN_IF_ERROR(s);
    }
  }
  return Status::OK();
}

VersionId ServingReplica::held() const { return VersionId{impl_->version, impl_->hash}; }
bool ServingReplica::in_delta() const { return impl_->in_progress; }
int ServingReplica::tp() const { return impl_->tp; }
uint64_t ServingReplica::version() const { return impl_->version; }
Hash128 ServingReplica::version_hash() const { return impl_->hash; }
Hash128 ServingReplica::running_hash() const { return impl_->running; }
const Storage& ServingReplica::storage(int rank) const { return impl_->ranks[rank]->storage; }
const PlacementMap& ServingReplica::placement(int rank) const { return impl_->ranks[rank]->map; }
uint64_t ServingReplica::shadow_bytes() const {
  uint64_t n = 0;
  for (const auto& s : impl_->shadow) n += s.size();
  return n;
}

}  // namespace dcr
