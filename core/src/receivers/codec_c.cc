// The C API for in-memory tensors (dcr/codec_c.h): BuildDelta over in-memory checkpoint images,
// and an all-or-nothing apply through BufferReceiver over the caller's buffers, or through a
// device receiver over the caller's device memory (the *_device functions' work,
// receivers/codec_device.h; their entry points are in src/devices).
#include "dcr/codec_c.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "dcr/apply.h"
#include "dcr/checkpoint.h"
#include "dcr/context.h"
#include "dcr/delta.h"
#include "dcr/device.h"
#include "dcr/hash.h"
#include "dcr/receiver.h"
#include "dcr/status_macros.h"
#include "internal/chunk_bounds.h"
#include "internal/parallel.h"
#include "receivers/c_error.h"
#include "receivers/codec_device.h"
#include "receivers/value_ops.h"

// A placement map (dcr/codec_c.h): the tensor set it was built over, per tensor its placed
// elements as (canonical element, destination address) sorted by element, and the device whose
// memory the destinations are (null: host memory).
struct dcr_placement_map {
  struct Entry {
    uint64_t src;
    uint8_t* dst;
  };
  std::vector<dcr::TensorInfo> tensors;
  std::vector<std::vector<Entry>> entries;
  uint64_t elements = 0;
  std::shared_ptr<dcr::Device> device;
};

