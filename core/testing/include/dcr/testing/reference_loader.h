// The reference serving runtime (a fixture): a rollout-engine stand-in (vLLM-like) whose native
// loader fuses, shards, pads, transposes, upcasts and quantizes a preset model (dcr/model.h) the
// way serving engines do. Tests, benchmarks and the CUDA checks load it through dcr/runtime.h's
// ModelLoader seam, exactly as a real engine's loader is recorded.
//
// Thread safety: loaders are thread-compatible; the conversions are pure.
#ifndef DCR_CORE_TESTING_INCLUDE_DCR_TESTING_REFERENCE_LOADER_H_
#define DCR_CORE_TESTING_INCLUDE_DCR_TESTING_REFERENCE_LOADER_H_

#include <cstdint>
#include <memory>

#include "dcr/model.h"
#include "dcr/runtime.h"
#include "dcr/status.h"
#include "dcr/statusor.h"

namespace dcr {

enum class FusedLayout : uint8_t {
  // qkv = [q | k | v] rows, gate_up = [gate | up] rows (vLLM's QKVParallelLinear / MergedColumn).
  kConcat = 0,
  // qkv grouped per kv head [q_g.. | k_g | v_g] and gate/up interleaved row by row (kernels that
  // want a group's heads, or gate and up rows, adjacent).
  kInterleaved = 1,
};

struct ServingConfig {
  ModelConfig model;
  int tp = 1;  // serving tensor-parallel size (any divisor of the head count)
  FusedLayout fused = FusedLayout::kConcat;
  int64_t vocab_multiple = 64;  // vocab padded to a multiple of vocab_multiple * tp (zero rows)
  bool fp32_norms = true;       // norms upcast to FP32 buffers (converted placements)
  int64_t max_positions = 256;  // rotary cos/sin tables [max_positions, rotary_dim / 2], FP32
  double rope_theta = 10000.0;
  // FP8 mode: linear weights (attention, MLP, experts) stored as F8_E4M3 with one FP32 scale per
  // fp8_block x fp8_block tile (amax / 448, computed at load). Embeddings, router, norms unchanged.
  bool fp8 = false;
  int64_t fp8_block = 128;
  // Expert weights stored transposed ([in, out], grouped per layer) as fused-MoE kernels want.
  bool transpose_experts = true;
};

// Checks a config against the model (divisibility of heads, intermediate sizes and FP8 blocks);
// kInvalidArgument naming the field otherwise.
Status ValidateServingConfig(const ServingConfig& config);

// The reference runtime's loader for serving rank `rank` of config.tp.
// Dense GQA and MoE models get fused, sharded buffers; other tensors (e.g. MLA projections) are
// replicated verbatim (norms upcast if fp32_norms).
StatusOr<std::unique_ptr<ModelLoader>> MakeReferenceLoader(const ServingConfig& config, int rank);
LoaderFactory ReferenceLoaderFactory(const ServingConfig& config);

// E4M3 (fn: no infinities, NaN = S.1111.111) with round-to-nearest-even and saturation to +-448.
uint8_t FloatToE4M3(float f);
float E4M3ToFloat(uint8_t b);

}  // namespace dcr

#endif  // DCR_CORE_TESTING_INCLUDE_DCR_TESTING_REFERENCE_LOADER_H_
