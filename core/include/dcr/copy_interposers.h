// Interposed libc copy functions for recording loads (runtime.h, "Interception").
//
// Include this header in exactly ONE translation unit of the executable (or of a shared library
// that is preloaded ahead of libc, e.g. a shim for a Python serving runtime). It defines memcpy,
// memmove, mempcpy, memset and the _FORTIFY_SOURCE forms __memcpy_chk, __memmove_chk,
// __memset_chk. Because the executable defines them, the dynamic linker binds every shared
// library's calls to these definitions too. Each forwards to libc's implementation found with
// dlsym(RTLD_NEXT) and reports the call to the dcr copy hook (dcr_c.h), which does nothing unless
// a recording is active: one relaxed atomic load and a predictable branch per call.
//
// Why a header and not part of dcr::receivers: a static library member that defines memcpy would
// be pulled into every binary that links dcr::receivers (the linker resolves the undefined memcpy
// of any object from the archive before it reaches libc), silently replacing memcpy in programs
// that never record. Binaries that record opt in here; RecordLoad refuses to run
// (kFailedPrecondition) in a binary that did not.
//
// What the hook cannot see: memcpy calls the compiler expanded inline (small constant sizes) and
// plain stores. RecordLoad's checks detect such writes to storage (see runtime.h).
#ifndef DCR_CORE_INCLUDE_DCR_COPY_INTERPOSERS_H_
#define DCR_CORE_INCLUDE_DCR_COPY_INTERPOSERS_H_

#include <dlfcn.h>

#include <atomic>
#include <cstddef>

#include "dcr/dcr_c.h"

extern "C" void dcr_copy_hook_report(void* dst, const void* src, size_t n, int kind);
extern "C" void dcr_copy_interposers_register(void);

namespace dcr_copy_interposers_detail {

using CopyFn = void* (*)(void*, const void*, size_t);
using SetFn = void* (*)(void*, int, size_t);
using ChkCopyFn = void* (*)(void*, const void*, size_t, size_t);
using ChkSetFn = void* (*)(void*, int, size_t, size_t);

inline thread_local bool t_resolving = false;

// Byte loops used only while dlsym itself is resolving (it may copy); kept out of GCC's
// loop-to-memcpy transformation so that they cannot call back into the interposers.
__attribute__((optimize("no-tree-loop-distribute-patterns"))) inline void* SlowCopy(void* d,
                                                                                    const void* s,
                                                                                    size_t n) {
  auto* dst = static_cast<volatile unsigned char*>(d);
  auto* src = static_cast<const unsigned char*>(s);
  if (static_cast<const void*>(const_cast<unsigned char*>(dst)) < s) {
    for (size_t i = 0; i < n; ++i) dst[i] = src[i];
  } else {
    for (size_t i = n; i > 0; --i) dst[i - 1] = src[i - 1];
  }
  return d;
}
__attribute__((optimize("no-tree-loop-distribute-patterns"))) inline void* SlowSet(void* d, int c,
                                                                                   size_t n) {
  auto* dst = static_cast<volatile unsigned char*>(d);
  for (size_t i = 0; i < n; ++i) dst[i] = static_cast<unsigned char>(c);
  return d;
}

template <typename Fn>
Fn Resolve(std::atomic<Fn>* slot, const char* name) {
  Fn f = slot->load(std::memory_order_acquire);
  if (f != nullptr) return f;
  if (t_resolving) return nullptr;
  t_resolving = true;
  f = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, name));
  t_resolving = false;
  if (f != nullptr) slot->store(f, std::memory_order_release);
  return f;
}

inline std::atomic<CopyFn> g_memcpy{nullptr}, g_memmove{nullptr}, g_mempcpy{nullptr};
inline std::atomic<SetFn> g_memset{nullptr};
inline std::atomic<ChkCopyFn> g_memcpy_chk{nullptr}, g_memmove_chk{nullptr};
inline std::atomic<ChkSetFn> g_memset_chk{nullptr};

struct Registrar {
  Registrar() { dcr_copy_interposers_register(); }
};
inline Registrar g_registrar;

}  // namespace dcr_copy_interposers_detail

extern "C" {

void* memcpy(void* __restrict dst, const void* __restrict src, size_t n) noexcept {
  using namespace dcr_copy_interposers_detail;
  CopyFn f = Resolve(&g_memcpy, "memcpy");
  void* r = f ? f(dst, src, n) : SlowCopy(dst, src, n);
  dcr_copy_hook_report(dst, src, n, DCR_COPY_HOST);
  return r;
}

void* memmove(void* dst, const void* src, size_t n) noexcept {
  using namespace dcr_copy_interposers_detail;
  CopyFn f = Resolve(&g_memmove, "memmove");
  void* r = f ? f(dst, src, n) : SlowCopy(dst, src, n);
  dcr_copy_hook_report(dst, src, n, DCR_COPY_HOST);
  return r;
}

void* mempcpy(void* __restrict dst, const void* __restrict src, size_t n) noexcept {
  using namespace dcr_copy_interposers_detail;
  CopyFn f = Resolve(&g_mempcpy, "mempcpy");
  void* r = f ? f(dst, src, n) : static_cast<char*>(SlowCopy(dst, src, n)) + n;
  dcr_copy_hook_report(dst, src, n, DCR_COPY_HOST);
  return r;
}

void* memset(void* dst, int c, size_t n) noexcept {
  using namespace dcr_copy_interposers_detail;
  SetFn f = Resolve(&g_memset, "memset");
  void* r = f ? f(dst, c, n) : SlowSet(dst, c, n);
  dcr_copy_hook_report(dst, nullptr, n, DCR_COPY_FILL);
  return r;
}

void* __memcpy_chk(void* dst, const void* src, size_t n, size_t dst_len) noexcept {
  using namespace dcr_copy_interposers_detail;
  ChkCopyFn f = Resolve(&g_memcpy_chk, "__memcpy_chk");
  void* r = f ? f(dst, src, n, dst_len) : SlowCopy(dst, src, n);
  dcr_copy_hook_report(dst, src, n, DCR_COPY_HOST);
  return r;
}

void* __memmove_chk(void* dst, const void* src, size_t n, size_t dst_len) noexcept {
  using namespace dcr_copy_interposers_detail;
  ChkCopyFn f = Resolve(&g_memmove_chk, "__memmove_chk");
  void* r = f ? f(dst, src, n, dst_len) : SlowCopy(dst, src, n);
  dcr_copy_hook_report(dst, src, n, DCR_COPY_HOST);
  return r;
}

void* __memset_chk(void* dst, int c, size_t n, size_t dst_len) noexcept {
  using namespace dcr_copy_interposers_detail;
  ChkSetFn f = Resolve(&g_memset_chk, "__memset_chk");
  void* r = f ? f(dst, c, n, dst_len) : SlowSet(dst, c, n);
  dcr_copy_hook_report(dst, nullptr, n, DCR_COPY_FILL);
  return r;
}

}  // extern "C"

#endif  // DCR_CORE_INCLUDE_DCR_COPY_INTERPOSERS_H_
