// Payload sizes of a preset's refit delta, measured with the real codec.
//
// The full inventory of a large preset cannot be materialised, so the model samples: every tensor
// of the inventory belongs to an element class (dtype x initialisation kind: "weight" matrices and
// embeddings ~N(0, 0.02), "norm" vectors ~1 + N(0, 0.05)). For each class present, a sample of up
// to `sample_elems` FP32 masters is trained with the synthetic AdamW step of dcr/testing/synth.h
// (AdamWStep, gradients = grad_snr * persistent + fresh noise, `warmup_steps` steps, then one
// measured step), cast to the class dtype (BF16 with round-to-nearest-even, or F32 bits), and the
// changes of the measured step are encoded with EncodeChunk (delta.h) exactly as one grid cell of
// the real delta. One learning rate is used for every class (as a trainer does) and calibrated by
// bisection so the "weight" BF16 class changes at the requested rate. Bytes per element of each
// class are then scaled to the class's element count in the inventory; the header (inventory JSON)
// and trailer (chunk table) sizes are added. No assumed compression ratio enters.
//
// Deterministic: a pure function of (preset, change_rate, options). Thread safety: pure functions.
#ifndef DCR_SIM_ENGINE_PAYLOAD_MODEL_H_
#define DCR_SIM_ENGINE_PAYLOAD_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "dcr/delta.h"
#include "dcr/statusor.h"
#include "dcr/testing/synth.h"

namespace dcr::sim::internal {

struct PayloadModelOptions {
  uint64_t sample_elems = uint64_t{1} << 22;  // per class, default one full grid cell (2^22)
  uint64_t calib_elems = uint64_t{1} << 17;   // sample used to calibrate the learning rate
  int warmup_steps = 10;                      // optimizer steps before the measured step
  double grad_snr = 0.1;
  uint64_t seed = 1;
  uint64_t chunk_elems = uint64_t{1} << 22;  // grid cell size of the real delta
  int zstd_level = 1;
  int context_classes = kContextClassesMax;  // DeltaOptions::context_classes, context form
};

struct ClassPayload {
  std::string name;  // e.g. "BF16/weight"
  std::string dtype;
  uint64_t elements = 0;  // in the full inventory
  uint64_t tensors = 0;
  uint64_t sample_elems = 0;
  double measured_rate = 0;      // fraction of sampled elements whose bits changed
  double bytes_per_element = 0;  // encoded chunk bytes / sampled elements
  double payload_bytes = 0;      // bytes_per_element * elements
  double dense_bytes = 0;
  // The context-coded form (EncodeContextChunk against the sample's base bits; the plain record
  // where it is not smaller or the chunk has no context form, as BuildDelta writes it).
  double context_bytes_per_element = 0;
  double context_payload_bytes = 0;
};

struct PayloadModel {
  std::string preset;
  double change_rate = 0;    // requested
  double measured_rate = 0;  // over all sampled elements, weighted by inventory counts
  double lr = 0;             // calibrated learning rate
  uint64_t elements = 0;
  uint64_t tensors = 0;
  uint64_t grid_chunks = 0;        // chunks of the real delta grid
  double dense_bytes = 0;          // full checkpoint tensor bytes
  double delta_bytes = 0;          // header + chunks + trailer
  double context_delta_bytes = 0;  // the same, context-coded chunks
  double header_bytes = 0;
  std::vector<ClassPayload> classes;

  // The context-coded chunks' bytes over the plain chunks' bytes (header and trailer excluded).
  double ContextChunkRatio() const {
    double plain = 0, context = 0;
    for (const ClassPayload& c : classes) {
      plain += c.payload_bytes;
      context += c.context_payload_bytes;
    }
    return plain > 0 ? context / plain : 1;
  }
};

// Measures the payload of `cfg` at `change_rate` (0 < rate < 1). kInvalidArgument for a bad rate,
// kUnimplemented for a dtype the sampler cannot train (anything but BF16 and F32), codec errors
// as returned by EncodeChunk.
StatusOr<PayloadModel> MeasurePayload(const ModelConfig& cfg, double change_rate,
                                      const PayloadModelOptions& options);

}  // namespace dcr::sim::internal

#endif  // DCR_SIM_ENGINE_PAYLOAD_MODEL_H_
