// Process-wide interposition of the libc copy functions (see runtime.h, "Interception").
//
// This object defines memcpy, memmove, memset, mempcpy and the _FORTIFY_SOURCE forms. Because the
// executable (which links dcr::core statically) defines them, the dynamic linker binds every
// shared library's calls to these definitions too. Each forwards to libc's implementation found
// with dlsym(RTLD_NEXT) and, only while an observer is installed, reports the call. The cost when
// no observer is installed is one relaxed atomic load and a predictable branch.
//
// The object is linked into a binary only when something references dcr_copy_hook_* (the
// recorder), so binaries that never record keep libc's functions untouched.
#include <dlfcn.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "dcr/dcr_c.h"

namespace {

using CopyFn = void* (*)(void*, const void*, size_t);
using SetFn = void* (*)(void*, int, size_t);
using ChkCopyFn = void* (*)(void*, const void*, size_t, size_t);
using ChkSetFn = void* (*)(void*, int, size_t, size_t);

struct Observer {
  dcr_copy_observer_fn fn;
  void* ctx;
};

std::atomic<Observer*> g_observer{nullptr};
Observer g_slot;
thread_local bool t_in_hook = false;
thread_local bool t_resolving = false;

// Byte loops used only while dlsym itself is resolving (it may copy); kept out of GCC's
// loop-to-memcpy transformation so they cannot call back into us.
__attribute__((optimize("no-tree-loop-distribute-patterns"))) void* SlowCopy(void* d,
                                                                             const void* s,
                                                                             size_t n) {
  auto* dst = static_cast<volatile unsigned char*>(d);
  auto* src = static_cast<const unsigned char*>(s);
  if (dst < src) {
    for (size_t i = 0; i < n; ++i) dst[i] = src[i];
  } else {
    for (size_t i = n; i > 0; --i) dst[i - 1] = src[i - 1];
  }
  return d;
}
__attribute__((optimize("no-tree-loop-distribute-patterns"))) void* SlowSet(void* d, int c,
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

std::atomic<CopyFn> g_memcpy{nullptr}, g_memmove{nullptr}, g_mempcpy{nullptr};
std::atomic<SetFn> g_memset{nullptr};
std::atomic<ChkCopyFn> g_memcpy_chk{nullptr}, g_memmove_chk{nullptr};
std::atomic<ChkSetFn> g_memset_chk{nullptr};

inline void Report(void* dst, const void* src, size_t n, int kind) {
  Observer* o = g_observer.load(std::memory_order_acquire);
  if (__builtin_expect(o == nullptr, 1) || t_in_hook || n == 0) return;
  t_in_hook = true;
  o->fn(o->ctx, dst, src, n, kind);
  t_in_hook = false;
}

}  // namespace

namespace dcr {
namespace internal {
bool SetHookMuted(bool muted) {
  const bool old = t_in_hook;
  t_in_hook = muted;
  return old;
}
}  // namespace internal
}  // namespace dcr

extern "C" {

void* memcpy(void* __restrict dst, const void* __restrict src, size_t n) noexcept {
  CopyFn f = Resolve(&g_memcpy, "memcpy");
  void* r = f ? f(dst, src, n) : SlowCopy(dst, src, n);
  Report(dst, src, n, DCR_COPY_HOST);
  return r;
}

void* memmove(void* dst, const void* src, size_t n) noexcept {
  CopyFn f = Resolve(&g_memmove, "memmove");
  void* r = f ? f(dst, src, n) : SlowCopy(dst, src, n);
  Report(dst, src, n, DCR_COPY_HOST);
  return r;
}

void* mempcpy(void* __restrict dst, const void* __restrict src, size_t n) noexcept {
  CopyFn f = Resolve(&g_mempcpy, "mempcpy");
  void* r = f ? f(dst, src, n) : static_cast<char*>(SlowCopy(dst, src, n)) + n;
  Report(dst, src, n, DCR_COPY_HOST);
  return r;
}

void* memset(void* dst, int c, size_t n) noexcept {
  SetFn f = Resolve(&g_memset, "memset");
  void* r = f ? f(dst, c, n) : SlowSet(dst, c, n);
  Report(dst, nullptr, n, DCR_COPY_FILL);
  return r;
}

void* __memcpy_chk(void* dst, const void* src, size_t n, size_t dst_len) noexcept {
  ChkCopyFn f = Resolve(&g_memcpy_chk, "__memcpy_chk");
  void* r = f ? f(dst, src, n, dst_len) : SlowCopy(dst, src, n);
  Report(dst, src, n, DCR_COPY_HOST);
  return r;
}

void* __memmove_chk(void* dst, const void* src, size_t n, size_t dst_len) noexcept {
  ChkCopyFn f = Resolve(&g_memmove_chk, "__memmove_chk");
  void* r = f ? f(dst, src, n, dst_len) : SlowCopy(dst, src, n);
  Report(dst, src, n, DCR_COPY_HOST);
  return r;
}

void* __memset_chk(void* dst, int c, size_t n, size_t dst_len) noexcept {
  ChkSetFn f = Resolve(&g_memset_chk, "__memset_chk");
  void* r = f ? f(dst, c, n, dst_len) : SlowSet(dst, c, n);
  Report(dst, nullptr, n, DCR_COPY_FILL);
  return r;
}

int dcr_copy_hook_install(dcr_copy_observer_fn fn, void* ctx) {
  if (fn == nullptr) return DCR_INVALID_ARGUMENT;
  if (g_observer.load(std::memory_order_acquire) != nullptr) return DCR_FAILED_PRECONDITION;
  g_slot.fn = fn;
  g_slot.ctx = ctx;
  Observer* expected = nullptr;
  if (!g_observer.compare_exchange_strong(expected, &g_slot)) return DCR_FAILED_PRECONDITION;
  return DCR_OK;
}

void dcr_copy_hook_remove(void) { g_observer.store(nullptr, std::memory_order_release); }

int dcr_copy_hook_active(void) { return g_observer.load(std::memory_order_acquire) != nullptr; }

void dcr_copy_hook_note(void* dst, const void* src, size_t n, int kind) {
  Report(dst, src, n, kind);
}

}  // extern "C"
