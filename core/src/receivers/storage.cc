// Storage of a serving rank, and the ordinary dense load.
#include <cstring>

#include "dcr/runtime.h"
#include "dcr/status_macros.h"

namespace dcr {
namespace {

// The allocator's initial content (like device memory fresh from the allocator): not a write of
// the loader, so it is done with a plain loop that the compiler must not turn into a memset call
// (which a recording load would see as a constant write over the whole buffer).
#if defined(__clang__)
#define DCR_NO_MEMSET_IDIOM __attribute__((no_builtin("memset")))
#else
#define DCR_NO_MEMSET_IDIOM __attribute__((optimize("no-tree-loop-distribute-patterns")))
#endif
DCR_NO_MEMSET_IDIOM void FillFresh(uint8_t* p, uint8_t v, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) p[i] = v;
}

}  // namespace

StatusOr<uint8_t*> Storage::Allocate(const std::string& name, const std::string& dtype_name,
                                     const std::vector<int64_t>& shape) {
  if (Find(name) != nullptr)
    return InvalidArgumentError("storage: duplicate buffer '" + name + "'");
  const DType dtype = DTypeFromName(dtype_name);
  if (dtype == DType::kUnknown) {
    return InvalidArgumentError("storage: buffer '" + name + "' has unknown dtype " + dtype_name);
  }
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return InvalidArgumentError("storage: buffer '" + name + "' has a negative dim");
    n *= static_cast<uint64_t>(d);
  }
  Buffer b;
  b.name = name;
  b.dtype_name = dtype_name;
  b.dtype = dtype;
  b.shape = shape;
  b.nbytes = n * static_cast<uint64_t>(DTypeWidth(dtype));
  memory_.emplace_back(new uint8_t[b.nbytes > 0 ? b.nbytes : 1]);
  b.data = memory_.back().get();
  FillFresh(b.data, fill_, b.nbytes);
  buffers_.push_back(std::move(b));
  return buffers_.back().data;
}

Storage::Buffer* Storage::Find(const std::string& name) {
  for (auto& b : buffers_) {
    if (b.name == name) return &b;
  }
  return nullptr;
}

const Storage::Buffer* Storage::Find(const std::string& name) const {
  for (const auto& b : buffers_) {
    if (b.name == name) return &b;
  }
  return nullptr;
}

uint64_t Storage::total_bytes() const {
  uint64_t n = 0;
  for (const auto& b : buffers_) n += b.nbytes;
  return n;
}

std::vector<TensorView> Storage::Views() const {
  std::vector<TensorView> v;
  for (const auto& b : buffers_) {
    TensorView t;
    t.name = b.name;
    t.dtype_name = b.dtype_name;
    t.shape = b.shape;
    t.data = b.data;
    t.nbytes = b.nbytes;
    v.push_back(std::move(t));
  }
  return v;
}

Status LoadCheckpoint(const Checkpoint& ckpt, ModelLoader* loader, Storage* storage) {
  DCR_RETURN_IF_ERROR(loader->Init(storage));
  for (const TensorInfo& t : ckpt.tensors()) {
    WeightRef w;
    w.name = t.name;
    w.dtype_name = t.dtype_name;
    w.dtype = t.dtype;
    w.shape = t.shape;
    w.data = ckpt.data(t);
    w.nbytes = t.nbytes;
    DCR_RETURN_IF_ERROR(loader->LoadWeight(w, storage).WithContext("loading " + t.name));
  }
  return Status::OK();
}

}  // namespace dcr
