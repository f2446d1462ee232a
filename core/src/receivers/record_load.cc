// RecordLoad: the recording load and its checks (runtime.h, "Interception").
#include <cstring>

#include "dcr/runtime.h"
#include "dcr/status_macros.h"
#include "receivers/placement_iter.h"
#include "receivers/recorder.h"

namespace dcr {
namespace {

enum : uint8_t { kCovPlaced = 1, kCovConverted = 2, kCovConstant = 4 };

std::vector<std::vector<uint8_t>> Coverage(const PlacementMap& map, const Storage& storage) {
  std::vector<std::vector<uint8_t>> cov(storage.buffers().size());
  for (size_t b = 0; b < cov.size(); ++b) cov[b].assign(storage.buffers()[b].nbytes, 0);
  for (const Placement& p : map.placements) {
    auto& c = cov[p.buffer];
    internal::ForEachPlaced(p, [&](uint64_t, uint64_t off) {
      for (int k = 0; k < p.width; ++k) c[off + k] |= kCovPlaced;
    });
  }
  for (const ConvertedRegion& r : map.converted) {
    const uint8_t f = r.tensor == kConstantRegion ? kCovConstant : kCovConverted;
    for (uint64_t i = 0; i < r.size; ++i) cov[r.buffer][r.offset + i] |= f;
  }
  return cov;
}

Status SameLayout(const Storage& a, const Storage& b) {
  if (a.buffers().size() != b.buffers().size()) {
    return FailedPreconditionError(
        "recording load: the loader allocated different buffers on a second run");
  }
  for (size_t i = 0; i < a.buffers().size(); ++i) {
    if (a.buffers()[i].name != b.buffers()[i].name ||
        a.buffers()[i].nbytes != b.buffers()[i].nbytes) {
      return FailedPreconditionError("recording load: buffer " + a.buffers()[i].name +
                                     " differs between two loads");
    }
  }
  return Status::OK();
}

// A copy of the checkpoint with the lowest bit of every element flipped.
StatusOr<std::unique_ptr<Checkpoint>> ProbeCheckpoint(const Checkpoint& ckpt) {
  std::vector<uint8_t> bytes(ckpt.file_data(), ckpt.file_data() + ckpt.file_size());
  const uint64_t base = ckpt.data_section_offset();
  for (const TensorInfo& t : ckpt.tensors()) {
    const int w = t.width();
    for (uint64_t i = 0; i < t.nbytes; i += w) bytes[base + t.offset + i] ^= 1;
  }
  return Checkpoint::FromBytes(std::move(bytes));
}

}  // namespace

StatusOr<PlacementMap> RecordLoad(const Checkpoint& ckpt, const LoaderFactory& factory, int rank,
                                  std::unique_ptr<ModelLoader>* loader_out, Storage* storage,
                                  const RecordOptions& options) {
  if (ckpt.sharded()) {
    return InvalidArgumentError(
        "recording load: the checkpoint is sharded (" + std::to_string(ckpt.files().size()) +
        " shards); a serving replica's loader is recorded copying from one safetensors file: "
        "give the replica a single-file checkpoint, or use a buffer receiver");
  }
  DCR_ASSIGN_OR_RETURN(std::unique_ptr<ModelLoader> loader, factory(rank));
  internal::CopyRecorder rec(ckpt);
  DCR_RETURN_IF_ERROR(rec.Start());
  Status st = loader->Init(storage);
  if (st.ok()) {
    for (const auto& b : storage->buffers()) rec.AddBuffer(b.name, b.data, b.nbytes);
    rec.ReplayPending();
    for (const TensorInfo& t : ckpt.tensors()) {
      rec.SetTensor(rec.TensorIndex(t.name));
      WeightRef w;
      w.name = t.name;
      w.dtype_name = t.dtype_name;
      w.dtype = t.dtype;
      w.shape = t.shape;
      w.data = ckpt.data(t);
      w.nbytes = t.nbytes;
      st = loader->LoadWeight(w, storage).WithContext("loading " + t.name);
      if (!st.ok()) break;
    }
    rec.SetTensor(-1);
  }
  PlacementMap map = rec.Finish();
  DCR_RETURN_IF_ERROR(st);

  const auto& bufs = storage->buffers();
  // A box whose bytes do not follow the checkpoint (e.g. copied into a staging buffer, converted
  // there in place, then copied into storage) is converted data of its tensor, not a placement.
  auto demote_failing = [&](const Checkpoint& src_ckpt, const Storage& st) {
    std::vector<Placement> kept;
    for (const Placement& p : map.placements) {
      const uint8_t* src = src_ckpt.data(*src_ckpt.Find(map.tensors[p.tensor]));
      const uint8_t* dst = st.buffers()[p.buffer].data;
      bool ok = true;
      internal::ForEachPlaced(p, [&](uint64_t e, uint64_t off) {
        ok = ok && std::memcmp(src + e * p.width, dst + off, p.width) == 0;
      });
      if (ok) {
        kept.push_back(p);
        continue;
      }
      internal::ForEachPlaced(p, [&](uint64_t, uint64_t off) {
        ConvertedRegion* last = map.converted.empty() ? nullptr : &map.converted.back();
        if (last && last->tensor == p.tensor && last->buffer == p.buffer &&
            last->offset + last->size == off) {
          last->size += p.width;
        } else {
          map.converted.push_back(ConvertedRegion{p.tensor, p.buffer, off, p.width});
        }
      });
    }
    map.placements.swap(kept);
  };
  demote_failing(ckpt, *storage);
  std::unique_ptr<Checkpoint> probe;
  Storage ps(0);
  if (options.probe) {
    DCR_ASSIGN_OR_RETURN(probe, ProbeCheckpoint(ckpt));
    DCR_ASSIGN_OR_RETURN(std::unique_ptr<ModelLoader> l3, factory(rank));
    DCR_RETURN_IF_ERROR(LoadCheckpoint(*probe, l3.get(), &ps));
    DCR_RETURN_IF_ERROR(SameLayout(*storage, ps));
    demote_failing(*probe, ps);
  }
  std::vector<std::vector<uint8_t>> cov;
  if (options.check_unobserved_writes || options.probe) cov = Coverage(map, *storage);
  if (options.check_unobserved_writes) {
    Storage other(0xFF);
    DCR_ASSIGN_OR_RETURN(std::unique_ptr<ModelLoader> l2, factory(rank));
    DCR_RETURN_IF_ERROR(LoadCheckpoint(ckpt, l2.get(), &other));
    DCR_RETURN_IF_ERROR(SameLayout(*storage, other));
    for (size_t b = 0; b < bufs.size(); ++b) {
      const uint8_t* x = bufs[b].data;
      const uint8_t* y = other.buffers()[b].data;
      for (uint64_t i = 0; i < bufs[b].nbytes; ++i) {
        if (x[i] == y[i] && cov[b][i] == 0) {
          return FailedPreconditionError(
              "recording load: buffer " + bufs[b].name + " byte " + std::to_string(i) +
              " was written without a copy call dcr can see (inlined memcpy or a plain store); "
              "the loader must place data with memcpy/cudaMemcpy");
        }
      }
    }
  }
  if (options.probe) {
    for (size_t b = 0; b < bufs.size(); ++b) {
      const uint8_t* x = bufs[b].data;
      const uint8_t* y = ps.buffers()[b].data;
      for (uint64_t i = 0; i < bufs[b].nbytes; ++i) {
        if (x[i] != y[i] && !(cov[b][i] & (kCovPlaced | kCovConverted))) {
          return FailedPreconditionError(
              "recording load: buffer " + bufs[b].name + " byte " + std::to_string(i) +
              " depends on the checkpoint but was not written while a tensor was being loaded");
        }
      }
    }
  }
  *loader_out = std::move(loader);
  return map;
}

}  // namespace dcr
