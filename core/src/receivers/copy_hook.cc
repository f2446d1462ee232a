// The process-wide copy hook: the observer slot, the report path and the C API (dcr_c.h). The
// interposed symbols themselves live in dcr/copy_interposers.h, which a binary includes in exactly
// one translation unit (so that linking dcr::receivers alone never replaces anybody's memcpy).
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "dcr/dcr_c.h"

namespace {

struct Observer {
  dcr_copy_observer_fn fn;
  void* ctx;
};

std::atomic<Observer*> g_observer{nullptr};
Observer g_slot;
thread_local bool t_in_hook = false;
std::atomic<int> g_interposers{0};

}  // namespace

namespace dcr {
namespace internal {
bool SetHookMuted(bool muted) {
  const bool old = t_in_hook;
  t_in_hook = muted;
  return old;
}
bool CopyInterposersLinked() { return g_interposers.load(std::memory_order_acquire) != 0; }
}  // namespace internal
}  // namespace dcr

extern "C" {

void dcr_copy_hook_report(void* dst, const void* src, size_t n, int kind) {
  Observer* o = g_observer.load(std::memory_order_acquire);
  if (__builtin_expect(o == nullptr, 1) || t_in_hook || n == 0) return;
  t_in_hook = true;
  o->fn(o->ctx, dst, src, n, kind);
  t_in_hook = false;
}

void dcr_copy_interposers_register(void) { g_interposers.store(1, std::memory_order_release); }

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
  dcr_copy_hook_report(dst, src, n, kind);
}

}  // extern "C"