namespace dcr {
namespace {

// The caller's descriptors as TensorInfo + address, checked.
struct HostTensor {
  TensorInfo info;
  uint8_t* data = nullptr;
};

StatusOr<std::vector<HostTensor>> ReadDescriptors(const dcr_tensor* t, size_t n, const char* what) {
  if (t == nullptr && n > 0) return InvalidArgumentError(std::string(what) + ": tensors is NULL");
  std::vector<HostTensor> out(n);
  std::map<std::string, size_t> seen;
  for (size_t i = 0; i < n; ++i) {
    const std::string where = std::string(what) + " tensor " + std::to_string(i);
    if (t[i].name == nullptr) return InvalidArgumentError(where + ": name is NULL");
    if (t[i].dtype == nullptr) return InvalidArgumentError(where + ": dtype is NULL");
    TensorInfo& info = out[i].info;
    info.name = t[i].name;
    if (!seen.emplace(info.name, i).second) {
      return InvalidArgumentError(std::string(what) + ": tensor '" + info.name + "' given twice");
    }
    info.dtype_name = t[i].dtype;
    info.dtype = DTypeFromName(info.dtype_name);
    if (info.dtype == DType::kUnknown) {
      return InvalidArgumentError(std::string(what) + " tensor '" + info.name +
                                  "': unknown dtype '" + info.dtype_name + "'");
    }
    if (t[i].ndim > 64 || (t[i].ndim > 0 && t[i].shape == nullptr)) {
      return InvalidArgumentError(std::string(what) + " tensor '" + info.name + "': bad shape");
    }
    uint64_t elems = 1;
    for (size_t d = 0; d < t[i].ndim; ++d) {
      const int64_t s = t[i].shape[d];
      if (s < 0) {
        return InvalidArgumentError(std::string(what) + " tensor '" + info.name +
                                    "': negative dimension");
      }
      info.shape.push_back(s);
      if (s != 0 && elems > (uint64_t{1} << 62) / static_cast<uint64_t>(s)) {
        return InvalidArgumentError(std::string(what) + " tensor '" + info.name + "': too large");
      }
      elems *= static_cast<uint64_t>(s);
    }
    info.nbytes = elems * static_cast<uint64_t>(DTypeWidth(info.dtype));
    if (t[i].nbytes != info.nbytes) {
      return InvalidArgumentError(std::string(what) + " tensor '" + info.name + "': nbytes " +
                                  std::to_string(t[i].nbytes) + " but its shape and dtype make " +
                                  std::to_string(info.nbytes));
    }
    // dcr_apply_delta writes through it (codec_c.h: the caller's bytes are writable).
    out[i].data = static_cast<uint8_t*>(const_cast<void*>(t[i].data));
    if (out[i].data == nullptr && info.nbytes > 0) {
      return InvalidArgumentError(std::string(what) + " tensor '" + info.name + "': data is NULL");
    }
  }
  return out;
}

std::vector<TensorView> Views(const std::vector<HostTensor>& ts) {
  std::vector<TensorView> v;
  v.reserve(ts.size());
  for (const HostTensor& t : ts) {
    v.push_back(TensorView{t.info.name, t.info.dtype_name, t.info.shape, t.data, t.info.nbytes});
  }
  return v;
}

DeltaOptions ToDeltaOptions(const dcr_codec_options& o) {
  DeltaOptions d;
  d.threads = o.threads;
  d.chunk_elems = o.chunk_elems;
  d.small_tensor_elems = o.small_tensor_elems;
  d.zstd_level = o.zstd_level;
  d.value_policy = static_cast<ValuePolicy>(o.value_policy);
  d.base_version = o.base_version;
  d.target_version = o.target_version;
  d.context_coding = o.context_coding != 0;
  d.context_classes = o.context_classes;
  d.full = o.full != 0;
  return d;
}

Status CheckOptions(const dcr_codec_options& o) {
  if (o.threads < 0) return InvalidArgumentError("options: threads must be >= 0");
  if (o.chunk_elems == 0) return InvalidArgumentError("options: chunk_elems must be > 0");
  if (o.value_policy < DCR_VALUES_AUTO || o.value_policy > DCR_VALUES_ABSOLUTE) {
    return InvalidArgumentError("options: value_policy must be one of DCR_VALUES_*");
  }
  if (o.context_coding != 0) DCR_RETURN_IF_ERROR(CheckContextClasses(o.context_classes));
  return Status();
}

// Download's piece: at most this many bytes of a device tensor are copied to the host at once.
constexpr uint64_t kDownloadPiece = uint64_t{64} << 20;

// SafetensorsImage of tensors whose data are addresses of `device`, downloaded into the image in
// pieces of at most kDownloadPiece bytes.
StatusOr<std::vector<uint8_t>> DeviceSafetensorsImage(Device* device,
                                                      const std::vector<TensorView>& views) {
  const std::string header = BuildSafetensorsHeader(views, {}, nullptr);
  uint64_t size = header.size();
  for (const TensorView& t : views) size += t.nbytes;
  std::vector<uint8_t> out(size);
  std::memcpy(out.data(), header.data(), header.size());
  uint64_t at = header.size();
  for (const TensorView& t : views) {
    for (uint64_t off = 0; off < t.nbytes; off += kDownloadPiece) {
      const uint64_t k = std::min(kDownloadPiece, t.nbytes - off);
      DCR_RETURN_IF_ERROR(
          device->Download(out.data() + at + off, static_cast<const uint8_t*>(t.data) + off, k)
              .WithContext("downloading tensor '" + t.name + "' from " + device->name()));
    }
    at += t.nbytes;
  }
  return out;
}

// The tensor set `t` as a checkpoint in memory: its bytes copied (host) or downloaded (device).
StatusOr<std::unique_ptr<Checkpoint>> ImageOf(Device* device, const dcr_tensor* t, size_t n,
                                              const char* what) {
  DCR_ASSIGN_OR_RETURN(auto ts, ReadDescriptors(t, n, what));
  if (device == nullptr) return Checkpoint::FromBytes(SafetensorsImage(Views(ts)));
  DCR_ASSIGN_OR_RETURN(auto image, DeviceSafetensorsImage(device, Views(ts)));
  return Checkpoint::FromBytes(std::move(image));
}

// dcr_encode_delta over host tensors (`device` null) or over tensors of `device`.
StatusOr<std::vector<uint8_t>> Encode(Device* device, const dcr_tensor* base, size_t n_base,
                                      const dcr_tensor* target, size_t n_target,
                                      const dcr_codec_options& o) {
  DCR_RETURN_IF_ERROR(CheckOptions(o));
  DCR_ASSIGN_OR_RETURN(auto tgt_ckpt, ImageOf(device, target, n_target, "target"));
  std::unique_ptr<Checkpoint> base_ckpt;
  if (base != nullptr || n_base > 0 || o.full == 0) {
    DCR_ASSIGN_OR_RETURN(base_ckpt, ImageOf(device, base, n_base, "base"));
  }
  DeltaMemorySink sink;
  DCR_RETURN_IF_ERROR(BuildDelta(base_ckpt.get(), *tgt_ckpt, ToDeltaOptions(o), &sink).status());
  return sink.Release();
}

// What it takes to give back one applied chunk: its record, and for chunks whose old bits cannot
// be computed from the record alone (overwrite values, context coding) those bits, in covered
// order.
struct Undo {
  size_t chunk = 0;  // index in the chunk table
  std::vector<uint8_t> covered;
  bool saved = false;
};

void StoreBits(uint8_t* p, int w, uint64_t bits) { std::memcpy(p, &bits, w); }  // little-endian

// What taking chunk `u` back needs of its record: the header alone when its old bits were saved
// (an overwrite chunk), else the decoded changes. The chunk was applied, so its record decodes.
StatusOr<DecodedChunk> UndoChunk(const DeltaReader& reader, const Undo& u) {
  DecodedChunk dc;
  if (u.saved) {
    size_t hs = 0, rs = 0;
    DCR_ASSIGN_OR_RETURN(dc.header, ParseChunkHeader(reader.chunk_data(u.chunk),
                                                     reader.chunk_size(u.chunk), &hs, &rs));
  } else {
    DCR_RETURN_IF_ERROR(reader.DecodeInto(u.chunk, &dc));
  }
  return dc;
}

// Restores the elements chunk `u` changed. The chunk was applied, so its record decodes and its
// segments lie inside their tensors.
Status TakeBack(const DeltaReader& reader, const std::vector<TensorBuffer>& bufs, const Undo& u) {
  DCR_ASSIGN_OR_RETURN(const DecodedChunk dc, UndoChunk(reader, u));
  std::vector<Segment> segs;
  const ChunkHeader& h = dc.header;
  const int w = h.elem_width;
  SegmentCursor cur(h.segments);
  auto locate = [&](uint64_t pos) {
    uint32_t s = 0;
    uint64_t e = 0;
    cur.Locate(pos, &s, &e);
    const TensorBuffer& tb = bufs[h.segments[s].tensor_index];
    return tb.data + e * static_cast<uint64_t>(w);
  };
  if (u.saved) {
    for (uint64_t p = 0; p < h.num_elements; ++p) {
      uint64_t bits = 0;
      std::memcpy(&bits, u.covered.data() + p * w, w);
      StoreBits(locate(p), w, bits);
    }
    return Status();
  }
  const bool all = h.position_mode == PositionMode::kDense;
  const uint64_t k = all ? h.num_elements : dc.positions.size();
  for (uint64_t j = 0; j < k; ++j) {
    uint8_t* at = locate(all ? j : dc.positions[j]);
    uint64_t now = 0;
    std::memcpy(&now, at, w);
    StoreBits(at, w, internal::InverseValue(h.value_mode, w, now, dc.values[j]));
  }
  return Status();
}

Status CheckInventory(const Inventory& inv, const std::vector<HostTensor>& ts) {
  std::map<std::string, const HostTensor*> by_name;
  for (const HostTensor& t : ts) by_name[t.info.name] = &t;
  for (const TensorInfo& d : inv.tensors) {
    auto it = by_name.find(d.name);
    if (it == by_name.end()) {
      return InvalidArgumentError("tensor '" + d.name + "' of the delta is not among the tensors");
    }
    const TensorInfo& have = it->second->info;
    if (have.dtype_name != d.dtype_name || have.shape != d.shape) {
      auto shape = [](const std::vector<int64_t>& s) {
        std::string r = "[";
        for (size_t i = 0; i < s.size(); ++i) {
          if (i > 0) r += ',';
          r += std::to_string(s[i]);
        }
        return r + "]";
      };
      return InvalidArgumentError("tensor '" + d.name + "' is " + have.dtype_name +
                                  shape(have.shape) + " but the delta has " + d.dtype_name +
                                  shape(d.shape));
    }
    by_name.erase(it);
  }
  if (!by_name.empty()) {
    return InvalidArgumentError("tensor '" + by_name.begin()->first +
                                "' is not in the delta's inventory");
  }
  return Status();
}

// Elements per Gather / Scatter call of the device path: bounds its host arrays (32 bytes per
// element) whatever a chunk covers.
constexpr uint64_t kDevicePiece = uint64_t{1} << 16;

// Calls fn(first, addr, n) for the covered elements [first, first + n) of chunk `h`, in pieces of
// at most kDevicePiece, with addr[k] the device address of element first + k.
// REQUIRES: the segments of `h` fit `bufs` (CheckChunkBounds).
template <typename Fn>
Status ForDeviceAddresses(const ChunkHeader& h, const std::vector<TensorBuffer>& bufs,
                          const uint64_t* positions, uint64_t count, Fn fn) {
  const uint64_t w = h.elem_width;
  SegmentCursor cur(h.segments);
  std::vector<uint64_t> addr;
  for (uint64_t first = 0; first < count; first += kDevicePiece) {
    const uint64_t n = std::min(kDevicePiece, count - first);
    addr.resize(n);
    for (uint64_t k = 0; k < n; ++k) {
      const uint64_t pos = positions != nullptr ? positions[first + k] : first + k;
      uint32_t sg = 0;
      uint64_t e = 0;
      cur.Locate(pos, &sg, &e);
      addr[k] = reinterpret_cast<uint64_t>(bufs[h.segments[sg].tensor_index].data + e * w);
    }
    DCR_RETURN_IF_ERROR(fn(first, addr.data(), n));
  }
  return Status();
}

// GatherCoveredBits over device tensors: the bits of every element chunk `h` covers, gathered on
// `device`. kDataLoss (as GatherCoveredBits) when the segments do not fit the tensors.
Status GatherCoveredOnDevice(Device* device, const ChunkHeader& h,
                             const std::vector<TensorBuffer>& bufs, std::vector<uint8_t>* out) {
  DCR_RETURN_IF_ERROR(internal::CheckChunkBounds(h, bufs));
  const int w = h.elem_width;
  out->assign(h.num_elements * static_cast<uint64_t>(w), 0);
  std::vector<uint64_t> zero, old_bits, new_bits;
  return ForDeviceAddresses(
      h, bufs, nullptr, h.num_elements,
      [&](uint64_t first, const uint64_t* addr, uint64_t n) -> Status {
        zero.assign(n, 0);
        old_bits.resize(n);
        new_bits.resize(n);
        DCR_RETURN_IF_ERROR(device->Gather(addr, zero.data(), n, w, ValueMode::kXor,
                                           old_bits.data(), new_bits.data()));
        for (uint64_t k = 0; k < n; ++k) {
          StoreBits(out->data() + (first + k) * w, w, old_bits[k]);
        }
        return Status();
      });
}

// TakeBack over device tensors: restores the elements chunk `u` changed, on `device`.
Status TakeBackOnDevice(Device* device, const DeltaReader& reader,
                        const std::vector<TensorBuffer>& bufs, const Undo& u) {
  DCR_ASSIGN_OR_RETURN(const DecodedChunk dc, UndoChunk(reader, u));
  const ChunkHeader& h = dc.header;
  const int w = h.elem_width;
  std::vector<uint64_t> begin, bits, zero, now;
  auto scatter = [&](const uint64_t* addr, uint64_t n) {
    begin.resize(n + 1);
    for (uint64_t k = 0; k <= n; ++k) begin[k] = k;
    return device->Scatter(addr, begin.data(), bits.data(), n, w);
  };
  if (u.saved) {
    return ForDeviceAddresses(h, bufs, nullptr, h.num_elements,
                              [&](uint64_t first, const uint64_t* addr, uint64_t n) -> Status {
                                bits.assign(n, 0);
                                for (uint64_t k = 0; k < n; ++k) {
                                  std::memcpy(&bits[k], u.covered.data() + (first + k) * w, w);
                                }
                                return scatter(addr, n);
                              });
  }
  const bool all = h.position_mode == PositionMode::kDense;
  const uint64_t count = all ? h.num_elements : dc.positions.size();
  return ForDeviceAddresses(
      h, bufs, all ? nullptr : dc.positions.data(), count,
      [&](uint64_t first, const uint64_t* addr, uint64_t n) -> Status {
        zero.assign(n, 0);
        now.resize(n);
        bits.resize(n);
        DCR_RETURN_IF_ERROR(
            device->Gather(addr, zero.data(), n, w, ValueMode::kXor, now.data(), bits.data()));
        for (uint64_t k = 0; k < n; ++k) {
          bits[k] = internal::InverseValue(h.value_mode, w, now[k], dc.values[first + k]);
        }
        return scatter(addr, n);
      });
}

// Runs after a delta committed, with the applied chunks (their undo records): what
// dcr_apply_delta_placed writes into the placed destinations. Its error is the apply's, with the
// tensors at the target.
using AfterCommit =
    std::function<Status(const DeltaReader& reader, const std::vector<TensorBuffer>& bufs,
                         const std::vector<Undo>& applied)>;

// The apply of dcr_apply_delta over host tensors (`device` null) or over tensors whose data are
// addresses of `device` (dcr_apply_delta_device): the same checks and all-or-nothing outcome.
Status Apply(const std::shared_ptr<Device>& device, const dcr_tensor* tensors, size_t n,
             const void* delta, size_t size, const dcr_codec_options& o, dcr_apply_result* result,
             const AfterCommit& after = nullptr) {
  DCR_RETURN_IF_ERROR(CheckOptions(o));
  if (delta == nullptr && size > 0) return InvalidArgumentError("delta is NULL");
  DCR_ASSIGN_OR_RETURN(auto ts, ReadDescriptors(tensors, n, "apply"));
  const auto* d = static_cast<const uint8_t*>(delta);
  DCR_ASSIGN_OR_RETURN(auto reader, DeltaReader::FromBytes(std::vector<uint8_t>(d, d + size)));
  DCR_RETURN_IF_ERROR(CheckInventory(reader->inventory(), ts));

  Hash128 held{o.known_base_hash[0], o.known_base_hash[1]};
  if (held == Hash128{} && (reader->header().flags & kFlagNoBase) == 0) {
    if (device != nullptr) {
      DCR_ASSIGN_OR_RETURN(held, DeviceContentHashOf(device.get(), Views(ts), o.threads));
    } else {
      held = ContentHashOf(Views(ts), o.threads);
    }
  }
  const VersionId start{reader->header().base_version, held};
  std::map<std::string, uint8_t*> data_of;
  for (const HostTensor& t : ts) data_of[t.info.name] = t.data;
  std::unique_ptr<Receiver> receiver;
  if (device != nullptr) {
    std::vector<DeviceReceiverTensor> storage;
    for (const HostTensor& t : ts) storage.push_back(DeviceReceiverTensor{t.info, t.data});
    receiver = internal::MakeBorrowingDeviceReceiver(device, std::move(storage), start);
  } else {
    std::vector<ReceiverTensor> storage;
    for (const HostTensor& t : ts) storage.push_back(ReceiverTensor{t.info, t.data});
    receiver = std::make_unique<BufferReceiver>(std::move(storage), start);
  }
  Receiver& rx = *receiver;
  DCR_RETURN_IF_ERROR(BeginDelta(*reader, &rx));

  // The tensors in inventory order, for gathering and restoring covered bits.
  std::vector<TensorBuffer> bufs;
  for (const TensorInfo& t : reader->inventory().tensors) {
    bufs.push_back(TensorBuffer{data_of[t.name], t.num_elements(), t.width(), 0});
  }

  std::mutex mu;
  std::vector<Undo> applied;
  Status first;
  uint64_t changes = 0;
  internal::ParallelFor(reader->num_chunks(), o.threads, [&](uint64_t i) {
    Undo u;
    u.chunk = i;
    size_t hs = 0, rs = 0;
    auto h = ParseChunkHeader(reader->chunk_data(i), reader->chunk_size(i), &hs, &rs);
    Status s = h.status();
    if (s.ok() && (h->value_mode == ValueMode::kAbsolute || IsContextCoded(*h))) {
      u.saved = true;
      s = device != nullptr ? GatherCoveredOnDevice(device.get(), *h, bufs, &u.covered)
                            : GatherCoveredBits(*h, bufs, &u.covered);
    }
    if (s.ok()) s = rx.ApplyRecord(reader->chunk_data(i), reader->chunk_size(i));
    std::lock_guard<std::mutex> lock(mu);
    if (!s.ok()) {
      if (first.ok()) first = s.WithContext("chunk " + std::to_string(h.ok() ? h->chunk_id : i));
      return false;
    }
    changes += h->num_changes;
    applied.push_back(std::move(u));
    return first.ok();
  });
  if (first.ok()) first = CommitDelta(*reader, &rx);
  if (!first.ok()) {
    rx.Abort();
    // Chunks cover disjoint elements (the chunk table has no chunk twice), so the order of the
    // restores does not matter.
    for (const Undo& u : applied) {
      Status s = device != nullptr ? TakeBackOnDevice(device.get(), *reader, bufs, u)
                                   : TakeBack(*reader, bufs, u);
      if (!s.ok()) {
        return InternalError("apply failed (" + first.ToString() +
                             ") and restoring the tensors failed: " + s.ToString());
      }
    }
    return first;
  }
  if (result != nullptr) {
    result->chunks = applied.size();
    result->changes = changes;
    result->base_version = reader->header().base_version;
    result->target_version = reader->header().target_version;
    result->target_hash[0] = rx.held().hash.lo;
    result->target_hash[1] = rx.held().hash.hi;
  }
  if (after) {
    Status s = after(*reader, bufs, applied);
    if (!s.ok()) {
      return InternalError(
          "the tensors hold the delta's target but writing its changes to the "
          "placements failed (rewrite them): " +
          s.ToString());
    }
  }
  return Status();
}

using PlacementMap = dcr_placement_map;

Status SameSet(const PlacementMap& m, const std::vector<HostTensor>& ts) {
  if (ts.size() != m.tensors.size()) {
    return InvalidArgumentError("the placement map was built over " +
                                std::to_string(m.tensors.size()) + " tensors, not " +
                                std::to_string(ts.size()));
  }
  for (size_t i = 0; i < ts.size(); ++i) {
    const TensorInfo& a = ts[i].info;
    const TensorInfo& b = m.tensors[i];
    if (a.name != b.name || a.dtype_name != b.dtype_name || a.shape != b.shape) {
      return InvalidArgumentError("tensor " + std::to_string(i) + " ('" + a.name +
                                  "') is not the placement map's tensor '" + b.name + "'");
    }
  }
  return Status();
}

StatusOr<std::unique_ptr<PlacementMap>> CreateMap(const dcr_tensor* tensors, size_t n,
                                                  const dcr_placement* p, size_t np) {
  DCR_ASSIGN_OR_RETURN(auto ts, ReadDescriptors(tensors, n, "placement map"));
  if (p == nullptr && np > 0) return InvalidArgumentError("placements is NULL");
  auto m = std::make_unique<PlacementMap>();
  for (const HostTensor& t : ts) m->tensors.push_back(t.info);
  m->entries.resize(n);
  std::vector<std::pair<uintptr_t, uintptr_t>> spans;  // destination byte ranges
  for (size_t i = 0; i < np; ++i) {
    const dcr_placement& pl = p[i];
    const std::string where = "placement " + std::to_string(i);
    if (pl.tensor >= n) {
      return InvalidArgumentError(where + ": tensor index " + std::to_string(pl.tensor) +
                                  " of a set of " + std::to_string(n));
    }
    const TensorInfo& info = ts[pl.tensor].info;
    const uint64_t w = static_cast<uint64_t>(info.width());
    const uint64_t elems = info.num_elements();
    if (pl.count > 0 && (pl.dst == nullptr || pl.src == nullptr || pl.dst_index == nullptr)) {
      return InvalidArgumentError(where + " (tensor '" + info.name + "'): NULL array or buffer");
    }
    if (pl.dst_elements > (uint64_t{1} << 62) / w) {
      return InvalidArgumentError(where + ": dst_elements too large");
    }
    auto& v = m->entries[pl.tensor];
    v.reserve(v.size() + pl.count);
    auto* dst = static_cast<uint8_t*>(pl.dst);
    for (uint64_t j = 0; j < pl.count; ++j) {
      const int64_t e = pl.src[j];
      const int64_t d = pl.dst_index[j];
      if (e < 0 || static_cast<uint64_t>(e) >= elems) {
        return InvalidArgumentError(where + ": element " + std::to_string(e) + " outside tensor '" +
                                    info.name + "' of " + std::to_string(elems) + " elements");
      }
      if (d < 0 || static_cast<uint64_t>(d) >= pl.dst_elements) {
        return InvalidArgumentError(where + " (tensor '" + info.name + "'): destination index " +
                                    std::to_string(d) + " outside a buffer of " +
                                    std::to_string(pl.dst_elements) + " elements");
      }
      uint8_t* at = dst + static_cast<uint64_t>(d) * w;
      v.push_back(PlacementMap::Entry{static_cast<uint64_t>(e), at});
      spans.emplace_back(reinterpret_cast<uintptr_t>(at), reinterpret_cast<uintptr_t>(at) + w);
    }
    m->elements += pl.count;
  }
  std::sort(spans.begin(), spans.end());
  for (size_t k = 1; k < spans.size(); ++k) {
    if (spans[k].first < spans[k - 1].second) {
      return InvalidArgumentError("two placed elements share destination bytes (address 0x" +
                                  [](uintptr_t a) {
                                    char b[32];
                                    std::snprintf(b, sizeof(b), "%llx",
                                                  static_cast<unsigned long long>(a));
                                    return std::string(b);
                                  }(spans[k].first) +
                                  "): each destination element holds one canonical element");
    }
  }
  for (auto& v : m->entries) {
    std::sort(v.begin(), v.end(), [](const PlacementMap::Entry& a, const PlacementMap::Entry& b) {
      return a.src != b.src ? a.src < b.src : a.dst < b.dst;
    });
  }
  return m;
}

// Element writes to device destinations, batched into Device::Scatter calls of at most
// kDevicePiece elements: Add the bits of one element after its destinations' addresses were
// appended to `addr`.
class DeviceScatterBatch {
 public:
  DeviceScatterBatch(Device* device, int width) : device_(device), width_(width) {
    begin_.push_back(0);
  }
  std::vector<uint64_t>* addresses() { return &addr_; }
  Status Add(uint64_t bits) {
    if (addr_.size() == begin_.back()) return Status();  // no destination
    bits_.push_back(bits);
    begin_.push_back(addr_.size());
    return bits_.size() >= kDevicePiece ? Flush() : Status();
  }
  Status Flush() {
    Status s;
    if (!bits_.empty()) {
      s = device_->Scatter(addr_.data(), begin_.data(), bits_.data(), bits_.size(), width_);
    }
    addr_.clear();
    bits_.clear();
    begin_.assign(1, 0);
    return s;
  }

