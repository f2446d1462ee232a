// libFuzzer target: one chunk record -> ParseChunkHeader, DecodeChunk, BufferApplier::ApplyChunk
// (also with range verification), overwrite-form conversion, and the journaled applier's checks.
// Any outcome is fine except a crash, a sanitizer report, or a failed apply that wrote bytes.
#include <cstring>

#include "dcr/apply.h"
#include "dcr/delta.h"
#include "dcr/journal.h"
#include "dcr/status_macros.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dcr;
  size_t hsize = 0, rsize = 0;
  StatusOr<ChunkHeader> h = ParseChunkHeader(data, size, &hsize, &rsize);
  if (h.ok() && (hsize > size || rsize > size)) __builtin_trap();
  StatusOr<DecodedChunk> dc = DecodeChunk(data, size);
  if (!dc.ok()) return 0;
  fuzz::FixedModel model;
  std::vector<TensorBuffer> bufs = model.Buffers();
  std::vector<std::vector<uint8_t>> before = model.bufs;
  BufferApplier applier(bufs);
  applier.set_verify_ranges(size % 2 == 0);
  Status s = applier.ApplyChunk(*dc);
  if (!s.ok() && model.bufs != before) __builtin_trap();  // a failed apply must write nothing
  // Absolute chunks are idempotent: applying again succeeds and changes nothing.
  if (s.ok() && dc->header.value_mode == ValueMode::kAbsolute) {
    std::vector<std::vector<uint8_t>> after = model.bufs;
    Status again = applier.ApplyChunk(*dc);
    if (!again.ok() || model.bufs != after) __builtin_trap();
  }
  return 0;
}
