// ServingReplica: one receiver per serving TP rank, in-place apply, joint commit.
#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

#include "dcr/hash.h"
#include "dcr/runtime.h"
#include "dcr/status_macros.h"
#include "internal/element_ops.h"
#include "runtime/chunk_apply.h"
#include "runtime/placement_iter.h"

namespace dcr {

struct ServingReplica::Impl {
  struct Rank {
    Storage storage{0};
    std::unique_ptr<ModelLoader> loader;
    PlacementMap map;
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
  std::vector<std::string> tensors;
  std::vector<std::string> dtype_names;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<uint64_t> salts, elements;
  std::vector<int> widths;
  std::vector<std::vector<Entry>> entries;      // per tensor
  std::vector<std::vector<uint8_t>> shadow;     // per tensor; empty = none
  std::vector<std::vector<int>> reload_ranks;   // per tensor: ranks with converted regions of it
  uint64_t version = 0;
  Hash128 hash, running;
  bool in_progress = false;
  uint64_t target_version = 0;
  std::set<uint64_t> applied;
  std::set<uint32_t> dirty;
  uint32_t last_dirty = ~0u;  // the tensor last inserted into `dirty` (changes come in runs)
  std::mutex mu;  // ApplyChunk may be called concurrently (apply.h); chunks are serialized

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
      if (span < 0) lo += span; else hi += span;
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
    DCR_ASSIGN_OR_RETURN(rank->map, RecordLoad(base, factory, r, &rank->loader, &rank->storage,
                                               options.record));
    impl->ranks.push_back(std::move(rank));
  }
  const PlacementMap& m0 = impl->ranks[0]->map;
  const size_t nt = m0.tensors.size();
  impl->tensors = m0.tensors;
  impl->entries.resize(nt);
  impl->shadow.resize(nt);
  impl->reload_ranks.resize(nt);
  for (size_t t = 0; t < nt; ++t) {
    const TensorInfo* ti = base.Find(m0.tensors[t]);
    impl->dtype_names.push_back(ti->dtype_name);
    impl->shapes.push_back(ti->shape);
    impl->salts.push_back(TensorSalt(ti->name));
    impl->elements.push_back(ti->num_elements());
    impl->widths.push_back(ti->width());
  }
  for (int r = 0; r < tp; ++r) {
    Impl::Rank& rk = *impl->ranks[r];
    for (const Placement& p : rk.map.placements) {
      impl->entries[p.tensor].push_back(Impl::Entry{rk.storage.buffers()[p.buffer].data, &p, false, {}});
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

Status ServingReplica::BeginDelta(const FileHeader& header) {
  Impl& m = *impl_;
  if (m.in_progress) return FailedPreconditionError("replica: a delta is already in progress");
  const bool no_base = (header.flags & kFlagNoBase) != 0;
  if (!no_base && header.base_hash != m.hash) {
    return FailedPreconditionError("replica holds version " + std::to_string(m.version) + " (" +
                                   m.hash.ToHex() + ") but the delta's base is " +
                                   header.base_hash.ToHex());
  }
  DCR_ASSIGN_OR_RETURN(Inventory inv, Inventory::Parse(header.inventory));
  if (inv.tensors.size() != m.tensors.size()) {
    return InvalidArgumentError("replica: the delta's inventory has " +
                                std::to_string(inv.tensors.size()) + " tensors, the runtime loaded " +
                                std::to_string(m.tensors.size()));
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

Status ServingReplica::ApplyChunk(const DecodedChunk& chunk) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  if (!m.in_progress) return FailedPreconditionError("replica: no delta in progress (BeginDelta)");
  for (const Segment& sg : chunk.header.segments) {
    if (sg.tensor_index < m.widths.size() && m.widths[sg.tensor_index] != chunk.header.elem_width) {
      return DataLossError("chunk " + std::to_string(chunk.header.chunk_id) +
                           ": element width differs from tensor " + m.tensors[sg.tensor_index]);
    }
  }
  DCR_ASSIGN_OR_RETURN(internal::ChunkSums sums, internal::ApplyChunkTwoPhase(chunk, &m));
  HashSub(&m.running, sums.old_sum);
  HashAdd(&m.running, sums.new_sum);
  m.applied.insert(chunk.header.chunk_id);
  return Status::OK();
}

Status ServingReplica::Finish(const Trailer& trailer) {
  Impl& m = *impl_;
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
      Impl::Rank& rk = *m.ranks[r];
      DCR_RETURN_IF_ERROR(rk.loader->LoadWeight(w, &rk.storage)
                              .WithContext("re-loading converted tensor " + w.name + " on rank " +
                                           std::to_string(r)));
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

int ServingReplica::tp() const { return impl_->tp; }
bool ServingReplica::committed() const { return !impl_->in_progress; }
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

Status ApplyDeltaToReplica(const DeltaReader& reader, ServingReplica* replica,
                           const std::vector<size_t>& order) {
  DCR_RETURN_IF_ERROR(replica->BeginDelta(reader.header()));
  std::vector<size_t> idx = order;
  if (idx.empty()) {
    for (size_t i = 0; i < reader.num_chunks(); ++i) idx.push_back(i);
  }
  DecodedChunk c;  // buffers reused across chunks
  for (size_t i : idx) {
    DCR_RETURN_IF_ERROR(reader.DecodeInto(i, &c));
    DCR_RETURN_IF_ERROR(replica->ApplyChunk(c));
  }
  return replica->Finish(reader.trailer());
}

}  // namespace dcr