 private:
  Device* device_;
  const int width_;
  std::vector<uint64_t> addr_, begin_, bits_;
};

// Writes changed elements of one tensor to their destinations, for elements given mostly in
// increasing order (a chunk's changes): the search for the next element gallops forward from the
// previous one, so a chunk costs about one pass over its part of the entries.
class PlacedWriter {
 public:
  explicit PlacedWriter(const std::vector<PlacementMap::Entry>& v) : v_(v), at_(v.begin()) {}
  // Copies the bits of canonical element `e` (at `bits`, w bytes) to its destinations, or with
  // `addresses` appends the destinations' addresses there instead (a device scatter writes
  // them); returns how many.
  uint64_t Write(uint64_t e, const uint8_t* bits, uint64_t w,
                 std::vector<uint64_t>* addresses = nullptr) {
    auto less = [](const PlacementMap::Entry& a, uint64_t x) { return a.src < x; };
    const auto end = v_.end();
    if (at_ != v_.begin() && std::prev(at_)->src >= e) {
      at_ = std::lower_bound(v_.begin(), at_, e, less);  // went backwards: search from the start
    } else {
      auto lo = at_;
      size_t step = 1;
      while (static_cast<size_t>(end - lo) > step && (lo + step)->src < e) {
        lo += step;
        step *= 2;
      }
      at_ = std::lower_bound(lo, lo + std::min<size_t>(step + 1, end - lo), e, less);
    }
    uint64_t k = 0;
    if (addresses != nullptr) {
      for (; at_ != end && at_->src == e; ++at_, ++k) {
        addresses->push_back(reinterpret_cast<uint64_t>(at_->dst));
      }
      return k;
    }
    for (; at_ != end && at_->src == e; ++at_, ++k) std::memcpy(at_->dst, bits, w);
    return k;
  }

