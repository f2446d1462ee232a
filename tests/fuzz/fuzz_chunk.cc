// libFuzzer target: one chunk record -> ParseChunkHeader, DecodeChunk, BufferApplier::ApplyChunk
// (also with range verification), and BufferApplier::ApplyRecord, which decodes and applies from
// the streams and must agree with DecodeChunk + ApplyChunk on the outcome and the bytes. A
// context-coded record is decoded against the fixed model's bits (a wrong base for nearly every
// mutated input): DecodeContextChunkInto + ApplyChunk must agree with ApplyRecord, and its plain
// form (ContextChunkToPlain) must decode to the same changes. Any
// outcome is fine except a crash, a sanitizer report, a failed apply that wrote bytes, or the two
// paths disagreeing.
#include <cstring>

#include "dcr/apply.h"
#include "dcr/context.h"
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
  fuzz::FixedModel streamed_model;
  BufferApplier streamed(streamed_model.Buffers());
  streamed.set_verify_ranges(size % 2 == 0);
  const std::vector<std::vector<uint8_t>> start = streamed_model.bufs;
  const Status rs = streamed.ApplyRecord(data, size);
  if (!rs.ok() && streamed_model.bufs != start) __builtin_trap();  // a failed apply writes nothing
  if (h.ok() && IsContextCoded(*h)) {
    // Decoded against the buffers' bits: ApplyRecord succeeds exactly when the context decoder
    // does (segments in range) and then writes the decoded changes.
    if (dc.ok()) __builtin_trap();  // a plain decoder never accepts a context-coded record
    fuzz::FixedModel model;
    std::vector<TensorBuffer> bufs = model.Buffers();
    std::vector<uint8_t> covered;
    if (!GatherCoveredBits(*h, bufs, &covered).ok()) {
      if (rs.ok()) __builtin_trap();
      return 0;
    }
    DecodedChunk cc;
    const Status cs = DecodeContextChunkInto(data, size, covered.data(), covered.size(), &cc);
    if (cs.ok() != rs.ok()) __builtin_trap();
    if (cs.ok()) {
      BufferApplier applier(bufs);
      if (!applier.ApplyChunk(cc).ok() || model.bufs != streamed_model.bufs) __builtin_trap();
      StatusOr<std::vector<uint8_t>> plain =
          ContextChunkToPlain(data, size, covered.data(), covered.size());
      if (!plain.ok()) __builtin_trap();
      StatusOr<DecodedChunk> pd = DecodeChunk(plain->data(), plain->size());
      if (!pd.ok() || pd->positions != cc.positions || pd->values != cc.values) __builtin_trap();
    }
    return 0;
  }
  if (!dc.ok()) {
    if (rs.ok()) __builtin_trap();  // a record DecodeChunk refuses is refused by ApplyRecord too
    return 0;
  }
  fuzz::FixedModel model;
  std::vector<TensorBuffer> bufs = model.Buffers();
  std::vector<std::vector<uint8_t>> before = model.bufs;
  BufferApplier applier(bufs);
  applier.set_verify_ranges(size % 2 == 0);
  Status s = applier.ApplyChunk(*dc);
  if (!s.ok() && model.bufs != before) __builtin_trap();  // a failed apply must write nothing
  // The streamed path reaches the same outcome and bytes.
  if (s.code() != rs.code() || model.bufs != streamed_model.bufs) {
    __builtin_trap();
  }
  // Absolute chunks are idempotent: applying again succeeds and changes nothing.
  if (s.ok() && dc->header.value_mode == ValueMode::kAbsolute) {
    std::vector<std::vector<uint8_t>> after = model.bufs;
    Status again = applier.ApplyChunk(*dc);
    if (!again.ok() || model.bufs != after) __builtin_trap();
  }
  return 0;
}
