// The reference training side (a fixture): a Megatron-like training state stepped with AdamW, and
// its ordinary exporter from rank shards to canonical Hugging Face tensors. Tests, benchmarks and
// `dcr train-delta` drive dcr/train.h's map discovery and per-rank delta construction with them;
// a real trainer supplies its own shards and its framework's exporter.
//
// Thread safety: TrainState is thread-compatible; ReferenceExporter is immutable and safe to share.
#ifndef DCR_CORE_TESTING_INCLUDE_DCR_TESTING_REFERENCE_TRAINER_H_
#define DCR_CORE_TESTING_INCLUDE_DCR_TESTING_REFERENCE_TRAINER_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "dcr/status.h"
#include "dcr/statusor.h"
#include "dcr/testing/synth.h"
#include "dcr/train.h"

namespace dcr {

struct TrainOptions {
  uint64_t seed = 1;
  double lr = 0;              // 0: calibrate to change_rate on the first step
  double change_rate = 0.03;  // target BF16 change rate per step (when lr == 0)
  int warmup_steps = 3;
  int threads = 0;   // 0 = hardware concurrency; never changes the bytes
  AdamWHyper hyper;  // lr here is ignored (see lr above)
};

// Shards with FP32 masters and AdamW moments, stepped deterministically. Replicas get identical
// values (same key, same gradients), as all-reduced gradients give in a real run.
class TrainState {
 public:
  static StatusOr<std::unique_ptr<TrainState>> Create(std::shared_ptr<const TrainStructure> s,
                                                      const TrainOptions& options);
  ~TrainState();
  // One optimizer step on every parameter whose name passes `filter` (all when null).
  void Step(const std::function<bool(const LocalParam&)>& filter = nullptr);
  const ShardSet& shards() const { return shards_; }
  const TrainStructure& structure() const { return *s_; }
  double lr() const { return lr_; }
  int64_t step() const { return t_; }

 private:
  TrainState() = default;
  void StepImpl(double lr, const std::function<bool(const LocalParam&)>& filter);
  std::shared_ptr<const TrainStructure> s_;
  TrainOptions options_;
  ShardSet shards_;
  struct Opt;
  std::unique_ptr<Opt> opt_;
  double lr_ = 0;
  int64_t t_ = 0;
};

// The framework's converter for TrainStructure's layout: gathers tensor-parallel shards, un-fuses
// QKV and gate/up, drops vocab padding, stores FP32 norms as BF16, folds the per-row scale into
// down_proj (fold_layers) and undoes the RoPE pair layout. Knows nothing about deltas.
class ReferenceExporter : public Exporter {
 public:
  explicit ReferenceExporter(std::shared_ptr<const TrainStructure> s) : Exporter(std::move(s)) {}
  Status ExportTensor(const ShardReader& shards, size_t t, uint8_t* out) const override;
};

}  // namespace dcr

#endif  // DCR_CORE_TESTING_INCLUDE_DCR_TESTING_REFERENCE_TRAINER_H_