 private:
  const std::vector<PlacementMap::Entry>& v_;
  std::vector<PlacementMap::Entry>::const_iterator at_;
};

Status ApplyPlaced(const dcr_tensor* tensors, size_t n, const void* delta, size_t size,
                   const PlacementMap& m, const dcr_codec_options& o, dcr_apply_result* result,
                   uint8_t* changed, uint64_t* written) {
  DCR_ASSIGN_OR_RETURN(auto ts, ReadDescriptors(tensors, n, "apply"));
  DCR_RETURN_IF_ERROR(SameSet(m, ts));
  std::map<std::string, uint32_t> index_of;
  for (size_t i = 0; i < ts.size(); ++i) index_of[ts[i].info.name] = static_cast<uint32_t>(i);
  std::vector<uint8_t> flags(n, 0);
  std::vector<uint64_t> count(n, 0);
  AfterCommit after = [&](const DeltaReader& reader, const std::vector<TensorBuffer>& bufs,
                          const std::vector<Undo>& applied) -> Status {
    std::vector<uint32_t> set_of;  // inventory index -> index in the tensor set
    for (const TensorInfo& t : reader.inventory().tensors) set_of.push_back(index_of[t.name]);
    std::mutex mu;
    Status first;
    internal::ParallelFor(applied.size(), o.threads, [&](uint64_t k) {
      const Undo& u = applied[k];
      DecodedChunk dc;
      Status s;
      if (u.saved) {
        size_t hs = 0, rs = 0;
        auto h = ParseChunkHeader(reader.chunk_data(u.chunk), reader.chunk_size(u.chunk), &hs, &rs);
        s = h.status();
        if (s.ok()) dc.header = std::move(*h);
      } else {
        s = reader.DecodeInto(u.chunk, &dc);
      }
      std::vector<std::pair<uint32_t, uint64_t>> touched;  // (set index, destinations written)
      if (s.ok()) {
        const ChunkHeader& h = dc.header;
        const uint64_t w = h.elem_width;
        SegmentCursor cur(h.segments);
        uint32_t writer_of = UINT32_MAX;
        std::optional<PlacedWriter> writer;
        std::optional<DeviceScatterBatch> batch;
        if (m.device != nullptr) batch.emplace(m.device.get(), static_cast<int>(w));
        auto put = [&](uint64_t pos) {
          uint32_t sg = 0;
          uint64_t e = 0;
          cur.Locate(pos, &sg, &e);
          const uint32_t ti = h.segments[sg].tensor_index;
          const uint8_t* now = bufs[ti].data + e * w;
          // Saved chunks cover unchanged elements too: their old bits tell the changed ones.
          if (u.saved && std::memcmp(now, u.covered.data() + pos * w, w) == 0) return;
          const uint32_t si = set_of[ti];
          if (touched.empty() || touched.back().first != si) touched.emplace_back(si, 0);
          if (writer_of != si) writer.emplace(m.entries[si]), writer_of = si;
          if (!batch) {
            touched.back().second += writer->Write(e, now, w);
            return;
          }
          touched.back().second += writer->Write(e, now, w, batch->addresses());
          uint64_t bits = 0;
          std::memcpy(&bits, now, w);
          if (s.ok()) s = batch->Add(bits);
        };
        if (u.saved || h.position_mode == PositionMode::kDense) {
          for (uint64_t p = 0; p < h.num_elements; ++p) put(p);
        } else {
          for (uint64_t p : dc.positions) put(p);
        }
        if (batch && s.ok()) s = batch->Flush();
      }
      std::lock_guard<std::mutex> lock(mu);
      if (!s.ok()) {
        if (first.ok()) first = s;
        return false;
      }
      for (const auto& [si, k] : touched) {
        flags[si] = 1;
        count[si] += k;
      }
      return true;
    });
    return first;
  };
  Status s = Apply(nullptr, tensors, n, delta, size, o, result, after);
  if (s.ok() || s.code() == StatusCode::kInternal) {
    if (changed != nullptr) std::copy(flags.begin(), flags.end(), changed);
    if (written != nullptr) std::copy(count.begin(), count.end(), written);
  }
  return s;
}

Status WriteAll(const PlacementMap& m, const dcr_tensor* tensors, size_t n, const uint8_t* which,
                int32_t threads, uint64_t* written) {
  DCR_ASSIGN_OR_RETURN(auto ts, ReadDescriptors(tensors, n, "placement write"));
  DCR_RETURN_IF_ERROR(SameSet(m, ts));
  std::vector<uint64_t> count(n, 0);
  std::mutex mu;
  Status first;
  internal::ParallelFor(n, threads < 0 ? 0 : threads, [&](uint64_t t) {
    if (which != nullptr && which[t] == 0) return true;
    const uint64_t w = static_cast<uint64_t>(ts[t].info.width());
    const uint8_t* src = ts[t].data;
    if (m.device == nullptr) {
      for (const PlacementMap::Entry& e : m.entries[t]) std::memcpy(e.dst, src + e.src * w, w);
    } else {
      DeviceScatterBatch batch(m.device.get(), static_cast<int>(w));
      Status s;
      for (const PlacementMap::Entry& e : m.entries[t]) {
        batch.addresses()->push_back(reinterpret_cast<uint64_t>(e.dst));
        uint64_t bits = 0;
        std::memcpy(&bits, src + e.src * w, w);
        s = batch.Add(bits);
        if (!s.ok()) break;
      }
      if (s.ok()) s = batch.Flush();
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (first.ok())
          first = s.WithContext("writing the placements of '" + ts[t].info.name + "' on " +
                                m.device->name());
        return false;
      }
    }
    count[t] = m.entries[t].size();
    return true;
  });
  if (written != nullptr) std::copy(count.begin(), count.end(), written);
  return first;
}

}  // namespace

