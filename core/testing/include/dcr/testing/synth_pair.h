// Versions of a synthetic model one step apart, for tests and benches: safetensors images from
// SynthTrainer (synth.h), checkpoints from the seeded synthetic model (test_model.h), and the small
// MoE serving rank the placement refit tests load. Header-only.
#ifndef DCR_CORE_TESTING_INCLUDE_DCR_TESTING_SYNTH_PAIR_H_
#define DCR_CORE_TESTING_INCLUDE_DCR_TESTING_SYNTH_PAIR_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/statusor.h"
#include "dcr/testing/reference_loader.h"
#include "dcr/testing/synth.h"
#include "dcr/testing/test_model.h"

namespace dcr::testing {

struct SynthImagePair {
  std::vector<uint8_t> before;  // the model as SynthTrainer::Create leaves it
  std::vector<uint8_t> after;   // after one Step
};

// SynthTrainer::Create(tensors, options), the image of its tensors, one Step, the image again.
// Errors: those of SynthTrainer::Create.
inline StatusOr<SynthImagePair> SynthStepImages(std::vector<TensorSpec> tensors,
                                                const SynthOptions& options) {
  auto tr = SynthTrainer::Create(std::move(tensors), options);
  if (!tr.ok()) return tr.status();
  SynthImagePair p;
  p.before = SafetensorsImage((*tr)->Views());
  (*tr)->Step();
  p.after = SafetensorsImage((*tr)->Views());
  return p;
}

struct CheckpointPair {
  std::unique_ptr<Checkpoint> v0, v1;  // nullptr where the image did not parse
};

// internal::MakeSyntheticModel(cfg, seed) as v0, and as v1 after
// internal::StepSyntheticModel(rate, step_seed, specials).
inline CheckpointPair SyntheticCheckpointPair(const ModelConfig& cfg, uint64_t seed, double rate,
                                              uint64_t step_seed, bool specials) {
  auto model = internal::MakeSyntheticModel(cfg, seed);
  CheckpointPair p;
  p.v0 = model.ToCheckpoint();
  internal::StepSyntheticModel(&model, rate, step_seed, specials);
  p.v1 = model.ToCheckpoint();
  return p;
}

// A small MoE model served unsharded with BF16 norms: vocab 1000, hidden 128, 2 layers, 8 heads
// (2 KV heads) of 16, intermediate 256, 4 experts of 64, 16 positions.
inline ServingConfig SmallMoeServingConfig() {
  ServingConfig cfg;
  cfg.model.vocab = 1000;
  cfg.model.hidden = 128;
  cfg.model.layers = 2;
  cfg.model.heads = 8;
  cfg.model.kv_heads = 2;
  cfg.model.head_dim = 16;
  cfg.model.intermediate = 256;
  cfg.model.experts = 4;
  cfg.model.moe_intermediate = 64;
  cfg.fp32_norms = false;
  cfg.max_positions = 16;
  return cfg;
}

}  // namespace dcr::testing

#endif  // DCR_CORE_TESTING_INCLUDE_DCR_TESTING_SYNTH_PAIR_H_
