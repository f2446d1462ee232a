// The C API (dcr_c.h): recording and receiving for runtimes that are not C++ dcr users.
#include <cstring>
#include <memory>
#include <string>

#include "dcr/dcr_c.h"
#include "dcr/delta.h"
#include "dcr/hash.h"
#include "dcr/runtime.h"
#include "dcr/status_macros.h"
#include "internal/element_ops.h"
#include "runtime/chunk_apply.h"
#include "runtime/placement_iter.h"
#include "runtime/recorder.h"

namespace {

thread_local std::string t_last_error;

int Fail(const dcr::Status& s) {
  t_last_error = s.ToString();
  return static_cast<int>(s.code());
}

}  // namespace

struct dcr_recorder {
  std::unique_ptr<dcr::Checkpoint> ckpt;
  std::unique_ptr<dcr::internal::CopyRecorder> rec;
  std::vector<std::pair<uint8_t*, uint64_t>> buffers;
};

// One rank's receiver over the runtime's own host buffers.
struct dcr_receiver {
  struct Entry {
    uint8_t* data;
    dcr::Placement box;
    bool primary;
  };
  dcr::PlacementMap map;
  std::vector<std::pair<uint8_t*, uint64_t>> buffers;
  std::vector<uint64_t> salts, elements;
  std::vector<int> widths;
  std::vector<std::string> dtype_names;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<std::vector<Entry>> entries;
  std::vector<std::vector<uint8_t>> shadow;
  std::vector<bool> converted;
  std::set<uint32_t> dirty, applied_dirty;
  std::set<uint64_t> applied;
  dcr_reload_fn reload = nullptr;
  void* reload_ctx = nullptr;
  dcr::Hash128 hash, running;
  bool in_progress = false;

  dcr::Status Check(const dcr::Segment& sg) const {
    if (sg.tensor_index >= elements.size()) return dcr::DataLossError("tensor index out of range");
    return dcr::internal::CheckSegmentBounds(sg, elements[sg.tensor_index]);
  }
  uint64_t Salt(uint32_t t) const { return salts[t]; }
  void OnSegment(const dcr::Segment&) {}
  uint64_t Read(uint32_t t, uint64_t e) const {
    if (!shadow[t].empty()) return dcr::internal::LoadElem(shadow[t].data(), widths[t], e);
    for (const Entry& en : entries[t]) {
      const int64_t off = en.primary ? en.box.Locate(e) : -1;
      if (off >= 0) return dcr::internal::LoadElem(en.data + off, widths[t], 0);
    }
    return 0;
  }
  void Write(uint32_t t, uint64_t e, uint64_t bits) {
    if (!shadow[t].empty()) {
      dcr::internal::StoreElem(shadow[t].data(), widths[t], e, bits);
      if (converted[t]) dirty.insert(t);
    }
    for (const Entry& en : entries[t]) {
      const int64_t off = en.box.Locate(e);
      if (off >= 0) dcr::internal::StoreElem(en.data + off, widths[t], 0, bits);
    }
  }
};