namespace internal {

StatusOr<std::vector<uint8_t>> EncodeOnDevice(Device* device, const dcr_tensor* base, size_t n_base,
                                              const dcr_tensor* target, size_t n_target,
                                              const dcr_codec_options& options) {
  return Encode(device, base, n_base, target, n_target, options);
}

Status ApplyOnDevice(std::shared_ptr<Device> device, const dcr_tensor* tensors, size_t n,
                     const void* delta, size_t size, const dcr_codec_options& options,
                     dcr_apply_result* result) {
  return Apply(device, tensors, n, delta, size, options, result);
}

Status CreatePlacementMapOnDevice(std::shared_ptr<Device> device, const dcr_tensor* tensors,
                                  size_t n, const dcr_placement* placements, size_t n_placements,
                                  dcr_placement_map** out) {
  *out = nullptr;
  DCR_ASSIGN_OR_RETURN(auto m, CreateMap(tensors, n, placements, n_placements));
  m->device = std::move(device);
  *out = m.release();
  return Status();
}

StatusOr<Hash128> HashOnDevice(Device* device, const dcr_tensor* tensors, size_t n,
                               int32_t threads) {
  DCR_ASSIGN_OR_RETURN(auto ts, ReadDescriptors(tensors, n, "hash"));
  return DeviceContentHashOf(device, Views(ts), threads < 0 ? 0 : threads);
}

}  // namespace internal
}  // namespace dcr

