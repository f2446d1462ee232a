// Interposed CUDA runtime copies for recording loads into device memory (runtime.h,
// "Interception"): cudaMemcpy, cudaMemcpyAsync, cudaMemcpy2D, cudaMemcpy2DAsync.
//
// Include in exactly ONE translation unit of an executable that links the CUDA runtime as a shared
// library (CUDA::cudart, libcudart.so), and do NOT include cuda_runtime_api.h in that translation
// unit: the definitions below use plain types (int for cudaError_t / cudaMemcpyKind, void* for
// cudaStream_t), which are ABI-identical. The executable's definitions take precedence over
// libcudart's for every caller in the process; each forwards to libcudart through
// dlsym(RTLD_NEXT) and reports the copy to the dcr copy hook (dcr_c.h): a 2D copy is reported as
// `height` row copies, so strided and transposing placements (element-wide 2D copies) are recorded
// as boxes. With a statically linked cudart the interposition cannot work; RecordLoad's checks then
// fail with a message instead of missing placements.
#ifndef DCR_CORE_INCLUDE_DCR_CUDA_COPY_INTERPOSERS_H_
#define DCR_CORE_INCLUDE_DCR_CUDA_COPY_INTERPOSERS_H_

#include <dlfcn.h>

#include <atomic>
#include <cstddef>

#include "dcr/dcr_c.h"

extern "C" void dcr_copy_hook_report(void* dst, const void* src, size_t n, int kind);

namespace dcr_cuda_copy_interposers_detail {

using Memcpy = int (*)(void*, const void*, size_t, int);
using MemcpyAsync = int (*)(void*, const void*, size_t, int, void*);
using Memcpy2D = int (*)(void*, size_t, const void*, size_t, size_t, size_t, int);
using Memcpy2DAsync = int (*)(void*, size_t, const void*, size_t, size_t, size_t, int, void*);

template <typename Fn>
Fn Resolve(std::atomic<Fn>* slot, const char* name) {
  Fn f = slot->load(std::memory_order_acquire);
  if (f == nullptr) {
    f = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, name));
    slot->store(f, std::memory_order_release);
  }
  return f;
}

inline std::atomic<Memcpy> g_memcpy{nullptr};
inline std::atomic<MemcpyAsync> g_memcpy_async{nullptr};
inline std::atomic<Memcpy2D> g_memcpy_2d{nullptr};
inline std::atomic<Memcpy2DAsync> g_memcpy_2d_async{nullptr};

// cudaMemcpyKind: 0 H2H, 1 H2D, 2 D2H, 3 D2D, 4 default (unified addressing).
inline int KindOf(int cuda_kind) {
  switch (cuda_kind) {
    case 1:
      return DCR_COPY_HOST_TO_DEVICE;
    case 2:
      return DCR_COPY_DEVICE_TO_HOST;
    case 3:
      return DCR_COPY_DEVICE_TO_DEVICE;
    case 4:
      return DCR_COPY_HOST_TO_DEVICE;
    default:
      return DCR_COPY_HOST;
  }
}

inline void Report2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                     size_t height, int kind) {
  for (size_t r = 0; r < height; ++r) {
    dcr_copy_hook_report(static_cast<char*>(dst) + r * dpitch,
                         static_cast<const char*>(src) + r * spitch, width, KindOf(kind));
  }
}

constexpr int kErrorNotFound = 500;  // cudaErrorSymbolNotFound: libcudart not dynamically linked

}  // namespace dcr_cuda_copy_interposers_detail

extern "C" {

int cudaMemcpy(void* dst, const void* src, size_t n, int kind) {
  using namespace dcr_cuda_copy_interposers_detail;
  Memcpy f = Resolve(&g_memcpy, "cudaMemcpy");
  if (f == nullptr) return kErrorNotFound;
  const int r = f(dst, src, n, kind);
  if (r == 0) dcr_copy_hook_report(dst, src, n, KindOf(kind));
  return r;
}

int cudaMemcpyAsync(void* dst, const void* src, size_t n, int kind, void* stream) {
  using namespace dcr_cuda_copy_interposers_detail;
  MemcpyAsync f = Resolve(&g_memcpy_async, "cudaMemcpyAsync");
  if (f == nullptr) return kErrorNotFound;
  const int r = f(dst, src, n, kind, stream);
  if (r == 0) dcr_copy_hook_report(dst, src, n, KindOf(kind));
  return r;
}

int cudaMemcpy2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                 size_t height, int kind) {
  using namespace dcr_cuda_copy_interposers_detail;
  Memcpy2D f = Resolve(&g_memcpy_2d, "cudaMemcpy2D");
  if (f == nullptr) return kErrorNotFound;
  const int r = f(dst, dpitch, src, spitch, width, height, kind);
  if (r == 0) Report2D(dst, dpitch, src, spitch, width, height, kind);
  return r;
}

int cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                      size_t height, int kind, void* stream) {
  using namespace dcr_cuda_copy_interposers_detail;
  Memcpy2DAsync f = Resolve(&g_memcpy_2d_async, "cudaMemcpy2DAsync");
  if (f == nullptr) return kErrorNotFound;
  const int r = f(dst, dpitch, src, spitch, width, height, kind, stream);
  if (r == 0) Report2D(dst, dpitch, src, spitch, width, height, kind);
  return r;
}

}  // extern "C"

#endif  // DCR_CORE_INCLUDE_DCR_CUDA_COPY_INTERPOSERS_H_