extern "C" {

const char* dcr_last_error(void) { return t_last_error.c_str(); }

int dcr_recorder_begin(const char* path, dcr_recorder** out) {
  if (path == nullptr || out == nullptr) return Fail(dcr::InvalidArgumentError("null argument"));
  auto r = std::make_unique<dcr_recorder>();
  auto ck = dcr::Checkpoint::Open(path);
  if (!ck.ok()) return Fail(ck.status());
  r->ckpt = std::move(ck).value();
  r->rec = std::make_unique<dcr::internal::CopyRecorder>(*r->ckpt);
  dcr::Status s = r->rec->Start();
  if (!s.ok()) return Fail(s);
  *out = r.release();
  return DCR_OK;
}

const void* dcr_recorder_tensor_data(dcr_recorder* r, const char* name, uint64_t* nbytes) {
  const dcr::TensorInfo* t = r ? r->ckpt->Find(name ? name : "") : nullptr;
  if (t == nullptr) return nullptr;
  if (nbytes) *nbytes = t->nbytes;
  return r->ckpt->data(*t);
}

int dcr_recorder_add_source(dcr_recorder* r, const void* file_base, uint64_t file_size) {
  if (r == nullptr || file_base == nullptr) return Fail(dcr::InvalidArgumentError("null argument"));
  if (file_size != r->ckpt->file_size()) {
    return Fail(dcr::InvalidArgumentError("dcr_recorder_add_source: size differs from the checkpoint"));
  }
  r->rec->AddSource(static_cast<const uint8_t*>(file_base), file_size);
  return DCR_OK;
}

int dcr_recorder_add_buffer(dcr_recorder* r, const char* name, void* data, uint64_t nbytes) {
  if (r == nullptr || name == nullptr || data == nullptr) {
    return Fail(dcr::InvalidArgumentError("null argument"));
  }
  r->rec->AddBuffer(name, static_cast<uint8_t*>(data), nbytes);
  r->buffers.emplace_back(static_cast<uint8_t*>(data), nbytes);
  r->rec->ReplayPending();
  return DCR_OK;
}

int dcr_recorder_set_tensor(dcr_recorder* r, const char* name) {
  if (r == nullptr) return Fail(dcr::InvalidArgumentError("null recorder"));
  if (name == nullptr) {
    r->rec->SetTensor(-1);
    return DCR_OK;
  }
  const int64_t t = r->rec->TensorIndex(name);
  if (t < 0) return Fail(dcr::NotFoundError(std::string("no tensor ") + name + " in the checkpoint"));
  r->rec->SetTensor(t);
  return DCR_OK;
}

int dcr_recorder_end(dcr_recorder* r, dcr_reload_fn reload, void* reload_ctx, dcr_receiver** out) {
  if (r == nullptr || out == nullptr) return Fail(dcr::InvalidArgumentError("null argument"));
  std::unique_ptr<dcr_recorder> owned(r);
  auto rx = std::make_unique<dcr_receiver>();
  rx->map = r->rec->Finish();
  rx->buffers = r->buffers;
  rx->reload = reload;
  rx->reload_ctx = reload_ctx;
  const size_t nt = rx->map.tensors.size();
  rx->entries.resize(nt);
  rx->shadow.resize(nt);
  rx->converted.assign(nt, false);
  for (uint32_t t : rx->map.converted_tensors()) rx->converted[t] = true;
  for (size_t t = 0; t < nt; ++t) {
    const dcr::TensorInfo* ti = r->ckpt->Find(rx->map.tensors[t]);
    rx->salts.push_back(dcr::TensorSalt(ti->name));
    rx->elements.push_back(ti->num_elements());
    rx->widths.push_back(ti->width());
    rx->dtype_names.push_back(ti->dtype_name);
    rx->shapes.push_back(ti->shape);
  }
  for (const dcr::Placement& p : rx->map.placements) {
    rx->entries[p.tensor].push_back(dcr_receiver::Entry{rx->buffers[p.buffer].first, p, false});
  }
  for (size_t t = 0; t < nt; ++t) {
    bool shadow = rx->converted[t];
    if (!shadow) {
      std::vector<uint32_t> owner(rx->elements[t], ~0u);
      auto& ents = rx->entries[t];
      for (size_t i = 0; i < ents.size(); ++i) {
        dcr::internal::ForEachPlaced(ents[i].box, [&](uint64_t e, uint64_t) {
          if (owner[e] == ~0u) owner[e] = static_cast<uint32_t>(i);
        });
      }
      for (uint32_t o : owner) shadow = shadow || o == ~0u;
      for (size_t i = 0; i < ents.size() && !shadow; ++i) {
        uint64_t mine = 0, total = 0;
        dcr::internal::ForEachPlaced(ents[i].box, [&](uint64_t e, uint64_t) {
          mine += owner[e] == i;
          ++total;
        });
        if (mine != 0 && mine != total) shadow = true;
        ents[i].primary = mine == total;
      }
    }
    if (shadow) {
      const dcr::TensorInfo* ti = r->ckpt->Find(rx->map.tensors[t]);
      rx->shadow[t].assign(r->ckpt->data(*ti), r->ckpt->data(*ti) + ti->nbytes);
      for (auto& en : rx->entries[t]) en.primary = false;
    }
  }
  rx->hash = r->ckpt->ContentHash();
  rx->running = rx->hash;
  *out = rx.release();
  return DCR_OK;
}

int dcr_receiver_begin(dcr_receiver* rx, const void* header, size_t size) {
  if (rx == nullptr || header == nullptr) return Fail(dcr::InvalidArgumentError("null argument"));
  if (rx->in_progress) return Fail(dcr::FailedPreconditionError("a delta is in progress"));
  size_t used = 0;
  auto h = dcr::ParseFileHeader(static_cast<const uint8_t*>(header), size, &used);
  if (!h.ok()) return Fail(h.status());
  if ((h->flags & dcr::kFlagNoBase) == 0 && h->base_hash != rx->hash) {
    return Fail(dcr::FailedPreconditionError("receiver holds " + rx->hash.ToHex() +
                                             " but the delta's base is " + h->base_hash.ToHex()));
  }
  auto inv = dcr::Inventory::Parse(h->inventory);
  if (!inv.ok()) return Fail(inv.status());
  if (inv->tensors.size() != rx->map.tensors.size()) {
    return Fail(dcr::InvalidArgumentError("the delta's inventory differs from the recorded checkpoint"));
  }
  for (size_t t = 0; t < inv->tensors.size(); ++t) {
    if (inv->tensors[t].name != rx->map.tensors[t] || inv->tensors[t].shape != rx->shapes[t]) {
      return Fail(dcr::InvalidArgumentError("the delta's tensor " + inv->tensors[t].name +
                                            " differs from the recorded checkpoint"));
    }
  }
  rx->in_progress = true;
  rx->applied.clear();
  rx->dirty.clear();
  rx->running = rx->hash;
  return DCR_OK;
}

int dcr_receiver_apply_chunk(dcr_receiver* rx, const void* record, size_t size) {
  if (rx == nullptr || record == nullptr) return Fail(dcr::InvalidArgumentError("null argument"));
  if (!rx->in_progress) return Fail(dcr::FailedPreconditionError("no delta in progress"));
  auto c = dcr::DecodeChunk(static_cast<const uint8_t*>(record), size);
  if (!c.ok()) return Fail(c.status());
  for (const dcr::Segment& sg : c->header.segments) {
    if (sg.tensor_index < rx->widths.size() && rx->widths[sg.tensor_index] != c->header.elem_width) {
      return Fail(dcr::DataLossError("chunk element width differs from its tensor's"));
    }
  }
  auto sums = dcr::internal::ApplyChunkTwoPhase(*c, rx);
  if (!sums.ok()) return Fail(sums.status());
  dcr::HashSub(&rx->running, sums->old_sum);
  dcr::HashAdd(&rx->running, sums->new_sum);
  rx->applied.insert(c->header.chunk_id);
  return DCR_OK;
}

int dcr_receiver_finish(dcr_receiver* rx, const void* trailer, size_t size) {
  if (rx == nullptr || trailer == nullptr) return Fail(dcr::InvalidArgumentError("null argument"));
  if (!rx->in_progress) return Fail(dcr::FailedPreconditionError("no delta in progress"));
  auto tr = dcr::ParseTrailer(static_cast<const uint8_t*>(trailer), size);
  if (!tr.ok()) return Fail(tr.status());
  for (const auto& e : tr->chunks) {
    if (rx->applied.count(e.chunk_id) == 0) {
      return Fail(dcr::FailedPreconditionError("chunk " + std::to_string(e.chunk_id) + " not applied"));
    }
  }
  if (rx->running != tr->target_hash) {
    return Fail(dcr::DataLossError("content hash after apply differs from the target's"));
  }
  for (uint32_t t : rx->dirty) {
    if (rx->reload == nullptr) {
      return Fail(dcr::FailedPreconditionError("converted tensor " + rx->map.tensors[t] +
                                               " changed but no reload callback was given"));
    }
    const int rc = rx->reload(rx->reload_ctx, rx->map.tensors[t].c_str(), rx->shadow[t].data(),
                              rx->shadow[t].size());
    if (rc != 0) {
      return Fail(dcr::Status(static_cast<dcr::StatusCode>(rc),
                              "reload callback failed for " + rx->map.tensors[t]));
    }
  }
  rx->dirty.clear();
  rx->hash = rx->running;
  rx->in_progress = false;
  return DCR_OK;
}

void dcr_receiver_stats(const dcr_receiver* rx, uint64_t* bit_preserving, uint64_t* converted,
                        uint64_t* constant) {
  if (rx == nullptr) return;
  if (bit_preserving) *bit_preserving = rx->map.bit_preserving_bytes();
  if (converted) *converted = rx->map.converted_bytes();
  if (constant) *constant = rx->map.constant_bytes();
}

void dcr_receiver_free(dcr_receiver* rx) { delete rx; }

}  // extern "C"