extern "C" {

void dcr_codec_options_init(dcr_codec_options* o) {
  if (o == nullptr) return;
  std::memset(o, 0, sizeof(*o));
  const dcr::DeltaOptions d;
  o->threads = d.threads;
  o->chunk_elems = d.chunk_elems;
  o->small_tensor_elems = d.small_tensor_elems;
  o->zstd_level = d.zstd_level;
  o->value_policy = static_cast<int32_t>(d.value_policy);
  o->base_version = d.base_version;
  o->target_version = d.target_version;
  o->context_classes = d.context_classes;
}

int dcr_encode_delta(const dcr_tensor* base, size_t n_base, const dcr_tensor* target,
                     size_t n_target, const dcr_codec_options* options, uint8_t** out,
                     size_t* out_size) {
  if (out == nullptr || out_size == nullptr) {
    return dcr::internal::CFail(dcr::InvalidArgumentError("out and out_size are required"));
  }
  *out = nullptr;
  *out_size = 0;
  dcr_codec_options o;
  dcr_codec_options_init(&o);
  if (options != nullptr) o = *options;
  auto bytes = dcr::Encode(nullptr, base, n_base, target, n_target, o);
  if (!bytes.ok()) return dcr::internal::CFail(bytes.status().WithContext("encode"));
  auto* p = static_cast<uint8_t*>(std::malloc(std::max<size_t>(bytes->size(), 1)));
  if (p == nullptr)
    return dcr::internal::CFail(dcr::ResourceExhaustedError("encode: out of memory"));
  std::memcpy(p, bytes->data(), bytes->size());
  *out = p;
  *out_size = bytes->size();
  return DCR_OK;
}

void dcr_bytes_free(uint8_t* bytes) { std::free(bytes); }

int dcr_apply_delta(const dcr_tensor* tensors, size_t n, const void* delta, size_t size,
                    const dcr_codec_options* options, dcr_apply_result* result) {
  dcr_codec_options o;
  dcr_codec_options_init(&o);
  if (options != nullptr) o = *options;
  dcr::Status s = dcr::Apply(nullptr, tensors, n, delta, size, o, result);
  if (!s.ok()) return dcr::internal::CFail(s.WithContext("apply"));
  return DCR_OK;
}

int dcr_delta_parts(const void* delta, size_t size, dcr_delta_part* parts, size_t cap,
                    size_t* count) {
  if ((delta == nullptr && size > 0) || count == nullptr || (parts == nullptr && cap > 0)) {
    return dcr::internal::CFail(dcr::InvalidArgumentError("dcr_delta_parts: null argument"));
  }
  const auto* d = static_cast<const uint8_t*>(delta);
  auto reader = dcr::DeltaReader::FromBytes(std::vector<uint8_t>(d, d + size));
  if (!reader.ok()) return dcr::internal::CFail(reader.status());
  size_t header_size = 0;
  auto h = dcr::ParseFileHeader(d, size, &header_size);
  if (!h.ok()) return dcr::internal::CFail(h.status());
  // DeltaReader checked the trailer offset (the u64 24 bytes before the end; little-endian).
  uint64_t trailer_offset = 0;
  std::memcpy(&trailer_offset, d + size - 24, 8);
  std::vector<dcr_delta_part> all;
  all.push_back(dcr_delta_part{0, header_size});
  for (size_t i = 0; i < (*reader)->num_chunks(); ++i) {
    const auto& e = (*reader)->trailer().chunks[i];
    all.push_back(dcr_delta_part{e.offset, e.size});
  }
  all.push_back(dcr_delta_part{trailer_offset, size - trailer_offset});
  *count = all.size();
  std::copy_n(all.begin(), std::min(cap, all.size()), parts);
  return DCR_OK;
}

int dcr_tensors_hash(const dcr_tensor* tensors, size_t n, int32_t threads, uint64_t hash[2]) {
  if (hash == nullptr) return dcr::internal::CFail(dcr::InvalidArgumentError("hash is NULL"));
  auto ts = dcr::ReadDescriptors(tensors, n, "hash");
  if (!ts.ok()) return dcr::internal::CFail(ts.status());
  const dcr::Hash128 h = dcr::ContentHashOf(dcr::Views(*ts), threads < 0 ? 0 : threads);
  hash[0] = h.lo;
  hash[1] = h.hi;
  return DCR_OK;
}

int dcr_placement_map_create(const dcr_tensor* tensors, size_t n, const dcr_placement* placements,
                             size_t n_placements, dcr_placement_map** out) {
  if (out == nullptr) return dcr::internal::CFail(dcr::InvalidArgumentError("out is NULL"));
  *out = nullptr;
  auto m = dcr::CreateMap(tensors, n, placements, n_placements);
  if (!m.ok()) return dcr::internal::CFail(m.status().WithContext("placement map"));
  *out = m->release();
  return DCR_OK;
}

void dcr_placement_map_free(dcr_placement_map* map) { delete map; }

uint64_t dcr_placement_map_elements(const dcr_placement_map* map) {
  return map == nullptr ? 0 : map->elements;
}

int dcr_apply_delta_placed(const dcr_tensor* tensors, size_t n, const void* delta, size_t size,
                           const dcr_placement_map* map, const dcr_codec_options* options,
                           dcr_apply_result* result, uint8_t* changed, uint64_t* written) {
  if (map == nullptr) return dcr::internal::CFail(dcr::InvalidArgumentError("map is NULL"));
  dcr_codec_options o;
  dcr_codec_options_init(&o);
  if (options != nullptr) o = *options;
  dcr::Status s = dcr::ApplyPlaced(tensors, n, delta, size, *map, o, result, changed, written);
  if (!s.ok()) return dcr::internal::CFail(s.WithContext("apply"));
  return DCR_OK;
}

int dcr_placement_map_write(const dcr_placement_map* map, const dcr_tensor* tensors, size_t n,
                            const uint8_t* which, int32_t threads, uint64_t* written) {
  if (map == nullptr) return dcr::internal::CFail(dcr::InvalidArgumentError("map is NULL"));
  dcr::Status s = dcr::WriteAll(*map, tensors, n, which, threads, written);
  if (!s.ok()) return dcr::internal::CFail(s.WithContext("placement write"));
  return DCR_OK;
}

}  // extern "C"
