// CopyRecorder: turns the copies observed during a recording load into a PlacementMap.
//
// Sources are mappings of one safetensors file; destinations are declared storage buffers. A copy
// from a source into a buffer becomes a run of canonical elements; runs are merged on the fly into
// affine boxes of up to 3 dimensions (rows of a slice, columns of a transposed copy, ...). Copies
// from a source into memory that is not storage give that memory a provenance (bounce buffers);
// anything else written into a buffer is converted (attributed to the tensor being loaded) or, for
// memset and writes outside any tensor's load, constant.
//
// Thread safety: OnCopy may be called from any thread (internally locked); the rest is
// thread-compatible.
#ifndef DCR_CORE_SRC_RECEIVERS_RECORDER_H_
#define DCR_CORE_SRC_RECEIVERS_RECORDER_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/runtime.h"

namespace dcr {
namespace internal {

// Mutes the copy hook on the calling thread (returns the previous state); defined in copy_hook.cc.
bool SetHookMuted(bool muted);
// True when the binary includes dcr/copy_interposers.h.
bool CopyInterposersLinked();
class ScopedHookMute {
 public:
  ScopedHookMute() : old_(SetHookMuted(true)) {}
  ~ScopedHookMute() { SetHookMuted(old_); }

 private:
  bool old_;
};

class CopyRecorder {
 public:
  // `ckpt` defines the canonical inventory (sorted names) and is the first source.
  explicit CopyRecorder(const Checkpoint& ckpt);
  ~CopyRecorder();

  // Another mapping of the same file image.
  void AddSource(const uint8_t* file_base, uint64_t file_size);
  void AddBuffer(const std::string& name, uint8_t* data, uint64_t nbytes);
  // Index into tensors() of the tensor being loaded, or -1.
  void SetTensor(int64_t tensor) { current_tensor_ = tensor; }
  int64_t TensorIndex(const std::string& name) const;
  const std::vector<std::string>& tensors() const { return map_.tensors; }

  // Installs the process copy hook (kInternal if one is installed) / removes it.
  Status Start();
  void Stop();

  // Called by the hook.
  void OnCopy(void* dst, const void* src, size_t n, int kind);

  // Copies observed before any buffer is declared (a loader's Init allocates and writes its buffers
  // in one go) are kept and processed by ReplayPending once the buffers are declared.
  void ReplayPending();

  // Closes open boxes and returns the map (buffers named as declared).
  PlacementMap Finish();

 private:
  struct TensorSpan {  // one tensor's bytes in the file image
    uint64_t file_begin, nbytes;
    uint32_t index;
    uint8_t width;
  };
  struct Prov {  // a staging range holding checkpoint bytes
    uintptr_t end;
    uint32_t tensor;
    uint64_t tensor_byte;
  };
  struct Piece {
    uint64_t len;
    int64_t tensor;  // -1: not checkpoint bytes
    uint64_t tensor_byte;
  };

  void ResolveSource(uintptr_t src, uint64_t n, std::vector<Piece>* out) const;
  void EraseProvenance(uintptr_t a, uintptr_t b);
  int FindBuffer(uintptr_t addr) const;
  void AddRun(uint32_t tensor, uint64_t elem, uint64_t count, uint32_t buffer, uint64_t dst_off,
              uint8_t width);
  void AddRegion(uint32_t tensor, uint32_t buffer, uint64_t off, uint64_t size);
  void CloseBox(uint64_t key);

  std::mutex mu_;
  PlacementMap map_;
  std::vector<TensorSpan> spans_;  // sorted by file_begin
  std::vector<std::pair<const uint8_t*, uint64_t>> sources_;
  std::vector<std::pair<uintptr_t, uint64_t>> buffer_ranges_;  // (begin, size) per buffer
  std::vector<uint32_t> buffer_order_;                         // buffer indices sorted by address
  std::map<uintptr_t, Prov> provenance_;
  std::map<uint64_t, Placement> open_;      // key = tensor << 32 | buffer
  std::map<uint64_t, size_t> last_closed_;  // key -> index in map_.placements
  struct Raw {
    void* dst;
    const void* src;
    size_t n;
    int kind;
  };
  std::vector<Raw> pending_;
  int64_t current_tensor_ = -1;
  bool started_ = false;
};

// Tries to extend box `b` by box `r` (same tensor, buffer, width): contiguous runs, one more step
// along the outermost dimension, or a new outermost dimension. Exposed for tests.
bool AppendBox(Placement* b, const Placement& r);

}  // namespace internal
}  // namespace dcr

#endif  // DCR_CORE_SRC_RECEIVERS_RECORDER_H_
